"""The report's PNG plots: the benchmarks' own for the cost section (:func:`attnzoo.benchmarks.tables.plot_latency`,
:func:`~attnzoo.benchmarks.tables.plot_overhead`, :func:`attnzoo.benchmarks.scaling.plot`) and the error at each
block's output of every export that has block figures (:func:`plot_block_errors`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.tables import plot_latency, plot_overhead
from attnzoo.fileio import save_png
from attnzoo.lazy import lazy_import

from .formats import block_entries, entry_title

scaling_bench = lazy_import("attnzoo.benchmarks.scaling")

__all__ = ["plots", "block_series", "plot_block_errors"]


def plots(report: Mapping[str, Any], out: Path) -> dict[str, Path]:
    """The PNGs of the cost section (those it has data for)."""
    cost = report.get("cost") or {}
    written: dict[str, Path] = {}
    lat = cost.get("latency") or {}
    if lat.get("status") == "ok":
        rows = [r for r in lat["rows"] if r["status"] == "ok" and r.get("median_ms") is not None]
        if rows:
            written["latency"] = plot_latency(rows, out / "latency.png")
        if lat.get("overheads"):
            written["overhead"] = plot_overhead(lat["overheads"], out / "overhead.png")
    sc = cost.get("scaling") or {}
    if sc.get("status") == "ok" and any(r["status"] == "ok" for r in sc["rows"]):
        written["scaling"] = scaling_bench.plot(dict(sc), out / "scaling.png")
    series = block_series(report)
    if series:
        written["blocks"] = plot_block_errors(series, out / "block-errors.png")
    return written


def block_series(report: Mapping[str, Any]) -> dict[str, dict[str, list[float]]]:
    """``{precision: {side: [rel_err of block 0, 1, ...]}}`` of every export that has block figures."""
    series: dict[str, dict[str, list[float]]] = {}
    shown = block_entries()
    for side, entries in (report.get("export") or {}).items():
        for dtype in shown:
            e = entries.get(dtype) or {}
            if e.get("status") == "ok" and e.get("blocks"):
                series.setdefault(dtype, {})[side] = [float(b["rel_err"]) for b in e["blocks"]]
    return {d: series[d] for d in shown if d in series}


def plot_block_errors(series: Mapping[str, Mapping[str, Sequence[float]]], path: Path) -> Path:
    """One small panel per precision: each side's error at each block's output (``max |out - ref| / max(1, max
    |ref|)``, log scale; fp32 / fp16 against eager, int8 / FP8 against the fp32 graph)."""
    import matplotlib  # heavy: matplotlib, for the charts only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(side for sides in series.values() for side in sides))
    fig, axes = plt.subplots(1, len(series), figsize=(2.8 * len(series) + 0.6, 2.6), squeeze=False)
    for ax, (dtype, sides) in zip(axes[0], series.items(), strict=True):
        for side, errs in sides.items():
            color = f"C{names.index(side)}"  # one colour per side in every panel
            ax.plot(range(len(errs)), [max(e, 1e-12) for e in errs], marker="o", ms=3, color=color, label=side)
        ax.set_yscale("log")
        ax.set_title(entry_title(dtype) + (" vs fp32 graph" if dtype in ("int8", "fp8") else " vs eager"), fontsize=9)
        ax.set_xlabel("block", fontsize=8)
        ax.set_xticks(range(max(len(errs) for errs in sides.values())))
        ax.tick_params(which="both", labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("rel. error at block output", fontsize=8)
    return save_png(fig, path, dpi=100)
