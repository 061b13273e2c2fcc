"""The record of an int8 / fp8 export, ``<model>.report.json``: its schema (:class:`QuantizationReport`, shared with
the readers in :mod:`attnzoo.runtime.schemas`), writing and reading it, and the lines ``export-model`` prints of
it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attnzoo.fileio import atomic_write_text
from attnzoo.runtime.precision import get_precision
from attnzoo.runtime.schemas import QuantizationReport, QuantizeReport
from attnzoo.runtime.sessions import read_report

from ..divergence import verdict as block_verdict

__all__ = ["QuantizeReport", "QuantizationReport", "write_report", "read_quantization_report", "summary"]


def write_report(report: QuantizationReport, path: str | Path) -> None:
    """Write ``report`` to ``path`` (temp + rename: a reader never sees half a report)."""
    atomic_write_text(Path(path), report.to_json())


def read_quantization_report(path: str | Path) -> QuantizationReport:
    """A quantization report file, read with :func:`attnzoo.runtime.sessions.read_report`'s bounds and checked
    against the schema.

    Raises:
        ValueError: one line naming the file: unreadable, not JSON, or not a quantization report.
    """
    data = read_report(path)
    try:
        return QuantizationReport.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{Path(path).name} is not a quantization report ({exc})") from None


def summary(report: Mapping[str, Any]) -> str:
    """A few lines for the terminal."""
    q = report["quantization"]
    cal = q["calibration"]
    ops = ", ".join(
        f"{n}/{report['quantization']['qdq']['total_ops'][op]} {op}"
        for op, n in q["qdq"]["quantized_ops"].items()
        if report["quantization"]["qdq"]["total_ops"][op]
    )
    lines = [
        f"{report['path']}: {report['variant']} {report['task']} {report['arch']} {report['dtype']} "
        f"({q['quantizer']} {q['quantizer_version']}), {report['file_size'] / 1e6:.2f} MB",
        f"  calibration: {cal['count']} x {cal['source']} (seed {cal['seed']}), {cal['method']}; quantized: {ops} "
        f"(Q/DQ placement {q['options']['placement']})",
        "  extra math: "
        + (
            f"{report['extra_math_scope_check']['nodes']} node(s) "
            + ("QUANTIZED (--quantize-extra-math)" if report["quantize_extra_math"] else "excluded, fp32, no Q/DQ")
            if report["extra_math_scope_check"]["nodes"]
            else "none declared for this variant: nothing excluded"
        ),
    ]
    lines += _auto_lines(q["options"].get("auto") or {}) + _smooth_lines(q["options"].get("smooth_quant") or {})
    lines += _fidelity_lines(report.get("fidelity") or {})
    lines += [f"  warning: {warning}" for warning in report.get("warnings", [])]
    lines.append(_accuracy_line(report))
    where = block_verdict(report.get("divergence"), report["passed"])
    verdict = "PASSED" + (f" ({where})" if where else "")
    if not report["passed"]:
        verdict = "FAILED: " + "; ".join(report["failures"]) + (f"; {where}" if where else "")
    lines.append(f"  {verdict}")
    return "\n".join(lines)


def _auto_lines(auto: Mapping[str, Any]) -> list[str]:
    """The ``auto`` placement's choice: groups quantized, the promise, what each group kept fp32 costs."""
    if not auto.get("groups"):
        return []
    kept = [g for g, d in auto["groups"].items() if not d["quantized"]]
    speed = (auto.get("speed") or {}).get("groups", {})
    named = [f"{g} ({speed[g]['slowdown']:.2f}x)" if g in speed else g for g in kept]
    chosen = auto.get("chosen", {})
    return [
        f"  auto placement: {len(auto['groups']) - len(kept)} of {len(auto['groups'])} Q/DQ groups quantized, "
        f"promised cosine {chosen.get('promised', 0.0):.4f} on {auto['selection_inputs']} choosing inputs"
        + (f"; kept fp32 (time in fp32 / quantized, ONNX Runtime CPU): {', '.join(named)}" if kept else "")
    ]


def _smooth_lines(smooth: Mapping[str, Any]) -> list[str]:
    """SmoothQuant's migration, when it moved anything."""
    if not smooth.get("migrated"):
        return []
    return [
        f"  SmoothQuant: {smooth['migrated']} of {len(smooth['layernorms'])} LayerNorm outputs had an outlier "
        f"channel (>= {smooth['min_ratio']:g}x the median range), migrated into the MatMul weights they feed "
        f"(alpha {smooth['alpha']:g}) before calibrating"
    ]


def _fidelity_lines(fid: Mapping[str, Any]) -> list[str]:
    """The agreement with fp32 on the held-out inputs, near-copies of calibration inputs apart."""
    if not fid:
        return []
    split = fid.get("split", {})
    chose = f", {split['choose']} others chose the placement" if split.get("choose") else ""
    line = (
        f"  fidelity to fp32 on {fid['n_inputs']} held-out inputs ({split.get('calibration', '?')} calibrate"
        f"{chose}): cosine worst "
        f"{fid['cosine']['min']:.4f} (gate {fid['min_cosine']:g}), mean {fid['cosine']['mean']:.4f}; relative "
        f"error mean {fid['relative_error']['mean']:.3f}, max {fid['relative_error']['max']:.3f}; top-1 "
        f"agreement {fid['top1_agreement']:.1%}"
    )
    line += f", top-5 overlap {fid['top5_overlap']:.1%}" if "top5_overlap" in fid else ""
    related = fid.get("related") or {}
    if related.get("near_copies"):
        worst = related["worst"]
        line += (
            f"; of them {related['near_copies']} near-copies of calibration inputs (worst "
            f"{worst['near_copies']:.4f}), {related['distinct']} distinct"
            + (f" (worst {worst['distinct']:.4f})" if "distinct" in worst else "")
        )
    return [line + (f" [WEAK: {fid['weak']}]" if fid.get("weak") else "")]


def _accuracy_line(report: Mapping[str, Any]) -> str:
    """The test-split score next to fp32's, or why there is none."""
    acc = report["accuracy"]
    if not acc.get("metrics"):
        return f"  accuracy not measured: {acc.get('warning') or acc.get('reason')}"
    m = acc["metrics"]
    unit = "images" if report["task"] == "cls" else "scenes"
    simulated = " [FP8 simulated]" if get_precision(report["dtype"]).ort_simulated else ""
    return (
        f"  {acc['metric_name']} on {acc['n_images']} {acc['data']} test {unit}: fp32 {m['fp32']:.2f}, "
        f"{report['dtype']} {m[report['dtype']]:.2f} (drop {acc['drop']:+.2f}, tolerance {acc['tolerance']:g})"
        + simulated
    )
