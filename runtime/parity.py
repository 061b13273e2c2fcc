"""One parity check with one tolerance table, used by the export verification, the TensorRT builder and the
benchmark's gate.

Error measure: ``max |out - ref| / max(1, max |ref|)`` on the logits, i.e. absolute for logits up to 1 and
relative to the largest logit above that; a shape mismatch or any non-finite output fails.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["TOLERANCES", "tolerance_key", "parity_error", "compare"]

#: Allowed parity error per precision (see the module docstring for the measure). The keys are the precisions a
#: row runs at (:data:`attnzoo.runtime.backends.DTYPES`), plus ``int8-static``.
TOLERANCES: dict[str, float] = {
    "fp32": 1e-4,  # IEEE fp32 vs fp32: the CPU, and every GPU backend with TF32 off (the fp32 rows)
    "tf32": 1e-3,  # fp32 tensors, matmuls / convolutions on TF32 tensor cores (10-bit mantissa inputs): the tf32 rows
    "fp16": 1e-2,  # fp16 graph (LayerNorm, softmax, projection in fp32) vs fp32
    "bf16": 6e-2,  # bf16 (OpenVINO bf16 hint, PyTorch autocast; extra math fp32) vs fp32: an 8-bit significand
    "int8": 1.5e-1,  # dynamic int8 ONNX Runtime vs fp32
    # static int8 (ModelOpt Q/DQ, NNCF) of a random-init benchmark model calibrated on random inputs, vs fp32: a
    # sanity gate (garbage scores ~1 and above; such a model can miss dynamic int8's gate). Trained int8 models are
    # judged by their test-set accuracy (export-model --dtype int8), not by this.
    "int8-static": 5e-1,
}


def tolerance_key(dtype: str) -> str:
    """The table entry for a run at ``dtype``: the precision itself. fp32 is IEEE fp32 on every device (the GPU
    backends turn TF32 off for it); a TF32 run is its own precision, ``tf32``, with its own entry."""
    if dtype not in TOLERANCES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(k for k in TOLERANCES if k != 'int8-static')}")
    return dtype


#: Elements per block of the float64 error computation: its temporaries stay at tens of MB even for
#: full-resolution segmentation logits (150 classes x 1024 x 1024 x batch 3 is 1.9 GB in float32).
_BLOCK = 1 << 22


def _abs_stats(out: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """Max and sum of ``|out - ref|``, max ``|ref|`` and whether ``out`` is finite, in float64, block by block
    (equal shapes)."""
    o, r = np.asarray(out).reshape(-1), np.asarray(ref).reshape(-1)
    max_err = sum_err = max_ref = 0.0
    finite = True
    for i in range(0, o.size, _BLOCK):
        ob, rb = o[i : i + _BLOCK].astype(np.float64), r[i : i + _BLOCK].astype(np.float64)
        finite = finite and bool(np.all(np.isfinite(ob)))
        diff = np.abs(ob - rb)
        max_err, sum_err = max(max_err, float(diff.max(initial=0.0))), sum_err + float(diff.sum())
        max_ref = max(max_ref, float(np.abs(rb).max(initial=0.0)))
    if not finite:  # NaN / inf outputs: no meaningful error size
        max_err = sum_err = float("nan")
    return {"max_abs_err": max_err, "mean_abs_err": sum_err / max(o.size, 1), "max_abs_ref": max_ref, "finite": finite}


def parity_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``max |out - ref| / max(1, max |ref|)``; ``inf`` on a shape mismatch or any non-finite output."""
    if np.shape(out) != np.shape(ref):
        return float("inf")
    st = _abs_stats(out, ref)
    if not st["finite"]:
        return float("inf")
    return st["max_abs_err"] / max(1.0, st["max_abs_ref"])


def compare(out: np.ndarray, ref: np.ndarray, key: str) -> dict[str, Any]:
    """Parity of ``out`` against ``ref`` under ``TOLERANCES[key]``.

    Returns:
        ``{"passed", "error", "tolerance", "key", "max_abs_err", "mean_abs_err", "max_abs_ref", "finite",
        "shape_ok", "top1_agree"}`` (``top1_agree``: share of argmax over axis 1 that match; None on a shape
        mismatch).
    """
    out, ref = np.asarray(out), np.asarray(ref)
    shape_ok = out.shape == ref.shape
    if shape_ok:
        st = _abs_stats(out, ref)
    else:
        st = {
            "max_abs_err": float("inf"),
            "mean_abs_err": float("inf"),
            "finite": bool(np.all(np.isfinite(out))),
            "max_abs_ref": float(np.abs(ref.astype(np.float64)).max(initial=0.0)),
        }
    err = st["max_abs_err"] / max(1.0, st["max_abs_ref"]) if shape_ok and st["finite"] else float("inf")
    tol = TOLERANCES[key]
    return {
        "passed": bool(err <= tol),
        "error": err,
        "tolerance": tol,
        "key": key,
        "shape_ok": shape_ok,
        "finite": st["finite"],
        "max_abs_err": st["max_abs_err"],
        "mean_abs_err": st["mean_abs_err"],
        "max_abs_ref": st["max_abs_ref"],
        "top1_agree": float((out.argmax(1) == ref.argmax(1)).mean()) if shape_ok and out.ndim > 1 else None,
    }


def check(out: np.ndarray, ref: np.ndarray, key: str) -> tuple[bool, float]:
    """``(passes, error)`` under ``TOLERANCES[key]``."""
    err = parity_error(out, ref)
    return err <= TOLERANCES[key], err


__all__.append("check")
