"""The projection checker: every block of a projection variant holds its orthogonal projection as plain ops.

For each ``blocks.N.attn.projection`` / ``blocks.N.attn.head_projection`` (``encoder.blocks.N...`` in a
Segmenter) the exported graph must contain, under that node-name scope, the two inner products
(``Mul`` + ``ReduceSum``, twice), ``Add`` (eps, a constant), ``Div``, ``Mul`` (coef * v) and ``Sub``, all computing
in fp32 (also in an fp16 graph), and no op outside the standard ONNX domain. In an fp16 graph LayerNorm and
Softmax must compute in fp32 too. The block count comes from the graph's node names (any depth).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import onnx
from onnx import numpy_helper

from .onnx_export import FP32_OPS, config_from_props, metadata_props

__all__ = ["REQUIRED_OPS", "PROJECTION_MODULES", "ProjectionCheckError", "check_projection", "assert_projection",
           "expected_scopes", "graph_depth"]

#: Minimum count of each op type inside one projection scope.
REQUIRED_OPS: Dict[str, int] = {"Mul": 3, "ReduceSum": 2, "Add": 1, "Div": 1, "Sub": 1}
#: Which projection sub-modules each projection variant has in every block.
PROJECTION_MODULES: Dict[str, Tuple[str, ...]] = {
    "belief": ("projection",),
    "belief-star": ("projection", "head_projection"),
    "exclusive": ("head_projection",),
    "belief2": ("projection",),
}
_STANDARD_DOMAINS = ("", "ai.onnx")


class ProjectionCheckError(ValueError):
    """An exported graph lacks projection ops (or computes them in the wrong precision)."""


def _block_prefix(config: Dict[str, Any]) -> str:
    """Module path of the block list: ``blocks`` (classifier) or ``encoder.blocks`` (Segmenter)."""
    return "encoder.blocks" if config["task"] == "seg" else "blocks"


def graph_depth(proto: onnx.ModelProto, prefix: str = "blocks") -> int:
    """Number of transformer blocks in an exported graph: 1 + the highest ``<prefix>.N`` in its node names.

    Taken from the graph, not from an arch table, so any depth (a converted timm ViT) is checked; a block
    whose nodes are all gone below the highest index still counts, and its projection is reported missing.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)[./]")
    found = [int(m.group(1)) for m in (pattern.match(n.name) for n in proto.graph.node) if m]
    return max(found) + 1 if found else 0


def expected_scopes(config: Dict[str, Any], depth: int) -> List[str]:
    """Node-name scopes that must hold a projection, e.g. ``blocks.0.attn.projection`` (empty for others)."""
    modules = PROJECTION_MODULES.get(config["variant"], ())
    return [f"{_block_prefix(config)}.{i}.attn.{m}" for i in range(depth) for m in modules]


def _elem_types(proto: onnx.ModelProto) -> Dict[str, int]:
    """Value name -> element type, from ONNX shape inference."""
    graph = onnx.shape_inference.infer_shapes(proto).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({t.name: t.data_type for t in proto.graph.initializer})
    return types


def _constants(proto: onnx.ModelProto) -> Dict[str, np.ndarray]:
    """Initializers and Constant-node outputs by name."""
    out = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            out[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return out


def _check_scope(scope: str, nodes: List[onnx.NodeProto], types: Dict[str, int],
                 consts: Dict[str, np.ndarray], eps: Optional[float]) -> List[str]:
    """Failures of one projection scope."""
    failures = []
    counts = Counter(n.op_type for n in nodes)
    for op, need in REQUIRED_OPS.items():
        if counts[op] < need:
            failures.append(f"{scope}: {counts[op]} {op} node(s), need {need}")
    for node in nodes:
        if node.op_type in REQUIRED_OPS and types.get(node.output[0]) != onnx.TensorProto.FLOAT:
            failures.append(f"{scope}: {node.name} does not compute in fp32")
    adds = [n for n in nodes if n.op_type == "Add"]
    for node in adds:
        values = [consts[i] for i in node.input if i in consts]
        if not values:
            failures.append(f"{scope}: {node.name} adds no constant (eps)")
        elif eps is not None and not np.isclose(float(np.ravel(values[0])[0]), eps, rtol=1e-3, atol=0.0):
            failures.append(f"{scope}: {node.name} adds {float(np.ravel(values[0])[0]):g}, metadata eps {eps:g}")
    return failures


def check_projection(model: Union[str, Path, onnx.ModelProto], config: Optional[Dict[str, Any]] = None,
                     dtype: Optional[str] = None) -> Dict[str, Any]:
    """Find the projection ops of every block; never raises for a missing op (see ``failures``).

    Args:
        model: ONNX file or proto exported by :func:`attnzoo.export.export_onnx`.
        config: The model config (variant, task); default: read from the file's metadata. The block count
            comes from the graph (:func:`graph_depth`).
        dtype: ``fp32``/``fp16``; default from metadata. For fp16 LayerNorm and Softmax must compute in fp32.

    Returns:
        ``{"ok", "failures": [str], "blocks": {scope: {"ops": {op: n}, "nodes": [names]}}, "nodes_per_block",
        "non_standard_ops", "depth"}``.
    """
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
    props = metadata_props(proto)
    if config is None:
        if "attnzoo.config" not in props:
            raise ProjectionCheckError("the graph has no attnzoo.config metadata; pass config=")
        config = config_from_props(props)
    dtype = dtype or props.get("dtype", "fp32")
    eps = float(props["eps"]) if props.get("eps") else None
    by_scope: Dict[str, List[onnx.NodeProto]] = defaultdict(list)
    for node in proto.graph.node:
        by_scope[node.name.rsplit("/", 1)[0]].append(node)
    types, consts = _elem_types(proto), _constants(proto)
    failures: List[str] = []
    blocks: Dict[str, Any] = {}
    depth = graph_depth(proto, _block_prefix(config))
    if depth == 0 and config["variant"] in PROJECTION_MODULES:
        failures.append(f"no {_block_prefix(config)}.N nodes in the graph (blocks missing or renamed)")
    for scope in expected_scopes(config, depth):
        nodes = by_scope.get(scope, [])
        if not nodes:
            failures.append(f"{scope}: no nodes (projection missing, folded or renamed)")
        failures += [] if not nodes else _check_scope(scope, nodes, types, consts, eps)
        blocks[scope] = {"ops": dict(Counter(n.op_type for n in nodes)), "nodes": [n.name for n in nodes]}
    odd = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.domain not in _STANDARD_DOMAINS})
    failures += [f"non-standard op {o} in the graph" for o in odd]
    if dtype == "fp16":
        failures += [f"{n.name}: {n.op_type} does not compute in fp32" for n in proto.graph.node
                     if n.op_type in FP32_OPS and types.get(n.output[0]) != onnx.TensorProto.FLOAT]
    per_block: Counter = Counter()
    for scope, found in blocks.items():
        per_block[scope.split(".attn.")[0]] += len(found["nodes"])
    return {"ok": not failures, "failures": failures, "blocks": blocks, "nodes_per_block": dict(per_block),
            "non_standard_ops": odd, "depth": depth}


def assert_projection(model: Union[str, Path, onnx.ModelProto], config: Optional[Dict[str, Any]] = None,
                      dtype: Optional[str] = None) -> Dict[str, Any]:
    """:func:`check_projection`, raising :class:`ProjectionCheckError` listing every failure."""
    result = check_projection(model, config, dtype)
    if not result["ok"]:
        raise ProjectionCheckError("projection check failed: " + "; ".join(result["failures"]))
    return result
