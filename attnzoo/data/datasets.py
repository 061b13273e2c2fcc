"""Data sets: the procedural ``shapes`` set, scikit-learn's bundled ``digits``, and users' folders.

Every loader returns an :class:`ImageSet` of uint8 images (N, H, W, 3), int64 labels (N,) and, for
segmentation, uint8 masks (N, H, W) of class indices (0 = background). Normalisation happens in one place,
:func:`attnzoo.preprocess.normalize`, through :class:`TensorDataset`.

``shapes`` is deterministic: image ``i`` of split ``s`` with seed ``k`` is drawn with its own
``numpy.random.Generator`` seeded from ``(k, split id, i)``, so splits never share an image and the same
arguments give the same pixels on any machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from attnzoo.data.fashion import fashion
from attnzoo.data.images import ImageSet, gray_to_rgb
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, load_image, normalize

__all__ = [
    "SHAPES_CLASSES",
    "SHAPES_SEG_CLASSES",
    "DIGITS_CLASSES",
    "SPLITS",
    "BUILTIN_DATA",
    "ImageSet",
    "TensorDataset",
    "shapes_images",
    "shapes",
    "digits",
    "imagefolder",
    "ade_folder",
    "check_source",
    "load_data",
]

SHAPES_CLASSES: list[str] = ["circle", "square", "triangle", "star", "cross", "ring"]
SHAPES_SEG_CLASSES: list[str] = ["background", *SHAPES_CLASSES]
DIGITS_CLASSES: list[str] = [str(d) for d in range(10)]
SPLITS: tuple[str, ...] = ("train", "val", "test")
BUILTIN_DATA: tuple[str, ...] = ("fashion", "shapes", "digits")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

#: Default number of ``shapes`` images per split.
SHAPES_SIZES = {"train": 8000, "val": 500, "test": 1000}
_SPLIT_ID = {"train": 0, "val": 1, "test": 2}


class TensorDataset(torch.utils.data.Dataset):
    """An :class:`ImageSet` as normalised float tensors: ``(image (3, H, W), target)``.

    The target is the label (``task="cls"``) or the mask as int64 (``task="seg"``).
    """

    def __init__(
        self,
        data: ImageSet,
        task: str = "cls",
        mean: Sequence[float] = DEFAULT_MEAN,
        std: Sequence[float] = DEFAULT_STD,
    ):
        if task == "seg" and data.masks is None:
            raise ValueError(f"data set {data.name!r} has no masks; it can only train classifiers")
        self.x = torch.from_numpy(normalize(data.images, mean, std))
        if task == "cls":
            target = data.labels
        else:
            assert data.masks is not None  # refused above
            target = data.masks.astype(np.int64)
        self.y = torch.from_numpy(np.ascontiguousarray(target))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


# ----------------------------------------------------------------------------------------------- shapes


def _polygon(n: int, r: float, angle: float, inner: float = 0.0) -> np.ndarray:
    """Regular polygon (or star when ``inner`` > 0) with circumradius ``r``, as (k, 2) offsets."""
    if inner > 0:
        t = angle + np.arange(2 * n) * math.pi / n
        rad = np.where(np.arange(2 * n) % 2 == 0, r, r * inner)
    else:
        t = angle + np.arange(n) * 2 * math.pi / n
        rad = np.full(n, r)
    return np.stack([rad * np.cos(t), rad * np.sin(t)], axis=1)


def _cross(r: float, angle: float) -> np.ndarray:
    """Plus sign with arm half-width 0.3 r and half-length 0.95 r, rotated by ``angle``."""
    a, b = 0.3 * r, 0.95 * r
    pts = np.array(
        [(a, b), (a, a), (b, a), (b, -a), (a, -a), (a, -b), (-a, -b), (-a, -a), (-b, -a), (-b, a), (-a, a), (-a, b)]
    )
    c, s = math.cos(angle), math.sin(angle)
    return pts @ np.array([[c, s], [-s, c]])


def _draw_shape(
    draws: Sequence[ImageDraw.ImageDraw], fills: Sequence, kind: str, cx: float, cy: float, r: float, angle: float
) -> None:
    """Draw one shape on every (draw, fill) pair (the image and its mask)."""
    box = (cx - r, cy - r, cx + r, cy + r)
    for draw, fill in zip(draws, fills, strict=False):
        if kind in ("circle", "ring"):
            draw.ellipse(box, fill=fill)
        else:
            pts = {
                "square": lambda: _polygon(4, r, angle),
                "triangle": lambda: _polygon(3, r, angle),
                "star": lambda: _polygon(5, r, angle, inner=0.45),
                "hexagon": lambda: _polygon(6, r, angle),
                "cross": lambda: _cross(r, angle),
            }[kind]()
            draw.polygon([(cx + x, cy + y) for x, y in pts], fill=fill)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A float (size, size, 3) background: a two-colour gradient plus stripes, checks or blotches."""
    c0, c1 = rng.uniform(0, 110, 3), rng.uniform(0, 110, 3)
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    t = rng.uniform(0, 2 * math.pi)
    ramp = np.cos(t) * xx + np.sin(t) * yy
    ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
    bg = c0 + (c1 - c0) * ramp[..., None] * rng.uniform(0.0, 0.6)
    kind = rng.integers(4)
    amp = rng.uniform(5, 20)
    if kind == 1:  # stripes
        period = rng.uniform(3, 9) * size / 32
        u = np.cos(rng.uniform(0, math.pi)) * xx + np.sin(rng.uniform(0, math.pi)) * yy
        bg = bg + amp * np.sign(np.sin(2 * math.pi * u * size / period))[..., None]
    elif kind == 2:  # checks
        cell = max(1, int(rng.integers(2, 6) * size / 32))
        checks = ((np.arange(size)[:, None] // cell + np.arange(size)[None, :] // cell) % 2) * 2 - 1
        bg = bg + amp * checks[..., None]
    elif kind == 3:  # low-frequency blotches
        coarse = rng.normal(0, 1, (4, 4, 3)).astype(np.float32)
        up = (
            np.asarray(
                Image.fromarray(((coarse + 3) * 40).clip(0, 255).astype(np.uint8)).resize(
                    (size, size), Image.Resampling.BICUBIC
                ),
                dtype=np.float64,
            )
            / 40
            - 3
        )
        bg = bg + amp * up
    return bg


def _object_colour(rng: np.random.Generator) -> tuple[int, int, int]:
    """A random bright colour (objects are brighter than the darker backgrounds)."""
    r, g, b = rng.uniform(150, 255, 3)
    return int(r), int(g), int(b)


def _shapes_one(rng: np.random.Generator, img_size: int, task: str) -> tuple[np.ndarray, np.ndarray]:
    """One ``shapes`` image and its mask, drawn at 4x (or 2x) resolution and downsampled."""
    ss = 4 if img_size <= 64 else (2 if img_size <= 256 else 1)
    big = img_size * ss
    bg = _background(rng, big)
    canvas = Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8))
    mask = Image.new("L", (big, big), 0)
    draw_img, draw_mask = ImageDraw.Draw(canvas), ImageDraw.Draw(mask)
    if task == "cls":  # small distractors first, then one dominant object on top
        objects = [(rng.uniform(0.08, 0.14), False) for _ in range(int(rng.integers(0, 3)))]
        objects.append((rng.uniform(0.3, 0.45), True))
    else:  # several objects of similar size that may overlap
        objects = [(rng.uniform(0.12, 0.3), False) for _ in range(int(rng.integers(2, 5)))]
    for rel, dominant in objects:
        k = int(rng.integers(len(SHAPES_CLASSES)))
        kind = SHAPES_CLASSES[k]
        r = rel * big
        lo, hi = (r, big - r) if dominant else (0.3 * r, big - 0.3 * r)
        cx, cy = rng.uniform(lo, hi, 2)
        angle = rng.uniform(0, 2 * math.pi)
        colour = _object_colour(rng)
        _draw_shape([draw_img, draw_mask], [colour, k + 1], kind, cx, cy, r, angle)
        if kind == "ring":  # punch the hole: the background shows through
            hole = 0.55 * r
            hole_box = (cx - hole, cy - hole, cx + hole, cy + hole)
            hole_mask = Image.new("L", (big, big), 0)
            ImageDraw.Draw(hole_mask).ellipse(hole_box, fill=255)
            canvas.paste(Image.fromarray(np.clip(bg, 0, 255).astype(np.uint8)), (0, 0), hole_mask)
            draw_mask.ellipse(hole_box, fill=0)
    img = np.asarray(canvas.resize((img_size, img_size), Image.Resampling.BOX), dtype=np.float64)
    img = img + rng.normal(0, rng.uniform(0, 8), img.shape)
    small_mask = np.asarray(mask.resize((img_size, img_size), Image.Resampling.NEAREST), dtype=np.uint8)
    return np.clip(img + 0.5, 0, 255).astype(np.uint8), small_mask


def shapes_images(
    n: int, img_size: int = 32, split: str = "test", seed: int = 0, task: str = "cls"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` procedural ``shapes`` images.

    Args:
        n: Number of images.
        img_size: Side in pixels.
        split: ``train``, ``val`` or ``test`` (disjoint seed ranges).
        seed: Data-set seed.
        task: ``cls`` (one dominant object plus small distractors) or ``seg`` (2-4 objects, may overlap).

    Returns:
        images uint8 (n, H, W, 3), labels int64 (n,) -- the class (0-based, ``SHAPES_CLASSES``) with the most
        pixels in the mask, i.e. the largest object -- and masks uint8 (n, H, W) with 0 = background and
        ``c + 1`` for class ``c`` (``SHAPES_SEG_CLASSES``).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if task not in ("cls", "seg"):
        raise ValueError(f"unknown task {task!r}; valid: cls, seg")
    if n < 0 or img_size < 4:
        raise ValueError(f"need n >= 0 and img_size >= 4, got n={n}, img_size={img_size}")
    images = np.zeros((n, img_size, img_size, 3), np.uint8)
    masks = np.zeros((n, img_size, img_size), np.uint8)
    labels = np.zeros(n, np.int64)
    task_id = 0 if task == "cls" else 1
    for i in range(n):
        rng = np.random.default_rng([int(seed), _SPLIT_ID[split], task_id, i])
        images[i], masks[i] = _shapes_one(rng, img_size, task)
        counts = np.bincount(masks[i].ravel(), minlength=len(SHAPES_SEG_CLASSES))[1:]
        labels[i] = int(np.argmax(counts))
    return images, labels, masks


def shapes(split: str, task: str = "cls", img_size: int = 32, n: int | None = None, seed: int = 0) -> ImageSet:
    """A split of ``shapes`` (``SHAPES_SIZES`` images by default). Classification uses ``SHAPES_CLASSES``,
    segmentation ``SHAPES_SEG_CLASSES`` (with background)."""
    n = SHAPES_SIZES[split] if n is None else n
    images, labels, masks = shapes_images(n, img_size, split, seed, task)
    names = SHAPES_CLASSES if task == "cls" else SHAPES_SEG_CLASSES
    return ImageSet(images, labels, masks, list(names), "shapes")


# ----------------------------------------------------------------------------------------------- digits


def _split_indices(n: int, split: str, seed: int = 0, fractions=(0.7, 0.1)) -> np.ndarray:
    """Deterministic train/val/test indices of ``n`` samples (70/10/20 by default)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    order = np.random.default_rng([int(seed), 12345]).permutation(n)
    a = int(round(n * fractions[0]))
    b = a + int(round(n * fractions[1]))
    return np.sort({"train": order[:a], "val": order[a:b], "test": order[b:]}[split])


def digits(split: str, task: str = "cls", img_size: int = 32, n: int | None = None, seed: int = 0) -> ImageSet:
    """scikit-learn's bundled 8x8 handwritten digits (1797 images, no download), upsampled to ``img_size``,
    white digits on black, 3 channels; split 70/10/20 with a fixed permutation."""
    check_source("digits", task)
    from sklearn.datasets import load_digits  # heavy: scikit-learn loads scipy; only the digits set needs it

    bunch = load_digits()
    idx = _split_indices(len(bunch.target), split, seed=0)
    if n is not None:
        idx = idx[:n]
    small = (bunch.images[idx] * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    images = gray_to_rgb(small, img_size, Image.Resampling.BICUBIC)
    return ImageSet(images, bunch.target[idx].astype(np.int64), None, list(DIGITS_CLASSES), "digits")


# ----------------------------------------------------------------------------------------------- folders


def _image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _read_resized(path: Path, img_size: int) -> np.ndarray:
    try:
        img = load_image(path)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return np.asarray(img.resize((img_size, img_size), Image.Resampling.BILINEAR), dtype=np.uint8)


def _split_root(root: Path, names: Sequence[str]) -> Path | None:
    """``root/<name>`` for the first of ``names`` that exists (e.g. ``val`` or ``validation``)."""
    for name in names:
        if (root / name).is_dir():
            return root / name
    return None


def _folder_indices(root: Path, count: int, split: str, has_splits: bool, n: int | None, seed: int) -> np.ndarray:
    """All files of a split folder, or the split's share of a flat folder; at most ``n``; never empty."""
    idx = np.arange(count) if has_splits else _split_indices(count, split, seed)
    if n is not None:
        idx = idx[:n]
    if len(idx) == 0:
        raise ValueError(f"{root}: the {split} split is empty (too few images)")
    return idx


_SPLIT_DIRS = {"train": ("train", "training"), "val": ("val", "validation"), "test": ("test", "testing")}


def imagefolder(
    root, split: str, task: str = "cls", img_size: int = 32, n: int | None = None, seed: int = 0
) -> ImageSet:
    """Class-per-folder images (``root/<class>/*.png``), resized to ``img_size``.

    With ``root/train``, ``root/val`` (or ``validation``) and ``root/test`` sub-folders, those are the splits
    (a missing test split falls back to val); otherwise all images are split 70/10/20 deterministically.
    """
    if task != "cls":
        raise ValueError("an image folder has no masks; use --task cls (or an ade-folder for seg)")
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"data folder not found: {root}")
    train_root = _split_root(root, _SPLIT_DIRS["train"])
    has_splits = train_root is not None
    base = root
    if has_splits:
        base = _split_root(root, _SPLIT_DIRS[split]) or _split_root(root, _SPLIT_DIRS["val"])
        if base is None:
            raise ValueError(f"{root}: has a train/ folder but no {split}/ or val/ folder")
    class_root = train_root if train_root is not None else root
    classes = sorted(p.name for p in class_root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ValueError(f"{class_root}: no class sub-folders (expected {class_root}/<class>/<image>)")
    files, labels = [], []
    for k, name in enumerate(classes):
        sub = base / name
        found = _image_files(sub) if sub.is_dir() else []
        if not found and base == class_root:
            raise ValueError(f"{sub}: empty class folder (no {', '.join(IMAGE_SUFFIXES)} files)")
        files += found
        labels += [k] * len(found)
    if not files:
        raise ValueError(f"{base}: no images found")
    idx = _folder_indices(root, len(files), split, has_splits, n, seed)
    images = np.stack([_read_resized(files[i], img_size) for i in idx])
    return ImageSet(images, np.asarray(labels, np.int64)[idx], None, classes, str(root))


def _read_mask(path: Path, size: tuple[int, int]) -> np.ndarray:
    try:
        with Image.open(path) as m:
            m.load()
            mode, arr = m.mode, np.asarray(m)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read mask: {exc}") from None
    if mode not in ("L", "P", "I", "I;16", "1"):
        raise ValueError(f"{path}: a mask must be a single-channel index PNG, got mode {mode}")
    if arr.shape[:2] != size:
        raise ValueError(
            f"{path}: mask size {arr.shape[1]}x{arr.shape[0]} does not match its image {size[1]}x{size[0]}"
        )
    if arr.max(initial=0) > 255:
        raise ValueError(f"{path}: class index {int(arr.max())} > 255 is not supported")
    return arr.astype(np.uint8)


def _max_class(ann_root: Path) -> int:
    """Largest class index over every annotation PNG under ``ann_root`` (at least 1)."""
    top = 1
    for path in sorted(ann_root.rglob("*.png")):
        try:
            with Image.open(path) as m:
                top = max(top, int(np.asarray(m).max(initial=0)))
        except OSError:  # reported with its name when its split is loaded
            continue
    return top


def ade_folder(
    root, split: str, task: str = "seg", img_size: int = 32, n: int | None = None, seed: int = 0
) -> ImageSet:
    """ADE20K-layout segmentation data: ``images/`` and ``annotations/`` (index PNGs, 0 = background/other,
    same file stem), optionally with ``training``/``validation`` sub-folders; an optional ``classes.txt``
    (one name per line, index 0 first) names the classes. Images and masks are resized to ``img_size``
    (masks with nearest neighbour). The classification label is the most frequent non-zero class."""
    root = Path(root)
    img_dir, ann_dir = root / "images", root / "annotations"
    if not img_dir.is_dir() or not ann_dir.is_dir():
        raise ValueError(f"{root}: an ade-folder needs images/ and annotations/ sub-folders")
    has_splits = _split_root(img_dir, _SPLIT_DIRS["train"]) is not None
    if has_splits:
        sub = _split_root(img_dir, _SPLIT_DIRS[split]) or _split_root(img_dir, _SPLIT_DIRS["val"])
        if sub is None:
            raise ValueError(f"{img_dir}: has a training/ folder but no {split} or validation folder")
        img_dir, ann_dir = sub, ann_dir / sub.name
    files = _image_files(img_dir)
    if not files:
        raise ValueError(f"{img_dir}: no images found")
    idx = _folder_indices(root, len(files), split, has_splits, n, seed)
    images, masks = [], []
    for i in idx:
        path = files[i]
        ann = ann_dir / (path.stem + ".png")
        if not ann.is_file():
            raise ValueError(f"{path}: no annotation {ann}")
        try:
            img = load_image(path)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        mask = _read_mask(ann, (img.height, img.width))
        images.append(np.asarray(img.resize((img_size, img_size), Image.Resampling.BILINEAR), dtype=np.uint8))
        masks.append(np.asarray(Image.fromarray(mask).resize((img_size, img_size), Image.Resampling.NEAREST)))
    masks_arr = np.stack(masks)
    names_file = root / "classes.txt"
    if names_file.is_file():
        names = [line.strip() for line in names_file.read_text().splitlines() if line.strip()]
    else:
        names = ["background"] + [f"class_{k}" for k in range(1, 256)]
    k_max = int(masks_arr.max())
    if k_max >= len(names):
        raise ValueError(f"{root}: mask class index {k_max} but classes.txt names only {len(names)} classes")
    if not names_file.is_file():  # the same classes for every split: the largest index of all annotations
        names = names[: max(_max_class(root / "annotations"), k_max) + 1]
    # the label is the largest non-background class (an index into ``names``, so +1 past background);
    # an all-background mask is labelled background (0)
    counts = np.stack([np.bincount(m.ravel(), minlength=len(names))[1:] for m in masks_arr])
    labels = np.where(counts.sum(1) > 0, counts.argmax(1) + 1, 0)
    return ImageSet(np.stack(images), labels.astype(np.int64), masks_arr, names, str(root))


def check_source(data: str, task: str, scene: dict | None = None) -> None:
    """What :func:`load_data` refuses before it reads anything, so a command can refuse it as a bad flag first.

    Raises:
        ValueError: scene options for anything but Fashion-MNIST segmentation, ``digits`` for segmentation, or a
            name that is neither a built-in source nor a folder.
    """
    if scene and not (data == "fashion" and task == "seg"):
        raise ValueError(f"scene options compose Fashion-MNIST segmentation scenes; {data!r} {task} takes none")
    if data == "digits" and task != "cls":
        raise ValueError("digits has no masks; use it with --task cls")
    if data not in BUILTIN_DATA and not Path(data).is_dir():
        raise ValueError(f"unknown data {data!r}: not one of {', '.join(BUILTIN_DATA)} and not a folder")


def load_data(
    data: str,
    split: str,
    task: str = "cls",
    img_size: int = 32,
    n: int | None = None,
    seed: int = 0,
    scene: dict | None = None,
) -> ImageSet:
    """Load a split of ``fashion`` (Fashion-MNIST, see :mod:`attnzoo.data.fashion`), ``shapes``, ``digits``,
    or a folder (an ade-folder when it has ``images/`` and
    ``annotations/``, else a class-per-folder image folder). ``scene``: how Fashion-MNIST segmentation scenes are
    composed (:func:`attnzoo.data.fashion.compose_scenes` options); only ``fashion`` takes it."""
    check_source(data, task, scene)
    if data == "shapes":
        return shapes(split, task, img_size, n, seed)
    if data == "digits":
        return digits(split, task, img_size, n, seed)
    if data == "fashion":
        return fashion(split, task, img_size, n, seed, scene=scene)
    root = Path(data)
    if (root / "images").is_dir() and (root / "annotations").is_dir():
        return ade_folder(root, split, task, img_size, n, seed)
    return imagefolder(root, split, task, img_size, n, seed)
