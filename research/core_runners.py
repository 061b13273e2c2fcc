"""How the fused-cores study runs one encoder block on each runtime, what a row's memory is, and the L1 bound.

A block (LayerNorm, attention, MLP) takes (batch, tokens, width) token tensors. Per mode (:data:`MODES`):

- ``eager``: the PyTorch module; ``compiled``: ``torch.compile(dynamic=False)`` of it (Inductor, C++ on the CPU);
- ``aoti``: ``torch.export`` of it at the group's shape, compiled by AOTInductor into a package (cached by the
  block's fingerprint in ``<cache>/fused-cores/``), loaded and run;
- ``ort``, ``openvino``: its ONNX export (the package's exporter settings: opset 20, dynamic batch, the custom op's
  ``Loop`` translation; cached per variant, core and tokens), in ONNX Runtime's untuned CPU session (the one
  export verification and the studies run, ``onnx_reference().session``) and OpenVINO's CPU plugin at f32
  (``OPENVINO.compiled``), each with the group's threads.

A row's peak memory (:class:`PeakResident`) is the process's peak resident set above its resident set just before
the row's call, for ``aoti``, ``ort`` and ``openvino`` just before its package or session is loaded (their
weights and arenas count, the compile does not), for ``compiled`` after its first call (the compile): the median of
:data:`MEASURES` tries, each from a fresh load, so that one try's allocator state (a heap another row left
fragmented, a one-time code load such as the Numba kernel's) does not decide the row. The kernel's own peak
counter (``/proc/self/status`` ``VmHWM``, reset through ``/proc/self/clear_refs``) records it, so no short peak is
missed; freed heap is handed back first (``malloc_trim``).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnzoo.fileio import atomic_path
from attnzoo.lazy import lazy_import
from attnzoo.limits import return_free_memory
from attnzoo.models.kernels import cpu_kernel_unavailable_reason
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.contract import INPUT_NAME, OUTPUT_NAME
from attnzoo.runtime.torch_export import fingerprint
from attnzoo.targets.openvino import OPENVINO

torch = lazy_import("torch")
np = lazy_import("numpy")
aoti = lazy_import("attnzoo.targets.aoti.package")
wafe = lazy_import("attnzoo.models.wafe")
flops = lazy_import("attnzoo.benchmarks.flops")
onnx_l1 = lazy_import("attnzoo.export.onnx_l1")

__all__ = [
    "MODES",
    "COMPILING",
    "MEASURES",
    "PeakResident",
    "Runner",
    "configured",
    "build_runner",
    "l1_bound",
    "current_impl",
]

MODES = ("eager", "compiled", "aoti", "ort", "openvino")
#: Modes that compile the block (minutes per shape on a loaded 2-core machine): their variants are chosen apart.
COMPILING = ("compiled", "aoti")
#: Tries a row's peak memory is the median of (module docstring).
MEASURES = 3
#: Vector ops are counted as one FMA each (two matrix FLOPs): the issue's AVX-512 argument.
FLOPS_PER_VECTOR_OP = 2


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


class PeakResident:
    """Peak resident memory above the level at entry, in MiB (``mb``), from the kernel's high-water mark; where
    ``/proc/self/clear_refs`` cannot reset it (not Linux), ``mb`` is ``None``."""

    def __enter__(self) -> PeakResident:
        return_free_memory()
        self.mb: float | None = None
        self._start = _status_kb("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        except OSError:
            self._start = None
        return self

    def __exit__(self, *exc: object) -> None:
        peak = _status_kb("VmHWM")
        if self._start is not None and peak is not None:
            self.mb = max(0.0, (peak - self._start) / 1024)


class Runner:
    """One block on one runtime: ``call()`` runs it on the group's input and returns the output as numpy;
    ``peak_mb`` and ``build_s`` (compile or export seconds, where there is one) are set by :func:`build_runner`."""

    def __init__(self, call: Callable[[], Any], peak_mb: float | None, build_s: float | None) -> None:
        self.call, self.peak_mb, self.build_s = call, peak_mb, build_s


def current_impl(variant_is_mae: bool, mode: str, tokens: int) -> str | None:
    """The MAE core ``mae_impl="auto"`` runs in ``mode`` (:func:`attnzoo.models.wafe.auto_mae_impl`'s rules, the
    label of a ``current`` row; a test holds the two together), None for other variants."""
    if not variant_is_mae:
        return None
    onnx_form = "loop" if tokens >= wafe.ONNX_LOOP_TOKENS else "blocked"
    compiled = "fused" if cpu_kernel_unavailable_reason() is None else "tiled"
    return {"eager": "fused", "compiled": compiled, "aoti": aoti.MAE_IMPL, "ort": onnx_form, "openvino": onnx_form}[
        mode
    ]


def configured(block: Any, impl: str | None) -> Any:
    """A copy of ``block`` whose MAE core is ``impl`` (None: the block as it is, ``auto``); set for good, since a
    compiled block's guards read it."""
    block = copy.deepcopy(block)
    if impl is not None:
        block.attn.distance.impl = impl
    return block


def _onnx(block: Any, x: Any, path: Path) -> float:
    """Export ``block`` to ``path`` (if not there yet) as the package's exporter does; returns the seconds."""
    if path.is_file():
        return 0.0
    start = time.perf_counter()
    with torch.no_grad(), atomic_path(path) as tmp:
        program = torch.onnx.export(
            block,
            (x[:2] if x.shape[0] > 1 else x.repeat(2, 1, 1),),
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},),
            opset_version=20,
            dynamo=True,
            optimize=True,
            verbose=False,
            report=False,
            custom_translation_table=onnx_l1.TRANSLATIONS,
        )
        assert program is not None
        program.save(str(tmp))
    return time.perf_counter() - start


def _aoti(block: Any, x: Any, cache: Path, name: str) -> tuple[Path, float]:
    """An AOTInductor package of ``block`` at ``x``'s shape, cached by its fingerprint; (path, compile seconds)."""
    cache.mkdir(parents=True, exist_ok=True)
    head = {"name": name, "shape": list(x.shape), "torch": torch.__version__}
    path = cache / f"{name}-{fingerprint(block, head, modules=aoti.CODE_MODULES)[:16]}.pt2"
    if path.is_file():
        return path, 0.0
    start = time.perf_counter()
    with torch.no_grad(), wafe.export_mae_impl(aoti.MAE_IMPL):  # what an AOTInductor export of a model runs
        program = torch.export.export(block, (x,), strict=False)
    with aoti.temporary_package(path) as tmp:
        aoti.compile_package(program, tmp)
    return path, time.perf_counter() - start


def _eager(block: Any, x: Any, threads: int, cache: Path, name: str) -> Runner:
    return _measured(lambda: _torch_call(block, x), None, None)


def _compiled(block: Any, x: Any, threads: int, cache: Path, name: str) -> Runner:
    fn = torch.compile(block, dynamic=False)
    start = time.perf_counter()
    _torch_call(fn, x)  # the compile
    return _measured(lambda: _torch_call(fn, x), None, time.perf_counter() - start)


def _packaged(block: Any, x: Any, threads: int, cache: Path, name: str) -> Runner:
    path, built = _aoti(block, x, cache / "aoti", name)
    return _measured(lambda: aoti.load_package(path), lambda runner: runner(x).numpy(), built)


def _onnx_runner(session: Callable[[Path, int], Any], run: Callable[[Any, Any], Any]):
    """A builder that exports the block to ONNX (cached) and runs it in ``session(path, threads)``."""

    def build(block: Any, x: Any, threads: int, cache: Path, name: str) -> Runner:
        path = cache / "onnx" / f"{name}.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        built = _onnx(block, x, path)
        xn = x.numpy()
        return _measured(lambda: session(path, threads), lambda loaded: run(loaded, xn), built)

    return build


#: How each mode builds a runner: (block, input, threads, cache folder, export name) -> Runner.
_BUILDERS: dict[str, Callable[..., Runner]] = {
    "eager": _eager,
    "compiled": _compiled,
    "aoti": _packaged,
    "ort": _onnx_runner(lambda path, threads: onnx_reference().session(path, threads), lambda s, xn: s.run(xn)),
    "openvino": _onnx_runner(OPENVINO.compiled, lambda c, xn: np.asarray(c([xn])[0])),
}


def build_runner(mode: str, block: Any, x: Any, threads: int, cache: Path, name: str) -> Runner:
    """``block`` (from :func:`configured`) on ``mode`` with ``threads`` threads, called once (the compile, for
    ``compiled``; a warm-up otherwise) with its peak memory measured (module docstring); ``name`` keys its cached
    export (variant, core and tokens)."""
    torch.set_num_threads(threads)
    return _BUILDERS[mode](block, x, threads, cache, name)


def _torch_call(fn: Any, x: Any) -> Any:
    with torch.inference_mode():
        return fn(x).numpy()


def _measured(load: Callable[[], Any], run: Callable[[Any], Any] | None, build_s: float | None) -> Runner:
    """Peak memory of ``load()`` and one call (``run(loaded)``; with no ``run``, ``load`` is the call), the median of
    :data:`MEASURES` tries (each try's session freed before the next is measured)."""
    peaks: list[float | None] = []
    for _ in range(MEASURES):
        loaded = None  # the previous try's session, freed before this one is measured
        with PeakResident() as mem:
            loaded = load()
            if run is not None:
                run(loaded)
        peaks.append(mem.mb)
    call = (lambda: run(loaded)) if run is not None else load
    known = [p for p in peaks if p is not None]
    return Runner(call, statistics.median(known) if len(known) == len(peaks) else None, build_s)


def l1_bound(variant: str, tokens: int, width: int, arch: str) -> float:
    """The arithmetic bound of a block of ``variant`` over ``standard``'s at ``tokens``: its matrix FLOPs plus its
    vector ops at :data:`FLOPS_PER_VECTOR_OP` each, over standard's matrix FLOPs (the FLOP counter,
    :mod:`attnzoo.benchmarks.flops`, on the meta device). For the L1 variants: ``Q K^T`` as L1 terms costs 3x its
    matrix product, ``P V`` stays one; softmax, LayerNorm and memory traffic are not counted."""

    def work(v: str) -> float:
        block = flops.meta_model(v, "cls", arch).blocks[0]
        count = flops.count_forward(block, torch.empty(1, tokens, width, device="meta"))
        return count.matrix_flops + FLOPS_PER_VECTOR_OP * count.vector_ops

    return work(variant) / work("standard")
