"""The fused L1 core of the MAE variants in ONNX: ``attnzoo::l1_attention`` as one ``Loop`` over query tiles.

Paper: Yi Jin, "Divergence vs. Convergence: What Do We Need? -- Substitutes for 'Attention'", 2024, eq. 5-6.

The torch exporter has no ONNX form for the custom op; :data:`TRANSLATIONS` gives it one (``torch.onnx.export``'s
``custom_translation_table``). The heads of all images are flattened to (B*M) rows and the queries padded to
``T`` tiles of ``bq``; one ``Loop`` iteration computes one tile of one head from end to end with ordinary ops and
emits it as a scan output:

- the distances as in :func:`attnzoo.models.wafe.pairwise_l1`: ``2 sum_c max(q_ic, k_jc) - sum_c q_ic -
  sum_c k_jc``, channels first (``Max`` of a query column against contiguous rows of keys, the channel sum a
  ``MatMul`` with a row of twos);
- ``Softmax(sign * scale * dist)`` and ``MatMul`` with the head's values.

So the graph never holds the N x N scores of a head, let alone of all of them: one (bq, d, N) slab of maxima and
one (bq, N) tile of scores live at a time, :data:`SLAB_BYTES` at most (``bq`` from :func:`loop_block`), whatever
the batch. The loop's trip count is computed from the input's shape, so the batch stays dynamic. Only the mask-free,
non-causal core exports this way (an image model's); :func:`attnzoo.models.wafe.onnx_mae_impl` says when it is used.

Every node is made while the exporter translates the op, so it carries the op's module path and is named
``blocks.N.attn.distance/...`` like the other forms (the extra-math check counts the scope's ``Loop``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnxscript
from onnxscript import FLOAT, ir

from attnzoo.models.kernels import L1_ATTENTION_OP

#: onnxscript's ops, typed for its own tensors, not the exporter's ``ir.Value``s they are called with here.
op: Any = onnxscript.opset20
_call_op: Callable[..., Sequence[ir.Value]] | None
try:  # private: the exporter's recorder of multi-output nodes (Loop, Scan) in a translation
    from torch.onnx._internal.exporter._torchlib.ops.hop import call_op as _call_op
except ImportError:
    _call_op = None

__all__ = ["SLAB_BYTES", "loop_block", "l1_attention_loop", "TRANSLATIONS"]

#: Bytes of the (bq, d, N) slab of maxima of one loop iteration: 16 MiB (16 queries at 4,097 tokens, 64 at 1,025,
#: for a 64-channel head).
SLAB_BYTES = 16 * 2**20


def _record_op(op_type: str, *inputs: ir.Value, body: ir.Graph, outputs: int) -> list[ir.Value]:
    """A node of ``outputs`` outputs recorded where the exporter records the translation's nodes: onnxscript's
    ``op.Loop`` gives a Loop one output only (its schema's outputs are variadic), so the exporter's own helper for
    its Loop and Scan nodes (``torch.onnx``'s higher-order-op translations) records it."""
    if _call_op is None:
        raise NotImplementedError(f"this torch's ONNX exporter has no {op_type} builder (torch 2.6 or later has one)")
    return list(_call_op(op_type, *inputs, body=body, _num_outputs=outputs))


def _static(value: Any, *axes: int) -> list[int]:
    """The sizes of ``value`` (an ``ir.Value``) on ``axes``, which the export knows (every axis but the batch)."""
    shape = value.shape
    if shape is None or not all(isinstance(shape[a], int) for a in axes):
        raise ValueError(f"the ONNX Loop form needs static sizes on axes {axes}, got {shape}")
    return [int(shape[a]) for a in axes]


def loop_block(n_q: int, n_k: int, d: int) -> int:
    """Queries per loop iteration: as many as keep the slab of maxima within :data:`SLAB_BYTES` (1 .. ``n_q``)."""
    return max(1, min(n_q, SLAB_BYTES // (4 * max(1, d) * max(1, n_k))))


def _const(nodes: list[ir.Node], array: Any, name: str) -> ir.Value:
    node = ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", ir.tensor(np.asarray(array), name=name))])
    nodes.append(node)
    return node.outputs[0]


def _node(nodes: list[ir.Node], op_type: str, *inputs: ir.Value, **attrs: Any) -> ir.Value:
    attributes = [ir.AttrInt64s(k, v) if isinstance(v, list) else ir.AttrInt64(k, v) for k, v in attrs.items()]
    node = ir.Node("", op_type, list(inputs), attributes=attributes)
    nodes.append(node)
    return node.outputs[0]


def _tile_body(qt: ir.Value, kt: ir.Value, ks: ir.Value, vf: ir.Value, tiles: int, d: int, coef: float) -> ir.Graph:
    """The loop body: iteration ``i`` takes query tile ``qt[i]`` (bq, d) of head ``i // tiles`` and emits its
    output rows (bq, dv); ``kt`` (B*M, d, N), ``ks`` (B*M, 1, N) and ``vf`` (B*M, N, dv) from the outer graph."""
    i = ir.Value(name="tile_index", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    cond_in = ir.Value(name="tile_cond_in", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
    count_in = ir.Value(name="tile_count_in", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([]))
    nodes: list[ir.Node] = []
    cond_out = _node(nodes, "Identity", cond_in)
    count_out = _node(nodes, "Identity", count_in)
    head = _node(nodes, "Div", i, _const(nodes, np.int64(tiles), "tiles"))
    q_i = _node(nodes, "Gather", qt, i, axis=0)  # (bq, d)
    k_h, ks_h, v_h = (_node(nodes, "Gather", t, head, axis=0) for t in (kt, ks, vf))  # (d, N), (1, N), (N, dv)
    last = _const(nodes, np.array([-1], np.int64), "last")
    maxima = _node(nodes, "Max", _node(nodes, "Unsqueeze", q_i, last), k_h)  # (bq, d, N)
    twos = _const(nodes, np.full((1, d), 2.0, np.float32), "twos")
    mid = _const(nodes, np.array([-2], np.int64), "mid")
    doubled = _node(nodes, "Squeeze", _node(nodes, "MatMul", twos, maxima), mid)  # (bq, N): 2 sum_c max
    q_sum = _node(nodes, "ReduceSum", q_i, last, keepdims=1)  # (bq, 1)
    dist = _node(nodes, "Sub", _node(nodes, "Sub", doubled, q_sum), ks_h)  # (bq, N)
    scores = _node(nodes, "Mul", dist, _const(nodes, np.float32(coef), "coef"))
    out = _node(nodes, "MatMul", _node(nodes, "Softmax", scores, axis=-1), v_h)  # (bq, dv)
    return ir.Graph([i, cond_in, count_in], [cond_out, count_out, out], nodes=nodes, name="l1_attention_tile")


def l1_attention_loop(
    q: FLOAT,
    k: FLOAT,
    v: FLOAT,
    attn_mask: FLOAT | None,
    sign: float,
    scale: float,
    is_causal: bool,
    block_q: int,
    block_k: int,
) -> tuple[FLOAT, FLOAT]:
    """The ONNX translation of ``attnzoo::l1_attention`` (its schema's arguments, annotated with onnxscript's
    types, from which the exporter reads its signature; the block sizes of the CPU kernel are not used):
    ``(out, lse)``, ``lse`` a placeholder the models never read. The exporter passes ``ir.Value``s."""
    if attn_mask is not None or is_causal:
        raise ValueError("the ONNX Loop form of attnzoo::l1_attention takes no mask and is not causal")
    heads, n_q, d = _static(q, 1, 2, 3)
    n_k, dv = _static(k, 2)[0], _static(v, 3)[0]
    bq = loop_block(n_q, n_k, d)
    tiles = -(-n_q // bq)
    qf = op.Reshape(q, op.Constant(value_ints=[-1, n_q, d]))  # (B*M, Nq, d)
    qp = op.Pad(qf, op.Constant(value_ints=[0, 0, 0, 0, tiles * bq - n_q, 0]))
    qt = op.Reshape(qp, op.Constant(value_ints=[-1, bq, d]))  # (B*M*T, bq, d): iteration i, tile i
    kf = op.Reshape(k, op.Constant(value_ints=[-1, n_k, d]))
    kt = op.Transpose(kf, perm=[0, 2, 1])  # (B*M, d, Nk): channels first
    ks = op.ReduceSum(kt, op.Constant(value_ints=[1]), keepdims=1)  # (B*M, 1, Nk)
    vf = op.Reshape(v, op.Constant(value_ints=[-1, n_k, dv]))
    trips = op.Gather(op.Shape(qt), op.Constant(value_int=0), axis=0)
    body = _tile_body(qt, kt, ks, vf, tiles, d, sign * scale)
    # one loop-carried value passed through (onnxscript's Loop takes at least one), then the scan output
    _, rows = _record_op("Loop", trips, op.Constant(value=ir.tensor(np.array(True))), trips, body=body, outputs=2)
    out = op.Reshape(rows, op.Constant(value_ints=[-1, heads, tiles * bq, dv]))
    out = op.Slice(out, op.Constant(value_ints=[0]), op.Constant(value_ints=[n_q]), op.Constant(value_ints=[2]))
    lse = op.ReduceSum(q, op.Constant(value_ints=[-1]), keepdims=0)  # placeholder: never read, pruned
    return out, lse


#: ``torch.onnx.export``'s ``custom_translation_table`` for the package's custom ops.
TRANSLATIONS: dict[Callable[..., Any], Callable[..., Any]] = {L1_ATTENTION_OP: l1_attention_loop}
