"""The checks an OpenVINO IR is held to before ``--format openvino`` writes it (:mod:`.format`): what its graph holds
(the variant's extra math per block, each op of it at f32 and reading no FakeQuantize; no 16-bit activation; a
dynamic batch; the model contract back whole from its ``rt_info``) and an int8 IR's gates on OpenVINO itself (its
worst output cosine to the fp32 graph, its test-split score next to fp32's).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.export import quantize
from attnzoo.export.check import block_prefix, variant_spec, walk_extra_scopes
from attnzoo.models import PROJECTION_OPS
from attnzoo.runtime.contract import BATCH_DIM, INPUT_NAME, ModelContract
from attnzoo.runtime.evaluate import score_runs
from attnzoo.runtime.precision import QUANTIZED

from . import library as ovrt  # patched there by tests

__all__ = ["ONNX_TO_OV", "NO_MATH_OPS", "QUANTIZED_TYPES", "count_extra_math"]

#: ONNX op types of the extra math's declared counts (:meth:`attnzoo.models.VariantSpec.required_ops`) -> the
#: OpenVINO op each becomes.
ONNX_TO_OV: dict[str, str] = {
    "Mul": "Multiply",
    "Div": "Divide",
    "Sub": "Subtract",
    "Add": "Add",
    "ReduceSum": "ReduceSum",
}
#: OpenVINO ops that only move, view or retype data: a scope of these alone holds no extra math.
NO_MATH_OPS = frozenset({"Constant", "Convert", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "ShapeOf"})


def _constant_value(output: Any) -> np.ndarray | None:
    """The value behind an op input, when it is a Constant (through a decompression ``Convert``)."""
    node = output.get_node()
    while node.get_type_name() == "Convert" and node.get_input_size():
        node = node.input_value(0).get_node()
    if node.get_type_name() != "Constant":
        return None
    return np.asarray(node.get_data(), dtype=np.float64)


#: Integer outputs that carry quantized values, not shapes or indices (an extra-math op that outputs one was
#: quantized).
QUANTIZED_TYPES = frozenset({"i8", "u8", "i4", "u4", "u1", "nf4"})


def _keeps_f32(element_type: Any) -> bool:
    """Whether an op's output keeps the extra math at f32: an f32 tensor, or an integer one that is shape or index
    arithmetic (``i64`` / ``i32`` / ``boolean``: a ``Concat`` of a reshape's target shape). A 16-bit or 8-bit float,
    or a quantized integer type (:data:`QUANTIZED_TYPES`), is not."""
    name = str(element_type.get_type_name())
    if element_type.is_real():
        return name == "f32"
    return name not in QUANTIZED_TYPES


def count_extra_math(model: Any, config: dict[str, Any], eps: float | None = None) -> dict[str, Any]:
    """Count each block's extra-math ops in an OpenVINO model (an IR read back): for each scope of
    :func:`attnzoo.export.check.expected_scopes`, the ops whose friendly name starts with ``<scope>/``. A scope must
    hold its declared op counts (ONNX op types, :data:`ONNX_TO_OV`), else at least one op outside
    :data:`NO_MATH_OPS`; every op of it that computes must output f32 (integer shape and index arithmetic aside:
    :func:`_keeps_f32`) and read no FakeQuantize; a projection's
    ``Add`` must add ``eps`` (the metadata's, when given). No op outside the weight constants may be 16-bit (the fp16
    IR compresses weights only). Never raises for a missing scope (see ``failures``).

    Returns:
        ``{"ok", "failures", "blocks": {scope: {"ops": {op: n}, "nodes": [names]}}, "nodes_per_block", "depth",
        "half_ops"}``.
    """
    block = re.compile(rf"^{re.escape(block_prefix(config))}\.(\d+)[./]")
    ops = list(model.get_ops())
    depth = 1 + max((int(m.group(1)) for m in (block.match(o.get_friendly_name()) for o in ops) if m), default=-1)
    spec = variant_spec(config)

    def judge(scope: str) -> tuple[list[str], dict[str, Any], int]:
        found = [o for o in ops if o.get_friendly_name().startswith(scope + "/")]
        entry = {"ops": dict(_onnx_counts(found)), "nodes": [o.get_friendly_name() for o in found]}
        return _scope_failures(model, scope, found, spec, eps), entry, len(found)

    walk = walk_extra_scopes(config, depth, "ops in the IR", judge)
    half = _half_ops(ops)
    failures = walk.failures + ([f"{len(half)} op(s) compute in 16 bits, not f32, e.g. {half[0]}"] if half else [])
    return {
        "ok": not failures,
        "failures": failures,
        "blocks": walk.blocks,
        "nodes_per_block": dict(walk.nodes_per_block),
        "depth": depth,
        "half_ops": len(half),
    }


def _onnx_counts(found: list[Any]) -> Counter:
    """The OpenVINO ops ``found`` counted by the ONNX op type they come from (:data:`ONNX_TO_OV`)."""
    to_onnx = {v: k for k, v in ONNX_TO_OV.items()}
    return Counter(to_onnx.get(o.get_type_name(), o.get_type_name()) for o in found)


def _scope_failures(model: Any, scope: str, found: list[Any], spec: Any, eps: float | None) -> list[str]:
    """What is wrong with one extra-math scope's ops ``found`` in ``model`` (see :func:`count_extra_math`)."""
    counts = _onnx_counts(found)
    module = scope.split(".attn.", 1)[1]
    required = spec.required_ops(module)
    if not found:
        return [
            f"{scope}: no ops named {scope}/... in the IR (variant {spec.name!r} declares extra scope {module!r}; "
            "its ops are missing, folded away or renamed)"
        ]
    failures = [
        f"{scope}: {counts[op]} {ONNX_TO_OV.get(op, op)} op(s), need {need}"
        for op, need in required.items()
        if counts[op] < need
    ]
    computing = [o for o in found if o.get_type_name() not in NO_MATH_OPS]
    if not required and not computing:
        failures.append(f"{scope}: only {', '.join(sorted(counts))} op(s), no op computes anything")
    failures += [
        f"{scope}: {o.get_friendly_name()} computes in {o.get_output_element_type(0)}, not f32"
        for o in computing
        if not _keeps_f32(o.get_output_element_type(0))
    ]
    failures += [
        f"{scope}: {name} reads a FakeQuantize"
        for name in ovrt.fake_quantized(model, [o.get_friendly_name() for o in computing])
    ]
    if dict(required) == dict(PROJECTION_OPS):
        failures += [f for o in computing if o.get_type_name() == "Add" for f in _eps_failures(scope, o, eps)]
    return failures


def _eps_failures(scope: str, add: Any, eps: float | None) -> list[str]:
    """A projection's ``Add`` must add a constant, ``eps`` when that is given."""
    values = [v for v in (_constant_value(add.input_value(i)) for i in range(add.get_input_size())) if v is not None]
    if not values:
        return [f"{scope}: {add.get_friendly_name()} adds no constant (eps)"]
    added = float(np.ravel(values[0])[0])
    if eps is not None and not np.isclose(added, eps, rtol=1e-3, atol=0.0):
        return [f"{scope}: {add.get_friendly_name()} adds {added:g}, metadata eps {eps:g}"]
    return []


def _half_ops(ops: list[Any]) -> list[str]:
    """The ops outside the weight constants with a 16-bit float output (the fp16 IR compresses weights only)."""
    return [
        f"{o.get_friendly_name()} ({o.get_type_name()})"
        for o in ops
        if o.get_type_name() != "Constant"
        and any(
            str(o.get_output_element_type(i).get_type_name()) in ("f16", "bf16") for i in range(o.get_output_size())
        )
    ]


def _op_histogram(model: Any) -> dict[str, int]:
    return dict(sorted(Counter(o.get_type_name() for o in model.get_ops()).items()))


def _weight_types(model: Any) -> dict[str, int]:
    """Element types of the IR's floating-point constants (its weights): ``f16`` in a compressed IR."""
    types: Counter = Counter()
    for o in model.get_ops():
        if o.get_type_name() == "Constant":
            t = str(o.get_output_element_type(0).get_type_name())
            if t.startswith(("f", "bf", "i8", "u8")):
                types[t] += 1
    return dict(sorted(types.items()))


def _graph_failures(
    ir: Path, report: dict[str, Any], config: dict[str, Any], props: dict[str, str], dtype: str, checkpoint: str
) -> list[str]:
    """What the IR written at ``ir`` holds, into ``report`` (its ops, weights, extra math, batch dimension; an int8
    IR's FakeQuantize ops), and why it must not be run, one line each: extra math missing or not f32, a fixed batch,
    an int8 IR without FakeQuantize, a contract that does not come back whole from its ``rt_info``."""
    model = ovrt.read_onnx(ir)
    report.update(
        num_ops=len(model.get_ops()),
        op_histogram=_op_histogram(model),
        weight_types=_weight_types(model),
        extra_math=count_extra_math(model, config, float(props["eps"]) if props.get("eps") else None),
    )
    failures = list(report["extra_math"]["failures"])
    if dtype in QUANTIZED:
        report["fake_quantize_ops"] = report["op_histogram"].get("FakeQuantize", 0)
        if not report["fake_quantize_ops"]:
            failures.append("no FakeQuantize in the IR: OpenVINO dropped the int8 graph's Q/DQ pairs")
    dim = model.input(INPUT_NAME).get_partial_shape()[0]
    report["batch_dim"] = BATCH_DIM if dim.is_dynamic else dim.get_length()
    if not dim.is_dynamic:
        failures.append(f"input batch dimension is fixed ({dim.get_length()}), not dynamic")
    contract = ModelContract.from_onnx(ir)  # what serving reads: the contract must come back whole
    if contract.dtype != dtype or contract.checkpoint_sha256 != checkpoint:
        failures.append(f"rt_info contract reads dtype {contract.dtype!r}, checkpoint {contract.checkpoint_sha256!r}")
    return failures


def _int8_fidelity(
    reference: np.ndarray, output: np.ndarray, gate: float, config: dict[str, Any], source: Any, runtime: str
) -> dict[str, Any]:
    """An int8 IR's outputs against the fp32 graph's on the same held-out inputs, under the gate its Q/DQ graph
    passed (``failure``: the line refusing it, when below)."""
    fidelity = {
        **quantize.output_agreement(reference, output, config["task"]),
        "min_cosine": gate,
        "inputs": int(len(output)),
        "source": source,
        "reference": "the verified fp32 ONNX graph on ONNX Runtime",
        "runtime": runtime,
    }
    fidelity["within_gate"] = bool(fidelity["finite"] and fidelity["cosine"]["min"] >= gate)
    if not fidelity["within_gate"]:
        fidelity["failure"] = (
            f"worst output cosine to fp32 {fidelity['cosine']['min']:.4f} on {len(output)} held-out input(s) is "
            f"below the gate {gate:g} its Q/DQ graph passed"
        )
    return fidelity


def _int8_accuracy(
    run: Any, measured: dict[str, Any], config: dict[str, Any], runtime: str, accept: bool
) -> dict[str, Any]:
    """An int8 IR's own score on the test split its Q/DQ graph was scored on (``measured``: that graph's
    ``accuracy``, whose fp32 score on the same images is the reference), within the same tolerance unless the drop
    is accepted (``failure``: the line refusing it)."""
    ev = score_runs({"int8": run}, config, limit=measured.get("limit"))
    fp32_score, tol = float(measured["metrics"]["fp32"]), float(measured["tolerance"])
    drop = fp32_score - ev["metrics"]["int8"]
    accuracy = {
        **{k: v for k, v in ev.items() if k != "agreement"},
        "metrics": {"fp32": fp32_score, "int8": ev["metrics"]["int8"]},
        "fp32_from": "the fp32 graph's score on the same images (the Q/DQ graph's report)",
        "limit": measured.get("limit"),
        "drop": drop,
        "tolerance": tol,
        "within_tolerance": drop <= tol,
        "accepted_drop": bool(accept and drop > tol),
        "runtime": runtime,
    }
    if drop > tol and not accept:
        accuracy["failure"] = (
            f"{ev['metric_name']} {ev['metrics']['int8']:.2f} on OpenVINO is {drop:.2f} points below fp32's "
            f"{fp32_score:.2f} (tolerance {tol:g}); pass --accept-accuracy-drop to write it anyway"
        )
    return accuracy
