"""The backend registry: every way attnzoo runs a model, one module each, one name each.

Modelled on Polygraphy's runners. A :class:`Backend` says what it is (its one name, the aliases the command lines
also accept, what it takes: the PyTorch module or a verified ONNX file, where it computes, its precisions, which
:class:`LoadOptions` it reads) and the facts its callers act on (:attr:`Backend.builds_engine`,
:attr:`Backend.jit_compiles`, :attr:`Backend.int8_model`, :attr:`Backend.serving_batch`, :attr:`Backend.library`,
:attr:`Backend.is_reference`),
whether it runs on this machine and if not why (:meth:`Backend.unavailable_reason`), and loads a model into a
:class:`Session` with one call for every backend, ``backend.load(model, LoadOptions(...))``. A session has ``run``
(host float32 in, float32 logits out), ``call`` (a reusable timed call on inputs already where the backend
computes, for the benchmark), ``info`` (the settings it ended up with) and ``close`` (frees its model, session or
engine; sessions are context managers: ``with backend.load(path, options) as session:``).

``bench-latency``, the demo, ``serve-models`` and the CPU-runtime choice all go through :func:`get_backend` and
never branch on a backend's name; ``python -m attnzoo.runtime`` prints the registry. Every backend belongs to a
deployment target (:mod:`attnzoo.runtime.targets`: a folder of :mod:`attnzoo.targets` or an installed package's entry
point), which lists it; the registry adds the targets' backends at its first lookup. Adding a backend is one module
of its target's folder that subclasses :class:`Backend` (its :meth:`Backend.open`), named in the target's
``backends``, plus its test; :func:`register_backend` adds one for this process only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import numpy as np

from attnzoo.errors import quoted
from attnzoo.lazy import lazy_import

from ..contract import ModelContract
from ..device import DeviceMemory, release_cuda_cache
from ..parity import compare, tolerance_key
from ..targets import collect, targets

torch = lazy_import("torch")  # the registry (and --help) load without torch

__all__ = [
    "Backend",
    "Session",
    "TorchDeviceSession",
    "Call",
    "LoadOptions",
    "register_backend",
    "get_backend",
    "canonical_backend",
    "backend_names",
    "backends",
    "cpu_runtimes",
    "backends_reading",
    "DTYPES",
    "TORCH_DTYPES",
    "ONNX_REFERENCE",
    "OnnxReference",
    "RuntimeSession",
    "onnx_reference",
    "reference_backend",
    "describe",
    "check_against_reference",
]

#: Precisions a backend row can run at (a backend lists the ones it supports). ``fp32`` is IEEE fp32 everywhere: the
#: GPU backends turn TF32 off for it; ``tf32`` is fp32 tensors with matmuls / convolutions on TF32 tensor cores (a
#: GPU of compute capability 8.0 or newer), asked for by name, never implied.
DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "int8")
#: The torch dtype name of each precision a PyTorch module runs at (``tf32``: float32 tensors, TF32 matmuls /
#: convolutions).
TORCH_DTYPES: dict[str, str] = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: The backend every export was verified with (ONNX Runtime's CPU provider); the others are checked against it.
ONNX_REFERENCE = "ort-cpu"


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model: every setting any backend reads. A backend reads the ones it names in
    :attr:`Backend.reads` and refuses a load that sets any other (:meth:`Backend.load`); a caller holding settings
    for many backends gives each its own with :meth:`Backend.options`.

    Attributes:
        dtype: Precision to run at (every backend reads it; an ONNX backend runs the file's own precision and
            ``dtype`` names it).
        device: The PyTorch device of backends that take the module (``cpu``, ``cuda``).
        threads: CPU threads (``None``: the runtime's default).
        batch: Fix the batch size (``None``: any batch).
        batch_sizes: The batch sizes an engine is built for (its profile spans them; empty: ``batch``, else 1).
        cache_dir: Where a backend keeps what it builds (optimized graphs, engines).
        keep_f32: Names of the ops a reduced precision keeps at f32 (the variant's extra math).
    """

    dtype: str = "fp32"
    device: str = "cpu"
    threads: int | None = None
    batch: int | None = None
    batch_sizes: tuple[int, ...] = ()
    cache_dir: Path | None = None
    keep_f32: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; valid: {', '.join(DTYPES)}")
        object.__setattr__(self, "batch_sizes", tuple(int(b) for b in self.batch_sizes))
        if self.keep_f32 is not None:
            object.__setattr__(self, "keep_f32", tuple(self.keep_f32))
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))

    def set_fields(self) -> tuple[str, ...]:
        """The settings that differ from their defaults (``dtype`` aside, which every backend reads)."""
        return tuple(
            f.name for f in dataclasses.fields(self) if f.name != "dtype" and getattr(self, f.name) != f.default
        )


@dataclass
class Call:
    """One inference, ready to repeat: its input already sits where the backend computes.

    Attributes:
        fn: One inference (the timed call; returns whatever the backend returns).
        output: One inference returning float32 logits on the host (for the parity gate).
        cuda: Time it with CUDA events (GPU backends).
        cuda_graph: ``fn`` replays a CUDA graph.
        memory: ``() -> (MB, what was measured)`` for device memory; ``None``: the caller measures host memory.
        session: The session the call runs on (:meth:`close` closes it); ``None``: the caller keeps it.
    """

    fn: Callable[[], object]
    output: Callable[[], np.ndarray]
    cuda: bool = False
    cuda_graph: bool = False
    memory: Callable[[], tuple[float, str]] | None = None
    session: Session | None = None

    def close(self) -> None:
        """Close the session the call runs on (the call cannot run after it)."""
        if self.session is not None:
            self.session.close()


_S = TypeVar("_S", bound="Session")


class Session:
    """A model loaded by one backend; close it (or use it as a context manager) to free its memory.

    Attributes:
        backend: The backend's name.
        fixed_size: The backend takes only the model's own input height and width (an exported graph); a
            segmenter then runs sliding windows of that size.
    """

    backend: str = ""
    fixed_size: bool = True
    closed: bool = False

    def run(self, x: np.ndarray) -> np.ndarray:
        """Float32 NCHW images on the host -> float32 logits on the host."""
        raise NotImplementedError

    def call(self, x: np.ndarray) -> Call:
        """A repeatable inference on ``x`` (made resident first); by default :meth:`run` on host memory."""
        xin = np.ascontiguousarray(x, dtype=np.float32)
        return Call(lambda: self.run(xin), lambda: np.asarray(self.run(xin), dtype=np.float32), session=self)

    def info(self) -> dict[str, Any]:
        """The settings the session ended up with (threads, providers, precision ...)."""
        return {}

    def release(self) -> None:
        """Drop what the session holds (its model, runtime session, engine, bound buffers); called once by
        :meth:`close`. A backend whose session holds anything overrides it."""

    def close(self) -> None:
        """Free the session's memory; it cannot run after it. Closing twice is closing once."""
        if not self.closed:
            self.closed = True
            self.release()

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class TorchDeviceSession(Session):
    """A session whose model (:attr:`net`: the PyTorch module, or a package compiled from it) takes torch tensors on
    :attr:`device`: host images moved there at :attr:`dtype`, the logits back as float32 on the host; on a GPU its
    calls are timed with CUDA events, its memory measured by :attr:`memory`, and closing it empties PyTorch's
    cache. A subclass sets these attributes and :attr:`_info`, and implements :meth:`_forward`."""

    net: Any = None
    device: Any = None  #: the ``torch.device``
    dtype: Any = None  #: the ``torch.dtype`` inputs are moved at
    memory: DeviceMemory | None = None
    cuda_graph: bool = False  #: its calls replay a CUDA graph
    _info: dict[str, Any]

    def _forward(self, xin: Any) -> Any:
        """The model on ``xin``, a tensor on :attr:`device`."""
        raise NotImplementedError

    def _input(self, x: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device, self.dtype)

    def run(self, x: np.ndarray) -> np.ndarray:
        return self._forward(self._input(x)).float().cpu().numpy()

    def call(self, x: np.ndarray) -> Call:
        xin = self._input(x)
        cuda = self.device.type == "cuda"
        return Call(
            lambda: self._forward(xin),
            lambda: self._forward(xin).float().cpu().numpy(),
            cuda=cuda,
            cuda_graph=self.cuda_graph,
            memory=self.memory.torch_peak if cuda and self.memory is not None else None,
            session=self,
        )

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def release(self) -> None:
        """Drop the model (:attr:`net`); on a GPU, PyTorch's cache is emptied."""
        self.net = None
        if self.device.type == "cuda":
            release_cuda_cache()


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
        reads: The :class:`LoadOptions` it reads besides ``dtype``; a load that sets another is refused.
        library: The runtime library that runs it (``torch``, ``onnxruntime``, ``openvino``, ``tensorrt``).
        builds_engine: Loading builds an engine ahead of running it; the engine can be built without running it
            (:meth:`build_only`: no GPU) and is kept under ``cache_dir``.
        jit_compiles: Loading (or the first call) compiles the model: its time counts against
            ``bench-latency --compile-budget``.
        int8_model: What its int8 rows run: ``qdq`` (ModelOpt's Q/DQ ONNX graph of the fp32 export) or ``nncf``
            (NNCF's quantization of the runtime's own model); ``None``: no int8 path.
        serving_batch: The batch a served model is compiled for when the session still runs any batch (one image
            at a time); ``None``: served with a dynamic batch.
        suffixes: The model files it loads when it takes ``onnx``, by suffix: ``.onnx``, and ``.xml`` for a runtime
            that reads its own IR (what the demo and ``serve-models`` serve with it from a folder).
        is_reference: The PyTorch model run as it is: the reference every other backend's rows are compared with
            (their parity and speed-ups), which always runs. Exactly one backend is (:func:`reference_backend`).
    """

    name: str
    summary: str
    aliases: tuple[str, ...] = ()
    takes: str = "onnx"
    device: str = "cpu"
    dtypes: tuple[str, ...] = ("fp32",)
    reads: tuple[str, ...] = ()
    library: str = ""
    builds_engine: bool = False
    jit_compiles: bool = False
    int8_model: str | None = None
    serving_batch: int | None = None
    suffixes: tuple[str, ...] = (".onnx",)
    is_reference: bool = False

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
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

    def options(self, **settings: Any) -> LoadOptions:
        """The :class:`LoadOptions` of ``settings`` this backend reads (``dtype`` always), the others left at their
        defaults: for a caller whose settings are the run's, not one backend's (the benchmark, the server)."""
        names = {f.name for f in dataclasses.fields(LoadOptions)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise TypeError(f"unknown load option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        return LoadOptions(**{k: v for k, v in settings.items() if k == "dtype" or k in self.reads})

    def load(self, model: Any, options: LoadOptions | None = None) -> Session:
        """Load ``model`` (a module or an ONNX path, as :attr:`takes` says) as ``options`` say.

        Raises:
            ValueError: ``options`` sets a setting this backend does not read (named, with the ones it reads).
        """
        options = options if options is not None else LoadOptions()
        unread = [n for n in options.set_fields() if n not in self.reads]
        if unread:
            raise ValueError(
                f"{self.name} does not read the load option(s) {', '.join(unread)} (it reads: dtype"
                f"{''.join(', ' + r for r in self.reads)})"
            )
        return self.open(model, options)

    def open(self, model: Any, options: LoadOptions) -> Session:
        """Load ``model`` with ``options`` (already checked by :meth:`load`); what a backend implements."""
        raise NotImplementedError

    def build_only(self, model: Any, options: LoadOptions) -> dict[str, Any]:
        """Build the engine of ``model`` without running it (a backend that :attr:`builds_engine`); its facts."""
        raise NotImplementedError(f"{self.name} builds no engine")

    def row_device(self, device: str = "cpu") -> str:
        """Where a row of this backend computes, given the PyTorch device of the run."""
        return device if self.device == "torch" else self.device


_REGISTRY: dict[str, Backend] = {}
_ALIASES: dict[str, str] = {}
#: Whether the targets' backends are in the registry (added at the first lookup, :func:`_with_targets`).
_TARGETS_ADDED: list[bool] = [False]


_B = TypeVar("_B", bound=Backend)


def register_backend(backend: _B) -> _B:
    """Add ``backend`` to the registry for this process (its name and aliases must be new); a target's backends
    are added from the targets (:mod:`attnzoo.runtime.targets`) without it."""
    if _REGISTRY.get(backend.name) is backend:
        return backend
    for name in (backend.name, *backend.aliases):
        if name in _REGISTRY or name in _ALIASES:
            raise ValueError(f"backend name {name!r} is taken (by {canonical_backend(name)})")
    if backend.is_reference and any(b.is_reference for b in _REGISTRY.values() if b is not backend):
        raise ValueError(f"{backend.name} cannot be the reference backend: {reference_backend()} is")
    _REGISTRY[backend.name] = backend
    _ALIASES.update({a: backend.name for a in backend.aliases})
    return backend


def _with_targets() -> dict[str, Backend]:
    """Every backend by name, in listing order: each target's at its :attr:`~attnzoo.runtime.targets.Target.order`
    (added to the registry at the first lookup), then those registered for this process in their order."""
    if not _TARGETS_ADDED[0]:
        _TARGETS_ADDED[0] = True
        for backend in collect("backends"):
            register_backend(backend)
    place: dict[str, int] = {}
    for target in targets():
        for backend in cast(tuple[Backend, ...], target.backends):
            if _REGISTRY.get(backend.name) is backend:
                place[backend.name] = target.order
    return dict(sorted(_REGISTRY.items(), key=lambda item: place.get(item[0], 1_000)))


def backend_names() -> tuple[str, ...]:
    """Every backend's one name: the targets' in their listing order, then those registered."""
    return tuple(_with_targets())


def backends() -> list[Backend]:
    """Every backend."""
    return list(_with_targets().values())


def canonical_backend(name: str) -> str:
    """The one name of ``name`` (itself or an alias); ``ValueError`` listing the valid names otherwise."""
    table = _with_targets()
    if name in table:
        return name
    if name in _ALIASES:
        return _ALIASES[name]
    raise ValueError(
        f"unknown backend {quoted(name)}; valid: {', '.join(table)} (aliases: "
        f"{', '.join(f'{a}={b.name}' for b in table.values() for a in b.aliases)})"
    )


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (or one of its aliases)."""
    return _REGISTRY[canonical_backend(name)]


def reference_backend() -> str:
    """The name of the reference backend (:attr:`Backend.is_reference`: the PyTorch model run as it is)."""
    return next(b.name for b in backends() if b.is_reference)


class RuntimeSession(Protocol):
    """A :class:`Session` of the ONNX reference backend that also shows its runtime's own session (an
    ``onnxruntime.InferenceSession``), for a caller that feeds other inputs than the contract's ``image``, reads other
    outputs than its logits or reads the session's inputs (the export's verification, the int8 gates)."""

    backend: str
    #: The runtime's own session object (``None`` once closed).
    session: Any

    def run(self, x: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> None: ...


class OnnxReference(Protocol):
    """What the ONNX reference backend (:data:`ONNX_REFERENCE`, :func:`onnx_reference`) offers beyond a
    :class:`Backend`'s ``load``: the runtime's untuned session of a file, and its profiled sessions."""

    name: str

    def options(self, **settings: Any) -> LoadOptions: ...

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None: ...

    def load(self, model: Any, options: LoadOptions | None = None) -> RuntimeSession:
        """The tuned session (:meth:`Backend.load`)."""
        ...

    def session(
        self, model: Any, threads: int | None = None, *, spinning: bool = True, optimized_path: Path | None = None
    ) -> RuntimeSession:
        """The runtime's own settings, untuned, on a path, the model's bytes or an ``onnx.ModelProto``: what export
        verification, the int8 gates and the studies that score a file run (``optimized_path``: the optimized graph
        saved there; ``spinning``: threads spin after a run)."""
        ...

    def profiled(
        self, model: Any, options: LoadOptions, profile_prefix: str, *, optimize: bool = True
    ) -> RuntimeSession:
        """The tuned session (``optimize``) or the file as exported, with the runtime's profiler on."""
        ...


def onnx_reference() -> OnnxReference:
    """The backend every export is verified with (:data:`ONNX_REFERENCE`), for a caller below or beside the targets
    that needs its untuned session (:meth:`OnnxReference.session`) or its profiler: asked of the registry, never
    imported from its target.

    Raises:
        TypeError: the backend registered under that name has no untuned session.
    """
    backend = get_backend(ONNX_REFERENCE)
    if not callable(getattr(backend, "session", None)) or not callable(getattr(backend, "profiled", None)):
        raise TypeError(f"{backend.name} offers no untuned session: it cannot be the ONNX reference")
    return cast(OnnxReference, backend)


def cpu_runtimes() -> list[Backend]:
    """The backends that run an ONNX file on the CPU (the candidates of the measured CPU-runtime choice)."""
    return [b for b in backends() if b.takes == "onnx" and b.device == "cpu"]


def backends_reading(suffix: str, among: Iterable[str] | None = None) -> list[str]:
    """The names of the backends (of ``among``, else the registry) that load a model file ending in ``suffix``
    (:attr:`Backend.suffixes`)."""
    names = [b.name for b in backends()] if among is None else list(among)
    return [name for name in names if suffix in get_backend(name).suffixes]


def describe(dtype: str = "fp32", device: str = "cpu") -> list[dict[str, Any]]:
    """One row per backend: name, aliases, what it takes, where it runs, its precisions, and whether it runs
    ``dtype`` here (and if not, why)."""
    rows = []
    for b in backends():
        reason = b.unavailable_reason(dtype, device)
        rows.append(
            {**{k: v for k, v in dataclasses.asdict(b).items()}, "runs_here": reason is None, "reason": reason or ""}
        )
    return rows


def check_against_reference(
    session: Session, path: Any, contract: Any = None, *, threads: int | None = None, seed: int = 0
) -> None:
    """Check that ``session`` (any backend's load of the ONNX file ``path``) answers a seeded random batch as ONNX
    Runtime's CPU provider does on the same file -- the runtime the export was verified with -- under the shared
    tolerance of the file's precision (:mod:`attnzoo.runtime.parity`). ``contract``: the file's already-read
    :class:`~attnzoo.runtime.contract.ModelContract`.

    Raises:
        ValueError: the outputs differ beyond the tolerance (naming the file, the backend, the error and the
            tolerance).
    """
    contract = contract or ModelContract.from_onnx(path)
    x = np.random.default_rng(seed).standard_normal((2, 3, *contract.input_size), dtype=np.float32)
    reference = get_backend(ONNX_REFERENCE)
    with reference.load(path, reference.options(threads=threads)) as ort:
        ref = ort.run(x)
    check = compare(session.run(x), ref, tolerance_key(contract.dtype))
    if not check["passed"]:
        raise ValueError(
            f"{Path(path).name}: {session.backend} differs from ONNX Runtime by {check['error']:.3g} "
            f"(tolerance {check['tolerance']:g}, {check['key']})"
        )
