"""The cells of the index table (:mod:`attnzoo.report.index`), each read from one report's ``report.json``: a cell
that has no figure says why (``not run``, ``unavailable``, ``failed``, ``absent``, the index's legend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attnzoo.machine import cpu_summary

from .render import FAILED, PASSED, step_states, step_title

__all__ = [
    "parity_cell",
    "int8_cosine_cell",
    "int8_top1_cell",
    "tensorrt_cell",
    "deploys_cell",
    "fused_cells",
    "overhead_cell",
    "machine",
]

_STATUS_CELL = {"skipped": "not run", "unavailable": "unavailable", "failed": "failed", "absent": "absent"}


def _status(entry: Any) -> str | None:
    """The cell of an entry that holds no figure (absent, or a status other than ``ok``), else ``None``."""
    if not isinstance(entry, Mapping):
        return "—"
    status: Any = entry.get("status")  # any JSON value
    return None if status == "ok" else _STATUS_CELL.get(status, str(status or "—"))


def _get(report: Mapping[str, Any], *keys: str) -> Any:
    """``report[k1][k2]...``, ``None`` where a key is missing."""
    value: Any = report
    for k in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(k)
    return value


def parity_cell(entry: Any) -> str:
    """fp32's, fp16's or a report format's parity with eager: ``ok (max err 2.6e-06)`` or ``FAILED (...)``."""
    if cell := _status(entry):
        return cell
    err = entry.get("max_abs_err")
    return f"{'ok' if entry.get('passed') else 'FAILED'}" + (f" ({err:.1e})" if err is not None else "")


def int8_cosine_cell(entry: Any) -> str:
    """int8's worst cosine to fp32 on held-out inputs, with the Q/DQ placement."""
    if cell := _status(entry):
        return cell
    cos = entry.get("cosine_min")
    return "—" if cos is None else f"{cos:.4f} ({entry.get('placement')})"


def int8_top1_cell(entry: Any) -> str:
    """int8's top-1 agreement with fp32 on held-out inputs, in percent."""
    if cell := _status(entry):
        return cell
    top1 = entry.get("top1_agreement")
    return "—" if top1 is None else f"{100 * top1:.1f}%"


def tensorrt_cell(entry: Any) -> str:
    """The TensorRT engine's state, its network check and, where it ran on a GPU, its parity."""
    if cell := _status(entry):
        return cell
    check = (entry.get("network_check") or {}).get("ok")
    state = f"{entry.get('state')}{'' if entry.get('ran_on_gpu') else ' - no GPU'}"
    parity = (entry.get("parity") or {}).get("passed") if entry.get("ran_on_gpu") else None
    return (
        state
        + ("" if check is None else f", network check {'ok' if check else 'FAILED'}")
        + ("" if parity is None else f", parity {'ok' if parity else 'FAILED'}")
    )


def deploys_cell(report: Mapping[str, Any]) -> str:
    """``verdict.deploys`` with its problems, or with the steps it does not count (``verdict.states``: those that did
    not run there; read from the export section for a report written before the verdict kept them)."""
    verdict = report.get("verdict") or {}
    if "deploys" not in verdict:
        return "—"
    if not verdict["deploys"]:
        return "no (" + ", ".join(verdict.get("problems") or []) + ")"
    states = verdict.get("states") or step_states(report)
    said = "; ".join(f"{step_title(k)} {s}" for k, s in states.items() if s not in (PASSED, FAILED))
    return f"yes (not counted: {said})" if said else "yes"


def fused_cells(report: Mapping[str, Any], runtimes: Sequence[str]) -> list[str]:
    """Per runtime: the variant's attention cores it runs fused, ``fused/cores``, from the fusion audit."""
    entry = _get(report, "fusion", report["variant"])
    if cell := _status(entry):
        return [cell] * len(runtimes)
    audited = {r.get("runtime"): r for r in _get(entry, "audit", "runtimes") or []}
    cells = []
    for name in runtimes:
        r = audited.get(name)
        cells.append("—" if r is None else f"{r['fused']}/{r['cores']}" if r.get("inspected") else "not inspected")
    return cells


#: The section each verdict ratio is measured in.
_RATIO_SECTION = {"overhead_first": "latency", "overhead_most_tokens": "scaling"}


def overhead_cell(report: Mapping[str, Any], key: str, tokens: bool) -> str:
    """``verdict.<key>``'s latency ratio to ``standard`` with its backend (and tokens, where the column's differ);
    without a ratio, the status of the section that measures it where that is not ``ok``."""
    verdict = report.get("verdict") or {}
    if key not in verdict:
        return "—"
    o = verdict[key]
    if o is None:
        if report["variant"] == "standard":
            return "baseline"
        section = _get(report, "cost", _RATIO_SECTION[key])
        cell = _status(section) if section is not None else None
        return cell or "not measured"
    where = f"{o['backend']}" + (f", {o['tokens']} tokens" if tokens else "")
    return f"x{o['ratio']:.2f} ({where})"


def machine(report: Mapping[str, Any]) -> str:
    """The CPU with its flags, and the GPU (or none), of the machine that wrote ``report``."""
    env = report.get("environment") or {}
    if not env.get("cpu"):
        return "—"
    gpu = (env.get("gpu") or {}).get("name") or "no GPU"
    return f"{cpu_summary(env['cpu'])}, {gpu}"


def _tokens(reports: Sequence[Mapping[str, Any]], key: str) -> list[int]:
    """The tokens of ``verdict.<key>`` across the reports that have it."""
    return sorted({o["tokens"] for r in reports if isinstance(o := _get(r, "verdict", key), Mapping)})
