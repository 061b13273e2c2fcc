"""Fusion audit: does each runtime run a block's attention core as one fused kernel?

A variant's attention core is, per block, the softmax with the matrix product that makes its scores
(``Q K^T``) and the one that applies it to the values. **Fused** (:data:`FUSED`, the one definition every table
of the package uses) means: one kernel of the runtime's own computes all three, read from the runtime's executed
or optimized graph, never from the source model. A runtime that recognises the pattern runs the three as one
kernel (OpenVINO's ``Subgraph`` from its snippets tokenizer, ONNX Runtime's ``Attention`` /
``MultiHeadAttention`` contrib ops); where a variant's extra math breaks the pattern, the core runs as separate
kernels that write the full score matrix to memory, which is what makes custom attention slow on GPUs
(NVIDIA/TensorRT#3243, #3665). One kernel is not by itself that saving: ONNX Runtime's CPU ``Attention`` kernel
still computes the whole score matrix into a buffer of its own, so on that runtime "fused" means one op, not less
memory (the memory a fused kernel saves is a GPU kernel's, such as a flash-attention one, which this audit cannot
read without a GPU). The audit reads each runtime's own result, never the source model alone:

- **OpenVINO**: the compiled model's runtime model (``get_runtime_model()``): a block is fused when one executed
  kernel computes its softmax and both of its matrix products (``originalLayersNames``).
- **ONNX Runtime**: the graph its CPU session optimized (``optimized_model_filepath``), and the graph of its
  transformer optimizer (``onnxruntime.transformers.optimizer.optimize_model``, ``model_type="vit"``): a block
  is fused when its softmax is gone and an attention contrib op took its place.

- **TensorRT**: an engine's layers can be read only from a deserialized engine, which needs a GPU; on a machine
  without one the audit says so (``inspected: false`` with the reason) instead of guessing, and every table shows
  it as "not inspected".

A file exported at opset 23 (``export_onnx(..., opset=23)``) carries each dot-product core as one standard
``Attention`` op; the audit then asks whether each runtime kept it whole: ONNX Runtime when the op is still in its
optimized graph, OpenVINO when the kernels that compute it hold no separate matrix product or softmax. The
transformer optimizer runs at ``opt_level=0``, which never splits a standard ``Attention`` op: on such a file its
count is the export's, not a runtime's reading, and its entry says so (``as_exported``: the cores that were
already one op in the file; :func:`runtime_label` labels it).

    python -m attnzoo.runtime.fusion model.onnx [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from attnzoo import mdtext
from attnzoo.cli import entry_point
from attnzoo.errors import UsageError
from attnzoo.lazy import lazy_import
from attnzoo.machine import gpu_info

from .backends import get_backend, onnx_reference
from .contract import config_from_props, metadata_props

if TYPE_CHECKING:
    import onnx
else:
    onnx = lazy_import("onnx")
ort = lazy_import("onnxruntime")
ov = lazy_import("openvino")
models = lazy_import("attnzoo.models")  # the arch table (timm): read by the transformer optimizer's audit only

__all__ = [
    "FUSED",
    "RUNTIMES",
    "runtime_label",
    "inspected_line",
    "AttentionCore",
    "attention_cores",
    "openvino_fusion",
    "onnxruntime_fusion",
    "tensorrt_fusion",
    "audit",
    "markdown",
    "main",
]

#: What "fused" means in every table of the package (the audit's one definition).
FUSED = (
    "fused: one kernel of the runtime's own computes a block's attention core (the scores' matrix product, the "
    "softmax and the values' matrix product), read from the runtime's executed or optimized graph"
)
#: The audit's runtimes, in order, as tables name them.
RUNTIMES = {
    "openvino": "OpenVINO",
    "onnxruntime": "ONNX Runtime",
    "onnxruntime-transformers": "ONNX Runtime transformer optimizer",
    "tensorrt": "TensorRT",
}


def runtime_label(entry: dict[str, Any]) -> str:
    """A runtime's name in a table, with what its count is where that is not a runtime's kernel: the transformer
    optimizer on a file whose cores were exported as ``Attention`` ops (its ``opt_level=0`` keeps them as written)."""
    runtime = str(entry.get("runtime"))
    name = RUNTIMES.get(runtime, runtime)
    if entry.get("as_exported"):
        name += " (opt_level 0 keeps the exported Attention ops: the export's count, not a kernel it chose)"
    return name


def inspected_line(runtimes: list[dict[str, Any]]) -> str:
    """One sentence naming the runtimes whose graphs were read and those that were not (with why)."""
    seen = [RUNTIMES.get(r["runtime"], r["runtime"]) for r in runtimes if r.get("inspected")]
    not_seen = [
        f"{RUNTIMES.get(r['runtime'], r['runtime'])} ({r.get('reason')})" for r in runtimes if not r.get("inspected")
    ]
    return (
        f"Inspected: {', '.join(seen) or 'none'}"
        + (f"; not inspected: {'; '.join(not_seen)}" if not_seen else "")
        + "."
    )


#: ONNX Runtime contrib ops that compute a whole attention core.
ORT_ATTENTION_OPS = (
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "PackedAttention",
    "PackedMultiHeadAttention",
    "SparseAttention",
)
#: Ops between the scores' matrix product and the softmax that keep the scores a (scaled, biased) dot product.
_SCORE_PATH_OPS = ("Mul", "Div", "Add", "Sub", "Cast", "Reshape", "Transpose", "Where")
_BLOCK = re.compile(r"^(.*?blocks\.\d+)\.attn\b")


@dataclass
class AttentionCore:
    """One block's attention core in the ONNX graph (node names).

    Attributes:
        block: The block's module path (``blocks.3``, ``encoder.blocks.3``).
        softmax: The softmax node.
        scores: The matrix product whose output the softmax normalises (through scaling / bias / layout ops only),
            or None when the scores are not a matrix product (the L1-distance variants).
        values: The matrix product that applies the softmax's output to the values.
        path: The nodes between ``scores`` and ``softmax``.
        producer: The node whose output the softmax takes (``scores`` or the last of ``path`` for a dot-product
            core; the end of whatever computes the scores otherwise).
        op: The standard ``Attention`` op (opset 23) that computes the whole core, or None; ``softmax`` then names
            the same node (the softmax is inside it).
    """

    block: str
    softmax: str
    scores: str | None
    values: str | None
    path: list[str]
    producer: str | None = None
    op: str | None = None

    @property
    def dot_product(self) -> bool:
        """Whether the scores are a matrix product: the form every runtime's attention fusion looks for (the
        ``Attention`` op's scores are one by its definition)."""
        return self.op is not None or (self.scores is not None and self.values is not None)

    @property
    def kernel_ops(self) -> set:
        """The ops one fused kernel must compute: the scores' matrix product (or, without one, the op that makes
        the scores), the softmax and the matrix product with the values; or the one ``Attention`` op."""
        if self.op is not None:
            return {self.op}
        return {n for n in (self.scores if self.dot_product else self.producer, self.softmax, self.values) if n}


def _load(model: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)


def attention_cores(model: str | Path | onnx.ModelProto) -> list[AttentionCore]:
    """Each block's attention cores (a softmax whose output weights values by a matrix product, or one standard
    ``Attention`` op), in graph order."""
    graph = _load(model).graph
    producer = {out: n for n in graph.node for out in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    cores = []
    for node in graph.node:
        block = _BLOCK.match(node.name)
        if block is not None and node.op_type == "Attention" and node.domain in ("", "ai.onnx"):
            cores.append(AttentionCore(block.group(1), node.name, None, None, [], None, op=node.name))
            continue
        if node.op_type != "Softmax" or block is None:
            continue
        path, src, scores = [], producer.get(node.input[0]), None
        first = src.name if src is not None else None
        while src is not None:
            if src.op_type == "MatMul":
                scores = src.name
                break
            if src.op_type not in _SCORE_PATH_OPS:
                break
            path.append(src.name)
            # follow the data input (the first non-constant one)
            src = next(
                (producer[i] for i in src.input if i in producer and producer[i].op_type not in ("Constant", "Shape")),
                None,
            )
        values, out = None, node.output[0]
        for _ in range(3):  # through a Cast (fp16 exports) at most
            users = consumers.get(out, [])
            nxt = next((u for u in users if u.op_type == "MatMul"), None)
            if nxt is not None:
                values = nxt.name
                break
            cast = next((u for u in users if u.op_type == "Cast"), None)
            if cast is None:
                break
            path.append(cast.name)
            out = cast.output[0]
        if values is not None:  # a softmax that weights no values (a gate over heads, say) is no attention core
            cores.append(AttentionCore(block.group(1), node.name, scores, values, path[::-1], first))
    return cores


def _verdict(cores: list[AttentionCore], fused: dict[str, str | None], runtime: str, **extra) -> dict[str, Any]:
    per_core = [
        {
            "block": c.block,
            "softmax": c.softmax,
            "fused": fused.get(c.softmax) is not None,
            "kernel": fused.get(c.softmax),
            "dot_product": c.dot_product,
        }
        for c in cores
    ]
    return {
        "runtime": runtime,
        "inspected": True,
        "cores": len(per_core),
        "fused": sum(c["fused"] for c in per_core),
        "per_core": per_core,
        **extra,
    }


def openvino_fusion(path: str | Path, cores: list[AttentionCore] | None = None, threads: int = 1) -> dict[str, Any]:
    """Which attention cores OpenVINO's CPU plugin runs as one kernel: softmax and both matrix products in one
    runtime node.

    Returns:
        ``{"runtime", "inspected", "cores", "fused", "per_core": [{"block", "softmax", "fused", "kernel",
        "dot_product"}], "version"}`` (``kernel``: the fused node's name and layer type).
    """
    cores = attention_cores(path) if cores is None else cores
    compiled = _openvino_compiled(path, threads)
    ops = compiled.get_runtime_model().get_ordered_ops()
    kernels = []
    for op in ops:
        info = op.get_rt_info()
        names = set(info["originalLayersNames"].astype(str).split(",")) if "originalLayersNames" in info else set()
        layer = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        kernels.append((f"{op.get_friendly_name()} ({layer})", names, layer))
    fused = {}
    onnx_names = {n.name for n in _load(path).graph.node}
    for c in cores:
        if c.op is not None:
            fused[c.softmax] = _openvino_op_kernel(c.op, ops, kernels, onnx_names)
        else:
            fused[c.softmax] = next((k for k, names, _ in kernels if c.kernel_ops <= names), None)
    return _verdict(cores, fused, "openvino", version=ov.get_version())


def _openvino_compiled(path: str | Path, threads: int) -> Any:
    """OpenVINO's compiled model of ``path``, from the ``openvino`` backend of the registry (its ``compiled``: the
    backend's fp32 settings), whose runtime model the audit reads."""
    return cast(Any, get_backend("openvino")).compiled(path, threads=threads)


def _openvino_op_kernel(op_name: str, ops: list, kernels: list, onnx_names: set) -> str | None:
    """The kernel that runs one ONNX ``Attention`` op whole in OpenVINO's runtime model, or None.

    The op's kernels are those that carry its name and, upstream of them, those that carry no name of the ONNX
    graph (the front end's decomposition: a masked core becomes a ``ScaledDotProductAttention`` and a NaN guard).
    The op is fused when one of them computes a softmax and none of them is a separate matrix product or softmax.
    """
    index = {op.get_friendly_name(): i for i, op in enumerate(ops)}
    mine = {i for i, (_, names, _) in enumerate(kernels) if op_name in names}
    todo = list(mine)
    while todo:
        i = todo.pop()
        for value in ops[i].inputs():
            j = index.get(value.get_source_output().get_node().get_friendly_name())
            if j is None or j in mine:
                continue
            names, layer = kernels[j][1], kernels[j][2]
            if layer not in ("Const", "Input") and not (names & onnx_names):
                mine.add(j)
                todo.append(j)
    separate = [j for j in mine if kernels[j][2] in ("MatMul", "Softmax", "SoftMax")]
    softmax = [j for j in mine if any("softmax" in n.lower() for n in kernels[j][1])]
    return kernels[softmax[0]][0] if softmax and not separate else None


def _ort_attention(graph: onnx.GraphProto, cores: list[AttentionCore]) -> dict[str, str | None]:
    """Blocks whose softmax an attention contrib op replaced (its softmax gone, one such op per fused block)."""
    attention = [n for n in graph.node if n.op_type in ORT_ATTENTION_OPS]
    left = {n.name for n in graph.node if n.op_type == "Softmax"}
    fused: dict[str, str | None] = {c.softmax: None for c in cores}
    kept = {n.name: n for n in attention if n.domain in ("", "ai.onnx")}
    for c in cores:  # a standard Attention op: fused when the runtime kept it whole (not decomposed)
        if c.op is not None and c.op in kept:
            fused[c.softmax] = f"{c.op} (ai.onnx.Attention)"
    attention = [n for n in attention if n.name not in kept]
    gone = [c for c in cores if c.op is None and c.softmax not in left]
    for c, op in zip(gone, attention, strict=False):
        fused[c.softmax] = f"{op.name or op.op_type} ({op.domain or 'ai.onnx'}.{op.op_type})"
    return fused


def _heads_and_width(path: str | Path) -> tuple[int, int]:
    """(attention heads, embedding width) of an attnzoo export, from its config's arch; (0, 0) when unknown
    (the transformer optimizer then detects them from the graph)."""
    try:
        arch = models.ARCHS.get(config_from_props(metadata_props(path)).get("arch"))
    except ValueError:  # no attnzoo config: not an attnzoo export
        arch = None
    return (int(arch["num_heads"]), int(arch["embed_dim"])) if arch else (0, 0)


@contextlib.contextmanager
def _warnings_silenced() -> Iterator[None]:
    """Log records below ERROR are dropped while active (the previous ``logging.disable`` level comes back)."""
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.WARNING))
    try:
        yield
    finally:
        logging.disable(previous)


def onnxruntime_fusion(
    path: str | Path, cores: list[AttentionCore] | None = None, transformer_optimizer: bool = False
) -> dict[str, Any]:
    """Which attention cores ONNX Runtime runs as one attention op: in the graph its CPU session optimizes (all levels),
    or, with ``transformer_optimizer``, in the graph of ``onnxruntime.transformers.optimizer`` (``vit``)."""
    cores = attention_cores(path) if cores is None else cores
    if transformer_optimizer:
        from onnxruntime.transformers.optimizer import optimize_model  # optional: ONNX Runtime's transformer optimizer

        num_heads, hidden_size = _heads_and_width(path)
        # its warnings (what it could not fuse, its shape inference) are the audit's result, not news; errors show
        with _warnings_silenced():
            optimized = optimize_model(
                str(path), model_type="vit", num_heads=num_heads, hidden_size=hidden_size, opt_level=0
            )
        graph = optimized.model.graph
        name = "onnxruntime-transformers"
    else:
        with tempfile.TemporaryDirectory(prefix="attnzoo-fusion-") as tmp:
            out = Path(tmp) / "optimized.onnx"
            onnx_reference().session(path, 1, optimized_path=out)
            graph = onnx.load(str(out), load_external_data=False).graph
        name = "onnxruntime"
    ops = Counter(n.op_type for n in graph.node if n.op_type in ORT_ATTENTION_OPS)
    extra: dict[str, Any] = {"version": ort.__version__, "attention_ops": dict(ops)}
    if transformer_optimizer:  # opt_level 0 never splits an exported Attention op: those counts are the file's
        extra["as_exported"] = sum(c.op is not None for c in cores)
    return _verdict(cores, _ort_attention(graph, cores), name, **extra)


def tensorrt_fusion(path: str | Path, cores: list[AttentionCore] | None = None) -> dict[str, Any]:
    """TensorRT's fused layers can be read only from a deserialized engine (``IEngineInspector``), which needs a
    CUDA GPU; without one the audit reports why, and no verdict."""
    cores = attention_cores(path) if cores is None else cores
    gpu = gpu_info()
    reason = (
        (
            "no CUDA GPU here: an engine's layers are read from the deserialized engine (IEngineInspector), "
            "which TensorRT does only on a GPU"
        )
        if gpu is None
        else "engine inspection on a GPU is not part of this audit yet"
    )
    return {"runtime": "tensorrt", "inspected": False, "cores": len(cores), "fused": None, "reason": reason}


def audit(path: str | Path, threads: int = 1) -> dict[str, Any]:
    """The attention cores of an ONNX file and, for each runtime here, which of them it runs fused."""
    cores = attention_cores(path)
    return {
        "file": str(path),
        "cores": [dict(asdict(c), dot_product=c.dot_product) for c in cores],
        "runtimes": [
            openvino_fusion(path, cores, threads),
            onnxruntime_fusion(path, cores),
            onnxruntime_fusion(path, cores, transformer_optimizer=True),
            tensorrt_fusion(path, cores),
        ],
    }


def markdown(result: dict[str, Any]) -> str:
    """One row per runtime: its fused cores of all, and the kernel that computes the first fused one (every value
    escaped: node names come from the ONNX file)."""
    cores = result["cores"]
    dot = sum(bool(c.get("dot_product")) for c in cores)
    lines = [
        f"{len(cores)} attention cores, {dot} with dot-product scores (the form attention fusion matches). "
        f"{mdtext.text(FUSED)}. {mdtext.text(inspected_line(result['runtimes']))}",
        "",
        "| runtime | fused cores | kernel (first fused core) |",
        "|---|---|---|",
    ]
    for r in result["runtimes"]:
        name = mdtext.text(runtime_label(r))
        if not r.get("inspected"):
            lines.append(f"| {name} | not inspected | {mdtext.text(r.get('reason'))} |")
            continue
        first = next((c["kernel"] for c in r.get("per_core", []) if c.get("kernel")), None)
        lines.append(f"| {name} | {_int(r.get('fused'))} of {_int(r.get('cores'))} | {mdtext.text(first or '-')} |")
    return "\n".join(lines)


def _int(value: Any) -> str:
    return str(value) if isinstance(value, int) else "?"


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnzoo.runtime.fusion", description=__doc__.splitlines()[0])
    parser.add_argument("onnx", type=Path, help="an ONNX file (an attnzoo export or any ViT-like model)")
    parser.add_argument("--json", action="store_true", help="print the whole audit as JSON")
    args = parser.parse_args(argv)
    if not args.onnx.is_file():
        raise UsageError(f"no such file: {args.onnx}")
    result = audit(args.onnx)
    print(json.dumps(result, indent=1) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
