"""TensorRT builds: an ONNX file parsed into a strongly typed network, its layers checked, the builder configured
(one optimisation profile, the target, TF32, the workspace) and the engine built, once per key in the engine cache.

Networks are always strongly typed: precision comes from the ONNX graph (an fp16 export computes LayerNorm,
softmax and the projection in fp32). There are no FP16/INT8 builder flags (TensorRT-RTX and TensorRT 11 removed
them). TF32, which TensorRT turns on by default, is one explicit choice per build (``tf32``): off unless asked, so
an fp32 engine computes IEEE fp32. One optimisation profile spans the batch sizes (min/opt/max). TensorRT-RTX
engines are built with ``REQUIRE_USER_ALLOCATION`` (what stream capture into a CUDA graph needs). TensorRT proper
reuses a timing cache across builds.

Ctrl-C and SIGTERM: TensorRT calls back into Python (its logger, the build's progress monitor) and catches an
exception raised there. The build therefore runs in a worker thread (:func:`attnzoo.signals.run_in_worker`; TensorRT
releases the GIL while it builds): the main thread acts on the signal at once, and the build is cancelled at its
next progress step (the monitor answers ``False``; it never raises). Parsing, which logs through a callback, runs
inside :func:`attnzoo.signals.signals_deferred`: a signal is raised as soon as TensorRT returns.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnzoo.fileio import atomic_write_bytes, derived_facts, private_dir, record_derived, sha256_file
from attnzoo.signals import run_in_worker, signals_deferred

from .library import (
    Library,
    TensorRTError,
    TensorRTParseError,
    gpu_available,
    last_errors,
    load_library,
    make_logger,
    resolve_compute_capability,
    run_problem,
    target_name,
)

__all__ = [
    "ParsedNetwork",
    "parse_onnx",
    "network_layers",
    "check_network_precision",
    "profile_batches",
    "Built",
    "build",
    "build_cached",
    "engine_cache_name",
]

#: ONNX op type -> TensorRT layer type the parser lowers it to (the ops whose precision is checked).
_LAYER_OF_OP = {
    "Mul": "ELEMENTWISE",
    "Add": "ELEMENTWISE",
    "Div": "ELEMENTWISE",
    "Sub": "ELEMENTWISE",
    "ReduceSum": "REDUCE",
    "Softmax": "SOFTMAX",
    "LayerNormalization": "NORMALIZATION",
}


def profile_batches(batch_sizes: Sequence[int]) -> tuple[int, int, int]:
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


def _progress_monitor(trt: Any, cancelled: Callable[[], bool]) -> Any | None:
    """An ``IProgressMonitor`` that cancels the build once ``cancelled()`` is true (``None`` where the bindings
    have none). A C callback: it never raises."""
    base: Any = getattr(trt, "IProgressMonitor", None)  # a class of the bindings, when they have one
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


def parse_onnx(onnx_path: str | Path, library: Library | None = None) -> ParsedNetwork:
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
    logger = make_logger(trt)
    builder = trt.Builder(logger)
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    network = builder.create_network(0 if flag is None else 1 << int(flag))
    parser = trt.OnnxParser(network, logger)
    with signals_deferred():  # the parser logs through ``logger``: a signal is raised once it returns
        ok = parser.parse_from_file(str(path))
    if not ok or network.num_layers == 0:
        errors = [str(parser.get_error(i)).strip().replace("\n", " ") for i in range(parser.num_errors)]
        raise TensorRTParseError(
            f"{lib.describe()} cannot parse {path.name}: {'; '.join(errors) if errors else 'the network is empty'}"
        )
    return ParsedNetwork(lib, builder, network, parser, logger, str(path))


def network_layers(network: Any) -> list[dict[str, Any]]:
    """Every layer as ``{"name", "type", "outputs": [dtype names]}`` (e.g. ``ELEMENTWISE``, ``FLOAT``)."""
    out = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        out.append(
            {
                "name": layer.name,
                "type": layer.type.name,
                "outputs": [layer.get_output(j).dtype.name for j in range(layer.num_outputs)],
            }
        )
    return out


def check_network_precision(
    network: Any, scopes: Mapping[str, Sequence[str]], op_types: Mapping[str, str]
) -> dict[str, Any]:
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
    failures: list[str] = []
    blocks: dict[str, dict[str, int]] = {}
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
_CANCELLED: list[tuple[Any, ...]] = []


@dataclass
class Built:
    """A serialized engine and how it was made."""

    blob: bytes = field(repr=False)
    library: Library
    compute_capability: str
    build_time_s: float
    profile: dict[str, int]
    input_shape: tuple[int, ...]
    workspace_gb: float
    timing_cache: str | None = None
    tf32: bool = False
    require_user_allocation: bool = False

    def facts(self) -> dict[str, Any]:
        """JSON-ready build facts for a report."""
        return {
            "library": self.library.name,
            "library_version": self.library.version,
            "compute_capability": self.compute_capability,
            "build_time_s": round(self.build_time_s, 3),
            "engine_size": len(self.blob),
            "profile": self.profile,
            "workspace_gb": self.workspace_gb,
            "tf32": self.tf32,
            "require_user_allocation": self.require_user_allocation,
            "timing_cache": self.timing_cache or "none (TensorRT-RTX: no-op; kernels specialise at run time)",
        }


def _resolve_cc(lib: Library, compute_capability: str | None, gpu: bool) -> str:
    cc = resolve_compute_capability(compute_capability, gpu)
    if not lib.ahead_of_time and cc != "CURRENT":
        raise ValueError(
            f"{lib.describe()} builds only for the GPU present (CURRENT), not {cc}; "
            "ahead-of-time builds need tensorrt-rtx"
        )
    problem = run_problem(lib) if cc == "CURRENT" else None
    if problem:  # an engine for this GPU would be one TensorRT-RTX cannot run
        raise ValueError(problem)
    return cc


def build(
    onnx_path: str | Path,
    *,
    batch_sizes: Sequence[int] = (1, 8),
    input_hw: Sequence[int] | None = None,
    compute_capability: str | None = None,
    workspace_gb: float = 2.0,
    timing_cache: str | Path | None = None,
    parsed: ParsedNetwork | None = None,
    library: Library | None = None,
    tf32: bool = False,
) -> Built:
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
    (lo, opt, hi), hw = _add_profile(net, config, batch_sizes, input_hw)
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
        raise TensorRTError(
            f"{lib.describe()} failed to build an engine from {Path(onnx_path).name} for {cc}{last_errors(net.logger)}"
        )
    if cache_path is not None:
        atomic_write_bytes(cache_path, bytes(config.get_timing_cache().serialize()))
    return Built(
        bytes(serialized),
        lib,
        cc,
        build_s,
        {"min": lo, "opt": opt, "max": hi},
        (hi, 3, *hw),
        workspace_gb,
        str(cache_path) if cache_path else None,
        tf32,
        user_allocation,
    )


def _add_profile(
    net: ParsedNetwork, config: Any, batch_sizes: Sequence[int], input_hw: Sequence[int] | None
) -> tuple[tuple[int, int, int], tuple[int, ...]]:
    """Add the optimization profile of ``batch_sizes`` at the input's (H, W) to ``config``: returns the profile's
    (min, opt, max) batches and the (H, W)."""
    inp = net.network.get_input(0)
    hw = tuple(int(v) for v in (input_hw or tuple(inp.shape)[2:]))
    if any(v < 1 for v in hw):
        raise ValueError(f"the input's spatial size is dynamic {tuple(inp.shape)}; pass input_hw")
    lo, opt, hi = profile_batches(batch_sizes)
    profile = net.builder.create_optimization_profile()
    profile.set_shape(inp.name, (lo, 3, *hw), (opt, 3, *hw), (hi, 3, *hw))
    config.add_optimization_profile(profile)
    return (lo, opt, hi), hw


def build_cached(
    onnx_path: str | Path,
    cache_dir: str | Path,
    *,
    batch_sizes: Sequence[int] = (1, 8),
    input_hw: Sequence[int] | None = None,
    compute_capability: str | None = None,
    workspace_gb: float = 2.0,
    library: Library | None = None,
    tf32: bool = False,
) -> dict[str, Any]:
    """Build an engine once and keep it in ``cache_dir``; later calls with the same key reuse it.

    For engines that are built but cannot run here (no GPU): building one again would only repeat seconds of
    work; for engines that run, it spares every batch row and every later (or resumed) run the build. The key is
    everything the engine depends on: the ONNX file's content (sha256: the variant, arch, dtype and weights), the
    input size, the profile, the target (``CURRENT`` with the GPU's compute capability), TF32, the library and its
    version. The engine and its record (``<engine>.json``, written last: the engine's SHA-256 and its build facts)
    are written atomically; an engine is reused only when it is the file recorded (an engine can carry code: one
    edited, planted or left without its record is built again, never deserialized), in a folder that is the user's
    alone (:func:`attnzoo.fileio.private_dir`). TensorRT proper shares one timing cache per library and target in
    ``cache_dir`` across builds (TensorRT-RTX has none: it keeps its run-time kernels in
    :func:`runtime_cache_path`).

    Returns:
        :meth:`Built.facts` plus ``engine`` (its file), ``onnx_sha256`` and ``cached`` (``True``: reused, not
        built by this call).

    Raises:
        As :func:`build`; ``ValueError`` when ``cache_dir`` is not the user's alone.
    """
    lib = library or load_library()
    path = Path(onnx_path)
    private_dir(cache_dir, "TensorRT engine cache folder")
    sha = sha256_file(path)
    cc = _resolve_cc(lib, compute_capability, gpu_available())
    target = target_name(cc)
    engine = Path(cache_dir) / engine_cache_name(
        path.stem,
        sha,
        batch_sizes=batch_sizes,
        input_hw=input_hw,
        target=target,
        tf32=tf32,
        library=lib,
        workspace_gb=workspace_gb,
    )
    facts_path, key = Path(str(engine) + ".json"), {"engine": engine.name}
    kept = derived_facts(facts_path, sha, [engine], key)  # None: not built yet, or not the engine recorded
    if kept:
        return {**kept, "engine": str(engine), "cached": True}
    timing = None if lib.ahead_of_time else Path(cache_dir) / f"timing_{lib.name}-{lib.version}_{target}.cache"
    built = build(
        path,
        batch_sizes=batch_sizes,
        input_hw=input_hw,
        compute_capability=cc,
        workspace_gb=workspace_gb,
        library=lib,
        tf32=tf32,
        timing_cache=timing,
    )
    facts = {**built.facts(), "engine": str(engine), "onnx": str(path), "onnx_sha256": sha}
    atomic_write_bytes(engine, built.blob)
    record_derived(facts_path, sha, [engine], key, facts=facts)
    return {**facts, "cached": False}


def engine_cache_name(
    stem: str,
    sha256: str,
    *,
    batch_sizes: Sequence[int],
    input_hw: Sequence[int] | None,
    target: str,
    tf32: bool,
    library: Library,
    workspace_gb: float,
) -> str:
    """The engine cache's key, as a file name: everything an engine depends on -- the ONNX file (its stem and
    the first 16 hex of its SHA-256), the input size (``onnx``: the file's own), the profile (min-opt-max batch),
    the target (``CURRENT-sm<cc>`` or an ahead-of-time compute capability), TF32, the library and its version, and
    the workspace limit. :func:`build_cached` is the one cache every caller (benchmark, server) goes through."""
    lo, opt, hi = profile_batches(batch_sizes)
    hw = "x".join(str(int(v)) for v in input_hw) if input_hw else "onnx"
    return (
        f"{stem}_{hw}_b{lo}-{opt}-{hi}_{target}{'_tf32' if tf32 else ''}_{library.name}-{library.version}_"
        f"ws{workspace_gb:g}_{sha256[:16]}.engine"
    )
