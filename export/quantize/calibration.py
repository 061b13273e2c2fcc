"""The inputs an int8 / fp8 export is calibrated on and the held-out inputs its fidelity is measured on:
the model's training split (:func:`calibration_images`, :func:`heldout_images`), a user's folder of images or
``.npy`` array, or random inputs; :func:`calibration_for` chooses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from attnzoo.data.datasets import IMAGE_SUFFIXES, load_data
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, input_style_of, load_image, normalize, to_input_style

__all__ = [
    "DEFAULT_CALIBRATION_COUNT",
    "DEFAULT_CALIBRATION_SEED",
    "DEFAULT_FIDELITY_COUNT",
    "Calibration",
    "calibration_images",
    "heldout_images",
    "load_calibration_folder",
    "random_calibration",
    "load_calibration_file",
    "calibration_for",
]

DEFAULT_CALIBRATION_COUNT = 512
DEFAULT_CALIBRATION_SEED = 0
#: Held-out inputs the fidelity is measured on (``auto``: half choose the placement, half are the gate's). With n
#: gate inputs a further input like them falls below the worst of them with probability 1 / (n + 1) (3 % for 32);
#: how the worst-of-n moves with n on the pretrained-like ViT is in docs/quantization.md.
DEFAULT_FIDELITY_COUNT = 64


def calibration_images(
    config: Mapping[str, Any], count: int = DEFAULT_CALIBRATION_COUNT, seed: int = DEFAULT_CALIBRATION_SEED
) -> np.ndarray:
    """``count`` training-split images of the model's data set, float32 NCHW, preprocessed as the model expects.

    Loaded with :func:`attnzoo.data.datasets.load_data` (the split the model was trained on, its image size and
    data seed) and normalised with the model's mean/std by :func:`attnzoo.preprocess.normalize`, exactly as the
    evaluation does it. Classifiers: ``count`` images drawn without replacement with
    ``numpy.random.default_rng(seed)``; segmenters: ``count`` training scenes composed from training garments
    with scene seed ``data_seed + 1 + seed`` (so not the very scenes the model was trained on).

    Raises:
        ValueError: the config names no data set (an untrained or config-less model), or ``count`` < 1.
    """
    if count < 1:
        raise ValueError(f"calibration count must be >= 1, got {count}")
    data = config.get("data")
    if not data or config.get("untrained"):
        raise ValueError(
            "the model names no data set to calibrate on (untrained or config-less); pass "
            "--calibration-data FILE.npy, or --random-init to calibrate on random inputs"
        )
    size = int(config["img_size"])
    task = config["task"]
    data_seed = int(config.get("data_seed", 0))
    if task == "seg":  # composed scenes: draw exactly `count` training scenes
        images = load_data(
            data, "train", task, size, n=count, seed=data_seed + 1 + seed, scene=config.get("scene")
        ).images
    else:
        images = load_data(data, "train", task, size, seed=data_seed).images
        if count < len(images):
            images = images[np.sort(np.random.default_rng(seed).choice(len(images), count, replace=False))]
    return normalize(images, config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))


def heldout_images(
    config: Mapping[str, Any],
    count: int = DEFAULT_FIDELITY_COUNT,
    calibration_count: int = DEFAULT_CALIBRATION_COUNT,
    seed: int = DEFAULT_CALIBRATION_SEED,
) -> np.ndarray:
    """``count`` training-split images that :func:`calibration_images` (``calibration_count``, ``seed``) does not
    draw, preprocessed the same way: the held-out inputs the fidelity to fp32 is measured on.

    Classifiers: drawn with ``default_rng(seed + 1)`` from the images outside the calibration draw; segmenters:
    ``count`` scenes composed with another scene seed than the calibration's.

    Raises:
        ValueError: as :func:`calibration_images`.
    """
    if count < 1:
        raise ValueError(f"held-out count must be >= 1, got {count}")
    data = config.get("data")
    if not data or config.get("untrained"):
        raise ValueError("the model names no data set to hold images out of")
    size, task, data_seed = int(config["img_size"]), config["task"], int(config.get("data_seed", 0))
    if task == "seg":
        images = load_data(data, "train", task, size, n=count, seed=data_seed + 1 + seed + 7919).images
    else:
        images = load_data(data, "train", task, size, seed=data_seed).images
        taken = np.zeros(len(images), bool)
        if calibration_count < len(images):
            taken[np.random.default_rng(seed).choice(len(images), calibration_count, replace=False)] = True
        else:
            taken[:] = True
        free = np.flatnonzero(~taken)
        if not len(free):
            raise ValueError("every training image was used for calibration; none is left to hold out")
        pick = np.random.default_rng(seed + 1).choice(free, min(count, len(free)), replace=False)
        images = images[np.sort(pick)]
    return normalize(images, config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))


def load_calibration_folder(
    path: str | Path,
    config: Mapping[str, Any],
    input_hw: tuple[int, int],
    count: int,
    seed: int = DEFAULT_CALIBRATION_SEED,
) -> np.ndarray:
    """Up to ``count`` images of a folder (searched recursively), drawn with ``default_rng(seed)``, preprocessed as
    the model's metadata says: :func:`attnzoo.preprocess.load_image` (any mode, EXIF turned, the pixel cap),
    converted to the model's input style, resized to ``input_hw`` and normalised with its mean/std.

    Raises:
        ValueError: one line: no such folder, no image in it (naming what was skipped: symlinked folders, which
            are not followed, and files of other types), or an unreadable or too large image (named).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"--calibration-data {folder}: no such folder")
    entries = list(folder.rglob("*"))  # symlinked folders are not descended into (no loops, nothing outside)
    files = sorted(p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        links = sorted(str(p.relative_to(folder)) for p in entries if p.is_symlink() and p.is_dir())
        others = sum(p.is_file() for p in entries)
        skipped = []
        if links:
            skipped.append(f"{len(links)} symlinked folder(s), not followed: {', '.join(links[:5])}")
        if others:
            skipped.append(f"{others} file(s) of other types")
        raise ValueError(
            f"--calibration-data {folder}: no images ({', '.join(IMAGE_SUFFIXES)}) in it"
            + (f"; skipped {' and '.join(skipped)}" if skipped else "")
        )
    if count < len(files):
        files = [files[i] for i in np.sort(np.random.default_rng(seed).choice(len(files), count, replace=False))]
    style, (h, w) = input_style_of(config), input_hw
    pixels = []
    for file in files:
        try:
            img = to_input_style(load_image(file), style, config["task"])
        except ValueError as exc:
            raise ValueError(f"--calibration-data {file}: {exc}") from None
        pixels.append(np.asarray(img.resize((w, h), Image.Resampling.BILINEAR), np.uint8))
    return normalize(np.stack(pixels), config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))


def random_calibration(
    input_hw: tuple[int, int], count: int = DEFAULT_CALIBRATION_COUNT, seed: int = DEFAULT_CALIBRATION_SEED
) -> np.ndarray:
    """Standard-normal float32 NCHW inputs (``--random-init``: an untrained model has no data set)."""
    return np.random.default_rng(seed).standard_normal((count, 3, *input_hw)).astype(np.float32)


def load_calibration_file(path: str | Path, input_hw: tuple[int, int] | None) -> np.ndarray:
    """A user's calibration batch: a ``.npy`` array (never unpickled) of float NCHW inputs, already normalised.

    ``input_hw`` ``None`` checks everything but the spatial size (before the model is loaded).

    Raises:
        ValueError: one line: missing/unreadable file, a pickle, wrong shape (must be ``(N, 3, H, W)``), a
            non-float dtype, no images, or non-finite values.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--calibration-data {path}: no such file or folder")
    try:
        x = np.load(path, allow_pickle=False, mmap_mode="r")
    except ValueError as exc:  # object arrays need pickle: refused
        raise ValueError(f"--calibration-data {path}: not a plain .npy array ({str(exc).splitlines()[0]})") from None
    except OSError as exc:
        raise ValueError(f"--calibration-data {path}: cannot read it as .npy ({exc})") from None
    if not isinstance(x, np.ndarray):
        raise ValueError(f"--calibration-data {path}: an .npz archive; save one array with numpy.save")
    want = ("3", *(map(str, input_hw) if input_hw else ("H", "W")))
    if x.ndim != 4 or x.shape[1] != 3 or (input_hw and tuple(x.shape[2:]) != tuple(input_hw)):
        raise ValueError(
            f"--calibration-data {path}: shape {tuple(x.shape)}, the model takes (N, {', '.join(want)}) "
            "float32 images normalised with its mean/std"
        )
    if x.dtype.kind != "f":
        raise ValueError(
            f"--calibration-data {path}: dtype {x.dtype}, need float32 (normalised images, not raw pixels)"
        )
    if x.shape[0] == 0:
        raise ValueError(f"--calibration-data {path}: holds no images (shape {tuple(x.shape)})")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError(f"--calibration-data {path}: holds NaN or infinite values")
    return x


@dataclass
class Calibration:
    """The inputs an int8 / fp8 export is calibrated on, the held-out inputs its fidelity is measured on, and
    what they are.

    Attributes:
        inputs: float32 NCHW, normalised as the model expects.
        source: What they are, for the report (e.g. ``fashion training split``).
        seed: The seed of their draw (``None`` for a user's array).
        labelled: The model has a labelled test split to be scored on (a trained zoo-style model).
        held_out: Inputs of the same source never calibrated on.
        random: Random inputs, not images.
        warnings: What the user should know (random inputs, few held-out inputs).
    """

    inputs: np.ndarray
    source: str
    seed: int | None
    labelled: bool
    held_out: np.ndarray | None = None
    random: bool = False
    warnings: list[str] = field(default_factory=list)


def _split(x: np.ndarray, held: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The last ``held`` of ``x`` held out, at most a quarter and at least one; the rest calibrates."""
    n = len(x)
    if n < 2:
        raise ValueError(
            f"{what}: {n} image(s); at least 2 are needed (one to calibrate on, one held out to measure the fidelity)"
        )
    held = max(1, min(held, n // 4))
    return np.ascontiguousarray(x[: n - held]), np.ascontiguousarray(x[n - held :])


def calibration_for(
    config: Mapping[str, Any],
    input_hw: tuple[int, int],
    *,
    untrained: bool = False,
    calibration_data: str | Path | None = None,
    calibration_count: int | None = None,
    calibration_seed: int | None = None,
    fidelity_count: int | None = None,
) -> Calibration:
    """The calibration and held-out inputs ``export-model --dtype int8|fp8`` uses.

    ``calibration_data``: a folder of images (the model's preprocessing from its metadata,
    :func:`load_calibration_folder`) or a ``.npy`` array of normalised inputs (:func:`load_calibration_file`), the
    last ``fidelity_count`` (at most a quarter) held out; else the model's training split
    (:func:`calibration_images`, :func:`heldout_images`); else random inputs: for an untrained model, and with a
    warning for a trained one (a converted pretrained model should be calibrated on images like its inputs).

    Raises:
        ValueError: a bad calibration file or folder.
    """
    count = calibration_count or DEFAULT_CALIBRATION_COUNT
    held = fidelity_count or DEFAULT_FIDELITY_COUNT
    seed = DEFAULT_CALIBRATION_SEED if calibration_seed is None else calibration_seed
    labelled = bool(config.get("data")) and not untrained
    warnings: list[str] = []
    if calibration_data is not None:
        path = Path(calibration_data)
        if path.is_dir():
            x = load_calibration_folder(path, config, input_hw, count + held, seed)
            what, used_seed = f"--calibration-data {path} (images, preprocessed from the model's metadata)", seed
        else:
            x, what, used_seed = load_calibration_file(path, input_hw), f"--calibration-data {path}", None
        inputs, held_out = _split(x, held, f"--calibration-data {path}")
        if len(held_out) < held:
            warnings.append(
                f"fidelity measured on only {len(held_out)} held-out input(s) of {path} (a quarter of "
                f"its {len(x)}; {len(inputs)} calibrate): a weak figure; give {4 * held} images or more "
                "for a firm one"
            )
        return Calibration(inputs, what, used_seed, labelled, held_out, False, warnings)
    if untrained or not config.get("data"):
        if not untrained:
            warnings.append(
                "calibrated on random (standard normal) inputs: a trained model's activations on real "
                "inputs differ, and its fidelity was measured on random inputs too; pass "
                "--calibration-data with a folder of images like its inputs"
            )
        else:
            warnings.append(
                f"--random-init: calibrating the UNTRAINED model on {count} random (standard normal) "
                "inputs; the quantized model's accuracy is meaningless and is not measured"
            )
        return Calibration(
            random_calibration(input_hw, count, seed),
            "random standard-normal inputs",
            seed,
            False,
            random_calibration(input_hw, held, seed + 1),
            True,
            warnings,
        )
    x = calibration_images(config, count, seed)
    if x.shape[2:] != tuple(input_hw):
        raise ValueError(
            f"the training images are {x.shape[2]}x{x.shape[3]}, --input-size "
            f"{input_hw[0]}x{input_hw[1]}; calibrate at the training size or pass --calibration-data"
        )
    return Calibration(
        np.ascontiguousarray(x),
        f"{config['data']} training split",
        seed,
        labelled,
        heldout_images(config, held, count, seed),
    )
