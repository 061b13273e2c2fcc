"""The int8 export of the pretrained-like ViT under each Q/DQ placement, through ``export_model`` (what
``export-model --dtype int8`` runs), measured on inputs that neither chose nor gated the placement: the export's own
fidelity figures, the fidelity on further images, how the worst-of-n moves with n, what ``auto`` kept, and the int8
latency next to fp32 (``python -m research.int8_fidelity --out DIR``)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_info
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
from research.study import contended, cpu_line

from .speed import fp32_speed_line, load_span, speeds
from .standin import pretrained_like_vit, smooth_images, write_images

# --help and --table load without torch, onnx and timm: these import at their first use
models = lazy_import("attnzoo.models")
export = lazy_import("attnzoo.export")
quantize = lazy_import("attnzoo.export.quantize")

__all__ = ["worst_of_n", "measure", "markdown"]


def worst_of_n(
    cosines: np.ndarray, sizes: Sequence[int] = (8, 16, 32, 64, 128), draws: int = 400, seed: int = 0
) -> list[dict[str, Any]]:
    """How the worst cosine of ``n`` inputs, and the promise made from them, move with ``n``: over ``draws``
    random subsets of ``cosines`` (per-input cosines on a large set), the median and 10th percentile of each, and
    the share of the large set below the subset's worst and below its promise."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        if n > len(cosines) // 2:
            continue
        subsets = [rng.choice(len(cosines), n, replace=False) for _ in range(draws)]
        worst = np.array([cosines[i].min() for i in subsets])
        promise = np.array([quantize.promised_cosine(cosines[i]) for i in subsets])
        rows.append(
            {
                "n": n,
                "worst_median": float(np.median(worst)),
                "worst_p10": float(np.percentile(worst, 10)),
                "below_worst": float(np.mean([np.mean(cosines < w) for w in worst])),
                "promised_median": float(np.median(promise)),
                "promised_p10": float(np.percentile(promise, 10)),
                "below_promise": float(np.mean([np.mean(cosines < p) for p in promise])),
            }
        )
    return rows


def _agreement(fp32: Path, model: Path, x: np.ndarray) -> tuple[dict[str, Any], np.ndarray]:
    """``output_agreement`` of ``model`` against ``fp32`` on ``x``, and the per-input cosines."""
    ref, out = quantize.onnx_outputs(fp32, x, None), quantize.onnx_outputs(model, x, None)
    return quantize.output_agreement(ref, out, "cls"), quantize.per_input_fidelity(ref, out)[0]


def _placement_row(model, placement: str, folder: Path, fp32: Path, unseen: np.ndarray, out: Path):
    """The int8 export with one placement, measured: ``(its row, its file)``; a refused export is a row with the
    reason and no file. ``auto`` runs with every default (the gate on, 0.99); the others with the gate off
    (``min_cosine=0``), so that they are measured either way, and the row says whether the default gate passes."""
    start = time.perf_counter()
    gate = None if placement == "auto" else 0.0
    try:
        result = export.export_model(
            model=model,
            out=out / f"int8-{placement}.onnx",
            dtype="int8",
            batch_sizes=(1,),
            qdq_placement=placement,
            calibration_data=folder,
            min_cosine=gate,
        )
    except export.ExportError as exc:
        return {"placement": placement, "refused": str(exc)}, None
    fid, quant = result.report["fidelity"], result.report["quantization"]
    auto = quant["options"].get("auto") or {}
    seen, cos = _agreement(fp32, result.path, unseen)
    row = {
        "placement": placement,
        "export_s": round(time.perf_counter() - start, 1),
        "gate_on": gate if gate is not None else quantize.DEFAULT_MIN_COSINE,
        "split": fid["split"],
        "gate": {k: fid[k] for k in ("n_inputs", "cosine", "relative_error", "promised_cosine", "top1_agreement")},
        "default_gate_passes": bool(fid["cosine"]["min"] >= quantize.DEFAULT_MIN_COSINE),
        "further": seen,
        "worst_of_n": worst_of_n(cos),
        "quantize_linear": quant["qdq"]["quantize_linear"],
        "auto": {k: auto[k] for k in ("all_quantized", "weights_only", "chosen", "rule", "speed") if k in auto},
        "auto_kept_fp32": [g for g, d in auto.get("groups", {}).items() if not d["quantized"]],
        "auto_groups": len(auto.get("groups", {})),
    }
    return row, result.path


def measure(
    out: Path,
    placements: Sequence[str] = ("tensorrt", "cpu", "auto"),
    *,
    images: int = 256,
    further: int = 512,
    runs: int = 40,
    command: str = "",
    **model_kwargs: Any,
) -> dict[str, Any]:
    """Export the converted pretrained-like ViT to int8 with each placement and measure it (:func:`_placement_row`);
    ``command``: the command line the result records."""
    load_start = list(os.getloadavg())
    model = models.convert_to_belief2(pretrained_like_vit(**model_kwargs))
    config = model.attnzoo_config
    size = int(config["img_size"])
    folder = write_images(out / "images", smooth_images(images, size))
    unseen = normalize(
        smooth_images(further, size, seed=1), config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD)
    )
    fp32 = export.export_model(model=model, out=out / "fp32.onnx", batch_sizes=(1,))
    rows: list[dict[str, Any]] = []
    files: dict[str, Path] = {"fp32": fp32.path}
    for placement in placements:
        row, path = _placement_row(model, placement, folder, fp32.path, unseen, out)
        rows.append(row)
        if path is not None:
            files[placement] = path
    x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
    speed = speeds(files, x, runs)
    for row in rows:
        if "refused" not in row:
            row["speed"] = {rt: s.get(row["placement"], s) for rt, s in speed.items()}
    load_end = list(os.getloadavg())
    return {
        "command": command,
        "cpu": cpu_info(),
        "model": {**model_kwargs, "config": config},
        "calibration": f"a folder of {images} smooth images (export defaults: the last quarter, at most 64, held out)",
        "further_inputs": f"{further} other smooth images (seed 1), never seen by the export",
        "fp32_speed": {rt: s.get("fp32", s) for rt, s in speed.items()},
        "load_average": {"start": load_start, "end": load_end},
        "contended": contended(load_start, load_end, 1),
        "rows": rows,
    }


def _placement_lines(result: Mapping[str, Any]) -> list[str]:
    """The fidelity and speed table: one row per placement."""
    lines = [
        "| placement | gate inputs: worst / mean cosine, rel. error | default gate (worst >= 0.99) | "
        f"{result['further_inputs'].split(' ')[0]} further inputs: worst / mean cosine, rel. error (max) | "
        "top-1 agree (further) | Q/DQ pairs | ORT int8 ms (x fp32) | OpenVINO int8 ms (x fp32) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        if "refused" in row:
            lines.append(f"| {row['placement']} | refused: {row['refused']} | | | | | | |")
            continue
        gate, further = row["gate"], row["further"]
        sp = [row["speed"][rt] for rt in ("onnxruntime", "openvino")]
        cell = [f"{s['ms']:.2f} ({s['speedup']:.2f}x)" if "ms" in s else s.get("error", "-") for s in sp]
        lines.append(
            f"| {row['placement']} | {gate['cosine']['min']:.4f} / {gate['cosine']['mean']:.4f}, "
            f"{gate['relative_error']['mean']:.3f} (n={gate['n_inputs']}) | "
            f"{'passes' if row['default_gate_passes'] else 'refused'} | {further['cosine']['min']:.4f} / "
            f"{further['cosine']['mean']:.4f}, {further['relative_error']['mean']:.3f} "
            f"({further['relative_error']['max']:.3f}) | "
            f"{further['top1_agreement']:.1%} | {row['quantize_linear']} | {cell[0]} | {cell[1]} |"
        )
    return lines


def _auto_lines(row: Mapping[str, Any]) -> list[str]:
    """What ``auto`` promised and kept at fp32, and what each kept group costs (nothing where it chose nothing)."""
    auto = row.get("auto") or {}
    if not auto.get("chosen"):
        return []
    sp = (auto.get("speed") or {}).get("groups", {})
    return [
        "",
        f"`{row['placement']}`: promised cosine {auto['chosen']['promised']:.4f} on the choosing inputs "
        f"(full placement {auto['all_quantized']['promised']:.4f}"
        + (f", weights only {auto['weights_only']['promised']:.4f}" if "weights_only" in auto else "")
        + f"); kept fp32 {len(row['auto_kept_fp32'])} of {row['auto_groups']} groups:",
        "",
        "| group kept fp32 | ORT ms fp32 / quantized | slowdown |",
        "|---|---|---|",
        *[
            f"| {g} | {sp[g]['fp32_ms']:.2f} / {sp[g]['quantized_ms']:.2f} | {sp[g]['slowdown']:.2f}x |"
            if g in sp
            else f"| {g} | - | - |"
            for g in row["auto_kept_fp32"]
        ],
    ]


def _worst_of_n_lines(result: Mapping[str, Any]) -> list[str]:
    lines = [
        "",
        "Worst-of-n on the further inputs (subsets of n, 400 draws): median / 10th percentile of the worst "
        "and of the promise, share of the further inputs below each",
        "",
        "| placement | n | worst median / p10 | below worst | promise median / p10 | below promise |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        for w in row.get("worst_of_n", []):
            lines.append(
                f"| {row['placement']} | {w['n']} | {w['worst_median']:.4f} / {w['worst_p10']:.4f} | "
                f"{w['below_worst']:.2%} | {w['promised_median']:.4f} / {w['promised_p10']:.4f} | "
                f"{w['below_promise']:.2%} |"
            )
    return lines


def markdown(result: Mapping[str, Any]) -> str:
    """The README tables: fidelity (the export's gate inputs, the further inputs), speed, worst-of-n."""
    lines = [cpu_line(result["cpu"]), "", *_placement_lines(result), ""]
    lines.append(
        fp32_speed_line(result["fp32_speed"])
        + "; "
        + load_span(result, " (contended: timings shared the cores with other work)")
    )
    for row in result["rows"]:
        lines += _auto_lines(row)
    return "\n".join(lines + _worst_of_n_lines(result))
