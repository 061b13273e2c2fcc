"""Benchmark output: the row log written as the run goes, then markdown tables, CSV, JSON (with the environment)
and PNG charts, written as one set.

The row log (:class:`attnzoo.benchmarks.rowlog.RowLog`, ``rows.jsonl`` in ``--out``) gets every finished row, with
its overhead entry, as one JSON line written and fsync'd at once: a run killed by any signal, SIGKILL included, keeps
every row it finished, and the same command run again reads them back and measures only the rest. Names and reasons
are HTML-escaped in the markdown tables.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.rowlog import LOG_NAME, ROW_FIELDS, RowLog
from attnzoo.machine import cpu_summary
from attnzoo.runtime.backends import reference_backend

from .plots import charts_unavailable, plot_efficiency, plot_latency, plot_overhead

__all__ = [
    "ROW_FIELDS",
    "OVERHEAD_FIELDS",
    "OUTPUTS",
    "LOG_NAME",
    "RowLog",
    "ceiling_line",
    "scope_line",
    "markdown",
    "write_outputs",
    "charts_unavailable",
    "plot_latency",
    "plot_efficiency",
    "plot_overhead",
    "profile_markdown",
]

#: Columns of an overhead row (variant against standard, A B A B alternation).
OVERHEAD_FIELDS = (
    "variant",
    "backend",
    "dtype",
    "batch",
    "pairs",
    "ratio_median",
    "ratio_q1",
    "ratio_q3",
    "ratio_iqr",
    "variant_median_ms",
    "standard_median_ms",
)


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.{digits}f}"
    return str(v)


def _esc(text: Any) -> str:
    """Text that came from a run or its row log (a name, a reason) as markdown text: HTML-escaped, pipes escaped."""
    return html.escape(str(text), quote=False).replace("|", "\\|")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], escape: bool = False) -> str:
    """A markdown table; ``escape``: every cell and header HTML-escaped (names and reasons from a row log)."""
    cell = _esc if escape else str
    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    return "\n".join(lines)


def markdown(result: Mapping[str, Any]) -> str:
    """All tables of a run: latency, speed-up pivot, overhead vs standard, skipped and failed backends."""
    rows = result["results"]
    ok = [r for r in rows if r["status"] == "ok"]
    parts = _run_header(result)
    parts += ["", "## Latency (ms; throughput in images/s)", ""]
    parts += _latency_section(ok)
    parts += _flops_lines(result.get("flops") or {})
    parts += _fastest_section(result.get("fastest_cpu") or [])
    pivot = _speedup_pivot(ok)
    if pivot:
        parts += [
            "",
            "## Speed-up over eager PyTorch (same variant and batch, eager at the row's precision where "
            "that row ran, else fp32: the table's 'vs'; median of per-pair ratios of an eager/backend A B A B "
            "run, else ratio of medians)",
            "",
            pivot,
        ]
    parts += _overhead_section(result.get("overheads", []))
    parts += _skipped_section([r for r in rows if r["status"] != "ok"])
    return "\n".join(parts) + "\n"


def _run_header(result: Mapping[str, Any]) -> list[str]:
    """The title, the command, the scope, the machine, the ceiling, where the time went and the GEMM rate."""
    parts = [
        f"# bench-latency: {result['settings']['task']} / {result['settings']['arch']}",
        "",
        f"Command: `{result['command']}`",
        "",
    ]
    if result.get("interrupted"):
        what = "Interrupted" if result["interrupted"].get("signal") else "Not finished"
        parts += [f"**{what}: {_esc(result['interrupted']['note'])}.**", ""]
    if result["settings"].get("scope"):
        parts += [scope_line(result["settings"]["scope"]), ""]
    parts += [result["note"], ""]
    env = result["environment"]
    gpu = env.get("gpu")
    parts.append(
        f"CPU: {cpu_summary(env['cpu'])}, {env['cpu']['usable_cores']} usable cores; GPU: "
        f"{gpu['name'] + ' driver ' + str(gpu['driver']) if gpu else 'none'}; load average at start "
        f"{env['load_average']}, at end {result.get('load_average_end')}; "
        f"threads {result['settings']['threads']}. Every number here holds for this machine only."
    )
    parts += ["", ceiling_line(result.get("ceiling"))]
    phases = result.get("phases_s")
    if phases:
        parts.append(
            f"\nWhere this run's {result['wall_time_s']:.0f} s went (s): "
            + "; ".join(f"{_esc(k)} {v:.1f}" for k, v in phases.items())
            + "."
        )
    gemm = env.get("gemm_gflops")
    if gemm:
        parts.append(
            f"\nfp32 GEMM {' x '.join(map(str, gemm['shape']))} ({gemm['threads']} thread(s)): PyTorch "
            f"{gemm['torch_gflops']:.0f} GFLOP/s, ONNX Runtime {gemm['onnxruntime_gflops']:.0f} GFLOP/s."
        )
    return parts


#: The latency table's columns, one per cell of :func:`_latency_cells`.
_LATENCY_HEADER = [
    "variant",
    "backend",
    "dtype",
    "batch",
    "median",
    "min",
    "mean",
    "p90",
    "p95",
    "p99",
    "CV",
    "img/s",
    "mem MB",
    "vs",
    "x eager",
    "x eager (pairs) [Q1, Q3]",
    "x eager fp32",
    "GFLOP/s",
    "% ceiling",
    "% roof",
    "parity err",
]


def _latency_cells(row: Mapping[str, Any]) -> list[str]:
    """One timed row of the latency table."""
    return [
        row["variant"],
        row["backend"],
        row["dtype"],
        str(row["batch"]),
        _fmt(row["median_ms"]),
        _fmt(row["min_ms"]),
        _fmt(row["mean_ms"]),
        _fmt(row["p90_ms"]),
        _fmt(row["p95_ms"]),
        _fmt(row["p99_ms"]),
        _fmt(row["cv"], 3),
        _fmt(row["throughput_img_s"], 1),
        _fmt(row["peak_mem_mb"], 1),
        _fmt(row.get("baseline")),
        _fmt(row["speedup_vs_eager"]),
        _pair(row),
        _fmt(row.get("speedup_vs_eager_fp32")),
        _fmt(row.get("achieved_gflops"), 1),
        _percent(row.get("ceiling_fraction")),
        _percent(row.get("roofline_fraction")),
        f"{row['parity_error']:.1e}",
    ]


def _latency_section(ok: Sequence[Mapping[str, Any]]) -> list[str]:
    """The latency table of the timed rows, and what `% roof` means where a row has one."""
    parts = [markdown_table(_LATENCY_HEADER, [_latency_cells(r) for r in ok], escape=True)]
    if any(r.get("roofline_fraction") is not None for r in ok):
        parts += [
            "",
            "`% roof` = the roofline lower bound of the row's forward pass on this GPU at the row's "
            "precision (attnzoo.benchmarks.roofline: dense datasheet peaks, fp32 on CUDA cores, tf32/fp16/bf16 "
            "on tensor cores, HBM bandwidth) / its median latency.",
        ]
    return parts


def _flops_lines(flops: Mapping[str, Any]) -> list[str]:
    """The counted GFLOP per image of each variant and the counter that counted them (none without counts)."""
    if not flops:
        return []
    return [
        "",
        "Counted GFLOP per image (one count per variant, on the eager model; every backend's row "
        "uses it): "
        + ", ".join(f"{_esc(v)} {f['flops_per_image'] / 1e9:.3f}" for v, f in flops.items())
        + f". Counter: {_esc(next(iter(flops.values()))['counter'])}.",
    ]


def _fastest_section(fastest: Sequence[Mapping[str, Any]]) -> list[str]:
    """The fastest fp32 CPU runtime per variant and batch (none without a choice)."""
    if not fastest:
        return []
    return [
        "",
        "## Fastest fp32 CPU runtime on this machine (per variant and batch: the largest speed-up over eager fp32)",
        "",
        markdown_table(
            ["variant", "batch", "fastest", "median ms", "x eager", "runner-up", "x runner-up", "decided by"],
            [
                [
                    f["variant"],
                    str(f["batch"]),
                    f["backend"],
                    _fmt(f["median_ms"]),
                    _fmt(f["x_eager"]),
                    f["runner_up"] or "-",
                    _fmt(f["x_runner_up"]),
                    f["how"] or "-",
                ]
                for f in fastest
            ],
            escape=True,
        ),
    ]


def _overhead_section(over: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each variant's overhead against standard from the paired runs (none without pairs)."""
    if not over:
        return []
    parts = ["", "## Overhead vs standard (median of per-pair ratios of an A B A B run; [Q1, Q3])", ""]
    parts.append(
        markdown_table(
            ["variant", "backend", "dtype", "batch", "ratio", "Q1", "Q3", "pairs"],
            [
                [
                    o["variant"],
                    o["backend"],
                    o["dtype"],
                    str(o["batch"]),
                    _fmt(o["ratio_median"], 3),
                    _fmt(o["ratio_q1"], 3),
                    _fmt(o["ratio_q3"], 3),
                    str(o["pairs"]),
                ]
                for o in over
            ],
            escape=True,
        )
    )
    return parts


def _skipped_section(bad: Sequence[Mapping[str, Any]]) -> list[str]:
    """The skipped and failed rows; a skip shared by every variant is listed once."""
    if not bad:
        return []
    parts = ["", "## Skipped and failed", ""]
    seen = set()
    lines = []
    for r in bad:
        key = (r["backend"], r["dtype"], r["status"], r["reason"])
        if r["status"] == "skipped" and key in seen:
            continue
        seen.add(key)
        who = "all variants" if r["status"] == "skipped" else f"{r['variant']} b{r['batch']}"
        lines.append([r["backend"], r["dtype"], r["status"], who, r["reason"]])
    parts.append(markdown_table(["backend", "dtype", "status", "where", "reason"], lines, escape=True))
    return parts


def scope_line(sc: Mapping[str, Any]) -> str:
    """One line for the terminal and the report: what this run leaves out and how to ask for everything."""
    if not sc.get("left_out"):
        return "Scope: everything (--all)." if sc.get("preset") == "all" else "Scope: everything --all measures."
    return f"Scope: this run leaves out {'; '.join(sc['left_out'])}. For everything: {sc['everything']}."


def _percent(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def ceiling_line(ceiling: Any) -> str:
    """One sentence: the machine's fp32 (and int8) matmul ceiling, or why there is none."""
    if not ceiling or ceiling.get("status") == "not measured":
        return f"Matmul ceiling: not measured ({(ceiling or {}).get('reason', 'no ceiling in this result')})."
    n = ceiling["shape"][0]
    libs = ", ".join(f"{k} {v['median_gflops']:.0f}" for k, v in ceiling["fp32"]["by_library"].items())
    end = ceiling.get("fp32_end_gflops")
    text = (
        f"Matmul ceiling ({n}x{n}x{n}, {ceiling['threads']} thread(s), median call): fp32 "
        f"{ceiling['fp32']['gflops']:.1f} GFLOP/s ({ceiling['fp32']['library']}; by library: {libs}"
        f"{f'; {end:.1f} at the end of the run' if end else ''})"
    )
    int8 = ceiling["int8"]
    if int8.get("status") == "measured":
        text += f"; int8 {int8['gops']:.1f} GOP/s ({int8['library']} MatMulInteger, {int8['isa']})"
    else:
        text += f"; int8 not measured: {int8.get('reason')}"
    return text + (
        ". `% ceiling` = counted FLOPs / median latency / the ceiling of the row's precision (CPU rows only); "
        "above 100 % a row ran while the machine was less busy than when the ceiling was measured (both are "
        "medians under the load of their moment: compare the two ceiling figures), or its runtime did less work "
        "than the FLOPs counted on the eager model."
    )


def _pair(row: Mapping[str, Any]) -> str:
    if row.get("speedup_pair_median") is None:
        return "-"
    return f"{row['speedup_pair_median']:.2f} [{row['speedup_pair_q1']:.2f}, {row['speedup_pair_q3']:.2f}]"


def _speedup_pivot(ok: list[Mapping[str, Any]]) -> str:
    cols = sorted(
        {
            (r["backend"], r["dtype"], r["batch"])
            for r in ok
            if r["speedup_vs_eager"] is not None and r["backend"] != reference_backend()
        },
        key=lambda c: (c[2], c[0], c[1]),
    )
    if not cols:
        return ""
    variants = list(dict.fromkeys(r["variant"] for r in ok))
    lookup = {
        (r["variant"], r["backend"], r["dtype"], r["batch"]): r["speedup_pair_median"]
        if r.get("speedup_pair_median") is not None
        else r["speedup_vs_eager"]
        for r in ok
    }
    rows = [[v] + [_fmt(lookup.get((v, *c))) for c in cols] for v in variants]
    return markdown_table(["variant"] + [f"{b} {d} b{n}" for b, d, n in cols], rows, escape=True)


def _csv(rows: Sequence[Mapping[str, Any]], fields: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fields), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


#: Every file of a run's output set (``write_outputs``), by name: written together, none left from an older set.
OUTPUTS: dict[str, str] = {
    "markdown": "results.md",
    "csv": "results.csv",
    "overheads_csv": "overheads.csv",
    "json": "results.json",
    "latency_png": "latency.png",
    "overhead_png": "overhead.png",
    "efficiency_png": "efficiency.png",
    "profile": "ort_profile.md",
}


def _render(result: Mapping[str, Any], profiles: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, Any]]:
    """Every output of ``result``: name -> (file name, bytes or a function drawing the file at a path)."""
    files: dict[str, tuple[str, Any]] = {
        "markdown": (OUTPUTS["markdown"], markdown(result).encode()),
        "csv": (OUTPUTS["csv"], _csv(result["results"], ROW_FIELDS).encode()),
        "overheads_csv": (OUTPUTS["overheads_csv"], _csv(result.get("overheads", []), OVERHEAD_FIELDS).encode()),
        "json": (OUTPUTS["json"], (json.dumps(result, indent=1, allow_nan=False, default=str) + "\n").encode()),
    }
    if profiles:
        files["profile"] = (OUTPUTS["profile"], profile_markdown(profiles).encode())
    ok = [r for r in result["results"] if r["status"] == "ok"]
    if (result.get("interrupted") or {}).get("signal") or charts_unavailable():  # a signal: written at once
        return files
    if ok:
        files["latency_png"] = (OUTPUTS["latency_png"], lambda path: plot_latency(ok, path))
    if result.get("overheads"):
        files["overhead_png"] = (OUTPUTS["overhead_png"], lambda path: plot_overhead(result["overheads"], path))
    if any(r.get("ceiling_fraction") is not None for r in ok):
        files["efficiency_png"] = (OUTPUTS["efficiency_png"], lambda path: plot_efficiency(ok, path))
    return files


def write_outputs(result: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write the output set of ``result`` -- ``results.md``, ``results.csv``, ``overheads.csv``, ``results.json``,
    ``ort_profile.md`` when profiled, the PNG charts (not for an interrupted run, nor without matplotlib) -- as one
    set: every file is written into a temporary folder in ``out_dir`` first, then renamed into place, and the files of
    an older set that this one does not have are removed. A failure while writing (out of disk) leaves the old set
    as it was.

    Raises:
        OSError: a file could not be written (the message names it; nothing in ``out_dir`` was replaced).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = _render(result, result.get("ort_profile") or [])
    tmp = Path(tempfile.mkdtemp(prefix=".results-", dir=out_dir))
    try:
        for name, content in files.values():
            try:
                if callable(content):
                    content(tmp / name)
                else:
                    with open(tmp / name, "wb") as f:
                        f.write(content)
                        f.flush()
                        os.fsync(f.fileno())
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"could not write {name} of the results ({exc.strerror or exc}); "
                    f"the results already in {out_dir} were left as they were",
                ) from None
        for name, _ in files.values():
            os.replace(tmp / name, out_dir / name)
        for name in set(OUTPUTS.values()) - {name for name, _ in files.values()}:
            (out_dir / name).unlink(missing_ok=True)  # of an older set: it would sit beside the new one
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {key: out_dir / name for key, (name, _) in files.items()}


def _op_table(naive: Mapping[str, Any], tuned: Mapping[str, Any], top: int = 12) -> str:
    ops = list(dict.fromkeys([*list(naive["ops"])[:top], *list(tuned["ops"])[:top]]))
    rows = []
    for op in ops:
        cells = [op]
        for prof in (naive, tuned):
            ms = prof["ops"].get(op)
            cells.append("-" if ms is None else f"{ms:.2f} ({100 * ms / prof['ms_per_run']:.0f}%)")
        rows.append(cells)
    return markdown_table(["op type", "naive ms/run (share)", "tuned ms/run (share)"], rows)


def profile_markdown(profiles: Sequence[Mapping[str, Any]]) -> str:
    """ONNX Runtime profiler summary: the unoptimized export vs the tuned ``ort-cpu`` session."""
    parts = [
        "# ONNX Runtime CPU profile (ORT profiler, kernel time per run summed by op type)",
        "",
        "naive = the export as written, graph optimizations off (ORT_DISABLE_ALL); tuned = the `ort-cpu` "
        "backend (saved ORT_ENABLE_EXTENDED graph loaded with ORT_ENABLE_ALL, batch fixed). Both: the run's "
        "intra-op threads, one inter-op thread, sequential, no spinning. Kernel time excludes the session's "
        "own overhead between kernels.",
        "",
        markdown_table(
            ["variant", "batch", "naive ms/run", "tuned ms/run", "naive top ops", "tuned top ops"],
            [
                [
                    p["variant"],
                    str(p["batch"]),
                    f"{p['naive']['ms_per_run']:.2f}",
                    f"{p['tuned']['ms_per_run']:.2f}",
                    _top3(p["naive"]),
                    _top3(p["tuned"]),
                ]
                for p in profiles
            ],
        ),
    ]
    for p in profiles:
        if p["variant"] == "standard":
            parts += [
                "",
                f"## standard, batch {p['batch']}",
                "",
                _op_table(p["naive"], p["tuned"]),
                "",
                "Slowest tuned nodes: "
                + "; ".join(f"`{n}` ({op}) {ms:.2f} ms" for n, op, ms in p["tuned"]["top_nodes"][:6]),
            ]
    return "\n".join(parts) + "\n"


def _top3(prof: Mapping[str, Any]) -> str:
    total = prof["ms_per_run"] or 1.0
    return ", ".join(f"{op} {100 * ms / total:.0f}%" for op, ms in list(prof["ops"].items())[:3])
