"""bench-latency's PNG charts (matplotlib, an optional dependency): latency per batch, the efficiency of each
backend and the overhead of each variant over ``standard``."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.fileio import save_png

__all__ = ["charts_unavailable", "plot_latency", "plot_efficiency", "plot_overhead"]


def charts_unavailable() -> str | None:
    """Why no PNG chart can be drawn here (matplotlib is not installed), or ``None``."""
    return None if importlib.util.find_spec("matplotlib") else "matplotlib is not installed: no PNG charts"


def _pyplot():
    import matplotlib  # heavy: matplotlib, for the charts only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(ax, title: str, ylabel: str, variants: Sequence[str]) -> None:
    """Title, y label, variant names on the x axis, grid and legend."""
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=35, ha="right", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def _save_fig(fig, path: Path) -> Path:
    """The benchmark charts at 110 dpi."""
    return save_png(fig, path, dpi=110)


def _batch_panels(rows: Sequence[Mapping[str, Any]]) -> tuple[Any, list[tuple[Any, int]], list, list, dict, float]:
    """A chart of one panel per batch with a bar per variant and backend/dtype: the figure, ``(axes, batch)`` per
    panel, the series ``(backend, dtype)``, the variants, each row by ``(variant, backend, dtype, batch)`` and the
    width of a bar."""
    plt = _pyplot()
    batches = sorted({r["batch"] for r in rows})
    series = list(dict.fromkeys((r["backend"], r["dtype"]) for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lookup = {(r["variant"], r["backend"], r["dtype"], r["batch"]): r for r in rows}
    fig, axes = plt.subplots(
        len(batches), 1, figsize=(max(8, 0.75 * len(variants) + 3), 3.6 * len(batches)), squeeze=False
    )
    width = 0.8 / max(len(series), 1)
    return fig, list(zip(axes[:, 0], batches, strict=False)), series, variants, lookup, width


def plot_latency(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Median latency (bars) with p90 (whisker) per variant, one bar per backend/dtype, one panel per batch."""
    fig, panels, series, variants, lookup, width = _batch_panels(rows)
    for ax, batch in panels:
        for i, (backend, dtype) in enumerate(series):
            xs, med, err = [], [], []
            for j, v in enumerate(variants):
                r = lookup.get((v, backend, dtype, batch))
                if r:
                    xs.append(j + (i - (len(series) - 1) / 2) * width)
                    med.append(r["median_ms"])
                    err.append(r["p90_ms"] - r["median_ms"])
            ax.bar(xs, med, width, yerr=[[0] * len(err), err], capsize=2, label=f"{backend} {dtype}")
        _style(ax, f"batch {batch}: median latency (whisker: p90)", "ms", variants)
    return _save_fig(fig, path)


def plot_efficiency(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Fraction of the machine's matmul ceiling per variant, one bar per backend/dtype, one panel per batch."""
    rows = [r for r in rows if r.get("ceiling_fraction") is not None]
    fig, panels, series, variants, lookup, width = _batch_panels(rows)
    for ax, batch in panels:
        for i, (backend, dtype) in enumerate(series):
            hits = [
                (j, lookup[(v, backend, dtype, batch)])
                for j, v in enumerate(variants)
                if (v, backend, dtype, batch) in lookup
            ]
            ax.bar(
                [j + (i - (len(series) - 1) / 2) * width for j, _ in hits],
                [100 * r["ceiling_fraction"] for _, r in hits],
                width,
                label=f"{backend} {dtype}",
            )
        ax.axhline(100, color="k", lw=0.8)
        _style(ax, f"batch {batch}: counted GFLOP/s as % of this machine's matmul ceiling", "% of ceiling", variants)
    return _save_fig(fig, path)


def plot_overhead(overheads: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Latency ratio to standard (median of pairs, whiskers Q1..Q3) per variant, per backend/dtype/batch."""
    plt = _pyplot()
    series = list(dict.fromkeys((o["backend"], o["dtype"], o["batch"]) for o in overheads))
    variants = list(dict.fromkeys(o["variant"] for o in overheads))
    lookup = {(o["variant"], o["backend"], o["dtype"], o["batch"]): o for o in overheads}
    fig, ax = plt.subplots(figsize=(max(8, 0.75 * len(variants) + 3), 4.2))
    width = 0.8 / max(len(series), 1)
    for i, key in enumerate(series):
        xs, med, lo, hi = [], [], [], []
        for j, v in enumerate(variants):
            o = lookup.get((v, *key))
            if o:
                xs.append(j + (i - (len(series) - 1) / 2) * width)
                med.append(o["ratio_median"])
                lo.append(o["ratio_median"] - o["ratio_q1"])
                hi.append(o["ratio_q3"] - o["ratio_median"])
        ax.errorbar(xs, med, yerr=[lo, hi], fmt="o", ms=4, capsize=2, label=f"{key[0]} {key[1]} b{key[2]}")
    ax.axhline(1.0, color="k", lw=0.8)
    _style(ax, "latency / standard latency (A B A B pairs; whiskers: Q1..Q3)", "ratio", variants)
    return _save_fig(fig, path)
