"""Fashion-MNIST (Xiao et al. 2017, MIT licence): the official IDX files, as classification and as composed
segmentation scenes.

The four official files ship with the package (:data:`PACKAGED_ROOT`, byte-for-byte copies of the files Debian's
package ``dataset-fashion-mnist`` installs under :data:`DEFAULT_ROOT`); nothing is downloaded. Which copy is read:
:func:`fashion_root`.

Splits: ``train`` is the official training set less a fixed 5,000-image hold-out (1 in :data:`VAL_EVERY`),
``val`` is that hold-out, ``test`` is the official 10,000-image test set.

Segmentation scenes (:func:`compose_scenes`): ``k`` garments (2 to 4) drawn from the split's images, each resized to a
random fraction of the canvas side (35-60 %) and pasted at a random place on a black ``size`` x ``size`` canvas
where it hides little of the garments already there (:data:`MAX_OVERLAP`); a later garment covers an earlier one
where its own pixels are on. Mask label = garment class + 1 wherever the garment's pixel exceeds
:data:`MASK_THRESHOLD`, 0 = background. Scene ``i`` of a split is drawn with its own generator seeded from
``(seed, split, i)``, so the scenes are the same on every machine, train scenes use only official training
images and test scenes only official test images.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
from PIL import Image

from attnzoo.data.images import ImageSet, gray_to_rgb

__all__ = [
    "FASHION_CLASSES",
    "FASHION_SEG_CLASSES",
    "DEFAULT_ROOT",
    "MASK_THRESHOLD",
    "VAL_EVERY",
    "PACKAGED_ROOT",
    "SCENE_SIZES",
    "MAX_OVERLAP",
    "MAX_TRIES",
    "SCENE_OPTIONS",
    "check_scene_options",
    "fashion_root",
    "read_idx",
    "fashion_arrays",
    "compose_scenes",
    "fashion",
]

FASHION_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
FASHION_SEG_CLASSES = ["background", *FASHION_CLASSES]
#: Where Debian's package ``dataset-fashion-mnist`` installs the official files.
DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
#: The same files, shipped with the package (its README, LICENSE and SHA256SUMS beside them).
PACKAGED_ROOT = Path(__file__).with_name("fashion-mnist")
#: A garment's pixel belongs to its mask when brighter than this (of 255).
MASK_THRESHOLD = 24
#: A garment is placed where it covers at most this fraction of its own pixels' worth of earlier garments
#: (up to ``MAX_TRIES`` random places; a garment that finds none is left out).
MAX_OVERLAP = 0.15
MAX_TRIES = 20
#: One in this many images of the official training set is held out as ``val`` (5,000 of 60,000; a fixed
#: permutation picks them).
VAL_EVERY = 12
#: Default number of composed scenes per split.
SCENE_SIZES = {"train": 12000, "val": 500, "test": 2000}
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_SPLIT_ID = {"train": 0, "val": 1, "test": 2}
_CACHE: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}


def _missing(folder: Path) -> list[str]:
    """The official files ``folder`` lacks (each may be gzipped or not)."""
    return [
        name
        for pair in _FILES.values()
        for name in pair
        if not (folder / name).is_file() and not (folder / f"{name}.gz").is_file()
    ]


def fashion_root(root: os.PathLike | None = None) -> Path:
    """The folder holding the IDX files: ``root``, else ``$ATTNZOO_FASHION_MNIST``, else Debian's
    :data:`DEFAULT_ROOT` when it holds them, else the copy shipped with the package (:data:`PACKAGED_ROOT`).

    Raises:
        FileNotFoundError: the folder given lacks a file, or neither Debian's nor the package's copy is whole.
    """
    given = root or os.environ.get("ATTNZOO_FASHION_MNIST")
    for folder in [Path(given)] if given else [DEFAULT_ROOT, PACKAGED_ROOT]:
        missing = _missing(folder)
        if not missing:
            return folder
    fix = (
        "point ATTNZOO_FASHION_MNIST (or root) at a folder with the four official IDX files"
        if given
        else "the package's copy is incomplete: reinstall attnzoo, or set ATTNZOO_FASHION_MNIST to a folder with the "
        "four official IDX files"
    )
    raise FileNotFoundError(f"Fashion-MNIST not found in {folder} (missing {', '.join(missing)}); {fix}")


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) of unsigned bytes: labels (N,) or images (N, H, W)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * k : 8 + 4 * k], "big") for k in range(ndim)]
    start = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(data) - start != count:
        raise ValueError(f"{path}: expected {count} bytes of data, found {len(data) - start} (truncated?)")
    return np.frombuffer(data, np.uint8, count, start).reshape(dims)


def _official(part: str, root: os.PathLike | None) -> tuple[np.ndarray, np.ndarray]:
    """The official ``train`` or ``test`` images (N, 28, 28) and labels (N,), cached per process."""
    folder = fashion_root(root)
    key = (str(folder), part)
    if key not in _CACHE:
        arrays = []
        for name in _FILES[part]:
            path = folder / name if (folder / name).is_file() else folder / f"{name}.gz"
            arrays.append(read_idx(path))
        images, labels = arrays
        if len(images) != len(labels):
            raise ValueError(f"{folder}: {len(images)} {part} images but {len(labels)} labels")
        _CACHE[key] = (images, labels.astype(np.int64))
    return _CACHE[key]


def fashion_arrays(split: str, root: os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Gray images (N, 28, 28) uint8 and labels (N,) of one split (see the module docstring)."""
    if split not in _SPLIT_ID:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(_SPLIT_ID)}")
    if split == "test":
        return _official("test", root)
    images, labels = _official("train", root)
    order = np.random.default_rng([0, 28]).permutation(len(labels))
    n_val = len(labels) // VAL_EVERY
    idx = np.sort(order[:n_val] if split == "val" else order[n_val:])
    return images[idx], labels[idx]


def compose_scenes(
    images: np.ndarray,
    labels: np.ndarray,
    n: int,
    size: int = 48,
    split: str = "test",
    seed: int = 0,
    per_scene: tuple[int, int] = (2, 4),
    fraction: tuple[float, float] = (0.35, 0.6),
    garment_px: tuple[int, int] | None = None,
    overlap: float | tuple[float, float] = MAX_OVERLAP,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compose ``n`` scenes of several garments (see the module docstring).

    Args:
        images, labels: The source garments (N, 28, 28) and their classes.
        n: Number of scenes.
        size: Canvas side in pixels.
        split: Only seeds the generator (scenes of different splits differ even from the same source).
        seed: Data-set seed.
        per_scene: Inclusive range of garments per scene.
        fraction: Range of each garment's side as a fraction of the canvas side (ignored with ``garment_px``).
        garment_px: Inclusive range of each garment's side in pixels, drawn uniformly (28: the native
            Fashion-MNIST image, not resized); None: ``fraction`` of the canvas.
        overlap: The most of a garment's own pixels that may land on earlier garments: one cap for every
            garment (default :data:`MAX_OVERLAP`; 1 or more: placed anywhere), or a range ``(lo, hi)`` from
            which each scene draws its own cap uniformly (values of 1 or more place that scene's garments
            anywhere), so the scenes range from barely touching to heavily overlapping garments.

    Returns:
        images uint8 (n, size, size, 3), labels int64 (n,) -- the class (0-based, ``FASHION_CLASSES``) with
        the most mask pixels -- and masks uint8 (n, size, size), 0 = background, class + 1 elsewhere.
    """
    out = np.zeros((n, size, size), np.uint8)
    masks = np.zeros((n, size, size), np.uint8)
    top = np.zeros(n, np.int64)
    caps = _overlap_range(overlap)
    for i in range(n):
        rng = np.random.default_rng([int(seed), _SPLIT_ID[split], 7, i])
        cap = caps[0] if caps[0] == caps[1] else float(rng.uniform(*caps))  # the default draws nothing extra
        for _ in range(int(rng.integers(per_scene[0], per_scene[1] + 1))):
            j = int(rng.integers(len(labels)))
            if garment_px is None:
                side = max(4, min(size, int(round(size * rng.uniform(*fraction)))))
            else:
                side = max(4, min(size, int(rng.integers(int(garment_px[0]), int(garment_px[1]) + 1))))
            g = (
                images[j]
                if side == 28
                else np.asarray(Image.fromarray(images[j]).resize((side, side), Image.Resampling.BILINEAR))
            )
            on = g > MASK_THRESHOLD
            for _try in range(MAX_TRIES):  # a place where the garment hides little of the earlier ones
                y, x = (int(v) for v in rng.integers(0, size - side + 1, 2))
                if cap >= 1.0 or (masks[i, y : y + side, x : x + side][on] > 0).sum() <= cap * on.sum():
                    out[i, y : y + side, x : x + side][on] = g[on]
                    masks[i, y : y + side, x : x + side][on] = labels[j] + 1
                    break
        counts = np.bincount(masks[i].ravel(), minlength=len(FASHION_SEG_CLASSES))[1:]
        top[i] = int(np.argmax(counts))
    return np.repeat(out[..., None], 3, axis=-1), top, masks


def _overlap_range(overlap) -> tuple[float, float]:
    """``overlap`` (a number or a ``(lo, hi)`` pair) as a checked ``(lo, hi)`` pair."""
    if np.isscalar(overlap):
        lo = hi = float(cast(float, overlap))  # a number (numpy's isscalar guard names no number type)
    else:
        lo, hi = float(overlap[0]), float(overlap[1])
    if not 0.0 <= lo <= hi:
        raise ValueError(f"overlap must be a number >= 0 or a range 0 <= lo <= hi, got {overlap!r}")
    return lo, hi


#: The scene options :func:`fashion` (and so ``train-model --scene-*``) passes on to :func:`compose_scenes`.
SCENE_OPTIONS = ("per_scene", "fraction", "garment_px", "overlap")


def check_scene_options(scene: dict[str, Any] | None) -> dict[str, Any]:
    """``scene`` (options of :func:`compose_scenes`) checked, as a plain JSON-able dict.

    Raises:
        ValueError: an unknown option or an impossible range.
    """
    out: dict[str, Any] = {}
    for key, value in (scene or {}).items():
        if key not in SCENE_OPTIONS:
            raise ValueError(f"unknown scene option {key!r}; valid: {', '.join(SCENE_OPTIONS)}")
        if value is None:
            continue
        if key == "overlap":
            lo, hi = _overlap_range(value)
            out[key] = lo if lo == hi else [lo, hi]
            continue
        lo, hi = value
        if not 0 < lo <= hi or (key == "fraction" and hi > 1):
            raise ValueError(
                f"scene option {key} must be a range 0 < lo <= hi{' <= 1' if key == 'fraction' else ''}, got {value!r}"
            )
        out[key] = [float(lo), float(hi)] if key == "fraction" else [int(lo), int(hi)]
    return out


def fashion(
    split: str,
    task: str = "cls",
    img_size: int | None = None,
    n: int | None = None,
    seed: int = 0,
    root: os.PathLike | None = None,
    scene: dict[str, Any] | None = None,
):
    """A split of Fashion-MNIST as an :class:`~attnzoo.data.images.ImageSet`.

    Classification: the split's 28x28 images (resized to ``img_size``, default 28), gray in 3 channels, the first
    ``n`` (all by default). Segmentation: ``n`` composed scenes (``SCENE_SIZES`` by default) of side ``img_size``
    (default 48), composed with ``scene`` (options of :func:`compose_scenes`: ``per_scene``, ``fraction``,
    ``garment_px``, ``overlap``; their defaults when None).
    """
    gray, labels = fashion_arrays(split, root)
    if task == "cls":
        if n is not None:
            gray, labels = gray[:n], labels[:n]
        return ImageSet(gray_to_rgb(gray, img_size or 28), labels, None, list(FASHION_CLASSES), "fashion")
    if task != "seg":
        raise ValueError(f"unknown task {task!r}; valid: cls, seg")
    count = SCENE_SIZES[split] if n is None else n
    opts = {k: tuple(v) if isinstance(v, list) else v for k, v in check_scene_options(scene).items()}
    images, top, masks = compose_scenes(gray, labels, count, img_size or 48, split, seed, **opts)
    return ImageSet(images, top, masks, list(FASHION_SEG_CLASSES), "fashion")
