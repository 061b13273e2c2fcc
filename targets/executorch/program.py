"""An ExecuTorch program (``.pte``) of the model: lowered to the XNNPACK delegate, written, checked and loaded by
ExecuTorch's Python runtime (``executorch.runtime.Runtime``) on the CPU, at fp32 or dynamic int8; what the
``executorch`` backend (:mod:`.backend`) runs and ``--format executorch`` (:mod:`.format`) writes.

The program is ``torch.export`` of the model with the batch dimension dynamic (traced at
:data:`attnzoo.runtime.torch_export.TRACE_BATCH`, 1 .. :data:`attnzoo.limits.MAX_BATCH_SIZE`), then
``to_edge_transform_and_lower`` with ``XnnpackPartitioner``: the ops XNNPACK takes run in its delegate, the rest in
ExecuTorch's portable kernels. Dynamic int8 (:func:`lower_program` ``dtype="int8"``) quantizes the ``nn.Linear``
layers only (``XNNPACKQuantizer``, per-channel int8 weights, int8 activations quantized at run time), the variant's
extra math (its ``extra_scopes``) excluded: it stays fp32.

The backend loads a program file that ``export-model --format executorch`` wrote and verified (its report says so,
for this very file: :func:`attnzoo.runtime.sessions.verified_report`), or one :func:`cached_program` lowers from the
PyTorch module into ``<cache_dir>/executorch/``, keyed by the module's content
(:func:`attnzoo.runtime.torch_export.fingerprint`), the
precision and the versions of torch and ExecuTorch; a cached program is used only when its SHA-256 is the one
recorded when it was lowered, in a cache folder that is the user's alone (:func:`attnzoo.fileio.cache_subdir`).
ExecuTorch's runtime can abort the process on a file that is not a program (its log line about a foreign
identifier is not UTF-8), so every program is checked first (:func:`program_problem`: the identifier, the header's
sizes against the file's) and a refusal is one line naming the file.

``threads`` sizes ExecuTorch's one CPU threadpool, which XNNPACK's delegate runs on. The pool is process-wide and a
loaded method keeps the pool it was loaded with: resizing it (which replaces it) under a method still open made that
method run on freed memory (a crash, or a corrupted heap, at its next call or when it was freed). So the pool is
sized before a method loads, and a size other than the pool's is refused while a method loaded here is open
(:func:`set_threads`).
"""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import importlib.util
import re
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from attnzoo.errors import first_line
from attnzoo.fileio import atomic_path
from attnzoo.lazy import lazy_import
from attnzoo.limits import MAX_BATCH_SIZE
from attnzoo.runtime.contract import BATCH_DIM
from attnzoo.runtime.torch_export import TRACE_BATCH, BuildCache, model_input, module_path

torch = lazy_import("torch")

__all__ = [
    "EXECUTORCH_DTYPES",
    "executorch_problem",
    "executorch_version",
    "lower_program",
    "write_program",
    "program_identifier",
    "program_problem",
    "load_method",
    "graph_nodes",
    "cached_program",
    "set_threads",
]

#: Precisions a program is lowered at: fp32, and dynamic int8 (the Linear layers; the extra math fp32).
EXECUTORCH_DTYPES: tuple[str, ...] = ("fp32", "int8")
#: Where the backend keeps the programs it lowers from the module: ``<cache_dir>/executorch/``
#: ``<variant>_<dtype>_<key>.pte`` (:func:`cached_program`).
CACHE = BuildCache("executorch", ".pte", "program")


def executorch_version() -> str | None:
    """The installed ExecuTorch's version, ``None`` when it is not installed."""
    if importlib.util.find_spec("executorch") is None:
        return None
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return None


def executorch_problem(dtype: str = "fp32") -> str | None:
    """Why a program at ``dtype`` cannot be lowered and run here (one line), or ``None``."""
    if dtype not in EXECUTORCH_DTYPES:
        return f"ExecuTorch programs are lowered at {', '.join(EXECUTORCH_DTYPES)}, not {dtype}"
    if executorch_version() is None:
        return "ExecuTorch is not installed (pip install 'attnzoo[executorch]')"
    return None


def lower_program(
    model: Any, hw: tuple[int, int], *, dtype: str = "fp32", keep_fp32: Sequence[str] = ()
) -> tuple[Any, Any]:
    """``torch.export`` of a copy of ``model`` (fp32, CPU) with a dynamic batch, quantized at ``dtype="int8"``
    (:func:`_quantize`, ``keep_fp32``: the variant's ``extra_scopes``, left fp32 in every block), lowered to XNNPACK.

    Returns:
        ``(exported, edge)``: the ``ExportedProgram`` and the ``EdgeProgramManager`` (its
        ``exported_program()`` is the graph the program is made of: :func:`graph_nodes`).
    """
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    net = copy.deepcopy(model).float().cpu().eval()
    x = torch.zeros(TRACE_BATCH, 3, *hw)
    dynamic = ({0: torch.export.Dim(BATCH_DIM, min=1, max=MAX_BATCH_SIZE)},)
    if dtype == "int8":
        net = _quantize(net, x, dynamic, keep_fp32)
    with torch.no_grad():
        exported = torch.export.export(net, (x,), dynamic_shapes=dynamic, strict=False)
    return exported, to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()])


def _in_scopes(node: Any, scopes: Sequence[str]) -> bool:
    """Whether ``node`` comes from a module ``<...>.attn.<scope>`` (or below) for one of ``scopes`` (a variant's
    ``extra_scopes``: ``projection``)."""
    if not scopes:
        return False
    pattern = re.compile(rf"(^|\.)attn\.({'|'.join(map(re.escape, scopes))})(\.|$)")
    stack = (node.meta.get("nn_module_stack") or {}).values()
    return any(pattern.search(module_path(str(path))) for path, *_ in stack)


def _quantize(net: Any, x: Any, dynamic: Any, keep_fp32: Sequence[str]) -> Any:
    """``net`` with its Linear layers dynamically quantized to int8 (pt2e, ``XNNPACKQuantizer``: per-channel int8
    weights, activations quantized at run time); each block's ``attn.<scope>`` module for the scopes ``keep_fp32``
    (and everything below it) is left fp32."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=True)
    quantizer = XNNPACKQuantizer().set_module_type(torch.nn.Linear, config)
    scopes = tuple(keep_fp32)
    quantizer.set_filter_function(lambda node: not _in_scopes(node, scopes))
    graph = torch.export.export(net, (x,), dynamic_shapes=dynamic, strict=False).module()
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        prepared(torch.randn(*x.shape, generator=torch.Generator().manual_seed(0)))
    return convert_pt2e(prepared)


def graph_nodes(edge: Any) -> Iterator[tuple[str, Any]]:
    """Every op node of the lowered program, as ``(where, node)``: ``xnnpack`` for the nodes inside a delegate (from
    each delegate's own graph), ``portable`` for those ExecuTorch runs itself. Each ``node`` has ``op``, ``target``
    (its op, named as ATen names it: ``mul``, ``view`` for the edge dialect's ``view_copy``) and ``meta`` (with the
    ``nn_module_stack`` torch.export recorded)."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    program = edge.exported_program() if hasattr(edge, "exported_program") else edge
    module = program.graph_module

    def plain(node: Any) -> Any:
        op = getattr(node.target, "_op", node.target)
        name = getattr(op, "__name__", str(op)).split(".")[0]
        name = name[: -len("_copy")] if name.endswith("_copy") else name
        return SimpleNamespace(op="call_function", target=SimpleNamespace(__name__=name), meta=node.meta)

    delegate = torch.ops.higher_order.executorch_call_delegate
    for node in module.graph.nodes:
        if node.op == "call_function" and node.target is not delegate:
            yield "portable", plain(node)
    for _, child in module.named_children():
        if isinstance(child, LoweredBackendModule):
            for node in child.original_module.graph.nodes:
                if node.op == "call_function":
                    yield "xnnpack", plain(node)


def write_program(edge: Any, path: Path) -> float:
    """Serialize ``edge`` (:func:`lower_program`) as an ExecuTorch program at ``path``; returns the seconds it took."""
    start = time.perf_counter()
    buffer = edge.to_executorch().buffer
    Path(path).write_bytes(buffer)
    return time.perf_counter() - start


#: ExecuTorch's extended header (after the identifier): ``eh00``, its length, the program's size, where the
#: segments (a delegate's data, the weights) start and how many bytes they take.
_EXTENDED_HEADER = b"eh00"


@functools.cache
def program_identifier() -> bytes:
    """The FlatBuffers file identifier of the installed ExecuTorch's programs (its ``program.fbs``; ``ET12`` when
    the schema is not shipped): bytes 4-7 of every ``.pte`` it loads."""
    spec = importlib.util.find_spec("executorch")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        schema = Path(folder) / "schema" / "program.fbs"
        found = re.search(r'file_identifier\s+"(.{4})"', schema.read_text()) if schema.is_file() else None
        if found:
            return found.group(1).encode()
    return b"ET12"


def program_problem(path: str | Path) -> str | None:
    """Why ``path`` is not an ExecuTorch program its runtime can be given (one line), or ``None``: it must carry
    the program identifier (:func:`program_identifier`) at byte 4, and the sizes its header states (the program,
    its segments) must fit in the file, as a truncated program's do not."""
    try:
        size = Path(path).stat().st_size
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    identifier = program_identifier()
    if head[4:8] != identifier:
        return f"not an ExecuTorch program (no {identifier.decode()} identifier at byte 4)"
    end, what = size, "its program takes"
    if head[8:12] == _EXTENDED_HEADER:
        length = int.from_bytes(head[12:16], "little")
        if not 24 <= length <= 56:
            return f"a damaged ExecuTorch program (its extended header says it is {length} bytes)"
        end = program = int.from_bytes(head[16:24], "little")
        base = int.from_bytes(head[24:32], "little")
        data = int.from_bytes(head[32:40], "little") if length >= 32 else 0
        if base:
            end, what = max(program, base + data), "its program and segments take"
    if end > size:
        return f"a truncated ExecuTorch program ({what} {end:,} bytes, the file has {size:,})"
    if not 8 <= int.from_bytes(head[0:4], "little") < end:
        return "a damaged ExecuTorch program (its root table lies outside it)"
    return None


#: The methods :func:`load_method` loaded that are still open (each keeps the threadpool it was loaded with).
_OPEN_METHODS: weakref.WeakSet = weakref.WeakSet()


def load_method(path: str | Path, threads: int | None = None) -> Any:
    """The ``forward`` method of the program at ``path``, loaded by ExecuTorch's Python runtime (its ``execute``
    takes a list of CPU tensors and returns a list), on a threadpool of ``threads`` (:func:`set_threads`, sized
    before the method loads; ``None``: the pool as it is).

    Raises:
        ValueError: one line naming ``path``: not a program (:func:`program_problem`, checked before ExecuTorch
            sees it), or one ExecuTorch refuses.
    """
    problem = program_problem(path)
    if problem is not None:
        raise ValueError(f"{path}: {problem}")
    from executorch.runtime import Runtime

    set_threads(threads)
    try:
        method = Runtime.get().load_program(Path(path)).load_method("forward")
    except RuntimeError as exc:  # ExecuTorch's own refusal names an error code, not the file
        raise ValueError(f"{path}: ExecuTorch cannot load it ({first_line(exc)})") from None
    _OPEN_METHODS.add(method)
    return method


def set_threads(threads: int | None) -> int:
    """Size ExecuTorch's CPU threadpool to ``threads`` (``None``: leave it as it is); returns its size.

    The pool is one per process, and ExecuTorch's resize (``_unsafe_reset_threadpool``) replaces it: a method loaded
    on the old pool would then run on freed memory. So a new size is refused while a method :func:`load_method`
    loaded is still open.

    Raises:
        ValueError: ``threads`` below 1, or a new size while a method is open.
    """
    from executorch.extension.pybindings import portable_lib

    size = int(portable_lib._threadpool_get_thread_count())
    if threads is None:
        return size
    if int(threads) < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if size != int(threads):
        if len(_OPEN_METHODS):
            raise ValueError(
                f"ExecuTorch runs every program of a process on one threadpool, of {size} thread(s), and "
                f"{len(_OPEN_METHODS)} program(s) loaded on it are open: it cannot become {int(threads)} thread(s) "
                f"until they are closed (or ask for {size})"
            )
        portable_lib._unsafe_reset_threadpool(int(threads))
    return int(portable_lib._threadpool_get_thread_count())


def cached_program(model: Any, cache_dir: str | Path, *, dtype: str = "fp32") -> tuple[Path, dict[str, Any]]:
    """The program of ``model`` at ``dtype`` in ``<cache_dir>/executorch/`` (:data:`CACHE`), lowered when none of
    the same fingerprint (weights, source, config, precision, input size, torch and ExecuTorch versions) is there,
    as :meth:`attnzoo.runtime.torch_export.BuildCache.get` keeps it: a program there is used only when it is the file
    lowered and recorded there (``ValueError`` for a cache folder that is not the user's alone).
    """
    from attnzoo.models import VARIANTS

    config, hw = model_input(model)
    head = {"config": config, "dtype": dtype, "hw": list(hw), "torch": torch.__version__}
    head["executorch"] = executorch_version()

    def lower_into(path: Path) -> dict[str, float]:
        spec = VARIANTS.get(str(config.get("variant")))
        keep = spec.extra_scopes if spec is not None else ()
        start = time.perf_counter()
        _, edge = lower_program(model, hw, dtype=dtype, keep_fp32=keep)
        lowered = time.perf_counter() - start
        with atomic_path(path) as tmp:
            written = write_program(edge, tmp)
        return {"lower_s": round(lowered, 2), "serialize_s": round(written, 2)}

    facts = {"dtype": dtype, "trace_batch": TRACE_BATCH}
    return CACHE.get(model, head, cache_dir, (dtype,), facts, lower_into, modules=(__name__,))
