"""Which TensorRT library builds and runs engines here: ``tensorrt_rtx`` or ``tensorrt``, its version, the build
targets (compute capabilities) and the GPUs its engines run on, and the logger every TensorRT object is given.

With a GPU, ``tensorrt`` is preferred when installed (it supports data-centre GPUs), else ``tensorrt_rtx`` with
``CURRENT``. Without a GPU only ``tensorrt_rtx`` can build. ``$ATTNZOO_TENSORRT`` (``tensorrt`` or
``tensorrt_rtx``) forces the choice.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from typing import Any

from attnzoo.lazy import lazy_import

torch = lazy_import("torch")

__all__ = [
    "LIBRARIES",
    "LIBRARY_ENV",
    "COMPUTE_CAPABILITIES",
    "DEFAULT_COMPUTE_CAPABILITY",
    "RTX_RUNS_ON",
    "TensorRTError",
    "TensorRTUnavailable",
    "TensorRTParseError",
    "Library",
    "gpu_available",
    "gpu_description",
    "tensorrt_proper_hint",
    "install_hint",
    "run_problem",
    "load_library",
    "unavailable_reason",
    "resolve_compute_capability",
    "target_name",
    "make_logger",
    "last_errors",
]

LIBRARIES: tuple[str, ...] = ("tensorrt", "tensorrt_rtx")
LIBRARY_ENV = "ATTNZOO_TENSORRT"
#: Compute capabilities TensorRT-RTX builds for ahead of time (its ``ComputeCapability`` enum, 1.7); ``CURRENT`` is
#: the GPU present.
COMPUTE_CAPABILITIES: tuple[str, ...] = ("SM75", "SM80", "SM86", "SM89", "SM120", "SM121", "CURRENT")
#: Compute capabilities whose GPUs run TensorRT-RTX engines: its support matrix (Turing RTX 20xx, Ampere RTX 30xx,
#: Ada RTX 40xx / L4 / L40S, Blackwell RTX 50xx, GB10). 8.0 (A100) is in the enum but not in the matrix; 9.0 (H100,
#: H200) is in neither: those data-centre GPUs need TensorRT proper.
RTX_RUNS_ON: dict[str, tuple[int, int]] = {
    "SM75": (7, 5),
    "SM86": (8, 6),
    "SM89": (8, 9),
    "SM120": (12, 0),
    "SM121": (12, 1),
}
#: Target without a GPU: Ada (SM 8.9: RTX 40xx, L4, L40S), the newest widely deployed data-centre inference part
#: TensorRT-RTX names.
DEFAULT_COMPUTE_CAPABILITY = "SM89"


class TensorRTError(RuntimeError):
    """A TensorRT build or run failed."""


class TensorRTUnavailable(TensorRTError):
    """No usable TensorRT library (or no GPU where one is needed)."""


class TensorRTParseError(TensorRTError):
    """TensorRT's ONNX parser rejected the file."""


@dataclass(frozen=True)
class Library:
    """An imported TensorRT library.

    Attributes:
        name: ``tensorrt`` or ``tensorrt_rtx``.
        module: The imported module.
        version: Its ``__version__``.
        ahead_of_time: Builds for a named compute capability without a GPU (TensorRT-RTX).
    """

    name: str
    module: Any = field(repr=False)
    version: str
    ahead_of_time: bool

    def describe(self) -> str:
        """``tensorrt_rtx 1.7.1.116``."""
        return f"{self.name} {self.version}"


def gpu_available() -> bool:
    """A CUDA GPU is visible to PyTorch (``False`` when torch is not installed)."""
    try:
        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def gpu_description() -> tuple[str, tuple[int, int]]:
    """The visible GPU's name and compute capability (needs a GPU)."""
    return torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))


def tensorrt_proper_hint() -> str:
    """The install command of TensorRT proper for the CUDA major of the installed torch (``tensorrt-cu13`` with a
    CUDA 13 torch), the library for data-centre GPUs."""
    try:
        major = (torch.version.cuda or "").split(".")[0]
    except ImportError:
        major = ""
    if not major:
        return "pip install 'tensorrt>=10' (with a CUDA build of torch)"
    return f"pip install 'tensorrt-cu{major}>=10'"


def install_hint() -> str:
    """How to install a TensorRT library here: ``tensorrt-rtx`` (builds without a GPU), or TensorRT proper."""
    return (
        f"pip install tensorrt-rtx (builds engines without a GPU; it comes with attnzoo[dev] / attnzoo[tensorrt]; "
        f"runs on GeForce/RTX-class GPUs), or {tensorrt_proper_hint()} on a machine with an NVIDIA GPU "
        "(data-centre GPUs such as the H100)"
    )


def run_problem(lib: Library) -> str | None:
    """Why engines of ``lib`` cannot run on the visible GPU (one line), or ``None``: TensorRT-RTX runs only on the
    compute capabilities of :data:`RTX_RUNS_ON`."""
    if lib.name != "tensorrt_rtx" or not gpu_available():
        return None
    name, cc = gpu_description()
    if cc in RTX_RUNS_ON.values():
        return None
    runs = ", ".join(f"{a}.{b}" for a, b in RTX_RUNS_ON.values())
    return (
        f"{lib.describe()} does not run on {name} (compute capability {cc[0]}.{cc[1]}): it runs on {runs} "
        f"(GeForce/RTX-class GPUs); for this GPU install TensorRT proper: {tensorrt_proper_hint()}"
    )


def _import(name: str) -> Library | None:
    try:
        mod = importlib.import_module(name)
    except Exception:  # ImportError, or a wheel whose native libraries fail to load
        return None
    return Library(
        name,
        mod,
        str(getattr(mod, "__version__", "?")),
        hasattr(mod, "ComputeCapability") and hasattr(mod.IBuilderConfig, "set_compute_capability"),
    )


def load_library(name: str | None = None, *, gpu: bool | None = None) -> Library:
    """The TensorRT library to build with.

    Args:
        name: ``tensorrt`` or ``tensorrt_rtx`` (default: ``$ATTNZOO_TENSORRT``, else see the module docstring).
        gpu: Whether a GPU is present (default: :func:`gpu_available`).

    Raises:
        TensorRTUnavailable: nothing usable is installed (the message names the install command).
        ValueError: unknown library name.
    """
    name = name or os.environ.get(LIBRARY_ENV) or None
    if name is not None and name not in LIBRARIES:
        raise ValueError(f"unknown TensorRT library {name!r}; valid: {', '.join(LIBRARIES)}")
    gpu = gpu_available() if gpu is None else gpu
    order = [name] if name else (["tensorrt", "tensorrt_rtx"] if gpu else ["tensorrt_rtx", "tensorrt"])
    found = [lib for lib in map(_import, order) if lib is not None]
    usable = [lib for lib in found if gpu or lib.ahead_of_time]
    if usable:
        return usable[0]
    if found:
        raise TensorRTUnavailable(
            f"{found[0].describe()} builds engines only on a machine with an NVIDIA GPU, and "
            f"none is visible; to build ahead of time here: pip install tensorrt-rtx"
        )
    raise TensorRTUnavailable(
        f"no TensorRT library is installed ({' or '.join(order)}); install one with: {install_hint()}"
    )


def unavailable_reason(*, run: bool = False) -> str | None:
    """Why engines cannot be built (``run``: built and run) here, or ``None`` when they can."""
    try:
        lib = load_library()
    except (TensorRTUnavailable, ValueError) as exc:
        return str(exc)
    if run and not gpu_available():
        return (
            f"running a TensorRT engine needs an NVIDIA GPU and none is visible ({lib.describe()} can only "
            f"build engines here)"
        )
    return run_problem(lib) if run else None


def resolve_compute_capability(compute_capability: str | None, gpu: bool) -> str:
    """The build target's name: ``compute_capability`` upper-cased, or by default ``CURRENT`` (the GPU present)
    with a GPU and :data:`DEFAULT_COMPUTE_CAPABILITY` without.

    Raises:
        ValueError: an unknown name, or ``CURRENT`` without a GPU (one line).
    """
    cc = (compute_capability or ("CURRENT" if gpu else DEFAULT_COMPUTE_CAPABILITY)).upper()
    if cc not in COMPUTE_CAPABILITIES:
        raise ValueError(f"unknown compute capability {compute_capability!r}; valid: {', '.join(COMPUTE_CAPABILITIES)}")
    if cc == "CURRENT" and not gpu:
        raise ValueError(
            f"compute capability CURRENT needs a GPU and none is visible; "
            f"name one of {', '.join(COMPUTE_CAPABILITIES[:-1])}"
        )
    return cc


def target_name(cc: str) -> str:
    """``cc``, with ``CURRENT`` made concrete (``CURRENT-sm90``): a cache shared by two GPUs keeps them apart."""
    if cc != "CURRENT":
        return cc
    major, minor = gpu_description()[1]
    return f"CURRENT-sm{major}{minor}"


def make_logger(trt: Any) -> Any:
    """A logger for the TensorRT module ``trt`` that keeps its errors (quoted in our exceptions) instead of printing
    them. TensorRT calls ``log`` from C and swallows what it raises, so ``log`` never raises."""

    class _Keep(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity, msg) -> None:  # a TensorRT callback: it must never raise
            try:
                if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                    self.errors.append(str(msg).strip().replace("\n", " "))
            except Exception:  # nothing may leave a C callback; the message is lost, not the run
                pass

    try:
        return _Keep()
    except Exception:  # bindings without a subclassable ILogger: TensorRT prints its errors itself
        return trt.Logger(trt.Logger.ERROR)


def last_errors(logger: Any, n: int = 2) -> str:
    """The last ``n`` errors a :func:`make_logger` logger kept, as a suffix for an exception message."""
    errors = getattr(logger, "errors", [])
    return f": {' | '.join(errors[-n:])}" if errors else " (see TensorRT's log above)"
