"""FP8 simulation: ModelOpt's FP8 Q/DQ graph in float ops that ONNX Runtime's CPU provider runs (it refuses
float8 tensors into Transpose), rounding exactly as QuantizeLinear does."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .qdq import _QDQ

__all__ = ["simulate_fp8"]

_FP8_TYPES = {TensorProto.FLOAT8E4M3FN}


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

    def is_fp8(node: onnx.NodeProto) -> bool:
        zp = tensor(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        return zp is not None and zp.data_type in _FP8_TYPES

    ranks: dict[str, int] = {t.name: len(t.dims) for t in proto.graph.initializer}
    try:
        inferred = onnx.shape_inference.infer_shapes(proto).graph
        for v in (*inferred.value_info, *inferred.input, *inferred.output):
            if v.type.tensor_type.HasField("shape"):
                ranks.setdefault(v.name, len(v.type.tensor_type.shape.dim))
    except Exception:  # noqa: BLE001 - ranks are only needed for per-channel scales; refused below if unknown
        pass
    nodes: list[onnx.NodeProto] = []
    for node in proto.graph.node:
        if not (node.op_type in _QDQ and is_fp8(node)):
            nodes.append(node)
            continue
        zp_t = tensor(node.input[2])
        assert zp_t is not None  # is_fp8: a constant float8 zero point
        zp = numpy_helper.to_array(zp_t).astype(np.float32)
        scale_t = tensor(node.input[1])
        if scale_t is None or np.any(zp != 0):
            raise ValueError(f"{node.name}: FP8 simulation needs a constant scale and zero point 0")
        x, s, y = node.input[0], node.input[1], node.output[0]
        scale = numpy_helper.to_array(scale_t).astype(np.float32)
        if scale.size != 1:  # per-channel: broadcast the scale along the node's axis
            axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
            rank = ranks.get(x)
            if rank is None or scale.ndim != 1:
                raise ValueError(f"{node.name}: per-channel FP8 scale on a tensor of unknown rank")
            shape = [1] * rank
            shape[axis % rank] = scale.size
            s = f"{s}__sim_axis{axis % rank}_rank{rank}"
            if s not in inits:
                inits[s] = numpy_helper.from_array(scale.reshape(shape), s)
                proto.graph.initializer.append(inits[s])
        if node.op_type == "QuantizeLinear":
            nodes += [
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
            ranks[y] = ranks.get(x, -1)
        else:
            nodes.append(helper.make_node("Mul", [x, s], [y], name=f"{node.name}__sim_scale"))
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
    return proto
