"""int8 fidelity of a pretrained-like ViT under each Q/DQ placement, through ``export_model`` (what
``export-model --dtype int8`` runs), on inputs that neither chose nor gated the placement.

Real pretrained ViTs carry a few residual-stream channels with huge activations (Darcet et al., "Vision Transformers
Need Registers", 2023, arXiv:2309.16588; Sun et al., "Massive Activations in Large Language Models", 2024,
arXiv:2402.17762) and outlier channels in the queries and keys. The study downloads no weights (it runs offline,
from the package alone), so :func:`pretrained_like_vit` builds a timm ViT in DINOv2 layout (patch embedding, class
token, LayerScale) whose weights reproduce both, without changing what the LayerNorms and attention compute: a bias
of ``residual_outlier`` in two residual channels that every LayerNorm gain damps, and two query channels scaled by
``qk_outlier`` with the matching key channels divided by it (q.k unchanged). It is converted to Belief2
(``convert_to_belief2``, the same function) and quantized with each placement from a folder of images (the export's
defaults: a quarter, at most 64, held out; ``auto``: half of those choose, half gate). The report holds, per
placement, the export's own fidelity figures, the fidelity on a further set of images the export never saw, how the
worst-of-n moves with n, what ``auto`` kept and what each kept group costs, and the int8 latency next to fp32 on
ONNX Runtime and OpenVINO (one thread, batch 1, every model's runs interleaved, with the load average: the machine
may be shared).

``--zoo-accuracy`` instead exports the zoo's models to int8 as ``export-model --dtype int8`` does (its default
``auto`` placement, and the ``cpu`` placement of the copies ``serve-demo`` / ``serve-models --dtype int8`` serve)
and records whether each still passes its accuracy gate on the test split, with its fidelity figures.

Usage::

    python -m research.int8_fidelity --out results/studies/int8-fidelity
    python -m research.int8_fidelity --out results/studies/int8-fidelity --zoo-accuracy cls
    python -m research.int8_fidelity --table results/studies/int8-fidelity/results.json
    python -m research.int8_fidelity --remedies --out results/studies/int8-remedies
    python -m research.int8_fidelity --zoo-outliers cls --out results/studies/int8-remedies

``--remedies``: the stand-in with LayerNorm outlier channels calibrated on augmented crops of three images,
each outlier remedy on the same footing (:func:`remedies`); ``--zoo-outliers``: whether ``auto``'s SmoothQuant
step moves anything in the zoo's models (:func:`zoo_outliers`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.errors import UsageError
from attnzoo.fileio import atomic_write_text, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_info
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
from attnzoo.runtime import openvino as ov
from attnzoo.runtime.backends.openvino import OPENVINO, OpenVINORuntimeSession
from attnzoo.runtime.backends.ort_cpu import ORT_CPU
from research.study import contended, reprint, require_out

# --help and --table load without torch, onnx and timm: these import at their first use
torch = lazy_import("torch")
onnx = lazy_import("onnx")
vision_transformer = lazy_import("timm.models.vision_transformer")
models = lazy_import("attnzoo.models")
zoo = lazy_import("attnzoo.zoo")
export = lazy_import("attnzoo.export")
quantize = lazy_import("attnzoo.export.quantize")

__all__ = [
    "pretrained_like_vit",
    "smooth_images",
    "speeds",
    "worst_of_n",
    "measure",
    "zoo_drift",
    "zoo_accuracy",
    "cpu_line",
    "markdown",
    "zoo_accuracy_markdown",
    "augmented_crops",
    "remedies",
    "remedies_markdown",
    "zoo_outliers",
    "zoo_outliers_markdown",
    "main",
]

#: Residual-stream channels given a massive activation, and the query/key channel of each head scaled.
OUTLIER_CHANNELS = (3, 17)
#: LayerNorm output channels (feeding the qkv and fc1 matmuls) given an outlier gain by ``ln_outlier``.
LN_OUTLIER_CHANNELS = (5, 40)


def pretrained_like_vit(
    *,
    img_size: int = 32,
    patch_size: int = 8,
    embed_dim: int = 96,
    depth: int = 4,
    num_heads: int = 3,
    num_classes: int = 10,
    residual_outlier: float = 20.0,
    qk_outlier: float = 8.0,
    layer_scale: float = 0.2,
    ln_outlier: float = 1.0,
    seed: int = 0,
):
    """A timm ``VisionTransformer`` (LayerScale, class token) with the outlier activations of a pretrained ViT.

    Weights are drawn at unit scale (matrices ~ N(0, 1/fan_in), LayerScale ~ ``layer_scale``), then the residual
    channels :data:`OUTLIER_CHANNELS` get a bias of ``residual_outlier`` (their LayerNorm gains 0.01, as a trained
    model damps them), and in every block the first query channel of each head is scaled by ``qk_outlier`` and the
    matching key channel divided by it. ``ln_outlier`` > 1 also gives the LayerNorm outputs that feed the qkv and
    fc1 matmuls outlier channels (:data:`LN_OUTLIER_CHANNELS`: their gain and bias times ``ln_outlier``, the
    matmul's weights of those input channels divided by it; the function is unchanged), the outliers SmoothQuant
    migrates (Xiao et al., "SmoothQuant", 2022, arXiv:2211.10438; Wei et al., "Outlier Suppression", 2022,
    arXiv:2209.13325).
    """
    torch.manual_seed(seed)
    model = vision_transformer.VisionTransformer(
        img_size=img_size,
        patch_size=patch_size,
        embed_dim=embed_dim,
        depth=depth,
        num_heads=num_heads,
        init_values=layer_scale,
        num_classes=num_classes,
    ).eval()
    gen = torch.Generator().manual_seed(seed)
    head_dim = embed_dim // num_heads
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() >= 2:
                p.copy_(noise / p[0].numel() ** 0.5)
            elif name.endswith("gamma"):
                p.copy_(layer_scale + 0.1 * layer_scale * noise)
            else:
                gain = name.endswith(("norm1.weight", "norm2.weight", "norm.weight"))
                p.copy_(0.1 * noise + (1.0 if gain else 0.0))
        channels = list(OUTLIER_CHANNELS)
        model.patch_embed.proj.bias[channels] += residual_outlier
        model.norm.weight[channels] = 0.01
        queries = [h * head_dim for h in range(num_heads)]
        for blk in model.blocks:
            blk.norm1.weight[channels] = 0.01
            blk.norm2.weight[channels] = 0.01
            w, b = blk.attn.qkv.weight, blk.attn.qkv.bias
            keys = [embed_dim + c for c in queries]
            w[queries] *= qk_outlier
            b[queries] *= qk_outlier
            w[keys] /= qk_outlier
            b[keys] /= qk_outlier
            for norm, linear in ((blk.norm1, blk.attn.qkv), (blk.norm2, blk.mlp.fc1)):
                ln = list(LN_OUTLIER_CHANNELS)
                norm.weight[ln] *= ln_outlier
                norm.bias[ln] *= ln_outlier
                linear.weight[:, ln] /= ln_outlier
    return model


def smooth_images(count: int, size: int, seed: int = 0) -> np.ndarray:
    """``count`` uint8 RGB images (N, size, size, 3) of smooth random colour fields with a few edges: a stand-in
    for photos (the study downloads no natural images)."""
    rng = np.random.default_rng(seed)
    out = np.empty((count, size, size, 3), np.uint8)
    for i in range(count):
        low = rng.uniform(0, 255, (4, 4, 3)).astype(np.uint8)
        img = np.asarray(Image.fromarray(low).resize((size, size), Image.Resampling.BICUBIC), np.float32)
        yy, xx = np.mgrid[:size, :size]
        edge = (np.cos(rng.uniform(0, np.pi)) * xx + np.sin(rng.uniform(0, np.pi)) * yy) > rng.uniform(0, size)
        img[edge] = 255 - img[edge]
        out[i] = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
    return out


def write_images(folder: Path, images: np.ndarray) -> Path:
    """Save ``images`` as PNG files in ``folder`` (a user's calibration folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(images):
        Image.fromarray(img).save(folder / f"img{i:04d}.png")
    return folder


def _interleaved_ms(runners: dict[str, Any], runs: int) -> dict[str, list[float]]:
    """Per model, ``runs`` timed calls (ms), taken round-robin so that a load on the machine hits every model alike."""
    for run in runners.values():
        run()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(runs):
        for key, run in runners.items():
            start = time.perf_counter()
            run()
            times[key].append((time.perf_counter() - start) * 1e3)
    return times


def _ov_session(path: Path) -> OpenVINORuntimeSession:
    """The ``openvino`` backend's session of ``path`` (ONNX or IR), one thread, batch 1: the study's OpenVINO runs."""
    return OPENVINO.load(path, OPENVINO.options(threads=1, batch=1))


def speeds(files: dict[str, Path], x: np.ndarray, runs: int = 40) -> dict[str, Any]:
    """Batch-1, one-thread latency of every file on ONNX Runtime and OpenVINO (``files["fp32"]`` the reference),
    interleaved per runtime: median ms and the median of the per-round fp32 / int8 ratios (speed-up), and the
    fastest run of each and their ratio (the runs least disturbed by other work on the machine)."""
    out: dict[str, Any] = {}
    makers = {
        "onnxruntime": lambda p: (lambda s: lambda: s.run(None, {"image": x}))(ORT_CPU.session(p, 1).session),
        "openvino": lambda p: _ov_session(p).call(x).fn,
    }
    for runtime, make in makers.items():
        try:
            times = _interleaved_ms({k: make(p) for k, p in files.items()}, runs)
        except Exception as exc:  # noqa: BLE001 - a runtime that cannot run a graph is a result, stated
            out[runtime] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
            continue
        ref = np.array(times["fp32"])
        out[runtime] = {
            k: {
                "ms": float(np.median(t)),
                "fastest_ms": float(np.min(t)),
                "speedup": float(np.median(ref / np.array(t))),
                "speedup_fastest": float(ref.min() / np.min(t)),
            }
            for k, t in times.items()
        }
    return out


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


def measure(
    out: Path,
    placements: Sequence[str] = ("tensorrt", "cpu", "auto"),
    *,
    images: int = 256,
    further: int = 512,
    runs: int = 40,
    **model_kwargs: Any,
) -> dict[str, Any]:
    """Export the converted pretrained-like ViT to int8 with each placement and measure it.

    ``auto`` runs with every default (the gate on, 0.99); ``tensorrt`` and ``cpu`` with the gate off
    (``min_cosine=0``), so that they are measured either way, and the row says whether the default gate passes.
    """
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
        start = time.perf_counter()
        gate = None if placement == "auto" else 0.0
        path = out / f"int8-{placement}.onnx"
        try:
            result = export.export_model(
                model=model,
                out=path,
                dtype="int8",
                batch_sizes=(1,),
                qdq_placement=placement,
                calibration_data=folder,
                min_cosine=gate,
            )
        except export.ExportError as exc:
            rows.append({"placement": placement, "refused": str(exc)})
            continue
        fid, q = result.report["fidelity"], result.report["quantization"]
        auto = q["options"].get("auto") or {}
        seen, cos = _agreement(fp32.path, result.path, unseen)
        files[placement] = result.path
        rows.append(
            {
                "placement": placement,
                "export_s": round(time.perf_counter() - start, 1),
                "gate_on": gate if gate is not None else quantize.DEFAULT_MIN_COSINE,
                "split": fid["split"],
                "gate": {
                    k: fid[k] for k in ("n_inputs", "cosine", "relative_error", "promised_cosine", "top1_agreement")
                },
                "default_gate_passes": bool(fid["cosine"]["min"] >= quantize.DEFAULT_MIN_COSINE),
                "further": seen,
                "worst_of_n": worst_of_n(cos),
                "quantize_linear": q["qdq"]["quantize_linear"],
                "auto": {k: auto[k] for k in ("all_quantized", "weights_only", "chosen", "rule", "speed") if k in auto},
                "auto_kept_fp32": [g for g, d in auto.get("groups", {}).items() if not d["quantized"]],
                "auto_groups": len(auto.get("groups", {})),
            }
        )
    x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
    speed = speeds(files, x, runs)
    for row in rows:
        if "refused" not in row:
            row["speed"] = {rt: s.get(row["placement"], s) for rt, s in speed.items()}
    load_end = list(os.getloadavg())
    return {
        "command": "python -m research.int8_fidelity " + " ".join(sys.argv[1:]),
        "cpu": cpu_info(),
        "model": {**model_kwargs, "config": config},
        "calibration": f"a folder of {images} smooth images (export defaults: the last quarter, at most 64, held out)",
        "further_inputs": f"{further} other smooth images (seed 1), never seen by the export",
        "fp32_speed": {rt: s.get("fp32", s) for rt, s in speed.items()},
        "load_average": {"start": load_start, "end": load_end},
        "contended": contended(load_start, load_end, 1),
        "rows": rows,
    }


def augmented_crops(photos: np.ndarray, count: int, seed: int = 0, shift: int = 4) -> np.ndarray:
    """``count`` uint8 augmentations of ``photos`` (N, H, W, 3), in turn: a random horizontal flip, a shift of up
    to ``shift`` pixels each way (edges reflected), brightness x0.8-1.2 and noise of 4 grey levels (sd): a
    calibration set made of a few photos, as a user makes one."""
    rng = np.random.default_rng(seed)
    size = photos.shape[1]
    out = np.empty((count, *photos.shape[1:]), np.uint8)
    for i in range(count):
        img = photos[i % len(photos)].astype(np.float32)
        if rng.random() < 0.5:
            img = img[:, ::-1]
        dy, dx = rng.integers(-shift, shift + 1, 2)
        padded = np.pad(img, ((shift, shift), (shift, shift), (0, 0)), mode="reflect")
        img = padded[shift + dy : shift + dy + size, shift + dx : shift + dx + size]
        img = img * rng.uniform(0.8, 1.2) + rng.normal(0, 4, img.shape)
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


#: ``--remedies``: the placements and ModelOpt calibration methods tried (ModelOpt 0.47's ONNX int8 quantizer
#: offers ``entropy`` and ``max``; its weights are per channel either way).
REMEDY_PLACEMENTS = ("auto", "cpu", "tensorrt")
REMEDY_METHODS = ("entropy", "max")


def _openvino_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    """An OpenVINO model's (ONNX or IR) outputs on ``x``, one input at a time."""
    with _ov_session(path) as session:
        return session.run(x)


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
    timed on ONNX Runtime and OpenVINO (:func:`speeds`).
    """
    load_start = list(os.getloadavg())
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
    fp32 = export.export_model(model=model, out=out / "fp32.onnx", batch_sizes=(1,))
    refs = {k: quantize.onnx_outputs(fp32.path, x, None) for k, x in sets.items()}
    rows: list[dict[str, Any]] = []
    files: dict[str, Path] = {"fp32": fp32.path}
    arr = np.load(calibration)
    held = min(quantize.DEFAULT_FIDELITY_COUNT, len(arr) // 4)  # export_model's split of a .npy
    defaults = "export_model defaults (auto/entropy, SmoothQuant where outliers, gate 0.99)"
    tried: list[tuple[str, str, str, bool | None]] = [(defaults, "auto", "entropy", None)]
    tried += [(f"{p}/{m}", p, m, False) for p in placements for m in methods]
    tried += [(f"{p}/{methods[0]} + SmoothQuant", p, methods[0], True) for p in smooth]
    for key, placement, method, smoothed in tried:
        path = out / f"int8-{len(rows)}.onnx"
        start = time.perf_counter()
        try:
            if smoothed is None:  # every default, the gate on: what a user gets
                report = export.export_model(
                    model=model, out=path, dtype="int8", batch_sizes=(1,), calibration_data=calibration
                ).report
            else:  # export_model's split of the .npy, the gate off (measured either way), SmoothQuant as asked
                report = quantize.quantize_verified(
                    fp32.path,
                    path,
                    config,
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
        except export.ExportError as exc:
            rows.append({"remedy": key, "refused": re.sub(r"; see \S+", "", str(exc).splitlines()[0])})
            continue
        fid, q = report["fidelity"], report["quantization"]
        auto = q["options"].get("auto") or {}
        worst = {
            k: float(quantize.per_input_fidelity(refs[k], quantize.onnx_outputs(path, x, None))[0].min())
            for k, x in sets.items()
        }
        files[key] = path
        rows.append(
            {
                "remedy": key,
                "placement": placement,
                "calibration_method": method,
                "export_s": round(time.perf_counter() - start, 1),
                "split": fid["split"],
                "gate_worst": fid["cosine"]["min"],
                "default_gate_passes": bool(
                    fid["cosine"]["min"] >= quantize.DEFAULT_MIN_COSINE
                    and (placement != "auto" or auto.get("promised"))
                ),
                "worst": worst,
                "quantize_linear": q["qdq"]["quantize_linear"],
                "auto_kept_fp32": [g for g, d in auto.get("groups", {}).items() if not d["quantized"]],
                "smooth_quant_migrated": (q["options"].get("smooth_quant") or {}).get("migrated"),
                "related": fid.get("related"),
                "warnings": [w.replace(f"{out}/", "") for w in report.get("warnings", [])],  # not the work folder
            }
        )
    nncf_row: dict[str, Any] = {"remedy": "nncf transformer (SmoothQuant), OpenVINO"}
    try:
        ir = out / "int8-nncf.xml"
        nncf_report = ov.nncf_int8(
            fp32.path,
            ir,
            np.load(calibration),
            ignored=quantize.extra_math_nodes(onnx.load(str(fp32.path)), config),
        )
        ov_refs = {k: _openvino_outputs(fp32.path, x) for k, x in sets.items()}
        nncf_row.update(
            placement="nncf",
            calibration_method="nncf default (min-max, SmoothQuant alpha for TRANSFORMER)",
            fake_quantize=nncf_report["fake_quantize"],
            worst={
                k: float(quantize.per_input_fidelity(ov_refs[k], _openvino_outputs(ir, x))[0].min())
                for k, x in sets.items()
            },
        )
    except Exception as exc:  # noqa: BLE001 - a quantizer that cannot run here is a result, stated
        nncf_row["refused"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    rows.append(nncf_row)
    x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
    speed = speeds(files, x, runs)
    for row in rows:
        if row["remedy"] in files:
            row["speed"] = {rt: s.get(row["remedy"], s) for rt, s in speed.items()}
    if "refused" not in nncf_row:
        ov_speed = _interleaved_ms(
            {
                "fp32": _ov_session(fp32.path).call(x).fn,
                "nncf": _ov_session(out / "int8-nncf.xml").call(x).fn,
            },
            runs,
        )
        ref = np.array(ov_speed["fp32"])
        nncf_row["speed"] = {
            "openvino": {
                "ms": float(np.median(ov_speed["nncf"])),
                "speedup": float(np.median(ref / np.array(ov_speed["nncf"]))),
            }
        }
    load_end = list(os.getloadavg())
    return {
        "command": "python -m research.int8_fidelity " + " ".join(sys.argv[1:]),
        "remedies": True,
        "cpu": cpu_info(),
        "versions": _versions(),
        "model": {**model_kwargs, "config": config},
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
        f"Command: `{result['command']}`; calibration: {result['calibration']}; load average "
        f"{result['load_average']['start'][0]:.2f} -> {result['load_average']['end'][0]:.2f}"
        + (" (contended)" if result["contended"] else ""),
        "",
        "| placement / calibration | worst cosine: clean originals | unrelated images | further crops | "
        "export's gate worst (default gate) | Q/DQ pairs | ORT int8 ms (x fp32) | OpenVINO int8 ms (x fp32) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "refused" in r:
            lines.append(f"| {r['remedy']} | refused: {r['refused']} | | | | | | |")
            continue
        w, sp = r["worst"], r.get("speed", {})
        cells = [
            f"{sp[rt]['ms']:.2f} ({sp[rt]['speedup']:.2f}x)" if "ms" in sp.get(rt, {}) else "-"
            for rt in ("onnxruntime", "openvino")
        ]
        gate = (
            f"{r['gate_worst']:.4f} ({'passes' if r['default_gate_passes'] else 'refused'})"
            if "gate_worst" in r
            else "-"
        )
        lines.append(
            f"| {r['remedy']} | {w['originals']:.4f} | {w['unrelated']:.4f} | {w['further_crops']:.4f} | {gate} | "
            f"{r.get('quantize_linear', r.get('fake_quantize', '-'))} | {cells[0]} | {cells[1]} |"
        )
    fp = result["fp32_speed"]
    lines += [
        "",
        "fp32: ONNX Runtime "
        + (f"{fp['onnxruntime']['ms']:.2f} ms" if "ms" in fp["onnxruntime"] else "-")
        + ", OpenVINO "
        + (f"{fp['openvino']['ms']:.2f} ms" if "ms" in fp.get("openvino", {}) else "-")
        + " (one thread, batch 1, median of interleaved runs)",
    ]
    for r in result["rows"]:  # the defaults' report on its gate inputs: near-copies of calibration inputs or not
        rel = r.get("related") or {}
        if rel:
            worst = rel["worst"]
            lines += [
                "",
                f"`{r['remedy']}`: of its {rel['near_copies'] + rel['distinct']} gate inputs, {rel['near_copies']} "
                f"are near-copies of calibration inputs (worst {worst.get('near_copies', float('nan')):.4f}), "
                f"{rel['distinct']} distinct"
                + (f" (worst {worst['distinct']:.4f})" if "distinct" in worst else "")
                + (f"; the report warns: {rel['warning']}" if rel.get("warning") else ""),
            ]
            break
    return "\n".join(lines)


def cpu_line(cpu: Mapping[str, Any]) -> str:
    """One line naming the CPU a result was measured on: its model, cores and key instruction-set flags."""
    return (
        f"CPU: {cpu.get('model', '?')}, {cpu.get('usable_cores', cpu.get('logical_cores', '?'))} usable cores; "
        f"flags: {', '.join(cpu.get('key_flags', [])) or 'none recorded'}"
    )


def markdown(result: Mapping[str, Any]) -> str:
    """The README tables: fidelity (the export's gate inputs, the further inputs), speed, worst-of-n."""
    lines = [
        cpu_line(result["cpu"]),
        "",
        "| placement | gate inputs: worst / mean cosine, rel. error | default gate (worst >= 0.99) | "
        f"{result['further_inputs'].split(' ')[0]} further inputs: worst / mean cosine, rel. error (max) | "
        "top-1 agree (further) | Q/DQ pairs | ORT int8 ms (x fp32) | OpenVINO int8 ms (x fp32) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        if "refused" in r:
            lines.append(f"| {r['placement']} | refused: {r['refused']} | | | | | | |")
            continue
        g, f = r["gate"], r["further"]
        sp = [r["speed"][rt] for rt in ("onnxruntime", "openvino")]
        cell = [f"{s['ms']:.2f} ({s['speedup']:.2f}x)" if "ms" in s else s.get("error", "-") for s in sp]
        lines.append(
            f"| {r['placement']} | {g['cosine']['min']:.4f} / {g['cosine']['mean']:.4f}, "
            f"{g['relative_error']['mean']:.3f} (n={g['n_inputs']}) | "
            f"{'passes' if r['default_gate_passes'] else 'refused'} | {f['cosine']['min']:.4f} / "
            f"{f['cosine']['mean']:.4f}, {f['relative_error']['mean']:.3f} ({f['relative_error']['max']:.3f}) | "
            f"{f['top1_agreement']:.1%} | {r['quantize_linear']} | {cell[0]} | {cell[1]} |"
        )
    fp = result["fp32_speed"]
    lines += [
        "",
        "fp32: ONNX Runtime "
        + (f"{fp['onnxruntime']['ms']:.2f} ms" if "ms" in fp["onnxruntime"] else "-")
        + ", OpenVINO "
        + (f"{fp['openvino']['ms']:.2f} ms" if "ms" in fp.get("openvino", {}) else "-")
        + f"; load average {result['load_average']['start'][0]:.2f} -> {result['load_average']['end'][0]:.2f}"
        + (" (contended: timings shared the cores with other work)" if result["contended"] else ""),
    ]
    for r in result["rows"]:
        auto = r.get("auto") or {}
        if auto.get("chosen"):
            sp = (auto.get("speed") or {}).get("groups", {})
            lines += [
                "",
                f"`{r['placement']}`: promised cosine {auto['chosen']['promised']:.4f} on the choosing inputs "
                f"(full placement {auto['all_quantized']['promised']:.4f}"
                + (f", weights only {auto['weights_only']['promised']:.4f}" if "weights_only" in auto else "")
                + f"); kept fp32 {len(r['auto_kept_fp32'])} of {r['auto_groups']} groups:",
                "",
                "| group kept fp32 | ORT ms fp32 / quantized | slowdown |",
                "|---|---|---|",
            ]
            lines += [
                f"| {g} | {sp[g]['fp32_ms']:.2f} / {sp[g]['quantized_ms']:.2f} | {sp[g]['slowdown']:.2f}x |"
                if g in sp
                else f"| {g} | - | - |"
                for g in r["auto_kept_fp32"]
            ]
    lines += [
        "",
        "Worst-of-n on the further inputs (subsets of n, 400 draws): median / 10th percentile of the worst "
        "and of the promise, share of the further inputs below each",
        "",
        "| placement | n | worst median / p10 | below worst | promise median / p10 | below promise |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        for w in r.get("worst_of_n", []):
            lines.append(
                f"| {r['placement']} | {w['n']} | {w['worst_median']:.4f} / {w['worst_p10']:.4f} | "
                f"{w['below_worst']:.2%} | {w['promised_median']:.4f} / {w['promised_p10']:.4f} | "
                f"{w['below_promise']:.2%} |"
            )
    return "\n".join(lines)


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
        f"Command: `{result['command']}`; load average "
        f"{result['load_average']['start'][0]:.2f} -> {result['load_average']['end'][0]:.2f}"
        + (" (contended)" if result["contended"] else ""),
        "",
        "| variant | task | placement | accuracy gate | fp32 | int8 | drop (tolerance) | fidelity: worst / mean "
        "cosine (n) | auto kept fp32 | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        a, f = r.get("accuracy"), r.get("fidelity")
        reason = _without_work_path(r.get("refused", "; ".join(r.get("failures", []))))
        verdict = "passes" if r.get("passed") else f"refused: {reason}"
        acc = (
            [f"{a['metrics']['fp32']:.2f}", f"{a['metrics']['int8']:.2f}", f"{a['drop']:+.2f} ({a['tolerance']:g})"]
            if a
            else ["-", "-", "-"]
        )
        fid = f"{f['cosine']['min']:.4f} / {f['cosine']['mean']:.4f} ({f['n_inputs']})" if f else "-"
        auto = r.get("auto")
        kept = (
            "-"
            if not auto
            else (f"{len(auto['kept_fp32'])} of {auto['groups']}" + (" (weights only)" if auto.get("fallback") else ""))
        )
        lines.append(
            f"| {r['variant']} | {r['task']} | {r['placement']} | {verdict} | {' | '.join(acc)} | {fid} | "
            f"{kept} | {r.get('seconds', '-')} |"
        )
    passed = sum(bool(r.get("passed")) for r in result["rows"])
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


def _zoo_selection(spec: str, data: str) -> list[tuple[str, str]]:
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m research.int8_fidelity", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None, help="folder for results.json and results.md")
    p.add_argument(
        "--table",
        type=Path,
        default=None,
        metavar="FILE",
        help="print the markdown of an earlier results.json or zoo-accuracy.json and run nothing",
    )
    p.add_argument("--img-size", type=int, default=None, help="default 64 (--remedies: 32)")
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--embed-dim", type=int, default=None, help="default 192 (--remedies: 96)")
    p.add_argument("--depth", type=int, default=None, help="default 6 (--remedies: 4)")
    p.add_argument("--num-heads", type=int, default=3)
    p.add_argument(
        "--ln-outlier",
        type=float,
        default=None,
        help="gain of the LayerNorm outputs' outlier channels (pretrained_like_vit; default 1, --remedies: 30)",
    )
    p.add_argument("--images", type=int, default=256, help="images in the calibration folder (a quarter held out)")
    p.add_argument("--further", type=int, default=512, help="further images, never seen by the export")
    p.add_argument("--runs", type=int, default=40, help="interleaved timed runs per model and runtime")
    p.add_argument(
        "--zoo",
        default=None,
        metavar="VARIANT:TASK,...",
        help="instead: the logits' drift of these zoo models' int8 copies on 512 further training images "
        "(zoo-drift.json)",
    )
    p.add_argument(
        "--zoo-accuracy",
        default=None,
        metavar="SELECTION",
        help="instead: export the zoo's models (VARIANT:TASK,... or cls, seg, all) to int8 with each of "
        f"{', '.join(ZOO_PLACEMENTS)} and record their accuracy gate (zoo-accuracy.json / .md)",
    )
    p.add_argument(
        "--remedies",
        action="store_true",
        help="instead: calibrate on augmented crops of 3 images and measure each outlier remedy (placement x "
        "calibration method, NNCF's SmoothQuant) on the clean images, unrelated ones and further crops "
        "(remedies.json / .md; the stand-in is 32 px, width 96, depth 4 unless given)",
    )
    p.add_argument(
        "--zoo-outliers",
        default=None,
        metavar="SELECTION",
        help="instead: the LayerNorm outputs' outlier ratio of these zoo models (VARIANT:TASK,... or cls, seg, "
        "all), i.e. whether auto's SmoothQuant step moves anything (zoo-outliers.json / .md)",
    )
    p.add_argument("--data", default="fashion", help="the zoo's data set for --zoo-accuracy (default fashion)")
    p.add_argument(
        "--name",
        default="zoo-accuracy",
        help="--zoo-accuracy's report: <out>/<name>.json and .md (default zoo-accuracy)",
    )
    return add_debug_flag(p)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if reprint(
        args.table,
        lambda r: (
            zoo_accuracy_markdown(r)
            if "zoo_accuracy" in r
            else remedies_markdown(r)
            if "remedies" in r
            else zoo_outliers_markdown(r)
            if "zoo_outliers" in r
            else markdown(r)
        ),
    ):
        return 0
    if not args.name or "/" in args.name or args.name.startswith("."):
        raise UsageError(f"--name: a plain file name, got {args.name!r}")
    out = writable_dir(require_out(args.out))
    if args.zoo_accuracy:
        selection = _zoo_selection(args.zoo_accuracy, args.data)
        load_start = list(os.getloadavg())
        rows: list[dict[str, Any]] = []
        command = "python -m research.int8_fidelity " + " ".join(sys.argv[1:] if argv is None else argv)
        result: dict[str, Any] = {}
        for variant, task in selection:  # the report rewritten after each row: a stopped run keeps what it measured
            for placement in ZOO_PLACEMENTS:
                rows.append(zoo_accuracy(variant, task, placement, args.data))
                print(json.dumps(rows[-1]), flush=True)
                load_end = list(os.getloadavg())
                result = {
                    "command": command,
                    "zoo_accuracy": True,
                    "cpu": cpu_info(),
                    "versions": _versions(),
                    "load_average": {"start": load_start, "end": load_end},
                    "contended": contended(load_start, load_end, 2),
                    "selected": len(selection) * len(ZOO_PLACEMENTS),
                    "rows": rows,
                }
                atomic_write_text(out / f"{args.name}.json", json.dumps(result, indent=1) + "\n")
                atomic_write_text(out / f"{args.name}.md", zoo_accuracy_markdown(result) + "\n")
        print(zoo_accuracy_markdown(result))
        return 0 if all(r.get("passed") for r in rows) else 1
    if args.zoo_outliers:
        selection = _zoo_selection(args.zoo_outliers, args.data)
        result = {
            "command": "python -m research.int8_fidelity " + " ".join(sys.argv[1:] if argv is None else argv),
            "zoo_outliers": True,
            "cpu": cpu_info(),
            "rows": [zoo_outliers(v, t) for v, t in selection],
        }
        atomic_write_text(out / "zoo-outliers.json", json.dumps(result, indent=1) + "\n")
        atomic_write_text(out / "zoo-outliers.md", zoo_outliers_markdown(result) + "\n")
        print(zoo_outliers_markdown(result))
        return 0
    if args.remedies:
        with tempfile.TemporaryDirectory(prefix="attnzoo-int8-remedies-") as work:
            result = remedies(
                Path(work),
                runs=args.runs,
                img_size=args.img_size or 32,
                patch_size=args.patch_size,
                embed_dim=args.embed_dim or 96,
                depth=args.depth or 4,
                num_heads=args.num_heads,
                ln_outlier=30.0 if args.ln_outlier is None else args.ln_outlier,
            )
        atomic_write_text(out / "remedies.json", json.dumps(result, indent=2) + "\n")
        atomic_write_text(out / "remedies.md", remedies_markdown(result) + "\n")
        print(remedies_markdown(result))
        return 0
    if args.zoo:
        rows = [zoo_drift(*item.split(":")) for item in args.zoo.split(",")]
        atomic_write_text(
            out / "zoo-drift.json",
            json.dumps(
                {"command": "python -m research.int8_fidelity " + " ".join(sys.argv[1:]), "rows": rows}, indent=2
            )
            + "\n",
        )
        print(json.dumps(rows, indent=1))
        return 0
    with tempfile.TemporaryDirectory(prefix="attnzoo-int8-fidelity-") as work:
        result = measure(
            Path(work),
            img_size=args.img_size or 64,
            patch_size=args.patch_size,
            embed_dim=args.embed_dim or 192,
            depth=args.depth or 6,
            num_heads=args.num_heads,
            ln_outlier=1.0 if args.ln_outlier is None else args.ln_outlier,
            images=args.images,
            further=args.further,
            runs=args.runs,
        )
    atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "results.md", markdown(result) + "\n")
    print(markdown(result))
    return 0


def _versions() -> dict[str, str]:
    """The versions of what quantizes and runs the int8 graphs."""
    return {name: version(name) for name in ("onnxruntime", "nvidia-modelopt", "torch")}

