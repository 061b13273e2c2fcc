"""The backend registry: every way attnzoo runs a model, one module each, one name each.

Modelled on Polygraphy's runners: a :class:`Backend` says what it is (its one name, the aliases the command
lines also accept, what it takes: the PyTorch module or a verified ONNX file, where it computes), whether it
runs on this machine and if not why (:meth:`Backend.unavailable_reason`), and loads a model into a
:class:`Session` with ``run`` (host float32 in, float32 logits out), ``call`` (a reusable timed call on
inputs already where the backend computes, for the benchmark) and ``info`` (the settings it ended up with).

``bench-latency``, the demo, ``serve-models`` and the CPU-runtime choice all go through :func:`get_backend`;
``python -m attnzoo.runtime`` prints the registry. Adding a backend is one module that subclasses
:class:`Backend`, calls :func:`register_backend` and is imported at the bottom of this file, plus its test.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["Backend", "Session", "Call", "register_backend", "get_backend", "canonical_backend", "backend_names",
           "backends", "cpu_runtimes", "DTYPES", "describe", "check_against_reference"]

#: Precisions a backend row can run at (a backend lists the ones it supports). ``fp32`` is IEEE fp32 everywhere: the
#: GPU backends turn TF32 off for it; ``tf32`` is fp32 tensors with matmuls / convolutions on TF32 tensor cores (a
#: GPU of compute capability 8.0 or newer), asked for by name, never implied.
DTYPES: Tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "int8")


@dataclass
class Call:
    """One inference, ready to repeat: its input already sits where the backend computes.

    Attributes:
        fn: One inference (the timed call; returns whatever the backend returns).
        output: One inference returning float32 logits on the host (for the parity gate).
        cuda: Time it with CUDA events (GPU backends).
        cuda_graph: ``fn`` replays a CUDA graph.
        memory: ``() -> (MB, what was measured)`` for device memory; ``None``: the caller measures host memory.
    """

    fn: Callable[[], object]
    output: Callable[[], np.ndarray]
    cuda: bool = False
    cuda_graph: bool = False
    memory: Optional[Callable[[], Tuple[float, str]]] = None


class Session:
    """A model loaded by one backend.

    Attributes:
        backend: The backend's name.
        fixed_size: The backend takes only the model's own input height and width (an exported graph); a
            segmenter then runs sliding windows of that size.
    """

    backend: str = ""
    fixed_size: bool = True

    def run(self, x: np.ndarray) -> np.ndarray:
        """Float32 NCHW images on the host -> float32 logits on the host."""
        raise NotImplementedError

    def call(self, x: np.ndarray) -> Call:
        """A repeatable inference on ``x`` (made resident first); by default :meth:`run` on host memory."""
        xin = np.ascontiguousarray(x, dtype=np.float32)
        return Call(lambda: self.run(xin), lambda: np.asarray(self.run(xin), dtype=np.float32))

    def info(self) -> Dict[str, Any]:
        """The settings the session ended up with (threads, providers, precision ...)."""
        return {}


@dataclass(frozen=True)
class Backend:
    """One way to run a model.

    Attributes:
        name: The one name (``bench-latency --backends``, ``serve-demo --backend``, ``serve-models --backend``).
        summary: One line: what runs the model, and how.
        aliases: Other spellings the command lines accept (older names included).
        takes: ``module`` (the PyTorch model) or ``onnx`` (a verified ONNX file, or a runtime's own IR of one).
        device: Where it computes: ``cpu``, ``cuda``, or ``torch`` (the PyTorch device the caller asks for).
        dtypes: Precisions it can run (:data:`DTYPES`).
    """

    name: str
    summary: str
    aliases: Tuple[str, ...] = ()
    takes: str = "onnx"
    device: str = "cpu"
    dtypes: Tuple[str, ...] = ("fp32",)

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False
                           ) -> Optional[str]:
        """Why this backend cannot run ``dtype`` here (one line), or ``None`` when it can.

        Args:
            dtype: The precision asked for.
            device: The PyTorch device (``cpu`` or ``cuda``) for backends whose ``device`` is ``torch``.
            build_only: For a backend that can build without running (TensorRT without a GPU): whether it can
                build here.
        """
        if dtype not in self.dtypes:
            return f"{self.name} runs {', '.join(self.dtypes)}, not {dtype}"
        return None

    def load(self, model: Any, *, dtype: str = "fp32", threads: Optional[int] = None, batch: Optional[int] = None,
             device: str = "cpu", cache_dir: Any = None) -> Session:
        """Load ``model`` (a module or an ONNX path, as :attr:`takes` says).

        Args:
            model: The model.
            dtype: Precision to run at (an ONNX backend runs the file's own precision; ``dtype`` names it).
            threads: CPU threads (``None``: the runtime's default).
            batch: Fix the batch size (``None``: any batch).
            device: PyTorch device of ``torch`` backends.
            cache_dir: Where a backend keeps what it builds (optimized graphs, engines).
        """
        raise NotImplementedError

    def row_device(self, device: str = "cpu") -> str:
        """Where a row of this backend computes, given the PyTorch device of the run."""
        return device if self.device == "torch" else self.device


_REGISTRY: Dict[str, Backend] = {}
_ALIASES: Dict[str, str] = {}


def register_backend(backend: Backend) -> Backend:
    """Add ``backend`` to the registry (its name and aliases must be new)."""
    for name in (backend.name, *backend.aliases):
        if name in _REGISTRY or name in _ALIASES:
            raise ValueError(f"backend name {name!r} is taken (by {canonical_backend(name)})")
    _REGISTRY[backend.name] = backend
    _ALIASES.update({a: backend.name for a in backend.aliases})
    return backend


def backend_names() -> Tuple[str, ...]:
    """Every backend's one name, in registration order."""
    return tuple(_REGISTRY)


def backends() -> List[Backend]:
    """Every registered backend."""
    return list(_REGISTRY.values())


def canonical_backend(name: str) -> str:
    """The one name of ``name`` (itself or an alias); ``ValueError`` listing the valid names otherwise."""
    if name in _REGISTRY:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    raise ValueError(f"unknown backend {name!r}; valid: {', '.join(_REGISTRY)} (aliases: "
                     f"{', '.join(f'{a}={n}' for a, n in _ALIASES.items())})")


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (or one of its aliases)."""
    return _REGISTRY[canonical_backend(name)]


def cpu_runtimes() -> List[Backend]:
    """The backends that run an ONNX file on the CPU (the candidates of the measured CPU-runtime choice)."""
    return [b for b in _REGISTRY.values() if b.takes == "onnx" and b.device == "cpu"]


def describe(dtype: str = "fp32", device: str = "cpu") -> List[Dict[str, Any]]:
    """One row per backend: name, aliases, what it takes, where it runs, its precisions, and whether it runs
    ``dtype`` here (and if not, why)."""
    rows = []
    for b in _REGISTRY.values():
        reason = b.unavailable_reason(dtype, device)
        rows.append({**{k: v for k, v in dataclasses.asdict(b).items()}, "runs_here": reason is None,
                     "reason": reason or ""})
    return rows


def check_against_reference(session: Session, path: Any, contract: Any = None, *, threads: Optional[int] = None,
                            seed: int = 0) -> None:
    """Check that ``session`` (any backend's load of the ONNX file ``path``) answers a seeded random batch as ONNX
    Runtime's CPU provider does on the same file -- the runtime the export was verified with -- under the shared
    tolerance of the file's precision (:mod:`attnzoo.runtime.parity`). ``contract``: the file's already-read
    :class:`~attnzoo.runtime.contract.ModelContract`.

    Raises:
        ValueError: the outputs differ beyond the tolerance (naming the file, the backend, the error and the
            tolerance).
    """
    from pathlib import Path

    from ..contract import ModelContract
    from ..parity import compare, tolerance_key

    contract = contract or ModelContract.from_onnx(path)
    x = np.random.default_rng(seed).standard_normal((2, 3, *contract.input_size), dtype=np.float32)
    ref = get_backend("ort-cpu").load(path, threads=threads).run(x)
    check = compare(session.run(x), ref, tolerance_key(contract.dtype))
    if not check["passed"]:
        raise ValueError(f"{Path(path).name}: {session.backend} differs from ONNX Runtime by {check['error']:.3g} "
                         f"(tolerance {check['tolerance']:g}, {check['key']})")


# The built-in backends register themselves; a new one is imported here.
from . import eager, torch_compile, ort_cpu, openvino, ort_cuda, ort_trt, tensorrt  # noqa: E402,F401
