"""The one preprocessing implementation shared by training, export verification, benchmarks and the demo.

Images of any PIL mode (RGBA, LA, palette, grayscale, 16-bit, float, CMYK) become 8-bit RGB; classification
inputs are resized to the model's input size, segmentation inputs keep their aspect ratio and are only
downscaled when their longer side exceeds ``max_side``; pixels are normalised with the model's mean/std.

Every image is turned as its EXIF orientation says before anything else, and an image larger than
:data:`attnzoo.limits.MAX_IMAGE_PIXELS` is refused from its header, before its pixels are decoded.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from attnzoo.limits import MAX_IMAGE_PIXELS

__all__ = ["DEFAULT_MEAN", "DEFAULT_STD", "ImageLike", "load_image", "to_rgb", "normalize", "preprocess",
           "fit_size", "UnreadableImageError", "ImageTooLargeError"]

#: Normalisation of the bundled data sets (pixels in [0, 1] mapped to [-1, 1]).
DEFAULT_MEAN: Tuple[float, float, float] = (0.5, 0.5, 0.5)
DEFAULT_STD: Tuple[float, float, float] = (0.5, 0.5, 0.5)

ImageLike = Union[str, Path, bytes, Image.Image, np.ndarray]


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode -> 8-bit RGB. Transparent pixels are composited over white; 16-bit and float images
    are rescaled from their own min..max range."""
    if img.mode == "RGB":
        return img
    if img.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N", "F"):
        arr = np.asarray(img, dtype=np.float64)
        lo, hi = float(np.nanmin(arr)) if arr.size else 0.0, float(np.nanmax(arr)) if arr.size else 0.0
        arr = np.nan_to_num((arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr))
        img = Image.fromarray((arr * 255.0 + 0.5).astype(np.uint8), mode="L")
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


class UnreadableImageError(ValueError):
    """Not an image file, or a damaged one."""


class ImageTooLargeError(ValueError):
    """More pixels than :data:`attnzoo.limits.MAX_IMAGE_PIXELS`, or a decompression bomb."""


def _check_pixels(img: Image.Image) -> None:
    """Refuse an image over the pixel cap (from its size alone: PIL reads it from the header)."""
    w, h = img.size
    if w * h > MAX_IMAGE_PIXELS:
        raise ImageTooLargeError(f"image is {w}x{h} ({w * h / 1e6:.0f} MP), over the {MAX_IMAGE_PIXELS / 1e6:.0f} MP "
                                 "limit (a decompression-bomb guard); downscale it first")


def load_image(source: ImageLike) -> Image.Image:
    """Open a path, bytes, PIL image or uint8/float array as RGB, turned upright as its EXIF says.

    Raises:
        ImageTooLargeError: over the pixel cap (checked before decoding), or a decompression bomb.
        UnreadableImageError: not an image, or a damaged one.
    """
    try:
        if isinstance(source, Image.Image):
            img = source
        elif isinstance(source, np.ndarray):
            arr = source
            if arr.dtype != np.uint8:
                arr = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
                arr = np.clip(arr * (255.0 if arr.max(initial=0) <= 1.0 else 1.0), 0, 255).astype(np.uint8)
            img = Image.fromarray(arr.squeeze(-1) if arr.ndim == 3 and arr.shape[-1] == 1 else arr)
        elif isinstance(source, (bytes, bytearray)):
            img = Image.open(io.BytesIO(source))
        else:
            img = Image.open(Path(source))
        _check_pixels(img)  # lazily opened: only the header has been read so far
        img.load()
        if img.getexif().get(ExifTags.Base.Orientation, 1) != 1:
            img = ImageOps.exif_transpose(img)
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"refused a decompression bomb: {exc}") from None
    except (UnidentifiedImageError, OSError, TypeError, ValueError) as exc:
        if isinstance(exc, ImageTooLargeError):
            raise
        raise UnreadableImageError(f"cannot read image: {exc}") from exc
    return to_rgb(img)


def fit_size(size: Tuple[int, int], max_side: int) -> Tuple[int, int]:
    """(H, W) scaled down (never up) so that max(H, W) <= max_side; each side at least 1."""
    h, w = size
    scale = min(1.0, max_side / max(h, w))
    return max(1, round(h * scale)), max(1, round(w * scale))


def normalize(pixels: np.ndarray, mean: Sequence[float] = DEFAULT_MEAN,
              std: Sequence[float] = DEFAULT_STD) -> np.ndarray:
    """uint8 (H, W, 3) or (N, H, W, 3) -> float32 (3, H, W) or (N, 3, H, W), ``(x/255 - mean) / std``."""
    x = pixels.astype(np.float32) / 255.0
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(np.moveaxis(x, -1, -3))


def preprocess(
        image: ImageLike,
        size: Optional[Union[int, Tuple[int, int]]] = None,
        mean: Sequence[float] = DEFAULT_MEAN,
        std: Sequence[float] = DEFAULT_STD,
        max_side: Optional[int] = None,
) -> np.ndarray:
    """Image -> float32 batch (1, 3, H, W) ready for a model or an ONNX session.

    Args:
        image: Path, bytes, PIL image or array.
        size: Output size (int for square, or (H, W)) -- classification; ``None`` keeps the image's size.
        mean, std: Per-channel normalisation (from the model's metadata).
        max_side: With ``size=None``, downscale so that the longer side is at most this (segmentation).
    """
    img = load_image(image)
    if size is not None:
        h, w = (size, size) if isinstance(size, int) else size
    else:
        h, w = img.height, img.width
        if max_side is not None:
            h, w = fit_size((h, w), max_side)
    if (img.height, img.width) != (h, w):
        img = img.resize((w, h), Image.BILINEAR)
    return normalize(np.asarray(img, dtype=np.uint8), mean, std)[None]
