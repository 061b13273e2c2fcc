"""Latency statistics in the form trtexec reports them, and A/B ratio statistics."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["summarize", "ratio_stats", "PERCENTILES"]

#: Percentiles reported besides the median.
PERCENTILES = (90, 95, 99)


def summarize(samples_s: Sequence[float], batch_size: int) -> dict[str, float]:
    """Per-iteration latencies (seconds) -> min/median/mean/p90/p95/p99 (ms), CV and throughput.

    Percentiles use linear interpolation (``numpy.percentile`` default). The coefficient of variation is
    ``std / mean`` with ``ddof=1``; throughput is ``batch_size / mean`` images per second.

    Raises:
        ValueError: fewer than two samples or a non-finite / non-positive sample.
    """
    x = np.asarray(samples_s, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"need at least 2 latency samples, got {x.size}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError("latency samples must be finite and positive")
    ms = x * 1e3
    out = {
        "iterations": int(x.size),
        "min_ms": float(ms.min()),
        "median_ms": float(np.median(ms)),
        "mean_ms": float(ms.mean()),
    }
    for p in PERCENTILES:
        out[f"p{p}_ms"] = float(np.percentile(ms, p))
    out["max_ms"] = float(ms.max())
    out["cv"] = float(ms.std(ddof=1) / ms.mean())
    out["throughput_img_s"] = float(batch_size / x.mean())
    return out


def ratio_stats(baseline_s: Sequence[float], other_s: Sequence[float]) -> dict[str, float]:
    """Per-pair ratios ``other / baseline`` of an A B A B ... run -> median, quartiles and IQR.

    Pairing cancels slow drifts of a shared machine: both members of a pair see about the same load.

    Raises:
        ValueError: different lengths or fewer than two pairs.
    """
    a = np.asarray(baseline_s, dtype=np.float64)
    b = np.asarray(other_s, dtype=np.float64)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"need two equally long sample lists of >= 2 pairs, got {a.size} and {b.size}")
    r = b / a
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    return {
        "pairs": int(r.size),
        "ratio_median": float(med),
        "ratio_q1": float(q1),
        "ratio_q3": float(q3),
        "ratio_iqr": float(q3 - q1),
    }
