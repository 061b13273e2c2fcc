"""int8 fidelity of a pretrained-like ViT under each Q/DQ placement, through ``export_model`` (what
``export-model --dtype int8`` runs).

Real pretrained ViTs carry a few residual-stream channels with huge activations (Darcet et al., "Vision
Transformers Need Registers", 2023, arXiv:2309.16588; Sun et al., "Massive Activations in Large Language Models",
2024, arXiv:2402.17762) and outlier channels in the queries and keys. No pretrained weights can be fetched here,
so :func:`pretrained_like_vit` builds a timm ViT in DINOv2 layout (patch embedding, class token, LayerScale) whose
weights reproduce both, without changing what the LayerNorms and attention compute: a bias of ``residual_outlier``
in two residual channels that every LayerNorm gain damps, and two query channels scaled by ``qk_outlier`` with the
matching key channels divided by it (q.k unchanged). It is converted to Belief2 (``convert_to_belief2``, the same
function) and quantized with each placement; the report holds each one's fidelity to fp32 on held-out inputs,
what ``auto`` kept, and ONNX Runtime's int8 latency on this CPU (the TensorRT engine is built, not run, here).

Usage::

    python -m attnzoo.studies.int8_fidelity --out results/studies/int8-fidelity
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from attnzoo.cli import add_debug_flag, entry_point

__all__ = ["pretrained_like_vit", "smooth_images", "measure", "main"]

#: Residual-stream channels given a massive activation, and the query/key channel of each head scaled.
OUTLIER_CHANNELS = (3, 17)


def pretrained_like_vit(*, img_size: int = 32, patch_size: int = 8, embed_dim: int = 96, depth: int = 4,
                        num_heads: int = 3, num_classes: int = 10, residual_outlier: float = 20.0,
                        qk_outlier: float = 8.0, layer_scale: float = 0.2, seed: int = 0):
    """A timm ``VisionTransformer`` (LayerScale, class token) with the outlier activations of a pretrained ViT.

    Weights are drawn at unit scale (matrices ~ N(0, 1/fan_in), LayerScale ~ ``layer_scale``), then the residual
    channels :data:`OUTLIER_CHANNELS` get a bias of ``residual_outlier`` (their LayerNorm gains 0.01, as a trained
    model damps them), and in every block the first query channel of each head is scaled by ``qk_outlier`` and the
    matching key channel divided by it.
    """
    import torch
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(seed)
    model = VisionTransformer(img_size=img_size, patch_size=patch_size, embed_dim=embed_dim, depth=depth,
                              num_heads=num_heads, init_values=layer_scale, num_classes=num_classes).eval()
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
    return model


def smooth_images(count: int, size: int, seed: int = 0) -> np.ndarray:
    """``count`` uint8 RGB images (N, size, size, 3) of smooth random colour fields with a few edges: a stand-in
    for photos (no natural images can be fetched here)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = np.empty((count, size, size, 3), np.uint8)
    for i in range(count):
        low = rng.uniform(0, 255, (4, 4, 3)).astype(np.uint8)
        img = np.asarray(Image.fromarray(low).resize((size, size), Image.BICUBIC), np.float32)
        yy, xx = np.mgrid[:size, :size]
        edge = (np.cos(rng.uniform(0, np.pi)) * xx + np.sin(rng.uniform(0, np.pi)) * yy) > rng.uniform(0, size)
        img[edge] = 255 - img[edge]
        out[i] = np.clip(img + rng.normal(0, 6, img.shape), 0, 255).astype(np.uint8)
    return out


def write_images(folder: Path, images: np.ndarray) -> Path:
    """Save ``images`` as PNG files in ``folder`` (a user's calibration folder)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(images):
        Image.fromarray(img).save(folder / f"img{i:04d}.png")
    return folder


def _latency_ms(path: Path, x: np.ndarray, runs: int = 30) -> float:
    """Median ONNX Runtime CPU latency (one thread) of ``path`` on ``x``."""
    from attnzoo.runtime.evaluate import cpu_session

    sess = cpu_session(path, 1)
    sess.run(None, {"image": x})
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, {"image": x})
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def measure(out: Path, placements: Sequence[str] = ("tensorrt", "cpu", "auto"), *, images: int = 160,
            **model_kwargs: Any) -> Dict[str, Any]:
    """Export the converted pretrained-like ViT to int8 with each placement (gate off, so every one is measured)
    and collect the fidelity, what ``auto`` kept and the int8 latency next to fp32."""
    from attnzoo.export import export_model
    from attnzoo.machine import cpu_info
    from attnzoo.models import convert_to_belief2

    model = convert_to_belief2(pretrained_like_vit(**model_kwargs))
    size = int(model.attnzoo_config["img_size"])
    folder = write_images(out / "images", smooth_images(images, size))
    fp32 = export_model(model=model, out=out / "fp32.onnx", batch_sizes=(1,))
    x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
    rows: List[Dict[str, Any]] = []
    for placement in placements:
        start = time.perf_counter()
        result = export_model(model=model, out=out / f"int8-{placement}.onnx", dtype="int8", batch_sizes=(1,),
                              qdq_placement=placement, calibration_data=folder, min_cosine=0.0)
        fid, q = result.report["fidelity"], result.report["quantization"]
        auto = q["options"].get("auto") or {}
        rows.append({"placement": placement, "export_s": round(time.perf_counter() - start, 1),
                     "cosine_mean": fid["cosine"]["mean"], "cosine_min": fid["cosine"]["min"],
                     "relative_error_mean": fid["relative_error"]["mean"], "top1_agreement": fid["top1_agreement"],
                     "held_out": fid["n_inputs"], "quantized_ops": q["qdq"]["quantized_ops"],
                     "quantize_linear": q["qdq"]["quantize_linear"],
                     "auto_kept_fp32": [g for g, d in auto.get("groups", {}).items() if not d["quantized"]],
                     "auto_groups": len(auto.get("groups", {})),
                     "ort_int8_ms": _latency_ms(result.path, x), "ort_fp32_ms": _latency_ms(fp32.path, x)})
    return {"command": "python -m attnzoo.studies.int8_fidelity " + " ".join(sys.argv[1:]), "cpu": cpu_info(),
            "model": {**model_kwargs, "config": model.attnzoo_config}, "calibration": f"{images} smooth images",
            "gate": "off (--min-cosine 0) so that every placement is measured; the default gate is 0.99",
            "rows": rows}


def markdown(result: Dict[str, Any]) -> str:
    """The README table."""
    lines = ["| placement | mean cosine to fp32 | worst | rel. error | top-1 agree | Q/DQ pairs | kept fp32 by auto | "
             "ORT int8 / fp32 ms (b1, 1 thread) |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        kept = ", ".join(r["auto_kept_fp32"]) or ("-" if r["placement"] != "auto" else "nothing")
        lines.append(f"| {r['placement']} | {r['cosine_mean']:.4f} | {r['cosine_min']:.4f} | "
                     f"{r['relative_error_mean']:.3f} | {r['top1_agreement']:.0%} | {r['quantize_linear']} | {kept} | "
                     f"{r['ort_int8_ms']:.2f} / {r['ort_fp32_ms']:.2f} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m attnzoo.studies.int8_fidelity", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for results.json and results.md")
    p.add_argument("--img-size", type=int, default=64)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--embed-dim", type=int, default=192)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--num-heads", type=int, default=3)
    return add_debug_flag(p)


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    import tempfile

    from attnzoo.fileio import atomic_write_text, writable_dir

    args = build_parser().parse_args(argv)
    out = writable_dir(args.out)
    with tempfile.TemporaryDirectory(prefix="attnzoo-int8-fidelity-") as work:
        result = measure(Path(work), img_size=args.img_size, patch_size=args.patch_size, embed_dim=args.embed_dim,
                         depth=args.depth, num_heads=args.num_heads)
    atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "results.md", markdown(result) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
