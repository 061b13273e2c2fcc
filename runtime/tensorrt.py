"""TensorRT build, load and run: one builder for ``export-model``, ``bench-latency`` and the demo.

Two libraries, one API:

- ``tensorrt_rtx`` (NVIDIA TensorRT for RTX, ``pip install tensorrt-rtx``) builds engines **ahead of time, with
  no GPU**, for a named compute capability (``SM75`` ... ``SM121``), or for ``CURRENT``, the GPU present. Its
  engines run only on the GPUs of its support matrix (:data:`RTX_RUNS_ON`: GeForce/RTX-class Turing to
  Blackwell); on any other GPU (an A100, an H100) running one is refused in one line naming the GPU;
- ``tensorrt`` (TensorRT >= 10) builds only for the GPU it runs on: the engine for data-centre GPUs.

With a GPU, ``tensorrt`` is preferred when installed (it supports data-centre GPUs), else ``tensorrt_rtx`` with
``CURRENT``. Without a GPU only ``tensorrt_rtx`` can build. ``$ATTNZOO_TENSORRT`` (``tensorrt`` or
``tensorrt_rtx``) forces the choice.

Networks are always strongly typed: precision comes from the ONNX graph (an fp16 export computes LayerNorm,
softmax and the projection in fp32). There are no FP16/INT8 builder flags (TensorRT-RTX and TensorRT 11 removed
them). TF32, which TensorRT turns on by default, is one explicit choice per build (``tf32``): off unless asked, so
an fp32 engine computes IEEE fp32. One optimisation profile spans the batch sizes (min/opt/max). Running an engine
needs an NVIDIA GPU; device buffers are torch CUDA tensors (no pycuda / cuda-python).

Running: an :class:`Engine` enqueues on a CUDA stream of its own (never the legacy default stream, which makes
TensorRT add synchronisations). TensorRT-RTX engines are built with ``REQUIRE_USER_ALLOCATION`` (what stream
capture into a CUDA graph needs), their contexts specialise kernels eagerly (``EAGER``: no fallback kernel while a
shape-specialised one compiles, so a timed or captured run uses the final kernels) and keep the compiled kernels
in a runtime cache on disk; whether a context can be captured is asked (``is_stream_capturable``) before a graph
is made. ``set_input_shape``'s answer is checked. TensorRT proper reuses a timing cache across builds.

Ctrl-C and SIGTERM: TensorRT calls back into Python (its logger, the build's progress monitor) and catches an
exception raised there. The build therefore runs in a worker thread (:func:`attnzoo.signals.run_in_worker`; TensorRT
releases the GIL while it builds): the main thread acts on the signal at once, and the build is cancelled at its
next progress step (the monitor answers ``False``; it never raises). Short calls with callbacks (parsing,
deserializing) run inside :func:`attnzoo.signals.signals_deferred`: a signal is raised as soon as TensorRT returns.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from attnzoo.signals import run_in_worker, signals_deferred
from attnzoo.fileio import atomic_write_bytes, atomic_write_text, sha256_file
from attnzoo.lazy import lazy_import

from .contract import INPUT_NAME, OUTPUT_NAME

torch = lazy_import("torch")

__all__ = ["LIBRARIES", "LIBRARY_ENV", "install_hint", "COMPUTE_CAPABILITIES", "DEFAULT_COMPUTE_CAPABILITY",
           "RTX_RUNS_ON", "gpu_description", "tensorrt_proper_hint", "run_problem", "set_input_shape",
           "runtime_cache_path",
           "TensorRTError", "TensorRTUnavailable", "TensorRTParseError", "Library", "gpu_available",
           "resolve_compute_capability",
           "load_library", "unavailable_reason", "ParsedNetwork", "parse_onnx", "network_layers",
           "check_network_precision", "profile_batches", "Built", "build", "build_cached", "engine_cache_name",
           "Engine"]

LIBRARIES: Tuple[str, ...] = ("tensorrt", "tensorrt_rtx")
LIBRARY_ENV = "ATTNZOO_TENSORRT"
#: Compute capabilities TensorRT-RTX builds for ahead of time (its ``ComputeCapability`` enum, 1.7); ``CURRENT`` is
#: the GPU present.
COMPUTE_CAPABILITIES: Tuple[str, ...] = ("SM75", "SM80", "SM86", "SM89", "SM120", "SM121", "CURRENT")
#: Compute capabilities whose GPUs run TensorRT-RTX engines: its support matrix (Turing RTX 20xx, Ampere RTX 30xx,
#: Ada RTX 40xx / L4 / L40S, Blackwell RTX 50xx, GB10). 8.0 (A100) is in the enum but not in the matrix; 9.0 (H100,
#: H200) is in neither: those data-centre GPUs need TensorRT proper.
RTX_RUNS_ON: Dict[str, Tuple[int, int]] = {"SM75": (7, 5), "SM86": (8, 6), "SM89": (8, 9), "SM120": (12, 0),
                                           "SM121": (12, 1)}
#: Target without a GPU: Ada (SM 8.9: RTX 40xx, L4, L40S), the newest widely deployed data-centre inference part
#: TensorRT-RTX names.
DEFAULT_COMPUTE_CAPABILITY = "SM89"
#: ONNX op type -> TensorRT layer type the parser lowers it to (the ops whose precision is checked).
_LAYER_OF_OP = {"Mul": "ELEMENTWISE", "Add": "ELEMENTWISE", "Div": "ELEMENTWISE", "Sub": "ELEMENTWISE",
                "ReduceSum": "REDUCE", "Softmax": "SOFTMAX", "LayerNormalization": "NORMALIZATION"}


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
    """A CUDA GPU is visible to PyTorch."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def gpu_description() -> Tuple[str, Tuple[int, int]]:
    """The visible GPU's name and compute capability (needs a GPU)."""
    return torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))


def tensorrt_proper_hint() -> str:
    """The install command of TensorRT proper for the CUDA major of the installed torch (``tensorrt-cu13`` with a
    CUDA 13 torch), the library for data-centre GPUs."""
    try:
        import torch

        major = (torch.version.cuda or "").split(".")[0]
    except ImportError:
        major = ""
    if not major:
        return "pip install 'tensorrt>=10' (with a CUDA build of torch)"
    return f"pip install 'tensorrt-cu{major}>=10'"


def install_hint() -> str:
    """How to install a TensorRT library here: ``tensorrt-rtx`` (builds without a GPU), or TensorRT proper."""
    return (f"pip install tensorrt-rtx (builds engines without a GPU; it comes with attnzoo[dev] / attnzoo[tensorrt]; "
            f"runs on GeForce/RTX-class GPUs), or {tensorrt_proper_hint()} on a machine with an NVIDIA GPU "
            "(data-centre GPUs such as the H100)")


def run_problem(lib: "Library") -> Optional[str]:
    """Why engines of ``lib`` cannot run on the visible GPU (one line), or ``None``: TensorRT-RTX runs only on the
    compute capabilities of :data:`RTX_RUNS_ON`."""
    if lib.name != "tensorrt_rtx" or not gpu_available():
        return None
    name, cc = gpu_description()
    if cc in RTX_RUNS_ON.values():
        return None
    runs = ", ".join(f"{a}.{b}" for a, b in RTX_RUNS_ON.values())
    return (f"{lib.describe()} does not run on {name} (compute capability {cc[0]}.{cc[1]}): it runs on {runs} "
            f"(GeForce/RTX-class GPUs); for this GPU install TensorRT proper: {tensorrt_proper_hint()}")


def _import(name: str) -> Optional[Library]:
    try:
        mod = importlib.import_module(name)
    except Exception:  # ImportError, or a wheel whose native libraries fail to load
        return None
    return Library(name, mod, str(getattr(mod, "__version__", "?")),
                   hasattr(mod, "ComputeCapability") and hasattr(mod.IBuilderConfig, "set_compute_capability"))


def load_library(name: Optional[str] = None, *, gpu: Optional[bool] = None) -> Library:
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
        raise TensorRTUnavailable(f"{found[0].describe()} builds engines only on a machine with an NVIDIA GPU, and "
                                  f"none is visible; to build ahead of time here: pip install tensorrt-rtx")
    raise TensorRTUnavailable(f"no TensorRT library is installed ({' or '.join(order)}); install one with: "
                              f"{install_hint()}")


def unavailable_reason(*, run: bool = False) -> Optional[str]:
    """Why engines cannot be built (``run``: built and run) here, or ``None`` when they can."""
    try:
        lib = load_library()
    except (TensorRTUnavailable, ValueError) as exc:
        return str(exc)
    if run and not gpu_available():
        return (f"running a TensorRT engine needs an NVIDIA GPU and none is visible ({lib.describe()} can only "
                f"build engines here)")
    return run_problem(lib) if run else None


def profile_batches(batch_sizes: Sequence[int]) -> Tuple[int, int, int]:
    """(min, opt, max) batch of the optimisation profile: opt is the median requested size."""
    sizes = sorted(set(int(b) for b in batch_sizes))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive integers, got {list(batch_sizes)}")
    return sizes[0], sizes[len(sizes) // 2], sizes[-1]


# ------------------------------------------------------------------------------------------------ parsing
@dataclass
class ParsedNetwork:
    """A strongly typed ``INetworkDefinition`` parsed from ONNX (builder and parser kept alive with it)."""

    library: Library
    builder: Any = field(repr=False)
    network: Any = field(repr=False)
    parser: Any = field(repr=False)
    logger: Any = field(repr=False)
    source: str = ""


def _logger(trt: Any) -> Any:
    """A logger that keeps TensorRT's errors (quoted in our exceptions) instead of printing them."""

    class _Keep(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: List[str] = []

        def log(self, severity, msg) -> None:  # noqa: D401 - TensorRT callback: must never raise
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(str(msg).strip().replace("\n", " "))

    try:
        return _Keep()
    except Exception:  # bindings without a subclassable ILogger: TensorRT prints its errors itself
        return trt.Logger(trt.Logger.ERROR)


def _progress_monitor(trt: Any, cancelled: Callable[[], bool]) -> Optional[Any]:
    """An ``IProgressMonitor`` that cancels the build once ``cancelled()`` is true (``None`` where the bindings
    have none). A C callback: it never raises."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class _Cancel(base):
        def __init__(self) -> None:
            base.__init__(self)

        def phase_start(self, phase_name, parent_phase, num_steps) -> None:
            pass

        def phase_finish(self, phase_name) -> None:
            pass

        def step_complete(self, phase_name, step) -> bool:
            return not cancelled()

    try:
        return _Cancel()
    except Exception:  # bindings without a subclassable monitor: the signal is acted on when the build returns
        return None


def _last_errors(logger: Any, n: int = 2) -> str:
    errors = getattr(logger, "errors", [])
    return f": {' | '.join(errors[-n:])}" if errors else " (see TensorRT's log above)"


def parse_onnx(onnx_path: Union[str, Path], library: Optional[Library] = None) -> ParsedNetwork:
    """Parse an ONNX file into a strongly typed network.

    Raises:
        TensorRTParseError: the parser rejected the file (the message holds its errors).
        FileNotFoundError: no such file.
    """
    lib = library or load_library()
    trt = lib.module
    path = Path(onnx_path)
    if not path.is_file():
        raise FileNotFoundError(f"ONNX file not found: {path}")
    logger = _logger(trt)
    builder = trt.Builder(logger)
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    network = builder.create_network(0 if flag is None else 1 << int(flag))
    parser = trt.OnnxParser(network, logger)
    with signals_deferred():  # the parser logs through ``logger``: a signal is raised once it returns
        ok = parser.parse_from_file(str(path))
    if not ok or network.num_layers == 0:
        errors = [str(parser.get_error(i)).strip().replace("\n", " ") for i in range(parser.num_errors)]
        raise TensorRTParseError(f"{lib.describe()} cannot parse {path.name}: "
                                 f"{'; '.join(errors) if errors else 'the network is empty'}")
    return ParsedNetwork(lib, builder, network, parser, logger, str(path))


def network_layers(network: Any) -> List[Dict[str, Any]]:
    """Every layer as ``{"name", "type", "outputs": [dtype names]}`` (e.g. ``ELEMENTWISE``, ``FLOAT``)."""
    out = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        out.append({"name": layer.name, "type": layer.type.name,
                    "outputs": [layer.get_output(j).dtype.name for j in range(layer.num_outputs)]})
    return out


def check_network_precision(network: Any, scopes: Mapping[str, Sequence[str]],
                            op_types: Mapping[str, str]) -> Dict[str, Any]:
    """Every listed ONNX op is a layer of the parsed network, of the right kind, computing in fp32.

    Args:
        network: The parsed ``INetworkDefinition`` (read before building: layer names are the ONNX node names).
        scopes: ``{scope: [ONNX node names]}``, e.g. each block's extra-math nodes from
            :func:`attnzoo.export.check_extra_math`. Ops of ``op_types`` outside the known kinds (a variant's own
            scope: MatMul, ReduceL2 ...) must compute in fp32 where a layer keeps their name and outputs floats;
            casts are ignored.
        op_types: ONNX node name -> op type (Mul, ReduceSum, Add, Div, Sub, Softmax, LayerNormalization).

    Returns:
        ``{"ok", "failures", "blocks": {scope: {"layers": n, "fp32": n}}, "layers": total}``.
    """
    layers = {layer["name"]: layer for layer in network_layers(network)}
    failures: List[str] = []
    blocks: Dict[str, Dict[str, int]] = {}
    for scope, names in scopes.items():
        counts: Counter = Counter()
        for name in names:
            op = op_types.get(name)
            layer = layers.get(name)
            if op not in _LAYER_OF_OP:  # another op of a variant's own extra scope: fp32 where it computes floats
                if op in ("Cast", "Constant") or layer is None or not {"FLOAT", "HALF", "BF16"} & set(layer["outputs"]):
                    continue  # casts at the scope's edges, shape arithmetic, ops the parser folded or renamed
                counts["layers"] += 1
                if layer["outputs"] != ["FLOAT"]:
                    failures.append(f"{scope}: {name} computes in {'/'.join(layer['outputs'])}, not FLOAT (fp32)")
                else:
                    counts["fp32"] += 1
                continue
            if layer is None:
                failures.append(f"{scope}: {name} ({op}) is not a layer of the TensorRT network")
                continue
            counts["layers"] += 1
            if layer["type"] != _LAYER_OF_OP[op]:
                failures.append(f"{scope}: {name} became a {layer['type']} layer, not {_LAYER_OF_OP[op]}")
            if layer["outputs"] != ["FLOAT"]:
                failures.append(f"{scope}: {name} computes in {'/'.join(layer['outputs'])}, not FLOAT (fp32)")
            else:
                counts["fp32"] += 1
        if not counts["layers"]:
            failures.append(f"{scope}: none of its ops is a layer of the TensorRT network")
        blocks[scope] = {"layers": counts["layers"], "fp32": counts["fp32"]}
    return {"ok": not failures, "failures": failures, "blocks": blocks, "layers": len(layers)}


# ------------------------------------------------------------------------------------------------ building
#: What cancelled builds used (network, config, logger, progress monitor): never freed, because TensorRT's own
#: threads may still call the logger or the monitor after the build returned.
_CANCELLED: List[Tuple[Any, ...]] = []

@dataclass
class Built:
    """A serialized engine and how it was made."""

    blob: bytes = field(repr=False)
    library: Library
    compute_capability: str
    build_time_s: float
    profile: Dict[str, int]
    input_shape: Tuple[int, ...]
    workspace_gb: float
    timing_cache: Optional[str] = None
    tf32: bool = False
    require_user_allocation: bool = False

    def facts(self) -> Dict[str, Any]:
        """JSON-ready build facts for a report."""
        return {"library": self.library.name, "library_version": self.library.version,
                "compute_capability": self.compute_capability, "build_time_s": round(self.build_time_s, 3),
                "engine_size": len(self.blob), "profile": self.profile, "workspace_gb": self.workspace_gb,
                "tf32": self.tf32, "require_user_allocation": self.require_user_allocation,
                "timing_cache": self.timing_cache or "none (TensorRT-RTX: no-op; kernels specialise at run time)"}


def resolve_compute_capability(compute_capability: Optional[str], gpu: bool) -> str:
    """The build target's name: ``compute_capability`` upper-cased, or by default ``CURRENT`` (the GPU present)
    with a GPU and :data:`DEFAULT_COMPUTE_CAPABILITY` without.

    Raises:
        ValueError: an unknown name, or ``CURRENT`` without a GPU (one line).
    """
    cc = (compute_capability or ("CURRENT" if gpu else DEFAULT_COMPUTE_CAPABILITY)).upper()
    if cc not in COMPUTE_CAPABILITIES:
        raise ValueError(f"unknown compute capability {compute_capability!r}; valid: {', '.join(COMPUTE_CAPABILITIES)}")
    if cc == "CURRENT" and not gpu:
        raise ValueError(f"compute capability CURRENT needs a GPU and none is visible; "
                         f"name one of {', '.join(COMPUTE_CAPABILITIES[:-1])}")
    return cc


def _resolve_cc(lib: Library, compute_capability: Optional[str], gpu: bool) -> str:
    cc = resolve_compute_capability(compute_capability, gpu)
    if not lib.ahead_of_time and cc != "CURRENT":
        raise ValueError(f"{lib.describe()} builds only for the GPU present (CURRENT), not {cc}; "
                         "ahead-of-time builds need tensorrt-rtx")
    problem = run_problem(lib) if cc == "CURRENT" else None
    if problem:  # an engine for this GPU would be one TensorRT-RTX cannot run
        raise ValueError(problem)
    return cc


def build(onnx_path: Union[str, Path], *, batch_sizes: Sequence[int] = (1, 8),
          input_hw: Optional[Sequence[int]] = None, compute_capability: Optional[str] = None,
          workspace_gb: float = 2.0, timing_cache: Optional[Union[str, Path]] = None,
          parsed: Optional[ParsedNetwork] = None, library: Optional[Library] = None, tf32: bool = False) -> Built:
    """Build a serialized engine from an ONNX file (nothing is written except the timing cache).

    Args:
        onnx_path: The ONNX file (input ``image``, batch dimension symbolic).
        batch_sizes: The profile spans min..max of these; opt is their median.
        input_hw: (H, W) of the input (default: from the network's input shape).
        compute_capability: One of ``COMPUTE_CAPABILITIES`` (TensorRT-RTX); default ``CURRENT`` with a GPU,
            else ``DEFAULT_COMPUTE_CAPABILITY``.
        workspace_gb: Workspace memory-pool limit.
        timing_cache: TensorRT's timing-cache file (read, then updated); ignored by TensorRT-RTX (a no-op there).
        parsed: An already parsed network of ``onnx_path`` (saves a parse).
        library: The library (default :func:`load_library`).
        tf32: Let fp32 matmuls / convolutions use TF32 (TensorRT's default); off: IEEE fp32.

    Raises:
        TensorRTUnavailable, TensorRTParseError, TensorRTError, ValueError.
    """
    gpu = gpu_available()
    net = parsed or parse_onnx(onnx_path, library)
    lib = net.library
    trt = lib.module
    cc = _resolve_cc(lib, compute_capability, gpu)
    config = net.builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
    if hasattr(trt.BuilderFlag, "TF32"):  # on by default in TensorRT: set either way, so the engine is what was asked
        (config.set_flag if tf32 else config.clear_flag)(trt.BuilderFlag.TF32)
    if lib.ahead_of_time:
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, cc), 0)
    user_allocation = hasattr(trt.BuilderFlag, "REQUIRE_USER_ALLOCATION")
    if user_allocation:  # TensorRT-RTX: what capturing an enqueue into a CUDA graph needs (the build fails instead
        config.set_flag(trt.BuilderFlag.REQUIRE_USER_ALLOCATION)  # if the network allocates at run time)
    cache_path = None
    if timing_cache is not None and not lib.ahead_of_time:
        cache_path = Path(timing_cache)
        cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
        config.set_timing_cache(cache, False)
    inp = net.network.get_input(0)
    hw = tuple(int(v) for v in (input_hw or tuple(inp.shape)[2:]))
    if any(v < 1 for v in hw):
        raise ValueError(f"the input's spatial size is dynamic {tuple(inp.shape)}; pass input_hw")
    lo, opt, hi = profile_batches(batch_sizes)
    profile = net.builder.create_optimization_profile()
    profile.set_shape(inp.name, (lo, 3, *hw), (opt, 3, *hw), (hi, 3, *hw))
    config.add_optimization_profile(profile)
    cancelled = threading.Event()
    monitor = _progress_monitor(trt, cancelled.is_set)
    if monitor is not None and hasattr(config, "progress_monitor"):
        config.progress_monitor = monitor

    def work() -> Any:
        keep = (net, config, monitor)  # alive while the build may still call them, even if abandoned  # noqa: F841
        return net.builder.build_serialized_network(net.network, config)

    start = time.perf_counter()
    try:
        serialized = run_in_worker(work, cancelled.set)  # Ctrl-C: raised at once here, the build cancelled
    finally:
        if cancelled.is_set():  # TensorRT's own threads may call back after a cancelled build returned
            _CANCELLED.append((net, config, monitor))
    build_s = time.perf_counter() - start
    if serialized is None:
        raise TensorRTError(f"{lib.describe()} failed to build an engine from {Path(onnx_path).name} for {cc}"
                            f"{_last_errors(net.logger)}")
    if cache_path is not None:
        atomic_write_bytes(cache_path, bytes(config.get_timing_cache().serialize()))
    return Built(bytes(serialized), lib, cc, build_s, {"min": lo, "opt": opt, "max": hi}, (hi, 3, *hw),
                 workspace_gb, str(cache_path) if cache_path else None, tf32, user_allocation)


def build_cached(onnx_path: Union[str, Path], cache_dir: Union[str, Path], *, batch_sizes: Sequence[int] = (1, 8),
                 input_hw: Optional[Sequence[int]] = None, compute_capability: Optional[str] = None,
                 workspace_gb: float = 2.0, library: Optional[Library] = None, tf32: bool = False) -> Dict[str, Any]:
    """Build an engine once and keep it in ``cache_dir``; later calls with the same key reuse it.

    For engines that are built but cannot run here (no GPU): building one again would only repeat seconds of
    work; for engines that run, it spares every batch row and every later (or resumed) run the build. The key is
    everything the engine depends on: the ONNX file's content (sha256: the variant, arch, dtype and weights), the
    input size, the profile, the target (``CURRENT`` with the GPU's compute capability), TF32, the library and its
    version. The engine and its facts (``<engine>.json``, written last: a key with facts is complete) are written
    atomically. TensorRT proper shares one timing cache per library and target in ``cache_dir`` across builds
    (TensorRT-RTX has none: it keeps its run-time kernels in :func:`runtime_cache_path`).

    Returns:
        :meth:`Built.facts` plus ``engine`` (its file), ``onnx_sha256`` and ``cached`` (``True``: reused, not
        built by this call).

    Raises:
        As :func:`build`.
    """
    lib = library or load_library()
    path = Path(onnx_path)
    sha = sha256_file(path)
    cc = _resolve_cc(lib, compute_capability, gpu_available())
    target = _target(cc)
    engine = Path(cache_dir) / engine_cache_name(path.stem, sha, batch_sizes=batch_sizes, input_hw=input_hw,
                                                 target=target, tf32=tf32, library=lib, workspace_gb=workspace_gb)
    facts_path = Path(str(engine) + ".json")
    try:
        facts = json.loads(facts_path.read_text())
        if facts.get("onnx_sha256") == sha and engine.stat().st_size == facts.get("engine_size"):
            return {**facts, "cached": True}
    except (OSError, ValueError):
        pass  # not built yet (or an unreadable entry: built again and replaced)
    timing = None if lib.ahead_of_time else Path(cache_dir) / f"timing_{lib.name}-{lib.version}_{target}.cache"
    built = build(path, batch_sizes=batch_sizes, input_hw=input_hw, compute_capability=cc,
                  workspace_gb=workspace_gb, library=lib, tf32=tf32, timing_cache=timing)
    facts = {**built.facts(), "engine": str(engine), "onnx": str(path), "onnx_sha256": sha}
    engine.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(engine, built.blob)
    atomic_write_text(facts_path, json.dumps(facts, indent=1) + "\n")
    return {**facts, "cached": False}


def engine_cache_name(stem: str, sha256: str, *, batch_sizes: Sequence[int], input_hw: Optional[Sequence[int]],
                      target: str, tf32: bool, library: Library, workspace_gb: float) -> str:
    """The engine cache's key, as a file name: everything an engine depends on -- the ONNX file (its stem and
    the first 16 hex of its SHA-256), the input size (``onnx``: the file's own), the profile (min-opt-max batch),
    the target (``CURRENT-sm<cc>`` or an ahead-of-time compute capability), TF32, the library and its version, and
    the workspace limit. :func:`build_cached` is the one cache every caller (benchmark, server) goes through."""
    lo, opt, hi = profile_batches(batch_sizes)
    hw = "x".join(str(int(v)) for v in input_hw) if input_hw else "onnx"
    return (f"{stem}_{hw}_b{lo}-{opt}-{hi}_{target}{'_tf32' if tf32 else ''}_{library.name}-{library.version}_"
            f"ws{workspace_gb:g}_{sha256[:16]}.engine")


def _target(cc: str) -> str:
    """``cc``, with ``CURRENT`` made concrete (``CURRENT-sm90``): a cache shared by two GPUs keeps them apart."""
    if cc != "CURRENT":
        return cc
    major, minor = gpu_description()[1]
    return f"CURRENT-sm{major}{minor}"


def runtime_cache_path(cache_dir: Union[str, Path], library: Library) -> Path:
    """Where TensorRT-RTX keeps the kernels it compiles at run time for the visible GPU (one file per library
    version and GPU; the library checks the GPU and versions itself and ignores a cache that does not fit)."""
    return Path(cache_dir) / f"runtime_{library.name}-{library.version}_{_target('CURRENT')}.cache"


def set_input_shape(context: Any, engine: Any, name: str, shape: Sequence[int]) -> None:
    """``context.set_input_shape``, its answer checked: ``TensorRTError`` naming the shape and the engine's
    profile (min/opt/max) when TensorRT refuses it (it returns ``False``, it does not raise)."""
    if not context.set_input_shape(name, tuple(shape)):
        profile = " / ".join(str(tuple(d)) for d in engine.get_tensor_profile_shape(name, 0))
        raise TensorRTError(f"the engine does not take {name} of shape {tuple(shape)}: its profile (min / opt / max) "
                            f"is {profile}")


# ------------------------------------------------------------------------------------------------ running
class Engine:
    """A deserialized engine with one execution context, run on torch CUDA buffers on a CUDA stream of its own
    (needs a GPU).

    Args:
        data: Serialized engine (bytes) or an engine file.
        library: The library that built it (default :func:`load_library`).
        runtime_cache: TensorRT-RTX: the file of compiled run-time kernels (:func:`runtime_cache_path`), read if
            there; :meth:`save_runtime_cache` writes it back.

    Raises:
        TensorRTUnavailable: no GPU, or one this library's engines do not run on (:func:`run_problem`).
        TensorRTError: the engine cannot be deserialized.
    """

    def __init__(self, data: Union[bytes, str, Path], library: Optional[Library] = None,
                 runtime_cache: Optional[Union[str, Path]] = None) -> None:
        if not gpu_available():
            raise TensorRTUnavailable("running a TensorRT engine needs an NVIDIA GPU and none is visible")

        self.library = library or load_library(gpu=True)
        problem = run_problem(self.library)
        if problem:
            raise TensorRTUnavailable(problem)
        trt = self.library.module
        blob = data if isinstance(data, (bytes, bytearray)) else Path(data).read_bytes()
        self._logger = _logger(trt)
        self._runtime = trt.Runtime(self._logger)
        with signals_deferred():  # TensorRT logs through ``_logger``: a signal is raised once it returns
            self.engine = self._runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise TensorRTError(f"{self.library.describe()} could not deserialize the engine (built by another "
                                f"TensorRT version, or for another GPU?){_last_errors(self._logger)}")
        self.stream = torch.cuda.Stream()  # not the legacy default stream: TensorRT synchronises around that one
        self.runtime_cache_file = Path(runtime_cache) if runtime_cache is not None else None
        self.settings: Dict[str, Any] = {"stream": "own", "kernel_specialization": "n/a", "runtime_cache": None}
        with signals_deferred():
            self.context = self.engine.create_execution_context(*self._runtime_config())

    def _runtime_config(self) -> Tuple[Any, ...]:
        """TensorRT-RTX's runtime config: eager kernel specialisation (the final kernels from the first call on, not
        a fallback while they compile) and the runtime cache; ``()`` for a library without one."""
        trt = self.library.module
        strategy = getattr(trt, "DynamicShapesKernelSpecializationStrategy", None)
        if strategy is None or not hasattr(self.engine, "create_runtime_config"):
            return ()
        config = self.engine.create_runtime_config()
        config.dynamic_shapes_kernel_specialization_strategy = strategy.EAGER
        self.settings["kernel_specialization"] = "EAGER"
        if self.runtime_cache_file is not None:
            self._cache = config.create_runtime_cache()
            if self.runtime_cache_file.is_file():
                self._cache.deserialize(self.runtime_cache_file.read_bytes())
            config.set_runtime_cache(self._cache)
            self.settings["runtime_cache"] = str(self.runtime_cache_file)
        self._config = config  # alive as long as the context
        return (config,)

    def save_runtime_cache(self) -> None:
        """Write the kernels compiled so far to the runtime cache file (atomically; no-op without one)."""
        cache = getattr(self, "_cache", None)
        if cache is not None and self.runtime_cache_file is not None:
            self.runtime_cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.runtime_cache_file, bytes(cache.serialize()))

    def _torch_dtype(self, name: str):
        return torch.from_numpy(np.zeros(0, self.library.module.nptype(self.engine.get_tensor_dtype(name)))).dtype

    def bind(self, x) -> Any:
        """Bind a CUDA input tensor; return the (NaN-filled) CUDA output tensor the engine writes to.

        Raises:
            TensorRTError: the shape is outside the engine's profile.
        """
        xin = x.to("cuda", self._torch_dtype(INPUT_NAME)).contiguous()
        set_input_shape(self.context, self.engine, INPUT_NAME, xin.shape)
        out = torch.full(tuple(self.context.get_tensor_shape(OUTPUT_NAME)), float("nan"), device="cuda",
                         dtype=self._torch_dtype(OUTPUT_NAME))
        self.context.set_tensor_address(INPUT_NAME, xin.data_ptr())
        self.context.set_tensor_address(OUTPUT_NAME, out.data_ptr())
        self.stream.wait_stream(torch.cuda.current_stream())  # the copies above were made on the current stream
        self._bound = (xin, out)  # keep the buffers alive while bound
        return out

    def close(self) -> None:
        """Free the execution context, the engine and its bound buffers (in that order: a context needs its
        engine); the engine cannot run after it. Closing twice is closing once."""
        self._bound = None
        for name in ("context", "_config", "_cache", "engine", "_runtime"):
            if hasattr(self, name):
                setattr(self, name, None)

    def capturable(self) -> bool:
        """Whether an enqueue on :attr:`stream` may be captured into a CUDA graph (TensorRT-RTX answers;
        TensorRT proper has no such query: ``True``, and a failed capture falls back to plain enqueues)."""
        ask = getattr(self.context, "is_stream_capturable", None)
        return True if ask is None else bool(ask(self.stream.cuda_stream))

    def enqueue(self, stream=None) -> None:
        """Enqueue one execution on ``stream`` (default: the engine's own)."""
        if not self.context.execute_async_v3((stream or self.stream).cuda_stream):
            raise TensorRTError(f"TensorRT execution failed{_last_errors(self._logger)}")

    def run(self, x: np.ndarray) -> np.ndarray:
        """One float32 NCHW batch -> float32 logits on the host."""
        out = self.bind(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        self.enqueue()
        self.stream.synchronize()
        return out.float().cpu().numpy()

    def latency_ms(self, x: np.ndarray, iters: int = 50, warmup_s: float = 0.2) -> Dict[str, float]:
        """Median and min latency of the enqueue on resident inputs, timed with CUDA events on the engine's stream
        after at least ``warmup_s`` seconds (and 10 calls) of warm-up."""
        self.bind(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        n, end = 0, time.perf_counter() + warmup_s
        while n < 10 or time.perf_counter() < end:
            self.enqueue()
            self.stream.synchronize()
            n += 1
        times = []
        for _ in range(iters):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            self.enqueue()
            stop.record(self.stream)
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return {"batch": int(x.shape[0]), "iterations": iters, "warmup_calls": n,
                "median_ms": float(np.median(times)), "min_ms": float(np.min(times))}
