"""FP8 simulation: ModelOpt's FP8 Q/DQ graph in float ops that ONNX Runtime's CPU provider runs (it refuses
float8 tensors into Transpose), rounding exactly as QuantizeLinear does."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["simulate_fp8"]

_FP8_TYPES = {TensorProto.FLOAT8E4M3FN}
_QDQ = ("QuantizeLinear", "DequantizeLinear")


def simulate_fp8(proto: onnx.ModelProto) -> onnx.ModelProto:
    """ModelOpt's FP8 Q/DQ graph rewritten into float ops that ONNX Runtime's CPU provider runs.

    Every ``QuantizeLinear(x, s, zp: float8e4m3fn)`` becomes ``Cast(Cast(x / s, to=FLOAT8E4M3FN, saturate=1),
    to=FLOAT)``: the values QuantizeLinear produces (round to nearest even on the e4m3 grid, saturating at
    +-448), held in float32; the layout ops between Q and DQ (Transpose) then move the same values; every
    ``DequantizeLinear(q, s, zp: float8)`` becomes ``q * s`` (an fp8 zero point is 0). Same points, same
    scales (a per-channel scale broadcast along the node's ``axis``); only the storage type of the quantized
    tensors differs.

    Raises:
        ValueError: a float8 Q/DQ with a non-constant scale, a non-zero zero point, or a per-channel scale on a
            tensor of unknown rank.
    """
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    inits = {t.name: t for t in proto.graph.initializer}
    consts = {
        n.output[0]: n.attribute[0].t
        for n in proto.graph.node
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
    }

    def tensor(name: str) -> onnx.TensorProto | None:
        return inits.get(name) or consts.get(name)

    ranks = _ranks(proto)
    nodes: list[onnx.NodeProto] = []
    for node in proto.graph.node:
        zp_t = tensor(node.input[2]) if node.op_type in _QDQ and len(node.input) > 2 and node.input[2] else None
        if zp_t is None or zp_t.data_type not in _FP8_TYPES:
            nodes.append(node)
            continue
        scale_t = tensor(node.input[1])
        if scale_t is None or np.any(numpy_helper.to_array(zp_t).astype(np.float32) != 0):
            raise ValueError(f"{node.name}: FP8 simulation needs a constant scale and zero point 0")
        s = _broadcast_scale(proto, inits, node, numpy_helper.to_array(scale_t).astype(np.float32), ranks)
        nodes += _simulated(node, s)
        if node.op_type == "QuantizeLinear":
            ranks[node.output[0]] = ranks.get(node.input[0], -1)
    _replace_nodes(proto, nodes)
    return proto


def _ranks(proto: onnx.ModelProto) -> dict[str, int]:
    """The rank of every tensor shape inference knows (the initializers' at least)."""
    ranks: dict[str, int] = {t.name: len(t.dims) for t in proto.graph.initializer}
    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
        for v in (*inferred.value_info, *inferred.input, *inferred.output):
            if v.type.tensor_type.HasField("shape"):
                ranks.setdefault(v.name, len(v.type.tensor_type.shape.dim))
    except Exception:  # ranks are only needed for per-channel scales; refused if unknown
        pass
    return ranks


def _broadcast_scale(
    proto: onnx.ModelProto,
    inits: dict[str, onnx.TensorProto],
    node: onnx.NodeProto,
    scale: np.ndarray,
    ranks: dict[str, int],
) -> str:
    """The name of ``node``'s scale as the simulation multiplies by it: itself when per-tensor; a per-channel
    scale reshaped to broadcast along the node's ``axis`` (added to the graph once)."""
    if scale.size == 1:
        return node.input[1]
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    rank = ranks.get(node.input[0])
    if rank is None or scale.ndim != 1:
        raise ValueError(f"{node.name}: per-channel FP8 scale on a tensor of unknown rank")
    shape = [1] * rank
    shape[axis % rank] = scale.size
    name = f"{node.input[1]}__sim_axis{axis % rank}_rank{rank}"
    if name not in inits:
        inits[name] = numpy_helper.from_array(scale.reshape(shape), name)
        proto.graph.initializer.append(inits[name])
    return name


def _simulated(node: onnx.NodeProto, s: str) -> list[onnx.NodeProto]:
    """``QuantizeLinear`` as ``Cast(Cast(x / s, FLOAT8E4M3FN, saturate), FLOAT)``; ``DequantizeLinear`` as ``q * s``."""
    x, y = node.input[0], node.output[0]
    if node.op_type != "QuantizeLinear":
        return [helper.make_node("Mul", [x, s], [y], name=f"{node.name}__sim_scale")]
    return [
        helper.make_node("Div", [x, s], [f"{y}__sim_div"], name=f"{node.name}__sim_div"),
        helper.make_node(
            "Cast",
            [f"{y}__sim_div"],
            [f"{y}__sim_fp8"],
            to=TensorProto.FLOAT8E4M3FN,
            saturate=1,
            name=f"{node.name}__sim_round",
        ),
        helper.make_node("Cast", [f"{y}__sim_fp8"], [y], to=TensorProto.FLOAT, name=f"{node.name}__sim_float"),
    ]


def _replace_nodes(proto: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> None:
    """``proto``'s nodes become ``nodes``; the float8 tensors' stale types and unused float8 initializers go."""
    # float8 tensors between Q and DQ (Transpose outputs) are float32 now: drop their stale value_info types
    keep = [v for v in proto.graph.value_info if v.type.tensor_type.elem_type not in _FP8_TYPES]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(keep)
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    used = {i for n in proto.graph.node for i in n.input}
    stale = [t for t in proto.graph.initializer if t.data_type in _FP8_TYPES and t.name not in used]
    for t in stale:
        proto.graph.initializer.remove(t)
