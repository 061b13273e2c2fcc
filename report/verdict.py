"""The verdict of a report: each step's state (:data:`STEP_STATES`), whether the variant deploys (only on steps that
ran here), every check that did not pass (:func:`failures`) and the one line that says it (:func:`verdict`); the
figures it quotes (the latency overheads against ``standard``) and the plain-text cells the page shares with it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.lazy import lazy_import
from attnzoo.mdtext import text
from attnzoo.runtime.backends import ONNX_REFERENCE
from attnzoo.runtime.fusion import RUNTIMES

from .formats import entry_title, report_formats

# report-variant --help loads without torch and timm: imported at their first use
factory = lazy_import("attnzoo.models.factory")

__all__ = [
    "verdict",
    "step_states",
    "step_title",
    "STEP_STATES",
    "PASSED",
    "FAILED",
    "BUILT",
    "UNAVAILABLE",
    "NOT_RUN",
    "REQUIRED_STEPS",
    "failures",
    "scaling_pairs",
]


def _num(v: Any, fmt: str = "{:.3g}") -> str:
    """A figure as Markdown text (``-`` where there is none; a value that is not a number, escaped)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return fmt.format(v) if isinstance(v, (int, float)) else text(v)


def _plain_state(entry: Mapping[str, Any] | None) -> str:
    """``ok``, or the status with its reason (plain text: the verdict line)."""
    if not entry:
        return "-"
    if entry.get("status") == "ok":
        return "ok"
    return f"{entry.get('status')}: {entry.get('reason', '')}".rstrip(": ")


def _state(entry: Mapping[str, Any] | None) -> str:
    """:func:`_plain_state` as Markdown text."""
    return text(_plain_state(entry))


def _fused(report: Mapping[str, Any], side: str) -> dict[str, str]:
    """Runtime -> ``fused/cores``, or ``not inspected``, for one side's audit (every runtime it names)."""
    entry = (report.get("fusion") or {}).get(side) or {}
    if entry.get("status") != "ok":
        return {}
    out = {}
    for r in entry["audit"]["runtimes"]:
        out[r["runtime"]] = f"{r['fused']}/{r['cores']}" if r["inspected"] else "not inspected"
    return out


#: The report's sections that hold steps (``cost.gpu``: committed results of another machine, not this run's).
_STEP_SECTIONS = ("identity", "export", "fusion", "fusable", "cost.latency", "cost.scaling")


def _row_name(path: str, row: Mapping[str, Any]) -> str:
    keys = [str(row[k]) for k in ("variant", "backend", "dtype") if row.get(k) is not None]
    keys += [f"b{row['batch']}"] if row.get("batch") is not None else []
    keys += [f"{row['tokens']} tokens"] if row.get("tokens") is not None else []
    return f"{path} ({' '.join(keys)})"


def failures(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every check of the run that did not pass: each entry, at any depth of a step section, whose ``status`` is
    ``failed``, or ``ok`` with ``passed`` false (an export that wrote a file which failed its check), and every
    timed row that failed; ``{"check": where in report.json, "reason": its reason}``. Steps that were skipped,
    unavailable or absent say why in their own place and are not failures."""
    found: list[dict[str, str]] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, Mapping):
            status = value.get("status")
            if status == "failed" or (status == "ok" and value.get("passed") is False):
                found.append({"check": path, "reason": str(value.get("reason") or "its check did not pass")})
                return
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, _row_name(path, v) if isinstance(v, Mapping) else f"{path}[{i}]")

    for section in _STEP_SECTIONS:
        value: Any = report
        for key in section.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        walk(value, section)
    return found


def _short(reason: str, limit: int = 160) -> str:
    reason = " ".join(reason.split())
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def _overhead_197(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The variant's latency ratio to standard at batch 1, fp32, on its fastest CPU runtime (else the first
    overhead measured)."""
    lat = (report.get("cost") or {}).get("latency") or {}
    if lat.get("status") != "ok" or not lat.get("overheads"):
        return None
    fast = next(
        (f["backend"] for f in lat.get("fastest_cpu", []) if f["variant"] == report["variant"] and f["batch"] == 1),
        None,
    )
    rows = [o for o in lat["overheads"] if o["dtype"] == "fp32" and o["batch"] == 1]
    pick = next((o for o in rows if o["backend"] == fast), rows[0] if rows else None)
    if pick is None:
        return None
    tokens = _tokens(report["identity"], lat["settings"]["arch"])
    return {"ratio": pick["ratio_median"], "backend": pick["backend"], "batch": 1, "tokens": tokens}


def _tokens(identity: Mapping[str, Any], arch: str) -> int | None:
    a = factory.ARCHS.get(arch)
    return None if a is None else (a["img_size"] // a["patch_size"]) ** 2 + 1


def scaling_pairs(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per (task, tokens, backend) of the scaling rows: standard's and the variant's latency and peak memory."""
    sc = (report.get("cost") or {}).get("scaling") or {}
    if sc.get("status") != "ok":
        return []
    variant = report["variant"]
    table: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in sc["rows"]:
        key = (r["task"], r["tokens"], r["backend"])
        side = "variant" if r["variant"] == variant else "standard"
        table.setdefault(key, {"task": r["task"], "tokens": r["tokens"], "backend": r["backend"]})[side] = r
    out = []
    for entry in table.values():
        v, s = entry.get("variant"), entry.get("standard")
        ok = v is not None and s is not None and v["status"] == s["status"] == "ok"
        entry["ratio"] = v["median_ms"] / s["median_ms"] if ok and v is not None and s is not None else None
        out.append(entry)
    return sorted(out, key=lambda e: (e["task"], e["tokens"], e["backend"]))


def _overhead_max(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The variant's latency ratio to standard at the classifier's most tokens measured (ONNX Runtime where it
    ran there, else eager)."""
    pairs = [p for p in scaling_pairs(report) if p["task"] == "cls" and p["ratio"] is not None]
    if not pairs:
        return None
    top = max(p["tokens"] for p in pairs)
    at = [p for p in pairs if p["tokens"] == top]
    pick = next((p for p in at if p["backend"] == ONNX_REFERENCE), at[0])
    return {"ratio": pick["ratio"], "backend": pick["backend"], "batch": 1, "tokens": top}


def _fusable_cell(runtime: str, entry: Any) -> str:
    """One runtime of the opset-23 audit: ``fused/cores``, ``not inspected``, or the export's count for the
    transformer optimizer (its ``opt_level=0`` keeps an exported Attention op as it is)."""
    name = RUNTIMES.get(runtime, runtime)
    if isinstance(entry, Mapping):
        if not entry.get("inspected"):
            return f"{name} not inspected"
        counts = f"{entry.get('fused')}/{entry.get('cores')}"
        return f"{name} {counts}" + (" as exported (opt_level 0)" if entry.get("as_exported") else "")
    fused, cores = entry  # reports written before runtimes kept their inspected flag: [fused, cores]
    exported = " as exported (opt_level 0)" if runtime == "onnxruntime-transformers" else ""
    return f"{name} {fused}/{cores}{exported}"


#: What each step of the verdict did in the run: it ``passed`` or ``failed`` (it ran, or was refused), or it did
#: not run here: ``built, not run`` (a TensorRT engine built and its network checked, never executed: no GPU),
#: ``unavailable`` (it cannot run on this machine: TensorRT or a format's runtime not installed) or ``not run`` (not
#: asked for with this budget). Only a step that ran and passed counts toward ``deploys``.
PASSED, FAILED, BUILT, UNAVAILABLE, NOT_RUN = "passed", "failed", "built, not run", "unavailable", "not run"
STEP_STATES = (PASSED, FAILED, BUILT, UNAVAILABLE, NOT_RUN)
#: The steps ``deploys`` requires to have run and passed; any other step counts where it ran (a failure is a
#: problem, a pass is counted) and is named as not counted where it did not.
REQUIRED_STEPS = ("parity", "fp16", "extra_math_kept", "int8")
#: The verdict's steps as its line names them (a format by its title, :func:`entry_title`).
_STEP_TITLES = {"parity": "fp32 parity", "extra_math_kept": "extra math", "tensorrt": "TensorRT"}


def step_title(step: str) -> str:
    """A verdict step as the line and the index name it (``fp32 parity``, ``TensorRT``, ``OpenVINO IR``)."""
    return _STEP_TITLES.get(step) or entry_title(step)


def _ran(entry: Mapping[str, Any] | None) -> str:
    """The state of an export step: ``ok`` and passed, ``ok`` with ``passed`` false or ``failed``, ``unavailable``,
    else (``skipped``, ``absent``, no entry) not run."""
    status = (entry or {}).get("status")
    if status == "ok":
        return PASSED if (entry or {}).get("passed") else FAILED
    return {"failed": FAILED, "unavailable": UNAVAILABLE}.get(str(status), NOT_RUN)


def _engine_state(trt: Mapping[str, Any]) -> str:
    """The TensorRT step's state: its network check failed, it was built and never executed (``built, not run``),
    or it ran on a GPU and its parity against ONNX Runtime passed or failed. A built engine is a fact about the
    build, never a passed check."""
    if trt.get("status") != "ok":
        return _ran(trt)
    if not (trt.get("network_check") or {}).get("ok"):
        return FAILED
    passed = (trt.get("parity") or {}).get("passed") if trt.get("ran_on_gpu") else None
    return BUILT if passed is None else PASSED if passed else FAILED


def step_states(report: Mapping[str, Any]) -> dict[str, str]:
    """Per step of the verdict (``parity``, ``fp16``, ``extra_math_kept``, ``int8``, ``tensorrt`` and every format of
    :func:`~attnzoo.report.formats.report_formats`), its state in :data:`STEP_STATES`, read from the variant's export
    section."""
    side = (report.get("export") or {}).get(report["variant"]) or {}
    kept = [v for v in (side.get("extra_math_kept") or {}).values() if v is not None]
    return {
        "parity": _ran(side.get("fp32")),
        "fp16": _ran(side.get("fp16")),
        "extra_math_kept": (PASSED if all(kept) else FAILED) if kept else NOT_RUN,
        "int8": _ran(side.get("int8")),
        "tensorrt": _engine_state(side.get("tensorrt") or {}),
        **{f: _ran(side.get(f)) for f in report_formats()},
    }


def verdict(report: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """The checks an author reads first, whether the variant deploys, and the one line that says it.

    ``deploys`` rests only on steps that ran here: every step of :data:`REQUIRED_STEPS` passed and no step failed;
    a step that did not run (a TensorRT engine built without a GPU, a runtime not installed, a step this budget
    leaves out) is named as not counted, never as a pass."""
    name = report["variant"]
    side = report["export"][name]
    states = step_states(report)
    # a format counts among the checks where it was written or refused, as it always has
    reported = report_formats()
    formats = [f for f in reported if (side.get(f) or {}).get("status") in ("ok", "failed")]
    checks = {k: s == PASSED for k, s in states.items() if k not in reported or k in formats}
    problems = [k for k, s in states.items() if s == FAILED or (k in REQUIRED_STEPS and s != PASSED)]
    uncounted = {k: s for k, s in states.items() if s != PASSED and k not in problems}
    fused = _fused(report, name)
    o1, o2 = _overhead_197(report), _overhead_max(report)
    said = "; ".join(f"{step_title(k)} {s}" for k, s in uncounted.items())
    parts = [
        f"{name}: deploys{f' (not counted: {said})' if said else ''}"
        if not problems
        else f"{name}: does not deploy ({', '.join(problems)})"
    ]
    parts += _export_parts(side, checks, states, formats)
    if fused:  # every runtime the audit names: a runtime whose graph could not be read says so
        parts.append("fused: " + ", ".join(f"{RUNTIMES.get(k, k)} {v}" for k, v in fused.items()))
    parts += _cost_parts(report, o1, o2)
    failed = failures(report)
    if failed:
        parts.append(
            f"{len(failed)} check(s) did not pass: " + "; ".join(f"{f['check']}: {_short(f['reason'])}" for f in failed)
        )
    parts.append(f"report: {out / 'report.md'}")
    return {
        "deploys": not problems,
        "problems": problems,
        "failed": failed,
        "checks": checks,
        "states": states,
        "fused": fused,
        "overhead_first": o1,
        "overhead_most_tokens": o2,
        "line": " | ".join(parts),
    }


def _export_parts(
    side: Mapping[str, Any], checks: Mapping[str, bool], states: Mapping[str, str], formats: Sequence[str]
) -> list[str]:
    """The verdict line's export parts: fp32 parity, fp16, the extra math, int8, TensorRT and each format counted."""
    fp32, fp16, int8, trt = side["fp32"], side["fp16"], side["int8"], side.get("tensorrt") or {}
    network_ok = bool((trt.get("network_check") or {}).get("ok"))
    parts = [
        f"fp32 parity {'ok' if checks['parity'] else 'FAILED'}"
        + (f" (max err {fp32['max_abs_err']:.1e})" if fp32.get("max_abs_err") is not None else "")
        + (
            f", first diverging block {fp32['first_diverging_block']}"
            if fp32.get("first_diverging_block") is not None
            else ""
        )
    ]
    parts.append(f"fp16 {'ok' if checks['fp16'] else _state(fp16) if fp16.get('status') != 'ok' else 'FAILED'}")
    parts.append(
        {PASSED: "extra math kept", FAILED: "extra math NOT kept"}.get(
            states["extra_math_kept"], "extra math not counted (no file written)"
        )
    )
    if int8.get("status") == "ok":
        parts.append(
            f"int8 cosine {_num(int8.get('cosine_min'), '{:.4f}')} top-1 "
            f"{_num(100 * int8['top1_agreement'] if int8.get('top1_agreement') is not None else None, '{:.0f}')}% "
            f"({int8.get('placement')})"
        )
    else:
        parts.append(f"int8 {_state(int8)}")
    if trt.get("status") == "ok":
        state = trt.get("state") or "built"
        ran = f", parity {'ok' if states['tensorrt'] == PASSED else 'FAILED'}" if trt.get("ran_on_gpu") else ""
        parts.append(
            f"TensorRT {state}{' - no GPU' if not trt.get('ran_on_gpu') else ''}, network check "
            f"{'ok' if network_ok else 'FAILED'}{ran}"
        )
    else:
        parts.append(f"TensorRT {_state(trt)}")
    for f in formats:  # a format written (or refused) here; one that cannot run here says so in the table
        parts.append(f"{entry_title(f)} {'ok' if checks[f] else 'FAILED'}")
    return parts


def _cost_parts(report: Mapping[str, Any], o1: Mapping[str, Any] | None, o2: Mapping[str, Any] | None) -> list[str]:
    """The verdict line's opset-23 fusion and its latency against standard (``o1``, ``o2``: the two overheads)."""
    parts = []
    fz = report.get("fusable") or {}
    if fz.get("status") == "ok":
        # reports written before every runtime was kept held only the inspected ones: the others were not
        shown = {**fz["fused"], **{k: {"inspected": False} for k in RUNTIMES if k not in fz["fused"]}}
        parts.append("opset 23: " + ", ".join(_fusable_cell(k, e) for k, e in shown.items()))
    else:
        parts.append(f"opset 23 {_plain_state(fz) if fz else 'not run'}")
    if o1 is None and o2 is None:
        parts.append("latency against standard: not measured")
    for o in (o1, o2):
        if o is not None:
            parts.append(f"x{o['ratio']:.2f} standard's latency at {o['tokens']} tokens ({o['backend']} b{o['batch']})")
    return parts
