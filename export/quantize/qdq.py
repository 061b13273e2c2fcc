"""Q/DQ graphs: where ModelOpt may put the Q/DQ nodes (the placements), what a quantized graph quantizes
(:func:`qdq_summary`), its groups of activation Q/DQ pairs (:func:`qdq_groups`), and the graph surgery that
points a reader back at fp32 values (the extra math, a group left unquantized)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import onnx

from attnzoo.runtime.contract import config_from_props, metadata_props
from attnzoo.runtime.precision import get_precision

from ..check import expected_scopes, graph_depth

__all__ = [
    "QUANTIZED_OP_TYPES",
    "QDQ_PLACEMENTS",
    "TENSORRT_QDQ_PLACEMENT",
    "AUTO_QDQ_PLACEMENT",
    "PLACEMENT_CHOICES",
    "DEFAULT_QDQ_PLACEMENT",
    "CPU_QDQ_PLACEMENT",
    "qdq_placement_error",
    "extra_math_nodes",
    "qdq_summary",
    "qdq_groups",
]

#: Op types whose quantization the report counts.
QUANTIZED_OP_TYPES: tuple[str, ...] = ("MatMul", "Gemm", "Conv")
#: Where ModelOpt puts the Q/DQ nodes (``--qdq-placement``), as extra ``modelopt.onnx.quantization.quantize``
#: arguments. ``tensorrt``: ModelOpt's default, also on residual Adds and the attention core's two matmuls, which
#: TensorRT fuses into int8 kernels. ``cpu``: only in front of the MatMul/Gemm/Conv weights' consumers outside the
#: attention core, the ops ONNX Runtime's CPU kernels run in int8; its other Q/DQ pairs are dequantized straight
#: into fp32 ops (a residual Add into LayerNorm), pure cost there. On an Intel Xeon with AMX, ONNX Runtime's int8
#: speed-up over fp32 is larger with ``cpu`` than with ``tensorrt`` (the figures:
#: ``results/studies/quantized-speed-amx/README.md``).
QDQ_PLACEMENTS: Mapping[str, Mapping[str, Any]] = {
    "tensorrt": {},
    "cpu": {"op_types_to_quantize": list(QUANTIZED_OP_TYPES), "disable_mha_qdq": True},
}
#: ModelOpt's own placement (what TensorRT fuses best).
TENSORRT_QDQ_PLACEMENT = "tensorrt"
#: The measured placement (:func:`auto_placement`): ModelOpt's ``tensorrt`` placement calibrated once, then its
#: groups of Q/DQ pairs (each weight MatMul/Gemm/Conv's activation input, each block's attention matmuls and
#: residual Adds) kept only where the output's promised cosine (:func:`promised_cosine`) on the choosing inputs
#: stays within :data:`DEFAULT_MIN_COSINE` of fp32.
AUTO_QDQ_PLACEMENT = "auto"
#: ``--qdq-placement`` choices: ModelOpt's two and the measured one.
PLACEMENT_CHOICES: tuple[str, ...] = (AUTO_QDQ_PLACEMENT, *QDQ_PLACEMENTS)
#: ``export-model``'s placement: measured, so that a pretrained model with outlier activations is not silently
#: degraded by ModelOpt's full placement, while a model that keeps its fidelity under it keeps all of it.
DEFAULT_QDQ_PLACEMENT = AUTO_QDQ_PLACEMENT
#: The placement of the int8 models this package runs on the CPU itself (bench-latency's ``ort-cpu``, the zoo's
#: int8 copies in the demo and serve-models).
CPU_QDQ_PLACEMENT = "cpu"
_QDQ = ("QuantizeLinear", "DequantizeLinear")
#: Ops that move values without computing on them (followed from a DequantizeLinear to its readers).
_LAYOUT_OPS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten")


def qdq_placement_error(placement: str, dtype: str) -> str | None:
    """One line saying why ``placement`` cannot be used for ``dtype``, or ``None``."""
    if placement not in PLACEMENT_CHOICES:
        return f"unknown Q/DQ placement {placement!r}; valid: {', '.join(PLACEMENT_CHOICES)}"
    if placement == CPU_QDQ_PLACEMENT and not get_precision(dtype).cpu_runtimes:
        return f"--qdq-placement cpu is for int8 on the CPU runtimes; {dtype} is TensorRT's (use tensorrt)"
    return None


def extra_math_nodes(proto: onnx.ModelProto, config: Mapping[str, Any] | None = None) -> list[str]:
    """Names of the nodes under the variant's extra-math scopes (e.g. ``blocks.0.attn.projection/...``).

    The scopes are :func:`attnzoo.export.check.expected_scopes` for the graph's depth; a node belongs to a scope
    when its name is the scope or starts with ``scope + "/"``. Empty for variants without extra math.

    Args:
        proto: An attnzoo export (fp32, or a quantized copy: the Q/DQ nodes ModelOpt adds are never named
            inside a scope unless quantizing it).
        config: The model config; default from the graph's metadata.
    """
    config = dict(config) if config is not None else config_from_props(metadata_props(proto))
    blocks = "encoder.blocks" if config["task"] == "seg" else "blocks"  # a Segmenter's blocks are its encoder's
    scopes = expected_scopes(config, graph_depth(proto, blocks))
    return [n.name for n in proto.graph.node if any(n.name == s or n.name.startswith(s + "/") for s in scopes)]


def _producers(proto: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in proto.graph.node for o in n.output}


def _constants(proto: onnx.ModelProto) -> set:
    """Names of the graph's initializers and Constant outputs."""
    return {t.name for t in proto.graph.initializer} | {
        o for n in proto.graph.node if n.op_type == "Constant" for o in n.output
    }


def _fed_by_dq(node: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto]) -> bool:
    """A node reads a DequantizeLinear output (possibly through layout ops that keep the values)."""
    for name in node.input:
        p = producers.get(name)
        while p is not None and p.op_type in _LAYOUT_OPS:
            p = producers.get(p.input[0])
        if p is not None and p.op_type == "DequantizeLinear":
            return True
    return False


def _reroute_extra_math(proto: onnx.ModelProto, extra_nodes: Sequence[str], weights: bool = True) -> list[str]:
    """Make extra-math ops read fp32 values where ModelOpt quantized a tensor they share with a quantized op.

    ModelOpt quantizes a *tensor* once: when the attention's ``V`` feeds both a quantized MatMul and the
    projection (through a Transpose/Reshape), every consumer reads the dequantized ``V``, excluded or not. Here
    each extra-math input that comes from a ``QuantizeLinear -> DequantizeLinear`` pair (through layout ops) is
    re-pointed at the pair's fp32 input (layout ops cloned as ``<name>__fp32``); layout and Q/DQ nodes left
    without consumers are removed. ``weights=False`` leaves an input whose ``QuantizeLinear`` reads a constant (a
    weight) quantized. Returns the extra-math inputs re-pointed (``node:input``).
    """
    producers = _producers(proto)
    consts = _constants(proto)
    extra = set(extra_nodes)
    clones: dict[str, list[onnx.NodeProto]] = {}
    fp32_name: dict[str, str | None] = {}

    def unquantized(name: str) -> str | None:
        if name in fp32_name:
            return fp32_name[name]
        p, found = producers.get(name), None
        if p is not None and p.op_type == "DequantizeLinear":
            q = producers.get(p.input[0])
            found = (
                q.input[0]
                if q is not None and q.op_type == "QuantizeLinear" and (weights or q.input[0] not in consts)
                else None
            )
        elif p is not None and p.op_type in _LAYOUT_OPS:
            src = unquantized(p.input[0])
            if src is not None:
                clone = onnx.NodeProto.FromString(p.SerializeToString())
                clone.name = f"{p.name}__fp32"
                clone.input[0] = src
                del clone.output[:]
                clone.output.extend(f"{o}__fp32" for o in p.output)
                clones.setdefault(p.name, []).append(clone)
                found = clone.output[0]
        fp32_name[name] = found
        return found

    rerouted = []
    for node in proto.graph.node:
        if node.name in extra:
            for i, name in enumerate(node.input):
                src = unquantized(name) if name else None
                if src is not None:
                    node.input[i] = src
                    rerouted.append(f"{node.name}:{i}")
    nodes = [m for n in proto.graph.node for m in (n, *clones.get(n.name, ()))]
    outputs = {o.name for o in proto.graph.output}
    while True:  # drop layout / Q/DQ nodes nobody reads any more
        used = {i for n in nodes for i in n.input} | outputs
        keep = [n for n in nodes if n.op_type not in (*_LAYOUT_OPS, *_QDQ) or any(o in used for o in n.output)]
        if len(keep) == len(nodes):
            break
        nodes = keep
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return rerouted


def qdq_summary(proto: onnx.ModelProto, extra_nodes: Sequence[str]) -> dict[str, Any]:
    """Where the Q/DQ nodes of a quantized graph are.

    Returns:
        ``{"quantize_linear", "dequantize_linear", "quantized_ops": {MatMul/Gemm/Conv: n quantized},
        "total_ops": {op: n}, "quantized_matmuls": [names fed by a DequantizeLinear], "extra_math_nodes": n,
        "extra_math_quantized": [extra-math nodes fed by a DequantizeLinear or Q/DQ named inside a scope]}``.
    """
    producers = _producers(proto)
    extra = set(extra_nodes)
    scopes = {n.rsplit("/", 1)[0] for n in extra}
    counts = Counter(n.op_type for n in proto.graph.node)
    quantized: Counter = Counter()
    matmuls, in_extra = [], []
    for node in proto.graph.node:
        fed = _fed_by_dq(node, producers)
        if node.op_type in QUANTIZED_OP_TYPES and fed:
            quantized[node.op_type] += 1
            if node.op_type == "MatMul":
                matmuls.append(node.name)
        if (node.name in extra and fed) or (node.op_type in _QDQ and node.name.rsplit("/", 1)[0] in scopes):
            in_extra.append(node.name)
    return {
        "quantize_linear": counts["QuantizeLinear"],
        "dequantize_linear": counts["DequantizeLinear"],
        "quantized_ops": {op: quantized[op] for op in QUANTIZED_OP_TYPES},
        "total_ops": {op: counts[op] for op in QUANTIZED_OP_TYPES},
        "quantized_matmuls": matmuls,
        "extra_math_nodes": len(extra),
        "extra_math_quantized": in_extra,
    }


def _block_of(name: str) -> str:
    """``blocks.3.attn/MatMul`` -> ``blocks.3`` (``encoder.blocks.3`` in a Segmenter); ``other`` outside blocks."""
    match = re.match(r"^((?:encoder\.)?blocks\.\d+)[./]", name)
    return match.group(1) if match else "other"


def qdq_groups(proto: onnx.ModelProto, fixed: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """The activation Q/DQ pairs of a ModelOpt graph, grouped: ``<module> input`` (kind ``weights``: the
    activation input of one weight MatMul/Gemm/Conv, e.g. ``blocks.3.mlp.fc1 input``; its weight stays int8),
    ``<block> attention`` (attention's two matmuls: both inputs are activations) and ``<block> residual`` (the
    residual Adds and whatever else reads a dequantized activation that is not a weight matmul). Nodes in
    ``fixed`` (the extra math under ``--quantize-extra-math``) belong to no group: they stay quantized.

    Returns:
        ``{group: {"kind": "weights" | "attention" | "residual", "block", "nodes": [reader names]}}`` (the readers
        to point back at fp32 values to leave the group unquantized, :func:`_reroute_extra_math`).
    """
    producers = _producers(proto)
    consts = _constants(proto)

    def source(name: str) -> onnx.NodeProto | None:
        p = producers.get(name)
        while p is not None and p.op_type in _LAYOUT_OPS:
            p = producers.get(p.input[0])
        return p

    def dq_of(name: str) -> tuple[onnx.NodeProto | None, onnx.NodeProto | None]:
        """The DequantizeLinear behind ``name`` (through layout ops) and the QuantizeLinear feeding it."""
        p = source(name)
        if p is None or p.op_type != "DequantizeLinear":
            return None, None
        q = producers.get(p.input[0])
        return p, q if q is not None and q.op_type == "QuantizeLinear" else None

    def weight(name: str) -> bool:  # a constant, or a constant quantized (int8 stored, or fp32 -> Q -> DQ)
        p, q = dq_of(name)
        return name in consts or (p is not None and (q is None or q.input[0] in consts))

    def activation_dq(name: str) -> bool:
        p, q = dq_of(name)
        return q is not None and q.input[0] not in consts

    groups: dict[str, dict[str, Any]] = {}
    fixed_names = set(fixed)
    for node in proto.graph.node:
        if node.op_type in _QDQ or node.name in fixed_names or not any(activation_dq(i) for i in node.input if i):
            continue
        block = _block_of(node.name)
        if node.op_type in QUANTIZED_OP_TYPES and any(weight(i) for i in node.input if i):
            kind, name = "weights", f"{node.name.split('/')[0]} input"
        else:
            kind = "attention" if node.op_type == "MatMul" else "residual"
            name = f"{block} {kind}"
        group = groups.setdefault(name, {"kind": kind, "block": block, "nodes": []})
        group["nodes"].append(node.name)
    return groups


def _without(proto: onnx.ModelProto, groups: Mapping[str, Mapping[str, Any]], names: Sequence[str]) -> onnx.ModelProto:
    """A copy of ``proto`` whose ``names`` groups read fp32 values (their Q/DQ pairs bypassed)."""
    copy = onnx.ModelProto.FromString(proto.SerializeToString())
    _reroute_extra_math(copy, [n for g in names for n in groups[g]["nodes"]], weights=False)
    return copy
