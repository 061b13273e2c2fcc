"""What a scaling run writes: ``scaling.json``, ``scaling.md`` (the cost model, the fitted exponents, every
measurement) and ``scaling.png`` (latency and peak memory against tokens and batch)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.tables import markdown_table
from attnzoo.fileio import atomic_path, atomic_write_text

from .fits import crossover_tokens

__all__ = ["markdown", "plot", "write_outputs"]


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


#: A table's columns: ``(header, cell of one item)``.
Columns = list[tuple[str, Callable[[dict[str, Any]], str]]]


def _table(columns: Columns, items: list[dict[str, Any]]) -> str:
    return markdown_table([header for header, _ in columns], [[cell(item) for _, cell in columns] for item in items])


def _cost_table(result: dict[str, Any]) -> str:
    """Per family member: the FLOPs per token and per token pair, and where attention becomes most of the work."""
    columns: Columns = [
        ("family", lambda cost: cost["family"]),
        ("variant", lambda cost: cost["variant"]),
        ("a: matrix FLOPs per token (x D^2)", lambda cost: _num(cost["matrix_linear_D2"], "{:g}")),
        ("b: matrix FLOPs per token pair (x D)", lambda cost: _num(cost["matrix_quadratic_D"], "{:g}")),
        ("c: vector ops per token pair (x D)", lambda cost: _num(cost["vector_quadratic_D"], "{:g}")),
        (
            f"N where b + c terms = a term (D = {result['cost_model'][0]['D']})",
            lambda cost: f"{crossover_tokens(cost):,.0f}",
        ),
    ]
    return _table(columns, result["cost_model"])


#: Per sweep, variant and backend: the exponents of work, latency and peak memory.
_FIT_COLUMNS: Columns = [
    ("sweep", lambda fit: fit["sweep"]),
    ("variant", lambda fit: fit["variant"]),
    ("backend", lambda fit: fit["backend"]),
    ("tokens / batch", lambda fit: f"{fit['range'][0]}-{fit['range'][1]}" if fit["range"] else "-"),
    ("points", lambda fit: str(fit["points"])),
    ("work exponent", lambda fit: _num(fit["work_exponent"])),
    ("latency exponent", lambda fit: _num(fit["latency_exponent"])),
    ("peak-memory exponent", lambda fit: _num(fit["memory_exponent"])),
]

#: Every measurement, skipped and failed ones with their reason.
_ROW_COLUMNS: Columns = [
    ("variant", lambda row: row["variant"]),
    ("backend", lambda row: row["backend"]),
    ("task", lambda row: row["task"]),
    ("px", lambda row: str(row["img_size"])),
    ("tokens", lambda row: str(row["tokens"])),
    ("batch", lambda row: str(row["batch"])),
    ("GFLOP", lambda row: _num(row["matrix_gflop"] + row["vector_gop"], "{:.1f}")),
    ("median ms", lambda row: _num(row["median_ms"], "{:.1f}")),
    ("ms / image", lambda row: _num(row["per_image_ms"], "{:.1f}")),
    ("GFLOP/s", lambda row: _num(row["achieved_gflop_s"], "{:.1f}")),
    ("peak MB", lambda row: _num(row["peak_mb"], "{:.0f}")),
    ("status", lambda row: row["status"] + (f": {row['reason']}" if row["reason"] else "")),
]


def markdown(result: dict[str, Any]) -> str:
    """Tables: the cost model, the fitted exponents, every measurement."""
    cpu, settings = result["environment"]["cpu"], result["settings"]
    partial = (
        [] if result.get("complete", True) else ["**Partial run**: stopped before every variant was measured.", ""]
    )
    return "\n".join(
        [
            "# Scaling: latency and peak memory against tokens and batch size",
            "",
            *partial,
            f"Command: `{result['command']}`",
            "",
            f"CPU: {cpu['model']} ({', '.join(cpu['key_flags'])}), {settings['threads']} thread(s); load average at "
            f"the start {result['environment']['load_average']}, at the end {result['load_average_end']}; wall time "
            f"{result['wall_time_s'] / 60:.0f} min. Models: {settings['arch']} with seeded random weights. "
            "Peak MB: the process's peak RSS above its size once the backend was built (activations and workspace).",
            "",
            "## Cost model (FLOPs of one encoder block, from attnzoo.benchmarks.flops)",
            "",
            "Per block with N tokens of width D: matrix FLOPs = a N D^2 + b N^2 D, vector ops (the MAE distance) "
            "= c N^2 D. Beyond the last column's N, attention is most of the work.",
            "",
            _cost_table(result),
            "",
            "## Fitted exponents (log-log least squares over the sizes that ran)",
            "",
            "work = counted matrix FLOPs + vector ops; latency ~ tokens^exponent (or batch^exponent).",
            "",
            _table(_FIT_COLUMNS, result["fits"]),
            "",
            "## Measurements",
            "",
            _table(_ROW_COLUMNS, result["rows"]),
            "",
        ]
    )


def plot(result: dict[str, Any], path: Path) -> Path:
    """Six panels: latency (top) and peak memory (bottom) against ViT tokens, Segmenter tokens and batch."""
    # heavy: matplotlib, for the plot only
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = [row for row in result["rows"] if row["status"] == "ok"]
    variants = list(dict.fromkeys(row["variant"] for row in result["rows"]))
    backends = list(dict.fromkeys(row["backend"] for row in result["rows"]))
    colors = {v: plt.cm.tab10(i % 10) for i, v in enumerate(variants)}
    styles = dict(zip(backends, [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")], strict=False))
    arch = result["settings"]["arch"]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9.5), squeeze=False)
    panels = [
        ("tokens", "tokens", f"{arch} classifier, batch 1"),
        ("seg", "tokens", f"Segmenter ({arch}), batch 1"),
        ("batch", "batch", f"{arch} classifier, {result['settings']['batch_px']} px"),
    ]
    for col, (sweep, var, title) in enumerate(panels):
        for v in variants:
            for b in backends:
                pts = sorted(
                    (row for row in rows if sweep in row["sweeps"] and row["variant"] == v and row["backend"] == b),
                    key=lambda row: row[var],
                )
                if not pts:
                    continue
                ls, mk = styles[b]
                xs = [row[var] for row in pts]
                lat = [row["per_image_ms"] if sweep == "batch" else row["median_ms"] for row in pts]
                axes[0][col].plot(xs, lat, ls, marker=mk, color=colors[v], ms=4)
                peak = [max(row["peak_mb"], 0.1) for row in pts]
                axes[1][col].plot(xs, peak, ls, marker=mk, color=colors[v], ms=4)
        axes[0][col].set_title(title)
        axes[0][col].set_ylabel("ms per image" if sweep == "batch" else "latency (ms)")
        axes[1][col].set_ylabel("peak memory above the built model (MB)")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2 if sweep == "batch" else 10)
            ax.set_yscale("log")
            ax.set_xlabel("batch size" if sweep == "batch" else "tokens")
            ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color=colors[v], lw=2, label=v) for v in variants]
    handles += [Line2D([], [], color="k", ls=styles[b][0], marker=styles[b][1], label=b) for b in backends]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 9), frameon=False)
    cpu = result["environment"]["cpu"]
    fig.suptitle(
        f"Scaling on {cpu['model']} ({', '.join(cpu['key_flags'])}), {result['settings']['threads']} "
        f"thread(s){' - machine shared with other jobs' if result.get('contended') else ''}"
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def write_outputs(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """scaling.json, scaling.md and scaling.png in ``out`` (written atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "scaling.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "scaling.md", markdown(result))
    return {"json": out / "scaling.json", "markdown": out / "scaling.md", "plot": plot(result, out / "scaling.png")}
