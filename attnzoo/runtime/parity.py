"""One parity check with one tolerance table, used by the export verification, the TensorRT builder and the
benchmark's gate.

Error measure: ``max |out - ref| / max(1, max |ref|)`` on the logits, i.e. absolute for logits up to 1 and
relative to the largest logit above that; a shape mismatch or any non-finite output fails.
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

__all__ = ["TOLERANCES", "tolerance_key", "parity_error", "compare"]

#: Allowed parity error per precision (see the module docstring for the measure).
TOLERANCES: Dict[str, float] = {
    "fp32": 1e-4,   # fp32 vs fp32 (ONNX Runtime CPU, TensorRT with TF32 off)
    "tf32": 1e-3,   # fp32 on a GPU where matmuls / convolutions may use TF32 (PyTorch cuDNN, ORT CUDA)
    "fp16": 1e-2,   # fp16 graph (LayerNorm, softmax, projection in fp32) vs fp32
    "bf16": 6e-2,   # bf16 eager vs fp32 (8-bit mantissa)
    "int8": 1.5e-1,  # dynamic int8 ONNX Runtime vs fp32
}


def tolerance_key(dtype: str, gpu: bool = False) -> str:
    """The table entry for a run at ``dtype``; fp32 on a GPU may use TF32."""
    if dtype not in TOLERANCES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(k for k in TOLERANCES if k != 'tf32')}")
    return "tf32" if dtype == "fp32" and gpu else dtype


def parity_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``max |out - ref| / max(1, max |ref|)``; ``inf`` on a shape mismatch or any non-finite output."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.max(np.abs(out - ref), initial=0.0) / max(1.0, float(np.max(np.abs(ref), initial=0.0))))


def compare(out: np.ndarray, ref: np.ndarray, key: str) -> Dict[str, Any]:
    """Parity of ``out`` against ``ref`` under ``TOLERANCES[key]``.

    Returns:
        ``{"passed", "error", "tolerance", "key", "max_abs_err", "max_abs_ref", "finite", "shape_ok",
        "top1_agree"}`` (``top1_agree``: share of argmax over axis 1 that match; None on a shape mismatch).
    """
    out64 = np.asarray(out, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    shape_ok = out64.shape == ref64.shape
    err = parity_error(out64, ref64)
    tol = TOLERANCES[key]
    result: Dict[str, Any] = {
        "passed": bool(err <= tol), "error": err, "tolerance": tol, "key": key, "shape_ok": shape_ok,
        "finite": bool(np.all(np.isfinite(out64))),
        "max_abs_err": float(np.max(np.abs(out64 - ref64), initial=0.0)) if shape_ok else float("inf"),
        "max_abs_ref": float(np.max(np.abs(ref64), initial=0.0)),
        "top1_agree": float((out64.argmax(1) == ref64.argmax(1)).mean()) if shape_ok and out64.ndim > 1 else None,
    }
    return result


def check(out: np.ndarray, ref: np.ndarray, key: str) -> Tuple[bool, float]:
    """``(passes, error)`` under ``TOLERANCES[key]``."""
    err = parity_error(out, ref)
    return err <= TOLERANCES[key], err


__all__.append("check")
