"""A user's int8 export of the pretrained-like ViT calibrated on augmented crops of a few photos, and what each
remedy for its LayerNorm outlier channels does, on the same footing (``python -m research.int8_fidelity
--remedies``)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_info
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
from attnzoo.targets import openvino as ov
from research.study import contended, cpu_line

from .speed import fp32_speed_line, interleaved_ms, load_span, openvino_outputs, ov_session, speeds, versions
from .standin import augmented_crops, pretrained_like_vit, smooth_images

# --help and --table load without onnx and timm: these import at their first use
onnx = lazy_import("onnx")
models = lazy_import("attnzoo.models")
export = lazy_import("attnzoo.export")
quantize = lazy_import("attnzoo.export.quantize")

__all__ = ["REMEDY_PLACEMENTS", "REMEDY_METHODS", "remedies", "remedies_markdown"]

#: ``--remedies``: the placements and ModelOpt calibration methods tried (ModelOpt 0.47's ONNX int8 quantizer
#: offers ``entropy`` and ``max``; its weights are per channel either way).
REMEDY_PLACEMENTS = ("auto", "cpu", "tensorrt")
REMEDY_METHODS = ("entropy", "max")
#: The first row: ``export_model``'s every default, the gate on, what a user gets.
DEFAULTS = "export_model defaults (auto/entropy, SmoothQuant where outliers, gate 0.99)"


def _worst(refs: Mapping[str, np.ndarray], outputs, sets: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The worst per-input cosine to fp32 (``refs``) on each kind of input, ``outputs(x)`` the model's outputs."""
    return {k: float(quantize.per_input_fidelity(refs[k], outputs(x))[0].min()) for k, x in sets.items()}


def _quantize(placement: str, method: str, smoothed: bool | None, setup: Mapping[str, Any], path: Path):
    """One remedy's int8 file at ``path``: its export report (``smoothed`` ``None``: ``export_model``'s every
    default, the gate on; else the same split of the .npy through ``quantize_verified``, the gate off so that it is
    measured either way, SmoothQuant as asked)."""
    calibration, arr, held = setup["calibration"], setup["arr"], setup["held"]
    if smoothed is None:
        return export.export_model(
            model=setup["model"], out=path, dtype="int8", batch_sizes=(1,), calibration_data=calibration
        ).report
    return quantize.quantize_verified(
        setup["fp32"],
        path,
        setup["config"],
        dtype="int8",
        calibration=arr[: len(arr) - held],
        held_out=arr[len(arr) - held :],
        calibration_source=f"--calibration-data {calibration.name}",
        measure_accuracy=False,
        min_cosine=0.0,
        placement=placement,
        smooth_quant=smoothed,
        calibration_method=method,
    )


def _remedy_row(tried: tuple[str, str, str, bool | None], setup: Mapping[str, Any], path: Path, out: Path):
    """One remedy exported and measured: ``(its row, its file)``; a refused one is a row with the reason, no file."""
    key, placement, method, smoothed = tried
    start = time.perf_counter()
    try:
        report = _quantize(placement, method, smoothed, setup, path)
    except export.ExportError as exc:
        return {"remedy": key, "refused": re.sub(r"; see \S+", "", str(exc).splitlines()[0])}, None
    fid, quant = report["fidelity"], report["quantization"]
    auto = quant["options"].get("auto") or {}
    row = {
        "remedy": key,
        "placement": placement,
        "calibration_method": method,
        "export_s": round(time.perf_counter() - start, 1),
        "split": fid["split"],
        "gate_worst": fid["cosine"]["min"],
        "default_gate_passes": bool(
            fid["cosine"]["min"] >= quantize.DEFAULT_MIN_COSINE and (placement != "auto" or auto.get("promised"))
        ),
        "worst": _worst(setup["refs"], lambda x: quantize.onnx_outputs(path, x, None), setup["sets"]),
        "quantize_linear": quant["qdq"]["quantize_linear"],
        "auto_kept_fp32": [g for g, d in auto.get("groups", {}).items() if not d["quantized"]],
        "smooth_quant_migrated": (quant["options"].get("smooth_quant") or {}).get("migrated"),
        "related": fid.get("related"),
        "warnings": [w.replace(f"{out}/", "") for w in report.get("warnings", [])],  # not the work folder
    }
    return row, path


def _nncf_row(setup: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """NNCF's ``TRANSFORMER`` scheme (SmoothQuant, per-channel weights) on the OpenVINO model of the same fp32
    ONNX, measured on the same inputs; a quantizer that cannot run here is a row with the reason."""
    row: dict[str, Any] = {"remedy": "nncf transformer (SmoothQuant), OpenVINO"}
    fp32, ir = setup["fp32"], out / "int8-nncf.xml"
    try:
        ignored = quantize.extra_math_nodes(onnx.load(str(fp32)), setup["config"])
        nncf_report = ov.nncf_int8(fp32, ir, np.load(setup["calibration"]), ignored=ignored)
        ov_refs = {k: openvino_outputs(fp32, x) for k, x in setup["sets"].items()}
        row.update(
            placement="nncf",
            calibration_method="nncf default (min-max, SmoothQuant alpha for TRANSFORMER)",
            fake_quantize=nncf_report["fake_quantize"],
            worst=_worst(ov_refs, lambda x: openvino_outputs(ir, x), setup["sets"]),
        )
    except Exception as exc:
        row["refused"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return row


def _nncf_speed(fp32: Path, ir: Path, x: np.ndarray, runs: int) -> dict[str, Any]:
    """NNCF's model against the fp32 one on OpenVINO, interleaved: its median ms and the per-round speed-up."""
    times = interleaved_ms({"fp32": ov_session(fp32).call(x).fn, "nncf": ov_session(ir).call(x).fn}, runs)
    ref = np.array(times["fp32"])
    return {
        "openvino": {"ms": float(np.median(times["nncf"])), "speedup": float(np.median(ref / np.array(times["nncf"])))}
    }


def _setup(out: Path, photos: int, crops: int, unrelated: int, model_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The converted stand-in, its fp32 export, the calibration .npy of augmented crops, the three kinds of input
    each remedy is measured on and fp32's outputs on them."""
    model = models.convert_to_belief2(pretrained_like_vit(**model_kwargs))
    config = model.attnzoo_config
    size = int(config["img_size"])
    mean, std = config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD)
    originals = smooth_images(photos, size, seed=2)
    sets = {
        "originals": normalize(originals, mean, std),
        "unrelated": normalize(smooth_images(unrelated, size, seed=1), mean, std),
        "further_crops": normalize(augmented_crops(originals, 64, seed=1), mean, std),
    }
    calibration = out / "crops.npy"
    np.save(calibration, normalize(augmented_crops(originals, crops, seed=0), mean, std))
    fp32 = export.export_model(model=model, out=out / "fp32.onnx", batch_sizes=(1,)).path
    arr = np.load(calibration)
    return {
        "model": model,
        "config": config,
        "size": size,
        "sets": sets,
        "calibration": calibration,
        "arr": arr,
        "held": min(quantize.DEFAULT_FIDELITY_COUNT, len(arr) // 4),  # export_model's split of a .npy
        "fp32": fp32,
        "refs": {k: quantize.onnx_outputs(fp32, x, None) for k, x in sets.items()},
    }


def remedies(
    out: Path,
    *,
    photos: int = 3,
    crops: int = 96,
    unrelated: int = 64,
    runs: int = 40,
    placements: Sequence[str] = REMEDY_PLACEMENTS,
    methods: Sequence[str] = REMEDY_METHODS,
    smooth: Sequence[str] = ("auto", "cpu"),
    command: str = "",
    **model_kwargs: Any,
) -> dict[str, Any]:
    """A user's int8 export of the pretrained-like ViT calibrated on augmented crops of a few photos, and what
    each remedy for its outlier channels does, on the same footing.

    ``crops`` augmentations (:func:`augmented_crops`) of ``photos`` smooth images are the ``.npy``
    ``calibration_data`` of ``export_model(dtype="int8")`` with every default (the first row); then the same split
    (a quarter held out, ``auto``: half choose, half gate) through ``quantize_verified`` once per placement x
    ModelOpt calibration method without SmoothQuant, and with it for ``smooth``, with ``min_cosine=0`` so that
    every row is measured (``default gate`` says what the default gate would have done); NNCF's ``TRANSFORMER`` scheme
    (SmoothQuant, per-channel weights) on the OpenVINO model of the same fp32 ONNX is one more row. Each is
    measured on the photos themselves (un-augmented), on ``unrelated`` other images and on 64 further crops, and
    timed on ONNX Runtime and OpenVINO (:func:`speeds`). ``command``: the command line the result records.
    """
    load_start = list(os.getloadavg())
    setup = _setup(out, photos, crops, unrelated, model_kwargs)
    tried: list[tuple[str, str, str, bool | None]] = [(DEFAULTS, "auto", "entropy", None)]
    tried += [(f"{p}/{m}", p, m, False) for p in placements for m in methods]
    tried += [(f"{p}/{methods[0]} + SmoothQuant", p, methods[0], True) for p in smooth]
    rows: list[dict[str, Any]] = []
    files: dict[str, Path] = {"fp32": setup["fp32"]}
    for remedy in tried:
        row, path = _remedy_row(remedy, setup, out / f"int8-{len(rows)}.onnx", out)
        rows.append(row)
        if path is not None:
            files[row["remedy"]] = path
    nncf_row = _nncf_row(setup, out)
    rows.append(nncf_row)
    x = np.random.default_rng(1).standard_normal((1, 3, setup["size"], setup["size"])).astype(np.float32)
    speed = speeds(files, x, runs)
    for row in rows:
        if row["remedy"] in files:
            row["speed"] = {rt: s.get(row["remedy"], s) for rt, s in speed.items()}
    if "refused" not in nncf_row:
        nncf_row["speed"] = _nncf_speed(setup["fp32"], out / "int8-nncf.xml", x, runs)
    load_end = list(os.getloadavg())
    return {
        "command": command,
        "remedies": True,
        "cpu": cpu_info(),
        "versions": versions(),
        "model": {**model_kwargs, "config": setup["config"]},
        "calibration": f"a .npy of {crops} augmented crops of {photos} smooth images (flip, shift <= 4 px, "
        "brightness x0.8-1.2, noise sd 4; export defaults: a quarter held out, auto: half choose, half gate)",
        "inputs": {
            "originals": f"the {photos} images themselves, un-augmented",
            "unrelated": f"{unrelated} other smooth images (seed 1)",
            "further_crops": "64 further augmented crops of the same images (seed 1)",
        },
        "fp32_speed": {rt: s.get("fp32", s) for rt, s in speed.items()},
        "load_average": {"start": load_start, "end": load_end},
        "contended": contended(load_start, load_end, 1),
        "rows": rows,
    }


def remedies_markdown(result: Mapping[str, Any]) -> str:
    """The remedies table: placement x calibration method -> worst cosine on each kind of input, gate, speed."""
    lines = [
        cpu_line(result["cpu"]),
        "",
        f"Command: `{result['command']}`; calibration: {result['calibration']}; {load_span(result)}",
        "",
        "| placement / calibration | worst cosine: clean originals | unrelated images | further crops | "
        "export's gate worst (default gate) | Q/DQ pairs | ORT int8 ms (x fp32) | OpenVINO int8 ms (x fp32) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        if "refused" in row:
            lines.append(f"| {row['remedy']} | refused: {row['refused']} | | | | | | |")
            continue
        worst, sp = row["worst"], row.get("speed", {})
        cells = [
            f"{sp[rt]['ms']:.2f} ({sp[rt]['speedup']:.2f}x)" if "ms" in sp.get(rt, {}) else "-"
            for rt in ("onnxruntime", "openvino")
        ]
        gate = (
            f"{row['gate_worst']:.4f} ({'passes' if row['default_gate_passes'] else 'refused'})"
            if "gate_worst" in row
            else "-"
        )
        lines.append(
            f"| {row['remedy']} | {worst['originals']:.4f} | {worst['unrelated']:.4f} | "
            f"{worst['further_crops']:.4f} | {gate} | "
            f"{row.get('quantize_linear', row.get('fake_quantize', '-'))} | {cells[0]} | {cells[1]} |"
        )
    lines += ["", fp32_speed_line(result["fp32_speed"]) + " (one thread, batch 1, median of interleaved runs)"]
    for row in result["rows"]:  # the defaults' report on its gate inputs: near-copies of calibration inputs or not
        rel = row.get("related") or {}
        if rel:
            worst = rel["worst"]
            lines += [
                "",
                f"`{row['remedy']}`: of its {rel['near_copies'] + rel['distinct']} gate inputs, {rel['near_copies']} "
                f"are near-copies of calibration inputs (worst {worst.get('near_copies', float('nan')):.4f}), "
                f"{rel['distinct']} distinct"
                + (f" (worst {worst['distinct']:.4f})" if "distinct" in worst else "")
                + (f"; the report warns: {rel['warning']}" if rel.get("warning") else ""),
            ]
            break
    return "\n".join(lines)
