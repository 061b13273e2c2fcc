"""The load test's outputs: ``results.json``, the table of ``results.md`` and the plot ``loadtest.png``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.fileio import atomic_write_text


def _table(result: dict[str, Any]) -> str:
    best = result["offline"]["best_img_s"]
    lines = [
        f"Offline best (bench-latency ort-cpu, {result['model']}): **{best:.1f} img/s** "
        f"({result['offline']['best']['threads']} thread(s), batch {result['offline']['best']['batch']}). "
        f"Ingress: {result['settings'].get('ingress', 'not recorded')}.",
        "",
    ]
    if result["runs"]:
        lines += [
            "| replicas x threads | max batch | clients | img/s | vs offline best | p50 ms | p95 ms | p99 ms | "
            "errors | lost | mean batch |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
    for r in result["runs"]:
        s = r["summary"]
        lines.append(
            f"| {r['replicas']} x {r['threads']} | {r['max_batch_size']} | {r['clients']} | "
            f"{s['throughput_rps']:.1f} | {r['vs_offline_best']:.2f} | {s['p50_ms']} | {s['p95_ms']} | "
            f"{s['p99_ms']} | {s['errors']} | {s['lost']} | {r['mean_batch']} |"
        )
    for key, label in (("soak", "Soak"), ("kill", "Replica kill")):
        if result.get(key):
            s = result[key]["summary"]
            lines += [
                "",
                f"{label}: {s['requests']} requests over {s['seconds']:.0f} s, {s['ok']} ok, "
                f"{s['errors']} errors, {s['lost']} lost, {s['throughput_rps']:.1f} img/s, "
                f"p95 {s['p95_ms']} ms.",
            ]
    if result.get("kill"):
        k = result["kill"]
        lines.append(
            f"Killed replica {k['killed_replica']} (pid {k['killed_pid']}) at {k['kill_at_s']} s: "
            f"{k['failed_in_flight_at_kill']} failed requests were in flight at the kill, "
            f"{k['failed_sent_after_kill']} were sent after it ({', '.join(k['failed_statuses']) or 'none'}); "
            f"replicas back after {k['replicas_back_after_s']} s; replaced: {k['replaced']}."
        )
    if len(result.get("kill_repeats", [])) > 1:
        ks = result["kill_repeats"]
        lines.append(
            f"Kill test repeated {len(ks)} times: failed requests in flight at the kill "
            f"{[k['failed_in_flight_at_kill'] for k in ks]}, sent after it "
            f"{[k['failed_sent_after_kill'] for k in ks]}, lost {[k['summary']['lost'] for k in ks]}; "
            f"runs with a failure sent after the kill: "
            f"{sum(k['failed_sent_after_kill'] > 0 for k in ks)} of {len(ks)}; "
            f"replaced every time: {all(k['replaced'] for k in ks)}."
        )
    return "\n".join(lines) + "\n"


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib  # heavy: matplotlib, for the plot at the end only

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = result["runs"]
    labels = [
        f"{r['replicas']}x{r['threads']} thr\n"
        + (f"batch {r['max_batch_size']}" if r["max_batch_size"] > 1 else "no batching")
        for r in runs
    ]
    fig = Figure(figsize=(11, 4.2), dpi=110)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    x = np.arange(len(runs))
    ax1.bar(x, [r["summary"]["throughput_rps"] for r in runs], color="#4c72b0")
    best = result["offline"]["best_img_s"]
    ax1.axhline(best, color="k", ls="--", lw=1, label=f"offline best {best:.0f} img/s")
    ax1.axhline(0.85 * best, color="#c44e52", ls=":", lw=1, label="85 % of it")
    ax1.set_xticks(x, labels, fontsize=8)
    ax1.set_ylabel("images/s")
    ax1.set_title(f"throughput, {runs[0]['clients']} clients", fontsize=10)
    ax1.legend(fontsize=8, loc="lower right")
    w = 0.27
    for i, (q, c) in enumerate((("p50_ms", "#55a868"), ("p95_ms", "#dd8452"), ("p99_ms", "#c44e52"))):
        ax2.bar(x + (i - 1) * w, [r["summary"][q] or 0 for r in runs], w, label=q[:-3], color=c)
    ax2.set_xticks(x, labels, fontsize=8)
    ax2.set_ylabel("latency (ms)")
    ax2.set_title("latency per request", fontsize=10)
    ax2.legend(fontsize=8)
    fig.suptitle(
        f"serve-models load test: {result['model']} on {result['environment']['cpu'].get('model', 'CPU')}, "
        f"{result['environment']['cpu'].get('logical_cores', '?')} cores",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)


def _write(result: dict[str, Any], out: Path) -> None:
    """``results.json``, ``results.md`` and (with runs) ``loadtest.png`` into ``out``; the table printed."""
    atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    table = _table(result)
    atomic_write_text(out / "results.md", table)
    written = [out / "results.json", out / "results.md"]
    if result["runs"]:
        _plot(result, out / "loadtest.png")
        written.append(out / "loadtest.png")
    print(table)
    print("wrote " + ", ".join(map(str, written)))
