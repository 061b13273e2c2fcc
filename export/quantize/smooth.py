"""SmoothQuant-style migration of outlier channels out of the LayerNorm outputs that feed weight MatMuls, on the
fp32 ONNX graph before ModelOpt calibrates it (:func:`smooth_layernorm_matmuls`).

A pretrained ViT's LayerNorm outputs carry a few channels tens of times larger than the rest (Wei et al., "Outlier
Suppression", 2022, arXiv:2209.13325); one int8 scale per tensor spends its range on them. Xiao et al.,
"SmoothQuant", 2022, arXiv:2211.10438, divide each input channel ``j`` of a linear layer by
``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` and multiply the weights' row ``j`` by it: ``(X / s)(s W) = X W``
in exact arithmetic. Here the division is folded into the LayerNorm's gain and bias, so the graph keeps its ops
and computes the same function in fp32 (to rounding); only the ranges int8 sees move.

A LayerNorm is migrated only where every reader of its output is a MatMul with a constant weight used by no other
node, its gain and bias are used by it alone, and none of these nodes is excluded (the variant's extra math stays
as it was), and only when its output's channel ranges are uneven: the largest channel's max|X| at least
:data:`SMOOTH_MIN_RATIO` times the median channel's on the calibration inputs. A model without such outliers is
left untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.evaluate import EVAL_BATCH

__all__ = ["SMOOTH_ALPHA", "SMOOTH_MIN_RATIO", "layernorm_outliers", "outlier_note", "smooth_layernorm_matmuls"]

#: SmoothQuant's migration strength (0: nothing moves to the weights, 1: all of it); 0.5, the paper's default.
SMOOTH_ALPHA = 0.5
#: Migrate a LayerNorm output only when its largest channel's max|X| is at least this many times the median
#: channel's (an outlier channel; a model without one keeps its graph as it is).
SMOOTH_MIN_RATIO = 8.0


def _candidates(proto: onnx.ModelProto, exclude: set[str]) -> list[tuple[onnx.NodeProto, list[onnx.NodeProto]]]:
    """LayerNorms whose output only feeds weight MatMuls, every tensor involved used by them alone."""
    inits = {t.name: t for t in proto.graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in proto.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in proto.graph.output}
    found = []
    for node in proto.graph.node:
        if node.op_type != "LayerNormalization" or node.name in exclude or len(node.input) < 3:
            continue
        if any(name not in inits or len(readers[name]) != 1 for name in node.input[1:3]):
            continue
        users = readers.get(node.output[0], [])
        if (
            not users
            or node.output[0] in outputs
            or any(
                u.op_type != "MatMul"
                or u.name in exclude
                or u.input[0] != node.output[0]
                or u.input[1] not in inits
                or len(readers[u.input[1]]) != 1
                or numpy_helper.to_array(inits[u.input[1]]).ndim != 2
                for u in users
            )
        ):
            continue
        found.append((node, users))
    return found


def _channel_max(proto: onnx.ModelProto, names: Sequence[str], x: np.ndarray, threads: int | None) -> list[np.ndarray]:
    """Per channel (last axis), max|value| of each named tensor over ``x``."""
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    del probe.graph.output[:]
    for name in names:
        probe.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    sess = onnx_reference().session(probe, threads).session
    feed = sess.get_inputs()[0].name
    peaks = [np.zeros(0, np.float32) for _ in names]
    for i in range(0, len(x), EVAL_BATCH):
        for k, out in enumerate(sess.run(None, {feed: x[i : i + EVAL_BATCH]})):
            m = np.abs(out).reshape(-1, out.shape[-1]).max(0)
            peaks[k] = m if not len(peaks[k]) else np.maximum(peaks[k], m)
    return peaks


def layernorm_outliers(
    proto: onnx.ModelProto, x: np.ndarray, *, exclude: Sequence[str] = (), threads: int | None = None
) -> dict[str, float]:
    """Per LayerNorm whose output feeds weight MatMuls only, max / median of its channels' max|X| on ``x``."""
    found = _candidates(proto, set(exclude))
    if not found:
        return {}
    peaks = _channel_max(proto, [n.output[0] for n, _ in found], x, threads)
    return {n.name: float(p.max() / max(float(np.median(p)), 1e-12)) for (n, _), p in zip(found, peaks, strict=True)}


def outlier_note(ratios: dict[str, float], min_ratio: float = SMOOTH_MIN_RATIO) -> str:
    """One clause naming the worst outlier channel ratio of :func:`layernorm_outliers`, or ``""`` below
    ``min_ratio``."""
    if not ratios or max(ratios.values()) < min_ratio:
        return ""
    name = max(ratios, key=lambda k: ratios[k])
    many = sum(r >= min_ratio for r in ratios.values())
    return (
        f"outlier activation channels: {many} of {len(ratios)} LayerNorm outputs feeding MatMuls have a channel "
        f">= {min_ratio:g}x the median channel's range (worst {ratios[name]:.0f}x, {name}), which one int8 "
        "scale per tensor cannot hold with the rest"
    )


def smooth_layernorm_matmuls(
    proto: onnx.ModelProto,
    calibration: np.ndarray,
    *,
    exclude: Sequence[str] = (),
    alpha: float = SMOOTH_ALPHA,
    min_ratio: float = SMOOTH_MIN_RATIO,
    threads: int | None = None,
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """A copy of the fp32 graph with the outlier channels of its LayerNorm outputs migrated into the weights of
    the MatMuls they feed (module docstring), and what was done.

    Args:
        proto: The fp32 graph.
        calibration: float32 NCHW inputs whose activation ranges decide (the calibration inputs).
        exclude: Node names left as they are (the variant's extra math).
        alpha: The migration strength.
        min_ratio: Migrate only where max / median of the channels' max|X| is at least this.

    Returns:
        ``(graph, report)``: the report names each LayerNorm looked at, its max / median channel ratio before and
        after, and whether it was migrated.
    """
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    found = _candidates(out, set(exclude))
    report: dict[str, Any] = {"alpha": alpha, "min_ratio": min_ratio, "layernorms": {}}
    if not found:
        report["migrated"] = 0
        return out, report
    peaks = _channel_max(out, [n.output[0] for n, _ in found], calibration, threads)
    inits = {t.name: t for t in out.graph.initializer}
    migrated = 0
    for (node, users), peak in zip(found, peaks, strict=True):
        ratio = float(peak.max() / max(float(np.median(peak)), 1e-12))
        entry: dict[str, Any] = {"ratio": round(ratio, 2), "readers": [u.name for u in users]}
        report["layernorms"][node.name] = entry
        if ratio < min_ratio:
            entry["migrated"] = False
            continue
        weights = [numpy_helper.to_array(inits[u.input[1]]) for u in users]
        w_peak = np.max([np.abs(w).max(1) for w in weights], axis=0)
        s = np.power(np.maximum(peak, 1e-5), alpha) / np.power(np.maximum(w_peak, 1e-5), 1 - alpha)
        s = (s / np.exp(np.mean(np.log(s)))).astype(np.float32)  # centred: the tensor's overall scale stays
        for name in node.input[1:3]:
            value = numpy_helper.to_array(inits[name]) / s
            inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))
        for u, w in zip(users, weights, strict=True):
            inits[u.input[1]].CopyFrom(numpy_helper.from_array((w * s[:, None]).astype(np.float32), u.input[1]))
        after = peak / s
        entry.update(migrated=True, ratio_after=round(float(after.max() / max(float(np.median(after)), 1e-12)), 2))
        migrated += 1
    report["migrated"] = migrated
    return out, report
