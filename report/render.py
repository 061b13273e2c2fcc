"""The report folder: ``report.json`` (the measurements, schema in docs/report-variant.md), ``report.md`` (one
GitHub-renderable page with PNG plots) and the one-line verdict.

Plots reuse the benchmarks' own (:func:`attnzoo.benchmarks.tables.plot_latency`,
:func:`~attnzoo.benchmarks.tables.plot_overhead`, :func:`attnzoo.benchmarks.scaling.plot`).
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.tables import markdown_table, plot_latency, plot_overhead
from attnzoo.fileio import atomic_write_bytes, atomic_write_text
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary
from attnzoo.mdtext import code, fence, text
from attnzoo.runtime.backends import ONNX_REFERENCE
from attnzoo.runtime.fusion import FUSED, RUNTIMES, inspected_line, runtime_label
from attnzoo.runtime.fusion import markdown as fusion_markdown

# report-variant --help loads without torch and timm: imported at their first use
factory = lazy_import("attnzoo.models.factory")
scaling_bench = lazy_import("attnzoo.benchmarks.scaling")
export_formats = lazy_import("attnzoo.export.formats")

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
    "markdown",
    "plots",
    "block_series",
    "plot_block_errors",
    "write_report",
    "RUNTIMES",
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


# ------------------------------------------------------------------------------------------------ verdict
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
    :data:`REPORT_FORMATS`), its state in :data:`STEP_STATES`, read from the variant's export section."""
    side = (report.get("export") or {}).get(report["variant"]) or {}
    kept = [v for v in (side.get("extra_math_kept") or {}).values() if v is not None]
    return {
        "parity": _ran(side.get("fp32")),
        "fp16": _ran(side.get("fp16")),
        "extra_math_kept": (PASSED if all(kept) else FAILED) if kept else NOT_RUN,
        "int8": _ran(side.get("int8")),
        "tensorrt": _engine_state(side.get("tensorrt") or {}),
        **{f: _ran(side.get(f)) for f in REPORT_FORMATS},
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
    formats = [f for f in REPORT_FORMATS if (side.get(f) or {}).get("status") in ("ok", "failed")]
    checks = {k: s == PASSED for k, s in states.items() if k not in REPORT_FORMATS or k in formats}
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


# ------------------------------------------------------------------------------------------------ plots
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


#: The precisions whose exports carry block figures, in the order the plot shows them.
BLOCK_PRECISIONS = ("fp32", "fp16", "int8", "fp8")
#: The formats besides the ONNX family and TensorRT a report can write for the variant (``export-model --format
#: NAME``), in the order its tables show them; an OpenVINO IR carries block figures too (read from the IR).
REPORT_FORMATS: tuple[str, ...] = ("openvino", "executorch")
#: Every export entry that can carry block figures, in the order the plot and the table show them.
BLOCK_ENTRIES = (*BLOCK_PRECISIONS, *REPORT_FORMATS)


def entry_title(name: str) -> str:
    """A report entry as the tables name it: a precision as it is (``fp16``), a format by its title (``OpenVINO
    IR``, from the export format's part)."""
    return export_formats.get_format(name).title if name in REPORT_FORMATS else name


def block_series(report: Mapping[str, Any]) -> dict[str, dict[str, list[float]]]:
    """``{precision: {side: [rel_err of block 0, 1, ...]}}`` of every export that has block figures."""
    series: dict[str, dict[str, list[float]]] = {}
    for side, entries in (report.get("export") or {}).items():
        for dtype in BLOCK_ENTRIES:
            e = entries.get(dtype) or {}
            if e.get("status") == "ok" and e.get("blocks"):
                series.setdefault(dtype, {})[side] = [float(b["rel_err"]) for b in e["blocks"]]
    return {d: series[d] for d in BLOCK_ENTRIES if d in series}


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
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


# ------------------------------------------------------------------------------------------------ markdown
def _identity_md(report: Mapping[str, Any]) -> list[str]:
    ident = report["identity"]
    if ident.get("status") != "ok":
        return [f"Not measured: {_state(ident)}"]
    lines = [
        markdown_table(
            ["", ""],
            [
                ["paper", text(ident["paper"] or "-")],
                ["package", text(f"{ident['package']} {ident['version']}".strip())],
                ["extra-math scopes", ", ".join(code(s) for s in ident["extra_scopes"]) or "none (plain attention)"],
                ["extra parameters", _num(ident["extra_params"])],
                [
                    "extra weights (beyond timm's Attention)",
                    ", ".join(code(w) for w in ident["extra_weights"]) or "none",
                ],
                ["scores", "pairwise distances (no matrix product)" if ident["pairwise_scores"] else "matrix products"],
                ["cost family", text(ident["cost_family"])],
            ],
        ),
        "",
    ]
    if ident["equations"]:
        lines += ["Equations:", "", *fence(ident["equations"]), ""]
    rows = [
        [
            "parameters",
            f"{ident['standard_params']:,}",
            f"{ident['params']:,}",
            f"{ident['params'] / ident['standard_params']:.3f}",
        ]
    ]
    for size, flops in ident["flops_per_image"].items():
        std = ident["standard_flops_per_image"][size]
        rows.append(
            [
                f"GFLOPs per image at {text(size)} px",
                f"{std / 1e9:.3f}",
                f"{flops / 1e9:.3f}",
                f"{ident['flops_ratio'][size]:.3f}",
            ]
        )
    lines += [
        f"ViT {code(ident['arch'])} classifier, counted by {text(ident['counter'])}:",
        "",
        markdown_table(["", "standard", text(report["variant"]), "ratio"], rows),
    ]
    return lines


def _md_parity(e: Mapping[str, Any]) -> str:
    """An ONNX entry's parity with eager: passed or not, its error, tolerance and batch sizes."""
    if e.get("status") != "ok":
        return _state(e)
    tol = next(iter(e["tolerance"].values()), None)
    return (
        f"{'passed' if e['passed'] else 'FAILED'}: max abs err {e['max_abs_err']:.2e} (tolerance {tol:g} x "
        f"max(1, max abs logit)), batch sizes {text(e['batch_sizes'])}"
    )


def _md_int8(e: Mapping[str, Any]) -> str:
    """A quantized entry's fidelity to fp32: cosine and top-1 agreement on held-out inputs."""
    if e.get("status") != "ok":
        return _state(e)
    top1 = e.get("top1_agreement")
    return (
        f"cosine to fp32 min {_num(e['cosine_min'], '{:.4f}')} / mean {_num(e['cosine_mean'], '{:.4f}')}, "
        f"top-1 agreement {_num(100 * top1 if top1 is not None else None, '{:.1f}')}% on "
        f"{_num(e.get('fidelity_inputs'))} held-out inputs"
    )


def _md_placement(e: Mapping[str, Any]) -> str:
    """The int8 placement chosen: what stayed fp32 and how many ops of each kind were quantized."""
    if e.get("status") != "ok":
        return "-"
    kept = e.get("kept_fp32") or []
    q, t = e.get("quantized_ops") or {}, e.get("total_ops") or {}
    ops = ", ".join(f"{text(k)} {_num(q[k])}/{_num(t.get(k, '?'))}" for k in q)
    return f"{code(e.get('placement'))}; kept fp32: {text(', '.join(map(str, kept)) or 'nothing')}; quantized {ops}"


def _md_accuracy(e: Mapping[str, Any]) -> str:
    """A side's test-split accuracy, fp32 and int8."""
    a = e["accuracy"]
    if a.get("status") != "ok":
        return _state(a)
    m = a.get("metrics") or {}
    return (
        f"{text(a.get('metric_name'))} fp32 {_num(m.get('fp32'), '{:.2f}')} / int8 "
        f"{_num(m.get('int8'), '{:.2f}')} on {_num(a.get('n_images'))} {text(a.get('data'))} "
        f"{text(a.get('split'))} images"
    )


def _md_tensorrt(e: Mapping[str, Any]) -> str:
    """A side's TensorRT engine: its state (without a GPU: the library and target) and its network check."""
    t = e.get("tensorrt") or {}
    if t.get("status") != "ok":
        return _state(t)
    nc = t.get("network_check") or {}
    state = text(t.get("state"))
    if not t.get("ran_on_gpu"):
        state = f"{state} - no GPU ({text(t.get('library'))}, {text(t.get('compute_capability'))})"
    return f"{state}; network check {'ok' if nc.get('ok') else 'FAILED'} ({_num(nc.get('layers'))} layers)"


def _md_kept(e: Mapping[str, Any]) -> str:
    """Whether each format of a side kept the extra math."""
    return ", ".join(f"{text(k)} {_num(v)}" for k, v in e["extra_math_kept"].items())


def _md_triton(e: Mapping[str, Any]) -> str:
    """A side's Triton config: written or not, its file and platform."""
    t = e["triton"]
    if t.get("status") != "ok":
        return _state(t)
    return f"{'written' if t.get('passed') else 'FAILED'}: {code(t.get('config'))} ({text(t.get('platform'))})"


def _md_source(e: Mapping[str, Any]) -> str:
    """Which model a side exported: the zoo's classifier, the author's checkpoint or a random init."""
    s = e["source"]
    return {
        "zoo": f"the zoo's classifier ({code(Path(str(s.get('checkpoint', ''))).name)})",
        "checkpoint": f"checkpoint {code(s.get('checkpoint'))}",
    }.get(s["kind"], f"random init ({text(s.get('arch'))})")


def _md_diverges(e: Mapping[str, Any]) -> str:
    """Where each entry with block outputs diverges."""
    said = [f"{entry_title(d)} {_where(e[d])}" for d in BLOCK_ENTRIES if (e.get(d) or {}).get("blocks")]
    return "; ".join(said) or "-"


def _md_written(e: Mapping[str, Any]) -> str:
    """A format's entry: its parity, the runtime it ran on and whether it kept the extra math."""
    if e.get("status") != "ok":
        return _state(e)
    extra = e.get("extra_math") or {}
    count = ", ".join(f"{text(k)} {_num(v)}" for k, v in (extra.get("nodes_per_block") or {}).items())
    return f"{_md_parity(e)}; on {text(e.get('runtime'))}; extra math {'kept' if extra.get('ok') else 'NOT kept'}" + (
        f" (ops per block: {count})" if count else ""
    )


def _export_md(report: Mapping[str, Any]) -> list[str]:
    sides = report["export"]
    names = (
        ["standard", report["variant"]]
        if "standard" in sides and report["variant"] != "standard"
        else [report["variant"]]
    )

    def cells(fn) -> list[str]:
        return [fn(sides[n]) for n in names]

    rows = [
        ["model", *cells(_md_source)],
        ["fp32: parity with eager", *cells(lambda e: _md_parity(e["fp32"]))],
        ["where it diverges (block outputs)", *cells(_md_diverges)],
        ["fp16: parity with eager fp32", *cells(lambda e: _md_parity(e["fp16"]))],
        ["extra math kept (per format)", *cells(_md_kept)],
        ["int8: fidelity to fp32", *cells(lambda e: _md_int8(e["int8"]))],
        ["int8: placement chosen", *cells(lambda e: _md_placement(e["int8"]))],
        ["accuracy on the test split", *cells(_md_accuracy)],
        ["FP8 graph", *cells(lambda e: _md_int8(e["fp8"]))],
        ["TensorRT", *cells(_md_tensorrt)],
        ["Triton config", *cells(_md_triton)],
        *[
            [f"{entry_title(f)}: parity with eager fp32", *cells(lambda e, f=f: _md_written(e.get(f) or {}))]
            for f in REPORT_FORMATS
        ],
    ]
    return [
        "Each row is `export_model()` run here; files under `exports/`.",
        "",
        markdown_table(["", *map(text, names)], rows),
    ]


def _where(entry: Mapping[str, Any]) -> str:
    """``first diverging block 1 (worst op `blocks.1.attn.proj/Add`)`` or ``worst block 3 (2.9e-07)``."""
    first, blocks = entry.get("first_diverging_block"), entry.get("blocks") or []
    if first is not None:
        op = entry.get("worst_op")
        return f"first diverging block {first}" + (f" (worst op {code(op)})" if op else "")
    worst = max(blocks, key=lambda b: b["rel_err"])
    return f"worst block {worst['block']} ({_num(worst['rel_err'], '{:.1e}')})"


def _fusion_md(report: Mapping[str, Any]) -> list[str]:
    fus = report.get("fusion") or {}
    variant = report["variant"]
    names = [n for n in ("standard", variant) if n in fus] if variant != "standard" else [variant]
    if not names:
        return ["Not audited: no fp32 export passed."]
    runtimes: dict[str, dict[str, str]] = {}
    labels: dict[str, str] = {}
    inspected = []
    for n in names:
        e = fus[n]
        if e.get("status") != "ok":
            for k in RUNTIMES:
                runtimes.setdefault(k, {})[n] = _state(e)
            continue
        inspected.append(f"{text(n)}: {text(inspected_line(e['audit']['runtimes']))}")
        for r in e["audit"]["runtimes"]:
            cell = f"{r['fused']} of {r['cores']}" if r["inspected"] else f"not inspected: {r['reason']}"
            runtimes.setdefault(r["runtime"], {})[n] = text(cell)
            labels.setdefault(r["runtime"], runtime_label(r))
    rows = [[text(labels.get(k, RUNTIMES.get(k, k))), *[v.get(n, "-") for n in names]] for k, v in runtimes.items()]
    lines = [
        f"Whether each runtime runs a block's attention core as one kernel ({text(FUSED)}; "
        "`attnzoo.runtime.fusion`), on the fp32 exports above. " + " ".join(inspected),
        "",
        markdown_table(["runtime", *[f"{text(n)}: fused cores" for n in names]], rows),
        "",
    ]
    e = fus.get(variant) or {}
    if e.get("status") == "ok":
        cores = e["audit"]["cores"]
        plain = [c for c in cores if not c["dot_product"]]
        if plain:
            lines += [
                f"{len(plain)} of {len(cores)} attention cores of {text(variant)} have scores that are no matrix "
                "product (the form every runtime's attention fusion matches), so no runtime can fuse them "
                "as attention.",
                "",
            ]
        lines += [f"{text(variant)}, kernel by kernel:", "", fusion_markdown(e["audit"])]
    return lines


def _ms(row: Mapping[str, Any] | None) -> str:
    """A timed row's median, else its status and reason."""
    if row is None:
        return "-"
    return f"{row['median_ms']:.2f}" if row["status"] == "ok" else text(f"{row['status']}: {row['reason']}")


def _latency_md(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> list[str]:
    lat = report["cost"]["latency"]
    if lat.get("status") != "ok":
        return [f"Not measured: {_state(lat)}"]
    st = lat["settings"]
    variant = report["variant"]
    over = {(o["backend"], o["dtype"], o["batch"]): o for o in lat["overheads"]}
    by = {(r["variant"], r["backend"], r["dtype"], r["batch"]): r for r in lat["rows"]}
    timed = [r for r in lat["rows"] if r["status"] in ("ok", "failed")]
    keys = list(dict.fromkeys((r["backend"], r["dtype"], r["batch"]) for r in timed))
    rows = []
    for b, d, n in keys:
        s, v, o = by.get(("standard", b, d, n)), by.get((variant, b, d, n)), over.get((b, d, n))
        ratio = f"{o['ratio_median']:.2f} [{o['ratio_q1']:.2f}, {o['ratio_q3']:.2f}]" if o else "-"
        mem = _num((v or {}).get("peak_mem_mb"), "{:.0f}")
        rows.append([text(b), text(d), text(n), _ms(s), _ms(v) if variant != "standard" else "-", ratio, mem])
    untimed: dict[tuple[str, str], str] = {}
    for r in lat["rows"]:
        if r["status"] not in ("ok", "failed") and r["variant"] == variant:
            untimed.setdefault((r["backend"], r["dtype"]), f"{r['status']}: {r['reason']}")
    bf16 = lat["bf16"]
    lines = [
        f"`bench-latency`'s run ({text(st['arch'])} classifier, {_num(_tokens(report['identity'], st['arch']))} "
        f"tokens, {_num(st['threads'])} thread, {st['min_time_s']:g} s per measurement, seeded random init: latency "
        "does not "
        "depend on the weights). Overhead: median [Q1, Q3] of per-pair ratios variant / standard from "
        "A B A B runs on the same backend, precision and batch.",
        "",
        markdown_table(
            [
                "backend",
                "dtype",
                "batch",
                "standard ms",
                f"{text(variant)} ms",
                "x standard",
                f"{text(variant)} peak MB",
            ],
            rows,
        ),
        "",
        "bf16 rows: " + ("this CPU has bf16 units" if bf16["rows"] else f"none - {text(bf16['reason'])}") + ".",
    ]
    if report["budget"]["compile_budget"] == 0:
        lines += [
            "",
            "`torch.compile` is not timed in this report: its compilation per shape and precision does not "
            "fit the report's time; `bench-latency --backends compile` times it.",
        ]
    if untimed:
        lines += ["", "Not timed here:", ""] + [f"- {text(f'{b} {d}: {why}')}" for (b, d), why in untimed.items()]
    if lat.get("interrupted"):
        lines += ["", f"Stopped early: {text(lat['interrupted']['note'])}"]
    for key in ("latency", "overhead"):
        if key in pngs:
            lines += ["", f"![{key}]({pngs[key].name})"]
    return lines


def _scaling_md(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> list[str]:
    sc = report["cost"]["scaling"]
    if sc.get("status") != "ok":
        return [f"Not measured: {_state(sc)}"]
    st = sc["settings"]
    variant = report["variant"]
    rows = []
    for p in scaling_pairs(report):

        def mb(r):
            return _num((r or {}).get("peak_mb"), "{:.0f}") if (r or {}).get("status") == "ok" else "-"

        rows.append(
            [
                {"cls": "classifier", "seg": "Segmenter"}.get(p["task"], text(p["task"])),
                text(p["tokens"]),
                text(p["backend"]),
                _ms(p.get("standard")),
                _ms(p.get("variant")) if variant != "standard" else "-",
                _num(p["ratio"], "{:.2f}"),
                mb(p.get("standard")),
                mb(p.get("variant")),
            ]
        )
    lines = [
        f"`python -m attnzoo.benchmarks.scaling`'s run ({text(st['arch'])} ViT, batch 1, {_num(st['threads'])} thread; "
        "peak memory: the process's peak resident set above the built model; a call predicted to take longer than "
        f"{st['max_call_s']:g} s is skipped with its reason).",
        "",
        markdown_table(
            [
                "model",
                "tokens",
                "backend",
                "standard ms",
                f"{text(variant)} ms",
                "x standard",
                "standard peak MB",
                f"{text(variant)} peak MB",
            ],
            rows,
        ),
    ]
    if not st["seg_sizes"]:
        lines += [
            "",
            "The Segmenter encoder at 4,097 tokens is not in this run (its calls take seconds each on a CPU); "
            "`python -m attnzoo.benchmarks.scaling` measures it.",
        ]
    if sc.get("contended"):
        lines += ["", "The machine was shared with other work during the run (load above the run's threads)."]
    if "scaling" in pngs:
        lines += ["", f"![scaling]({pngs['scaling'].name})"]
    return lines


def _fusable_md(report: Mapping[str, Any]) -> list[str]:
    fz = report.get("fusable") or {"status": "absent", "reason": "not run"}
    if fz["status"] != "ok":
        return [f"{_state(fz)}."]
    rows = []
    for k, e in fz["fused"].items():
        if not isinstance(e, Mapping):  # an earlier report's [fused, cores]
            e = {"runtime": k, "inspected": True, "fused": e[0], "cores": e[1]}
        cell = f"{e['fused']} of {e['cores']}" if e.get("inspected") else f"not inspected: {e.get('reason')}"
        rows.append([text(runtime_label({"runtime": k, **e})), text(cell)])
    speed = [
        [
            text(k),
            f"{s['opset20_ms']:.2f}",
            f"{s['opset23_ms']:.2f}",
            f"{s['speedup']:.2f} ({s['speedup_q1']:.2f}-{s['speedup_q3']:.2f})",
        ]
        for k, s in fz["speed"].items()
    ]
    return [
        f"The same model (the same weights) exported at opset 23 ({code(fz['file'])}), where each dot-product core "
        f"is one standard `Attention` op ({_num(fz['attention_ops'])} here), verified against eager with the extra "
        f"math {'kept' if fz['extra_math_kept'] else 'NOT kept'} (`export-model --opset 23`). {text(FUSED)}.",
        "",
        markdown_table(["runtime", "fused cores at opset 23"], rows),
        "",
        f"Its speed against the opset-20 file, batch 1, one thread, {_num(fz['rounds'])} rounds round-robin, each "
        "runtime's outputs of both files checked first against the opset-20 file's ONNX Runtime output "
        "(speed-up: the per-round ratio of the opset-20 time to the opset-23 time, median and quartiles):",
        "",
        markdown_table(["runtime", "opset 20 ms", "opset 23 ms", "speed-up"], speed),
    ]


def _gpu_md(report: Mapping[str, Any]) -> list[str]:
    g = report["cost"]["gpu"]
    if g["status"] != "ok":
        return [f"Absent: {text(g['reason'])}."]
    rows = [
        [
            text(r["from"]),
            text(r["gpu"] or "-"),
            text(r["model"]),
            text(r["variant"]),
            text(r["backend"]),
            text(r["dtype"]),
            text(r["batch"]),
            _num(r["median_ms"], "{:.3f}") if r["status"] == "ok" else text(f"{r['status']}: {r['reason']}"),
            _num(r["overhead"], "{:.2f}"),
        ]
        for r in g["rows"]
    ]
    return [
        f"{text(g['note'])}.",
        "",
        markdown_table(
            ["from", "GPU", "model", "variant", "backend", "dtype", "batch", "median ms", "x standard"], rows
        ),
    ]


def markdown(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> str:
    """``report.md``."""
    lines = [
        *_checks_md(report),
        "",
        "## Identity",
        "",
        *_identity_md(report),
        "",
        "## Export",
        "",
        *_export_md(report),
        *([] if "blocks" not in pngs else ["", f"![error at each block's output]({pngs['blocks'].name})"]),
        "",
        "## Fusion audit",
        "",
        *_fusion_md(report),
        "",
        "### A fusable export (opset 23)",
        "",
        *_fusable_md(report),
        "",
        "## Cost",
        "",
        "### Latency",
        "",
        *_latency_md(report, pngs),
        "",
        "### Scaling in tokens",
        "",
        *_scaling_md(report, pngs),
        "",
        "### GPU",
        "",
        *_gpu_md(report),
        "",
    ]
    return "\n".join(lines)


def _checks_md(report: Mapping[str, Any]) -> list[str]:
    """The title, the verdict, where and how the run was measured, and the table of checks."""
    env = report["environment"]
    v = report["verdict"]
    gpu = (env.get("gpu") or {}).get("name") or "no GPU"
    versions = env["versions"]
    lines = [
        f"# {text(report['variant'])}: does it deploy, and what does it cost?",
        "",
        f"**Verdict:** {text(v['line'])}",
        "",
        f"Measured by {code(report['command'] or 'report_variant()')} in {report['wall_time_s']:.0f} s "
        f"({report.get('cpu_time_s', 0):.0f} CPU s) on "
        f"{text(cpu_summary(env['cpu']))}, {text(gpu)}; torch {text(versions.get('torch'))}, onnxruntime "
        f"{text(versions.get('onnxruntime'))}, openvino {text(versions.get('openvino'))}"
        f"{' (--quick: micro models, small sizes, short timing)' if report['quick'] else ''}. Every figure "
        "below comes from this run unless it says otherwise.",
        "",
        "| check | result |",
        "|---|---|",
    ]
    for k, state in v["states"].items():
        cell = {PASSED: "yes", FAILED: "no"}.get(state) or (
            f"{state}: required" if k in v["problems"] else f"{state}: not counted toward deploys"
        )
        lines.append(f"| {text(k.replace('_', ' '))} | {text(cell)} |")
    for f in v.get("failed") or []:
        lines.append(f"| {text(f['check'])} | no: {text(f['reason'])} |")
    return lines


def write_report(report: dict[str, Any], out: Path, replot: bool = True) -> tuple[list[Path], str]:
    """Add the verdict to ``report``, write ``report.json``, the plots and ``report.md`` into ``out``; returns the
    files and the verdict line. ``replot=False``: the plots ``report["plots"]`` names are kept as they are (a report
    rendered again from its ``report.json``, nothing measured)."""
    report["verdict"] = verdict(report, out)
    if replot:
        pngs = plots(report, out)
    else:
        pngs = {k: out / Path(str(name)).name for k, name in (report.get("plots") or {}).items()}
        pngs = {k: p for k, p in pngs.items() if p.is_file()}
    report["plots"] = {k: p.name for k, p in pngs.items()}
    atomic_write_text(out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    atomic_write_text(out / "report.md", markdown(report, pngs))
    return [out / "report.md", out / "report.json", *pngs.values()], report["verdict"]["line"]
