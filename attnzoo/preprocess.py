"""The one preprocessing implementation shared by training, export verification, benchmarks and the demo.

Images of any PIL mode (RGBA, LA, palette, grayscale, 16-bit, float, CMYK) become 8-bit RGB; classification
inputs are resized to the model's input size, segmentation inputs keep their aspect ratio and are only
downscaled when their longer side exceeds ``max_side``; pixels are normalised with the model's mean/std.

Every image is turned as its EXIF orientation says before anything else, and an image larger than
:data:`attnzoo.limits.MAX_IMAGE_PIXELS` is refused from its header, before its pixels are decoded.

A model's *input style* says what its training images looked like, so that an upload can be converted to
look the same before it is resized (:func:`to_input_style`): ``rgb`` (used as is) or ``gray-on-black``
(Fashion-MNIST and the digits: a light object on a black background, gray, filling the frame).
"""

from __future__ import annotations

import contextlib
import io
import re
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from attnzoo.limits import MAX_IMAGE_PIXELS

__all__ = [
    "DEFAULT_MEAN",
    "DEFAULT_STD",
    "ImageLike",
    "load_image",
    "to_rgb",
    "normalize",
    "preprocess",
    "fit_size",
    "UnreadableImageError",
    "ImageTooLargeError",
    "INPUT_STYLES",
    "DATA_INPUT_STYLE",
    "input_style_of",
    "to_input_style",
    "busy_background",
    "image_size",
]

#: Normalisation of the bundled data sets (pixels in [0, 1] mapped to [-1, 1]).
DEFAULT_MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
DEFAULT_STD: tuple[float, float, float] = (0.5, 0.5, 0.5)

ImageLike = str | Path | bytes | Image.Image | np.ndarray

#: What each input style means (see :func:`to_input_style`).
INPUT_STYLES = {
    "rgb": "used as it is",
    "gray-on-black": "gray; inverted when the background is bright; background set to black and contrast "
    "stretched; for classification cropped to the object and centred in a square",
}
#: The input style of the models trained on each built-in data set (a folder of images: ``rgb``).
DATA_INPUT_STYLE = {"fashion": "gray-on-black", "digits": "gray-on-black", "shapes": "rgb"}
#: A pixel this far above the black background (0..255, after the stretch) belongs to the object.
OBJECT_THRESHOLD = 24
#: For classification the object is cropped and centred only when its box's longer side is below this share of
#: the image's shorter side (a real training image, which already fills its frame, is left as it is).
CROP_BELOW = 0.8
#: Border pixels whose spread (median absolute deviation, 0..255) exceeds this make a busy background.
BUSY_BORDER_MAD = 20.0


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
        raise ImageTooLargeError(
            f"image is {w}x{h} ({w * h / 1e6:.0f} MP), over the {MAX_IMAGE_PIXELS / 1e6:.0f} MP "
            "limit (a decompression-bomb guard); downscale it first"
        )


_OPEN_LOCK = threading.Lock()  # warnings.catch_warnings swaps process-wide state: one opener at a time


@contextlib.contextmanager
def _quiet_open() -> Iterator[None]:
    """Around ``Image.open`` only: Pillow warns (``DecompressionBombWarning``) about images over its own 89 MP
    limit as it reads their header, before :func:`_check_pixels` refuses them at 40 MP with a clearer line.
    Pillow's ``DecompressionBombError`` (over 179 MP) still raises."""
    with _OPEN_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        yield


@contextlib.contextmanager
def _image_errors() -> Iterator[None]:
    """Pillow's failures while opening or decoding as the package's two image errors."""
    try:
        yield
    except Image.DecompressionBombError as exc:  # over Pillow's own limit, far above ours: ours is the one to name
        pixels = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(pixels.group(1)) / 1e6:.0f} MP, " if pixels else ""
        raise ImageTooLargeError(
            f"refused a decompression bomb: image is {size}over the "
            f"{MAX_IMAGE_PIXELS / 1e6:.0f} MP limit; downscale it first"
        ) from None
    except (UnidentifiedImageError, OSError, TypeError, ValueError) as exc:
        if isinstance(exc, ImageTooLargeError):
            raise
        raise UnreadableImageError(f"cannot read image: {exc}") from exc


def image_size(data: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image, read from its header alone (no pixel is decoded), so that a server can
    reserve the memory decoding it will take before it starts.

    Raises:
        ImageTooLargeError: over the pixel cap, or a decompression bomb.
        UnreadableImageError: not an image, or a damaged header.
    """
    with _image_errors(), _quiet_open(), Image.open(io.BytesIO(data)) as img:
        _check_pixels(img)
        return img.size


def load_image(source: ImageLike) -> Image.Image:
    """Open a path, bytes, PIL image or uint8/float array as RGB, turned upright as its EXIF says.

    Raises:
        ImageTooLargeError: over the pixel cap (checked before decoding), or a decompression bomb.
        UnreadableImageError: not an image, or a damaged one.
    """
    with _image_errors():
        if isinstance(source, Image.Image):
            img = source
        elif isinstance(source, np.ndarray):
            arr = source
            if arr.dtype != np.uint8:
                arr = np.nan_to_num(arr.astype(np.float64), nan=0.0, posinf=255.0, neginf=0.0)
                arr = np.clip(arr * (255.0 if arr.max(initial=0) <= 1.0 else 1.0), 0, 255).astype(np.uint8)
            img = Image.fromarray(arr.squeeze(-1) if arr.ndim == 3 and arr.shape[-1] == 1 else arr)
        else:
            with _quiet_open():  # reads the header only; the size is checked right below
                img = Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else Path(source))
        try:
            _check_pixels(img)  # lazily opened: only the header has been read so far
        except ImageTooLargeError:
            if img is not source:
                img.close()  # the file Image.open holds
            raise
        img.load()
        if img.getexif().get(ExifTags.Base.Orientation, 1) != 1:
            img = ImageOps.exif_transpose(img)
    return to_rgb(img)


def fit_size(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    """(H, W) scaled down (never up) so that max(H, W) <= max_side; each side at least 1."""
    h, w = size
    scale = min(1.0, max_side / max(h, w))
    return max(1, round(h * scale)), max(1, round(w * scale))


def normalize(
    pixels: np.ndarray, mean: Sequence[float] = DEFAULT_MEAN, std: Sequence[float] = DEFAULT_STD
) -> np.ndarray:
    """uint8 (H, W, 3) or (N, H, W, 3) -> float32 (3, H, W) or (N, 3, H, W), ``(x/255 - mean) / std``."""
    unit = pixels.astype(np.float32) / 255.0
    x = (unit - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(np.moveaxis(x, -1, -3))


def preprocess(
    image: ImageLike,
    size: int | tuple[int, int] | None = None,
    mean: Sequence[float] = DEFAULT_MEAN,
    std: Sequence[float] = DEFAULT_STD,
    max_side: int | None = None,
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
        img = img.resize((w, h), Image.Resampling.BILINEAR)
    return normalize(np.asarray(img, dtype=np.uint8), mean, std)[None]


def input_style_of(config: Mapping[str, Any]) -> str:
    """A model's input style: ``input_style`` of its config, else that of the data set it was trained on."""
    style = config.get("input_style") or DATA_INPUT_STYLE.get(str(config.get("data", "")), "rgb")
    if style not in INPUT_STYLES:
        raise ValueError(f"unknown input style {style!r}; valid: {', '.join(INPUT_STYLES)}")
    return style


def _border(gray: np.ndarray) -> np.ndarray:
    return np.concatenate([gray[0], gray[-1], gray[1:-1, 0], gray[1:-1, -1]])


def busy_background(img: Image.Image) -> bool:
    """True when the image's border is not one plain colour (a photo of a scene rather than of an object on a
    plain background), judged from the spread of its gray border pixels."""
    border = _border(np.asarray(img.convert("L"), np.float32))
    return float(np.median(np.abs(border - np.median(border)))) > BUSY_BORDER_MAD


def to_input_style(img: Image.Image, style: str, task: str = "cls") -> Image.Image:
    """Convert an RGB image to look like a model's training images (see :data:`INPUT_STYLES`); RGB out.

    ``gray-on-black``: gray; inverted when the border's median is bright (a garment photographed on white);
    the border's median becomes black and the brightest object pixels (99.5th percentile) white; for ``cls``
    the image is cropped to the object's box (pixels above :data:`OBJECT_THRESHOLD`) and padded with black to a
    centred square, as Fashion-MNIST's garments fill their frame. The caller then resizes it.
    """
    if style == "rgb":
        return img
    if style != "gray-on-black":
        raise ValueError(f"unknown input style {style!r}; valid: {', '.join(INPUT_STYLES)}")
    gray = np.asarray(img.convert("L"), np.float32)
    background = float(np.median(_border(gray)))
    if background > 127.5:
        gray, background = 255.0 - gray, 255.0 - background
    gray = np.clip(gray - background, 0.0, None)
    peak = float(np.percentile(gray, 99.5)) if gray.size else 0.0
    if peak > 0:
        gray = np.clip(gray * (255.0 / peak), 0.0, 255.0)
    if task == "cls":
        rows, cols = np.nonzero(gray > OBJECT_THRESHOLD)
        if rows.size and max(np.ptp(rows), np.ptp(cols)) + 1 < CROP_BELOW * min(gray.shape):
            gray = gray[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
            h, w = gray.shape
            side = max(h, w)
            square = np.zeros((side, side), np.float32)
            square[(side - h) // 2 : (side - h) // 2 + h, (side - w) // 2 : (side - w) // 2 + w] = gray
            gray = square
    return Image.fromarray((gray + 0.5).astype(np.uint8), mode="L").convert("RGB")
