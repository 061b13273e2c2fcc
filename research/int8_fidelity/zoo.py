"""The zoo's own models at int8: the logits' drift of the int8 copies the demo serves (``--zoo``), whether each
model's int8 export passes its accuracy gate under each placement (``--zoo-accuracy``), and whether ``auto``'s
SmoothQuant step would move anything in them (``--zoo-outliers``)."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.errors import UsageError
from attnzoo.fileio import atomic_write_text
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_info
from research.study import contended, cpu_line, write_json

from .speed import load_span, versions

# --help and --table load without torch, onnx and timm: these import at their first use
onnx = lazy_import("onnx")
zoo = lazy_import("attnzoo.zoo")
export = lazy_import("attnzoo.export")
quantize = lazy_import("attnzoo.export.quantize")

__all__ = [
    "ZOO_PLACEMENTS",
    "zoo_selection",
    "zoo_drift",
    "zoo_accuracy",
    "zoo_outliers",
    "zoo_accuracy_markdown",
    "zoo_outliers_markdown",
    "run_zoo_accuracy",
    "run_zoo_outliers",
    "run_zoo_drift",
]


def zoo_drift(variant: str, task: str, count: int = 512) -> dict[str, Any]:
    """A zoo model's int8 copy (``cpu`` placement, as the demo and serve-models make it: 512 training images) on
    ``count`` further training images outside the calibration draw: the cosine of its logits to fp32's per input,
    and whether the prediction changed where the cosine is lowest."""
    model, config, sha = export.load_for_export(variant, task)
    with tempfile.TemporaryDirectory(prefix="attnzoo-zoo-drift-") as work:
        fp32, int8 = Path(work) / "fp32.onnx", Path(work) / "int8.onnx"
        export.export_verified(model, fp32, config, batch_sizes=(1,), checkpoint_sha256=sha)
        quantize.quantize_onnx(
            fp32,
            int8,
            dtype="int8",
            placement=quantize.CPU_QDQ_PLACEMENT,
            calibration=quantize.calibration_images(config, quantize.DEFAULT_CALIBRATION_COUNT),
            exclude_nodes=quantize.extra_math_nodes(onnx.load(str(fp32)), config),
        )
        x = quantize.heldout_images(config, count, quantize.DEFAULT_CALIBRATION_COUNT)
        ref, out = quantize.onnx_outputs(fp32, x, None), quantize.onnx_outputs(int8, x, None)
    cos = quantize.per_input_fidelity(ref, out)[0]
    low = cos < quantize.DEFAULT_MIN_COSINE
    same = ref.reshape(len(ref), ref.shape[1], -1).argmax(1) == out.reshape(len(out), out.shape[1], -1).argmax(1)
    return {
        "variant": variant,
        "task": task,
        "placement": quantize.CPU_QDQ_PLACEMENT,
        "n_inputs": int(len(cos)),
        "cosine": {
            "min": float(cos.min()),
            "mean": float(cos.mean()),
            "p1": float(np.percentile(cos, 1)),
            "p5": float(np.percentile(cos, 5)),
        },
        "below_gate": float(low.mean()),
        "prediction_agreement_below_gate": float(same[low].mean()) if low.any() else None,
        "prediction_agreement": float(same.mean()),
    }


#: The placements ``--zoo-accuracy`` exports with: ``export-model --dtype int8``'s default, and the one of the
#: zoo's int8 copies that ``serve-demo`` / ``serve-models --dtype int8`` serve.
ZOO_PLACEMENTS = ("auto", "cpu")


#: ``; see <the run's temporary folder>/<file>``: a file of a temporary folder removed when the export returned.
_WORK_PATH = re.compile(r"; see \S*attnzoo-zoo-int8-[^/\s]+/\S+")


def _without_work_path(reason: str) -> str:
    """A refusal's reason without the path of the failed report in the run's temporary folder (removed with it; its
    figures are in the row)."""
    return _WORK_PATH.sub("", reason)


def zoo_accuracy(variant: str, task: str, placement: str, data: str) -> dict[str, Any]:
    """A zoo model exported to int8 as ``export-model --variant V --task T --dtype int8 [--qdq-placement P]``
    does (every other default: 512 training images calibrate, 64 further ones held out, the whole test split
    scored next to fp32): whether it passed its accuracy gate, its accuracy, and its fidelity to fp32."""
    start = time.perf_counter()
    row: dict[str, Any] = {"variant": variant, "task": task, "data": data, "placement": placement}
    with tempfile.TemporaryDirectory(prefix="attnzoo-zoo-int8-") as work:
        out = Path(work) / f"{variant}_{task}_int8.onnx"
        try:
            report = export.export_model(variant, task=task, dtype="int8", out=out, qdq_placement=placement).report
        except export.ExportError as exc:
            failed = out.with_name(out.stem + ".failed.report.json")
            report = json.loads(failed.read_text()) if failed.is_file() else None
            row["refused"] = _without_work_path(str(exc).splitlines()[0])
        row["seconds"] = round(time.perf_counter() - start, 1)
    if report is None:
        return row
    acc, fid = report["accuracy"], report.get("fidelity") or {}
    auto = report["quantization"]["options"].get("auto") or {}
    row.update(passed=bool(report["passed"]), failures=report["failures"])
    if acc.get("metrics"):
        row["accuracy"] = {
            k: acc[k] for k in ("metric_name", "n_images", "metrics", "drop", "tolerance", "within_tolerance")
        }
    if fid:
        row["fidelity"] = {
            "n_inputs": fid["n_inputs"],
            "split": fid.get("split"),
            "gate_on": fid["gate_on"],
            "cosine": fid["cosine"],
            "relative_error": fid["relative_error"],
            "top1_agreement": fid["top1_agreement"],
        }
    if auto.get("groups"):
        row["auto"] = {
            "promised": auto.get("promised"),
            "chosen": auto.get("chosen"),
            "kept_fp32": [g for g, d in auto["groups"].items() if not d["quantized"]],
            "groups": len(auto["groups"]),
            "fallback": auto.get("fallback"),
        }
    row["quantize_linear"] = report["quantization"]["qdq"]["quantize_linear"]
    smooth = report["quantization"]["options"].get("smooth_quant")
    if smooth is not None:
        row["smooth_quant"] = {"migrated": smooth["migrated"], "layernorms": len(smooth["layernorms"])}
    return row


def zoo_outliers(variant: str, task: str) -> dict[str, Any]:
    """Whether ``auto``'s SmoothQuant step would move anything in a zoo model: the largest max / median channel
    range of its LayerNorm outputs that feed MatMuls, on the 512 training images the export calibrates on."""
    from attnzoo.export.quantize.smooth import SMOOTH_MIN_RATIO, layernorm_outliers

    model, config, sha = export.load_for_export(variant, task)
    with tempfile.TemporaryDirectory(prefix="attnzoo-zoo-outliers-") as work:
        fp32 = Path(work) / "fp32.onnx"
        export.export_verified(model, fp32, config, batch_sizes=(1,), checkpoint_sha256=sha)
        proto = onnx.load(str(fp32))
        ratios = layernorm_outliers(
            proto,
            quantize.calibration_images(config, quantize.DEFAULT_CALIBRATION_COUNT),
            exclude=quantize.extra_math_nodes(proto, config),
        )
    worst = max(ratios, key=lambda k: ratios[k]) if ratios else None
    return {
        "variant": variant,
        "task": task,
        "layernorms": len(ratios),
        "worst_ratio": ratios[worst] if worst else None,
        "worst_layernorm": worst,
        "would_migrate": sum(r >= SMOOTH_MIN_RATIO for r in ratios.values()),
    }


def zoo_outliers_markdown(result: Mapping[str, Any]) -> str:
    """The zoo's LayerNorm outlier ratios: per model, the worst one and how many LayerNorms auto would migrate."""
    from attnzoo.export.quantize.smooth import SMOOTH_MIN_RATIO

    lines = [
        cpu_line(result["cpu"]),
        "",
        f"Command: `{result['command']}`; a LayerNorm output is migrated from {SMOOTH_MIN_RATIO:g}x",
        "",
        "| variant | task | LayerNorms feeding MatMuls | worst max / median channel range | migrated |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        worst = f"{r['worst_ratio']:.1f}x ({r['worst_layernorm']})" if r["worst_layernorm"] else "-"
        lines.append(f"| {r['variant']} | {r['task']} | {r['layernorms']} | {worst} | {r['would_migrate']} |")
    return "\n".join(lines)


def zoo_accuracy_markdown(result: Mapping[str, Any]) -> str:
    """The zoo int8 accuracy table: per model and placement, the gate's verdict, the accuracy and the fidelity."""
    lines = [
        cpu_line(result["cpu"]),
        "",
        f"Command: `{result['command']}`; {load_span(result)}",
        "",
        "| variant | task | placement | accuracy gate | fp32 | int8 | drop (tolerance) | fidelity: worst / mean "
        "cosine (n) | auto kept fp32 | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        accuracy, fidelity = row.get("accuracy"), row.get("fidelity")
        reason = _without_work_path(row.get("refused", "; ".join(row.get("failures", []))))
        verdict = "passes" if row.get("passed") else f"refused: {reason}"
        acc = (
            [
                f"{accuracy['metrics']['fp32']:.2f}",
                f"{accuracy['metrics']['int8']:.2f}",
                f"{accuracy['drop']:+.2f} ({accuracy['tolerance']:g})",
            ]
            if accuracy
            else ["-", "-", "-"]
        )
        fid = (
            f"{fidelity['cosine']['min']:.4f} / {fidelity['cosine']['mean']:.4f} ({fidelity['n_inputs']})"
            if fidelity
            else "-"
        )
        auto = row.get("auto")
        kept = (
            "-"
            if not auto
            else (f"{len(auto['kept_fp32'])} of {auto['groups']}" + (" (weights only)" if auto.get("fallback") else ""))
        )
        lines.append(
            f"| {row['variant']} | {row['task']} | {row['placement']} | {verdict} | {' | '.join(acc)} | {fid} | "
            f"{kept} | {row.get('seconds', '-')} |"
        )
    passed = sum(bool(row.get("passed")) for row in result["rows"])
    selected = result.get("selected", len(result["rows"]))
    lines += [
        "",
        f"{passed} of {len(result['rows'])} int8 exports pass their accuracy gate"
        + (
            f" (a partial run: {len(result['rows'])} of the {selected} selected)."
            if selected > len(result["rows"])
            else "."
        ),
    ]
    return "\n".join(lines)


def zoo_selection(spec: str, data: str) -> list[tuple[str, str]]:
    """``VARIANT:TASK,...``, or ``cls`` / ``seg`` / ``all`` (the zoo's models of ``data`` for that task)."""
    have = [(e["variant"], e["task"]) for e in zoo.entries() if e["data"] == data]
    if spec in ("cls", "seg", "all"):
        return [(v, t) for v, t in have if spec in ("all", t)]
    chosen = []
    for item in spec.split(","):
        variant, _, task = item.strip().partition(":")
        if (variant, task) not in have:
            raise UsageError(
                f"--zoo-accuracy: the zoo has no {data} model {item.strip()!r} (VARIANT:TASK, or cls, seg, all)"
            )
        chosen.append((variant, task))
    return chosen


def run_zoo_accuracy(selection: Sequence[tuple[str, str]], data: str, out: Path, name: str, command: str) -> bool:
    """``--zoo-accuracy``: every selected model at each of :data:`ZOO_PLACEMENTS`, the report rewritten after each
    row (a stopped run keeps what it measured); whether every export passed its gate."""
    load_start = list(os.getloadavg())
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    for variant, task in selection:
        for placement in ZOO_PLACEMENTS:
            rows.append(zoo_accuracy(variant, task, placement, data))
            print(json.dumps(rows[-1]), flush=True)
            load_end = list(os.getloadavg())
            result = {
                "command": command,
                "zoo_accuracy": True,
                "cpu": cpu_info(),
                "versions": versions(),
                "load_average": {"start": load_start, "end": load_end},
                "contended": contended(load_start, load_end, 2),
                "selected": len(selection) * len(ZOO_PLACEMENTS),
                "rows": rows,
            }
            write_json(out / f"{name}.json", result)
            atomic_write_text(out / f"{name}.md", zoo_accuracy_markdown(result) + "\n")
    print(zoo_accuracy_markdown(result))
    return all(r.get("passed") for r in rows)


def run_zoo_outliers(selection: Sequence[tuple[str, str]], out: Path, command: str) -> None:
    """``--zoo-outliers``: every selected model's LayerNorm outlier ratios, into ``zoo-outliers.json`` / ``.md``."""
    result = {
        "command": command,
        "zoo_outliers": True,
        "cpu": cpu_info(),
        "rows": [zoo_outliers(v, t) for v, t in selection],
    }
    write_json(out / "zoo-outliers.json", result)
    atomic_write_text(out / "zoo-outliers.md", zoo_outliers_markdown(result) + "\n")
    print(zoo_outliers_markdown(result))


def run_zoo_drift(spec: str, out: Path, command: str) -> None:
    """``--zoo VARIANT:TASK,...``: each model's int8 copy's drift, into ``zoo-drift.json``."""
    rows = [zoo_drift(variant, task) for variant, _, task in (item.partition(":") for item in spec.split(","))]
    write_json(out / "zoo-drift.json", {"command": command, "rows": rows}, indent=2)
    print(json.dumps(rows, indent=1))
