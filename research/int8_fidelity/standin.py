"""The stand-ins the int8-fidelity study quantizes, made offline from the package alone (it downloads no weights
and no photos): a timm ViT with the outlier activations of a pretrained one, smooth random images for photos, and
augmented crops of a few of them for a user's small calibration set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from attnzoo.lazy import lazy_import

# --help and --table load without torch and timm: these import at their first use
torch = lazy_import("torch")
vision_transformer = lazy_import("timm.models.vision_transformer")

__all__ = [
    "OUTLIER_CHANNELS",
    "LN_OUTLIER_CHANNELS",
    "pretrained_like_vit",
    "smooth_images",
    "write_images",
    "augmented_crops",
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
