"""How close a quantized graph's outputs are to the fp32 graph's: per input (:func:`per_input_fidelity`), over
held-out inputs (:func:`output_agreement`), what inputs like them are promised (:func:`promised_cosine`), and
the fidelity gate on the worst held-out input."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx

from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.evaluate import EVAL_BATCH

from .calibration import DEFAULT_FIDELITY_COUNT
from .qdq import AUTO_QDQ_PLACEMENT, _without, qdq_groups

__all__ = [
    "DEFAULT_MIN_COSINE",
    "FIRM_GATE_INPUTS",
    "PROMISE_COVERAGE",
    "PROMISE_CONFIDENCE",
    "per_input_fidelity",
    "output_agreement",
    "tolerance_factor",
    "promised_cosine",
    "onnx_outputs",
    "NEAR_COPY_SIMILARITY",
    "pixel_similarity",
    "related_inputs",
]

#: The fidelity gate: the smallest cosine similarity between an int8 / fp8 graph's output and the fp32 graph's
#: (each output flattened) on the *worst* of the gate's held-out inputs that is written (``--min-cosine``). The
#: worst, not the mean: a mean of 0.99 lets a quarter of a user's images sit below it. 0.99 separates ModelOpt's
#: full placement from the weights-only one on a pretrained-like ViT (``results/studies/int8-fidelity``).
DEFAULT_MIN_COSINE = 0.99
#: Fewer gate inputs than this mark the fidelity figure as weak in the report and the summary.
FIRM_GATE_INPUTS = DEFAULT_FIDELITY_COUNT // 2
#: ``auto``'s margin (:func:`promised_cosine`): the placement must promise that this share of inputs like the
#: choosing ones stay within the gate ...
PROMISE_COVERAGE = 0.999
#: ... with this confidence (a one-sided normal tolerance bound on log(1 - cosine)).
PROMISE_CONFIDENCE = 0.90


def per_input_fidelity(reference: np.ndarray, output: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per input (its output flattened): cosine similarity to the reference (0 for a non-finite output), relative
    L2 error ``|out - ref| / |ref|``, and whether the output is finite."""
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    out = output.reshape(len(output), -1).astype(np.float64)
    finite = cast(np.ndarray, np.isfinite(out).all(axis=1))  # an array along axis 1 (numpy types a scalar too)
    out = np.where(np.isfinite(out), out, 0.0)
    norm_r, norm_o = np.linalg.norm(ref, axis=1), np.linalg.norm(out, axis=1)
    cos = np.where(finite, (ref * out).sum(1) / np.maximum(norm_r * norm_o, 1e-30), 0.0)
    rel = np.linalg.norm(out - ref, axis=1) / np.maximum(norm_r, 1e-30)
    return cos, rel, finite


def output_agreement(reference: np.ndarray, output: np.ndarray, task: str) -> dict[str, Any]:
    """How close a quantized graph's outputs are to the fp32 graph's on the same inputs.

    Per input (its output flattened): cosine similarity and relative L2 error ``|out - ref| / |ref|``; the top-1
    agreement (per image for classifiers, per pixel for segmenters) and, for classifiers with 5 classes or more,
    the mean overlap of the top-5 sets; :func:`promised_cosine` of the cosines. A non-finite output counts as
    cosine 0.

    Returns:
        ``{"n_inputs", "cosine": {"min", "mean"}, "relative_error": {"mean", "max"}, "promised_cosine",
        "top1_agreement", "top5_overlap" (classifiers with >= 5 classes), "finite"}``.
    """
    cos, rel, finite = per_input_fidelity(reference, output)
    agree = reference.argmax(1) == np.where(np.isfinite(output), output, -np.inf).argmax(1)
    result = {
        "n_inputs": int(len(cos)),
        "cosine": {"min": float(cos.min()), "mean": float(cos.mean())},
        "relative_error": {"mean": float(rel.mean()), "max": float(rel.max())},
        "promised_cosine": promised_cosine(cos),
        "top1_agreement": float(agree.mean()),
        "finite": bool(finite.all()),
    }
    if task == "cls" and reference.shape[1] >= 5:
        top_r, top_o = np.argsort(-reference, 1)[:, :5], np.argsort(-output, 1)[:, :5]
        result["top5_overlap"] = float(np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top_r, top_o, strict=False)]))
    return result


def tolerance_factor(n: int, coverage: float = PROMISE_COVERAGE, confidence: float = PROMISE_CONFIDENCE) -> float:
    """The one-sided normal tolerance factor k: with probability ``confidence`` at least ``coverage`` of a normal
    population lies below ``mean + k * sd`` of ``n`` draws from it, ``nct.ppf(confidence, n - 1, z sqrt(n)) /
    sqrt(n)`` with ``z`` the ``coverage`` quantile (NIST/SEMATECH e-Handbook 7.2.6.3; SciPy comes with
    ModelOpt). ``inf`` below 3 draws."""
    from scipy.stats import nct, norm  # heavy: SciPy, for the fidelity gate's promise only

    if n < 3:
        return float("inf")
    return float(nct.ppf(confidence, n - 1, norm.ppf(coverage) * np.sqrt(n)) / np.sqrt(n))


def promised_cosine(
    cosines: np.ndarray, coverage: float = PROMISE_COVERAGE, confidence: float = PROMISE_CONFIDENCE
) -> float:
    """The cosine that ``coverage`` of inputs like these stay above, with ``confidence``: ``1 - exp(m + k s)``,
    ``m`` and ``s`` the mean and standard deviation of ``log(1 - cosine)`` over them (a log-normal fit of the
    error; ``k`` :func:`tolerance_factor`), and never above the worst of them. The wider their spread and the
    fewer they are, the further below their worst it lies: the margin ``auto`` chooses with. ``0`` below 3
    inputs (nothing can be promised)."""
    cos = np.asarray(cosines, np.float64)
    k = tolerance_factor(len(cos), coverage, confidence)
    if not np.isfinite(k):
        return 0.0
    log_err = np.log(np.clip(1.0 - cos, 1e-12, None))
    bound = 1.0 - float(np.exp(log_err.mean() + k * log_err.std(ddof=1)))
    return max(0.0, min(bound, float(cos.min())))


#: Held-out inputs whose :func:`pixel_similarity` to a calibration input is at least this are near-copies of it
#: (crops, flips, brightness or noise of the same image); the figures are in docs/quantization.md.
NEAR_COPY_SIMILARITY = 0.9
#: The grid :func:`pixel_similarity` averages each channel down to.
_SIMILARITY_GRID = 8


def _pixel_features(x: np.ndarray) -> np.ndarray:
    """Each input's channels averaged down to a ``_SIMILARITY_GRID`` square, mean-removed, unit length."""
    n, c, h, w = x.shape
    k = max(1, min(_SIMILARITY_GRID, h, w))
    x = x[:, :, : h - h % k, : w - w % k]
    f = x.reshape(n, c, k, x.shape[2] // k, k, x.shape[3] // k).mean((3, 5)).reshape(n, -1).astype(np.float64)
    f -= f.mean(1, keepdims=True)
    return f / np.maximum(np.linalg.norm(f, axis=1, keepdims=True), 1e-12)


def pixel_similarity(x: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per input of ``x`` (float NCHW), the largest cosine between its downsampled pixels (each channel averaged to
    an 8x8 grid, mean-removed) and those of any input of ``reference``: 1 for the same image, high for a crop,
    flip, brightness change or noisy copy of it, low for an unrelated image."""
    if not len(x) or not len(reference):
        return np.zeros(len(x))
    fr = _pixel_features(reference)
    return np.concatenate([(_pixel_features(x[i : i + 256]) @ fr.T).max(1) for i in range(0, len(x), 256)])


def related_inputs(x: np.ndarray, calibration: np.ndarray, cosines: np.ndarray) -> dict[str, Any]:
    """How many of the held-out inputs ``x`` are near-copies of ``calibration`` inputs (:func:`pixel_similarity`
    >= :data:`NEAR_COPY_SIMILARITY`) and the worst of ``cosines`` (theirs to fp32) on each kind; ``warning`` when
    half or more are: their worst says little about images unlike the calibration ones."""
    sim = pixel_similarity(x, calibration)
    near = sim >= NEAR_COPY_SIMILARITY
    result: dict[str, Any] = {
        "measure": f"largest cosine of 8x8 downsampled, mean-removed pixels to a calibration input; near-copy "
        f"from {NEAR_COPY_SIMILARITY:g}",
        "near_copies": int(near.sum()),
        "distinct": int((~near).sum()),
        "similarity_median": float(np.median(sim)) if len(sim) else 0.0,
        "worst": {
            kind: float(cosines[mask].min())
            for kind, mask in (("near_copies", near), ("distinct", ~near))
            if mask.any()
        },
    }
    if len(x) and near.mean() >= 0.5:
        result["warning"] = (
            f"{int(near.sum())} of {len(x)} held-out inputs are near-copies of calibration inputs (crops or "
            f"augmentations of the same images; median similarity {result['similarity_median']:.2f}): their "
            "worst cosine says little about other images; give --calibration-data images unlike one another, "
            "or check the model on unrelated ones"
        )
    return result


def onnx_outputs(model: Path | onnx.ModelProto, x: np.ndarray, threads: int | None) -> np.ndarray:
    """The graph's outputs on ``x`` with ONNX Runtime (CPU), in batches."""
    sess = onnx_reference().session(model, threads).session
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i : i + EVAL_BATCH]})[0] for i in range(0, len(x), EVAL_BATCH)])


def _finite_outputs(model: Path | onnx.ModelProto, x: np.ndarray, threads: int | None) -> bool:
    sess = onnx_reference().session(model, threads).session
    out = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    return bool(np.isfinite(out).all())


def _fidelity(
    proto: onnx.ModelProto,
    runnable: onnx.ModelProto,
    fp32_onnx: Path,
    x: np.ndarray,
    task: str,
    gate: float,
    placement: str,
    run,
    threads: int | None,
    calibration: np.ndarray | None = None,
) -> dict[str, Any]:
    """The gate's measurement on ``x``; below the gate, also what the weights-only placement measures there; with
    ``calibration``, how many of ``x`` are near-copies of its inputs and the worst on each kind
    (:func:`related_inputs`)."""
    reference = onnx_outputs(fp32_onnx, x, threads)
    output = onnx_outputs(runnable, x, threads)
    result = {
        **output_agreement(reference, output, task),
        "min_cosine": gate,
        "runtime": "onnxruntime CPUExecutionProvider",
    }
    result["gate_on"] = (
        "worst held-out input"
        if gate > 0
        else "not gated (--min-cosine 0, or a labelled model: its test-split accuracy decides)"
    )
    result["within_gate"] = bool(result["finite"] and result["cosine"]["min"] >= gate)
    if calibration is not None:
        result["related"] = related_inputs(x, calibration, per_input_fidelity(reference, output)[0])
    if result["within_gate"]:
        return result
    groups = qdq_groups(proto)
    hint = ""
    if groups:
        weights = _without(proto, groups, [g for g in groups if groups[g]["kind"] != "weights"])
        alt = output_agreement(reference, onnx_outputs(run(weights), x, threads), task)["cosine"]["min"]
        result["weights_only_worst"] = alt
        hint = f"; the weight MatMuls alone: worst {alt:.4f}" + (
            f" (--qdq-placement {AUTO_QDQ_PLACEMENT} quantizes only what promises the gate)"
            if alt >= gate and placement != AUTO_QDQ_PLACEMENT
            else ", also below: calibrate on images like the model's inputs (--calibration-data DIR)"
            if alt < gate
            else ""
        )
    result["failure"] = (
        f"worst output cosine to fp32 {result['cosine']['min']:.4f} (mean {result['cosine']['mean']:.4f}) "
        f"on {len(x)} held-out input(s) is below --min-cosine {gate:g} (Q/DQ placement {placement})"
        f"{hint}"
    )
    return result
