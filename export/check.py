"""The extra-math checker: every block holds each of its variant's extra scopes as plain, fp32 ops.

The scopes are the variant's ``extra_scopes`` (``attnzoo.models.register_variant``): for each
``blocks.N.attn.<scope>`` (``encoder.blocks.N...`` in a Segmenter) the exported graph must hold nodes named
``<scope>/<Op>`` in every block; a scope that declares required ops (the orthogonal projection's
:data:`attnzoo.models.PROJECTION_OPS`: two inner products ``Mul`` + ``ReduceSum``, ``Add`` eps (a constant),
``Div``, ``Mul`` coef * v, ``Sub``) must have at least those, any other scope at least one op. Every op of a
scope computes in fp32 (also in an fp16 graph; only its ``Cast`` nodes may output 16-bit), and no op in the graph
is outside the standard ONNX domain. In an fp16 graph LayerNorm and Softmax must compute in fp32 too. The block
count comes from the graph's node names (any depth).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from attnzoo.models import PROJECTION_OPS, VariantSpec
from attnzoo.models.checkpoint import require_variant
from attnzoo.runtime.contract import config_from_props, metadata_props
from attnzoo.runtime.precision import PRECISIONS

__all__ = [
    "ExtraMathCheckError",
    "check_extra_math",
    "assert_extra_math",
    "expected_scopes",
    "ScopeWalk",
    "walk_extra_scopes",
    "graph_depth",
    "block_prefix",
    "variant_spec",
]

_STANDARD_DOMAINS = ("", "ai.onnx")
#: Ops that only move or retype data: a scope of these alone holds no extra math.
_NO_MATH_OPS = ("Cast", "Constant", "Identity")
_HALF_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


class ExtraMathCheckError(ValueError):
    """An exported graph lacks extra-math ops (or computes them in the wrong precision)."""


def variant_spec(config: Mapping[str, Any]) -> VariantSpec:
    """The registered variant of a model config.

    Raises:
        ValueError: the variant is not registered (naming the plugin package to install when the config
            records one).
    """
    return require_variant(config)


def block_prefix(config: dict[str, Any]) -> str:
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


def expected_scopes(config: dict[str, Any], depth: int) -> list[str]:
    """Node-name scopes that must hold extra math, e.g. ``blocks.0.attn.projection`` (empty when the variant
    declares no ``extra_scopes``), block by block."""
    modules = variant_spec(config).extra_scopes
    return [f"{block_prefix(config)}.{i}.attn.{m}" for i in range(depth) for m in modules]


@dataclass
class ScopeWalk:
    """What one extra-math check found, scope by scope (:func:`walk_extra_scopes`).

    Attributes:
        failures: What is missing or wrong, in scope order (the depth's own line first).
        blocks: Per scope, what the check describes of it (its ops, its node names).
        nodes_per_block: Per block (``blocks.3``), the nodes counted in its extra-math scopes.
    """

    failures: list[str] = field(default_factory=list)
    blocks: dict[str, Any] = field(default_factory=dict)
    nodes_per_block: Counter = field(default_factory=Counter)


def walk_extra_scopes(
    config: Mapping[str, Any], depth: int, where: str, judge: Callable[[str], tuple[list[str], dict[str, Any], int]]
) -> ScopeWalk:
    """The walk every extra-math check shares, whatever it reads (an ONNX graph, an OpenVINO IR, a
    ``torch.export`` program): a model of no block fails for a variant that declares extra scopes (``where``: what
    was searched, e.g. ``nodes in the graph``); then each scope of :func:`expected_scopes` is judged by the check's
    own ``judge(scope) -> (failures, the scope's entry of blocks, its node count)``."""
    walk = ScopeWalk()
    if depth == 0 and variant_spec(config).extra_scopes:
        walk.failures.append(f"no {block_prefix(dict(config))}.N {where} (blocks missing or renamed)")
    for scope in expected_scopes(dict(config), depth):
        failures, entry, count = judge(scope)
        walk.failures += failures
        walk.blocks[scope] = entry
        walk.nodes_per_block[scope.split(".attn.")[0]] += count
    return walk


def _scope_module(scope: str) -> str:
    """``blocks.3.attn.projection`` -> ``projection`` (the name the variant declared)."""
    return scope.split(".attn.", 1)[1]


def _elem_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Value name -> element type, from ONNX shape inference."""
    graph = onnx.shape_inference.infer_shapes(proto).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({t.name: t.data_type for t in proto.graph.initializer})
    return types


def _constants(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and Constant-node outputs by name."""
    out = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            out[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return out


def _check_scope(
    scope: str,
    nodes: list[onnx.NodeProto],
    types: dict[str, int],
    consts: dict[str, np.ndarray],
    eps: float | None,
    required: Mapping[str, int],
) -> list[str]:
    """Failures of one extra-math scope: required ops (or at least one op), fp32, and a projection's eps."""
    failures = []
    counts = Counter(n.op_type for n in nodes)
    for op, need in required.items():
        if counts[op] < need:
            failures.append(f"{scope}: {counts[op]} {op} node(s), need {need}")
    if not required and not any(n.op_type not in _NO_MATH_OPS for n in nodes):
        failures.append(f"{scope}: only {', '.join(sorted(counts))} node(s), no op computes anything")
    for node in nodes:
        if node.op_type == "Cast":
            continue  # the casts into and out of the fp32 scope
        if node.op_type in required and types.get(node.output[0]) != onnx.TensorProto.FLOAT:
            failures.append(f"{scope}: {node.name} does not compute in fp32")
        elif any(types.get(o) in _HALF_TYPES for o in node.output):
            failures.append(f"{scope}: {node.name} computes in 16 bits, not fp32")
    if dict(required) != dict(PROJECTION_OPS):
        return failures
    for node in (n for n in nodes if n.op_type == "Add"):  # an orthogonal projection's only Add is + eps
        values = [consts[i] for i in node.input if i in consts]
        if not values:
            failures.append(f"{scope}: {node.name} adds no constant (eps)")
        elif eps is not None and not np.isclose(float(np.ravel(values[0])[0]), eps, rtol=1e-3, atol=0.0):
            failures.append(f"{scope}: {node.name} adds {float(np.ravel(values[0])[0]):g}, metadata eps {eps:g}")
    return failures


def check_extra_math(
    model: str | Path | onnx.ModelProto, config: dict[str, Any] | None = None, dtype: str | None = None
) -> dict[str, Any]:
    """Find the extra-math ops of every block; never raises for a missing op (see ``failures``).

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
            raise ExtraMathCheckError("the graph has no attnzoo.config metadata; pass config=")
        config = config_from_props(props)
    dtype = dtype or props.get("dtype", "fp32")
    eps = float(props["eps"]) if props.get("eps") else None
    by_scope: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in proto.graph.node:
        by_scope[node.name.rsplit("/", 1)[0]].append(node)
    types, consts = _elem_types(proto), _constants(proto)
    depth = graph_depth(proto, block_prefix(config))
    spec = variant_spec(config)

    def judge(scope: str) -> tuple[list[str], dict[str, Any], int]:
        nodes = by_scope.get(scope, [])
        entry = {"ops": dict(Counter(n.op_type for n in nodes)), "nodes": [n.name for n in nodes]}
        if not nodes:
            missing = (
                f"{scope}: no nodes named {scope}/... (variant {spec.name!r} declares extra scope "
                f"{_scope_module(scope)!r}; its ops are missing, folded away or renamed)"
            )
            return [missing], entry, 0
        return (
            _check_scope(scope, nodes, types, consts, eps, spec.required_ops(_scope_module(scope))),
            entry,
            len(nodes),
        )

    walk = walk_extra_scopes(config, depth, "nodes in the graph", judge)
    odd = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.domain not in _STANDARD_DOMAINS})
    failures = walk.failures + [f"non-standard op {o} in the graph" for o in odd]
    precision = PRECISIONS.get(dtype)  # an unknown dtype: the contract's check
    fp32_ops = precision.fp32_ops if precision is not None else ()
    if fp32_ops:
        failures += [
            f"{n.name}: {n.op_type} does not compute in fp32"
            for n in proto.graph.node
            if n.op_type in fp32_ops and types.get(n.output[0]) != onnx.TensorProto.FLOAT
        ]
    return {
        "ok": not failures,
        "failures": failures,
        "blocks": walk.blocks,
        "nodes_per_block": dict(walk.nodes_per_block),
        "non_standard_ops": odd,
        "depth": depth,
    }


def assert_extra_math(
    model: str | Path | onnx.ModelProto, config: dict[str, Any] | None = None, dtype: str | None = None
) -> dict[str, Any]:
    """:func:`check_extra_math`, raising :class:`ExtraMathCheckError` listing every failure."""
    result = check_extra_math(model, config, dtype)
    if not result["ok"]:
        raise ExtraMathCheckError("extra-math check failed: " + "; ".join(result["failures"]))
    return result
