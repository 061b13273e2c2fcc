"""The measured Q/DQ placement (``--qdq-placement auto``): which groups of ModelOpt's full placement to keep,
chosen on held-out inputs with a margin (:func:`auto_placement`), and what each group kept fp32 costs in speed
(:func:`group_speed`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from attnzoo.runtime.backends import onnx_reference

from .fidelity import (
    DEFAULT_MIN_COSINE,
    PROMISE_CONFIDENCE,
    PROMISE_COVERAGE,
    onnx_outputs,
    per_input_fidelity,
    promised_cosine,
    tolerance_factor,
)
from .qdq import _without, qdq_groups

__all__ = ["SPEED_RUNS", "auto_placement", "group_speed"]

#: Interleaved batch-1 runs per latency figure of a group ``auto`` kept fp32 (ONNX Runtime CPU, one thread).
SPEED_RUNS = 20


def auto_placement(
    proto: onnx.ModelProto,
    reference: np.ndarray,
    x: np.ndarray,
    task: str,
    *,
    min_cosine: float = DEFAULT_MIN_COSINE,
    runnable=lambda p: p,
    threads: int | None = None,
    fixed: Sequence[str] = (),
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Choose which Q/DQ pairs of ModelOpt's full (``tensorrt``) placement to keep, by measurement, with a margin.

    A candidate qualifies when its :func:`promised_cosine` on ``x`` (the cosine that 99.9 % of inputs like
    ``x`` stay above, with 90 % confidence: below the worst of ``x`` by a margin that grows with their spread
    and shrinks with their number) is at least ``min_cosine``. In order: ModelOpt's full placement, kept whole
    when it qualifies; else the weight MatMul/Gemm/Conv inputs (:func:`qdq_groups` kind ``weights``) all
    quantized when they qualify together, then each block's attention matmuls and residual Adds added back least
    harmful first (measured alone on top), each only while the graph still qualifies; else the same greedy
    choice over every group, weight inputs first, from the graph with no activation quantized. When even that
    graph, or no group on it, qualifies, ``decision["promised"]`` is ``False``: no placement can promise the
    gate, and :func:`quantize_verified` refuses.

    Args:
        proto: ModelOpt's Q/DQ graph (``tensorrt`` placement).
        reference: The fp32 graph's outputs on ``x``.
        x: Held-out inputs (not the calibration batch, and not those the final gate measures).
        runnable: Turns a candidate into what ONNX Runtime runs (:meth:`attnzoo.runtime.precision.Precision.ort_graph`).
        fixed: Nodes whose Q/DQ stay whatever the choice (the extra math under ``--quantize-extra-math``).

    Returns:
        ``(chosen graph, decision)``; the decision names every group, whether it was quantized and why, the
        figures of the full, weights-only and chosen graphs, and the rule.
    """
    groups = qdq_groups(proto, fixed)
    measure = _measurer(proto, groups, reference, x, runnable, threads)
    k = tolerance_factor(len(x))
    decision: dict[str, Any] = {
        "min_cosine": min_cosine,
        "selection_inputs": int(len(x)),
        "tolerance_factor": k,
        "rule": f"a placement qualifies when the cosine that {PROMISE_COVERAGE:.1%} of inputs like the {len(x)} "
        f"choosing ones stay above, with {PROMISE_CONFIDENCE:.0%} confidence (log-normal fit of 1 - cosine: "
        f"1 - exp(mean + {k:.2f} sd) of its log, at most their worst), is >= {min_cosine:g}",
        "groups": {},
    }
    weights = [g for g in groups if groups[g]["kind"] == "weights"]
    full = decision["all_quantized"] = measure(list(groups))
    if full["promised"] >= min_cosine or not groups:
        for name, g in groups.items():
            decision["groups"][name] = {"kind": g["kind"], "quantized": True, "why": "the full placement qualifies"}
        decision.update(chosen=full, promised=full["promised"] >= min_cosine)
        return proto, decision
    chosen, order = _start(decision, measure, weights, [g for g in groups if g not in weights], min_cosine)
    _add_greedily(decision, measure, groups, chosen, order, min_cosine)
    final = decision["chosen"] = measure(chosen)
    decision["promised"] = bool(chosen) and final["promised"] >= min_cosine
    if not decision["promised"]:  # nothing qualifies: the weight MatMuls alone (refused unless the gate is 0)
        chosen = list(weights)
        decision["fallback"] = "no placement qualifies: the weight inputs alone quantized"
        for name, g in groups.items():
            entry = decision["groups"].setdefault(name, {"kind": g["kind"], "why": decision["fallback"]})
            entry["quantized"] = name in weights
            if name in weights:
                entry["why"] = decision["fallback"]
        decision["chosen"] = measure(chosen)
    return _without(proto, groups, [g for g in groups if g not in chosen]), decision


_Measure = Callable[[Sequence[str]], dict[str, float]]


def _measurer(
    proto: onnx.ModelProto,
    groups: dict[str, Any],
    reference: np.ndarray,
    x: np.ndarray,
    runnable: Callable[[onnx.ModelProto], onnx.ModelProto],
    threads: int | None,
) -> _Measure:
    """A function giving the fidelity (worst, mean and promised cosine on ``x``) of the graph with only the named
    groups quantized, each set measured once."""
    seen: dict[frozenset, dict[str, float]] = {}

    def measure(names: Sequence[str]) -> dict[str, float]:
        key = frozenset(names)
        if key not in seen:
            candidate = _without(proto, groups, [g for g in groups if g not in key])
            cos = per_input_fidelity(reference, onnx_outputs(runnable(candidate), x, threads))[0]
            seen[key] = {"worst": float(cos.min()), "mean": float(cos.mean()), "promised": promised_cosine(cos)}
        return seen[key]

    return measure


def _start(
    decision: dict[str, Any], measure: _Measure, weights: list[str], others: list[str], min_cosine: float
) -> tuple[list[str], list[str]]:
    """Where the greedy choice starts (the weight inputs, when they qualify together; else nothing) and the groups
    it tries (none when not even the graph with no activation quantized qualifies)."""
    base = decision["weights_only"] = measure(weights)
    if base["promised"] >= min_cosine:
        for name in weights:
            decision["groups"][name] = {
                "kind": "weights",
                "quantized": True,
                "why": f"the weight inputs together qualify ({base['promised']:.4f})",
            }
        return list(weights), others
    decision["nothing_quantized"] = measure([])
    if decision["nothing_quantized"]["promised"] < min_cosine:
        return [], []  # not even the graph with no activation quantized qualifies: nothing will
    return [], weights + others


def _add_greedily(
    decision: dict[str, Any],
    measure: _Measure,
    groups: dict[str, Any],
    chosen: list[str],
    order: list[str],
    min_cosine: float,
) -> None:
    """Add each group of ``order`` to ``chosen``, least harmful alone first (weight inputs before the rest), while
    the graph still qualifies; each group's entry says why."""
    alone = {name: measure([*chosen, name]) for name in order}
    for name in sorted(order, key=lambda n: (groups[n]["kind"] != "weights", -alone[n]["promised"])):
        entry: dict[str, Any] = {"kind": groups[name]["kind"], "alone": alone[name]}
        with_it = measure([*chosen, name]) if alone[name]["promised"] >= min_cosine else alone[name]
        if with_it["promised"] >= min_cosine:
            chosen.append(name)
            entry.update(quantized=True, why=f"promised cosine with it {with_it['promised']:.4f} >= {min_cosine:g}")
        else:
            entry.update(
                quantized=False,
                why=f"kept fp32: quantizing it takes the promised cosine to {with_it['promised']:.4f} < {min_cosine:g}",
            )
        decision["groups"][name] = entry


def group_speed(
    chosen: onnx.ModelProto,
    full: onnx.ModelProto,
    decision: Mapping[str, Any],
    x: np.ndarray,
    *,
    runs: int = SPEED_RUNS,
    fixed: Sequence[str] = (),
) -> dict[str, Any]:
    """What each group ``auto`` kept fp32 costs in speed here: ONNX Runtime CPU, one thread, batch 1, the chosen
    graph against the chosen graph with that group quantized too, ``runs`` runs of each interleaved, the fastest
    of each (the run least disturbed by other work on the machine). ``slowdown`` > 1: the group in fp32 is slower
    on this CPU.

    Returns:
        ``{"runtime", "batch", "runs", "chosen_ms", "groups": {group: {"fp32_ms", "quantized_ms", "slowdown"}}}``.
    """
    groups = qdq_groups(full, fixed)
    kept = [g for g, d in decision["groups"].items() if not d["quantized"] and g in groups]
    quantized = [g for g, d in decision["groups"].items() if d["quantized"]]
    one = np.ascontiguousarray(x[:1])
    base = onnx_reference().session(chosen, 1).session
    name = base.get_inputs()[0].name

    def timed(sess) -> float:
        start = time.perf_counter()
        sess.run(None, {name: one})
        return (time.perf_counter() - start) * 1e3

    base.run(None, {name: one})
    result: dict[str, Any] = {
        "runtime": "onnxruntime CPUExecutionProvider, 1 thread",
        "batch": 1,
        "runs": runs,
        "statistic": "fastest of the interleaved runs",
        "groups": {},
    }
    mine: list[float] = []
    for group in kept:
        other = (
            onnx_reference()
            .session(_without(full, groups, [g for g in groups if g not in {*quantized, group}]), 1)
            .session
        )
        other.run(None, {name: one})
        pairs = [(timed(base), timed(other)) for _ in range(runs)]
        a, b = np.array(pairs).T
        mine.extend(a)
        result["groups"][group] = {
            "fp32_ms": float(a.min()),
            "quantized_ms": float(b.min()),
            "slowdown": float(a.min() / b.min()),
        }
    result["chosen_ms"] = float(min(mine)) if mine else None
    return result
