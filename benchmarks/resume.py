"""The killed-run resume: what a row log (:class:`attnzoo.benchmarks.rowlog.RowLog`, ``rows.jsonl`` in ``--out``)
already holds, so that the same command run again keeps it and measures only the rest, and the result built from
every row of the log, this run's and the earlier runs'.
"""

from __future__ import annotations

from typing import Any

from attnzoo.benchmarks.rowlog import RowLog

__all__ = ["FINAL", "kept_rows", "groups_done", "results_from_log", "resume_lines"]

#: Row statuses a resumed run keeps (a ``skipped`` row is only written again: no GPU, budget spent ...).
FINAL = ("ok", "failed", "built")

#: A row's place: (variant, backend, dtype, batch).
RowKey = tuple[str, str, str, int]


def kept_rows(log: RowLog | None) -> dict[RowKey, dict[str, Any]]:
    """The finished rows of earlier runs in ``log`` (their ``row`` records), by place: not measured again."""
    kept = [r for r in (log.of("row") if log else []) if r["row"]["status"] in FINAL]
    return {(r["row"]["variant"], r["row"]["backend"], r["row"]["dtype"], r["row"]["batch"]): r for r in kept}


def groups_done(log: RowLog | None) -> set[tuple[str, int]]:
    """The (variant, batch) groups whose head-to-head and profiles an earlier run finished."""
    return {(g["variant"], g["batch"]) for g in (log.of("group") if log else [])}


def results_from_log(log: RowLog) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every row of the log, one per (variant, backend, dtype, batch) -- the finished one, else the latest skipped
    one -- grouped by variant and batch in the order they first appear; and the overhead entries of those rows."""
    chosen: dict[RowKey, dict[str, Any]] = {}
    for record in log.of("row"):
        r = record["row"]
        key = (r["variant"], r["backend"], r["dtype"], r["batch"])
        if key not in chosen or chosen[key]["row"]["status"] not in FINAL:
            chosen[key] = record
    order = {k: i for i, k in enumerate(dict.fromkeys((k[0], k[3]) for k in chosen))}
    records = sorted(chosen.values(), key=lambda rec: order[(rec["row"]["variant"], rec["row"]["batch"])])
    return [rec["row"] for rec in records], [rec["overhead"] for rec in records if rec.get("overhead")]


def resume_lines(log: RowLog, kept: int, to_measure: int) -> list[str]:
    """What the run says at its start about the log it resumes: a torn last line dropped, the rows kept."""
    lines = []
    if log.torn:
        lines.append(
            f"{log.path.name}: dropped its torn last line ({log.torn} bytes without a newline: a write cut by a "
            "kill); every whole line was kept"
        )
    if kept:
        lines.append(f"resuming: {kept} finished row(s) kept from {log.path}; {to_measure} to measure")
    return lines
