"""The TensorRT target's own export option, ``--compute-capability``: the GPU an engine is built for, checked
before any work (a known target; one the precision's tensor cores exist on; ``CURRENT`` only with a GPU)."""

from __future__ import annotations

from attnzoo.errors import UsageError, quoted
from attnzoo.lazy import lazy_import
from attnzoo.runtime.precision import Precision, get_precision
from attnzoo.runtime.targets import FormatOption

from . import library
from .library import COMPUTE_CAPABILITIES, DEFAULT_COMPUTE_CAPABILITY

torch = lazy_import("torch")

__all__ = ["COMPUTE_CAPABILITY", "check_compute_capability", "compute_capability_error"]


def compute_capability_error(precision: Precision, compute_capability: str | None) -> str | None:
    """One line when a TensorRT target is older than ``precision`` needs (FP8: SM 8.9, its tensor cores), else
    ``None``.

    ``compute_capability`` is a name of :data:`~attnzoo.targets.tensorrt.library.COMPUTE_CAPABILITIES`; ``None`` is
    the build default (the GPU present, else ``DEFAULT_COMPUTE_CAPABILITY``); ``CURRENT`` asks the GPU.
    """
    need = precision.min_compute_capability
    if need is None:
        return None
    try:
        cc = library.resolve_compute_capability(compute_capability, library.gpu_available())
    except ValueError as exc:  # an unknown name, or CURRENT without a GPU: the build would refuse it the same way
        return str(exc)
    if cc == "CURRENT":
        major, minor = torch.cuda.get_device_capability(0)
        name = f"the GPU present (SM{major}{minor})"
    else:
        digits = cc[2:]
        major, minor = int(digits[:-1]), int(digits[-1])
        name = cc
    if (major, minor) < need:
        return (
            f"--dtype {precision.name} needs compute capability SM{need[0]}{need[1]} or newer "
            f"({precision.name.upper()} tensor cores); {name} has none"
        )
    return None


def check_compute_capability(compute_capability: str | None, dtype: str) -> None:
    """Refuse, with a :class:`UsageError`, a target no engine of ``dtype`` can be built for: an unknown name, one
    without the precision's tensor cores, or ``CURRENT`` without a GPU."""
    if compute_capability is not None and compute_capability not in COMPUTE_CAPABILITIES:
        error: str | None = (
            f"unknown compute capability {quoted(compute_capability)}; valid: {', '.join(COMPUTE_CAPABILITIES)}"
        )
    else:
        error = compute_capability_error(get_precision(dtype), compute_capability)
    if error is None and compute_capability == "CURRENT" and not library.gpu_available():
        error = (
            "--compute-capability CURRENT needs a GPU and none is visible; name one to build ahead of time (e.g. SM89)"
        )
    if error:
        raise UsageError(error)


def _upper(value: str) -> str:
    return str(value).upper()


#: ``--compute-capability``: the GPU an engine is built for (TensorRT's, and Triton's ``tensorrt_plan`` folder's).
COMPUTE_CAPABILITY = FormatOption(
    "compute_capability",
    owner="tensorrt",
    help=(
        f"--format tensorrt: GPU to build for, one of {', '.join(COMPUTE_CAPABILITIES)} (default: CURRENT, the GPU "
        f"present; without a GPU {DEFAULT_COMPUTE_CAPABILITY}, built ahead of time with tensorrt-rtx and not run)"
    ),
    choices=COMPUTE_CAPABILITIES,
    normalize=_upper,
    metavar="SM",
    title="compute capability",
)
