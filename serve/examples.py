"""The example images the demo ships: ``shapes`` scenes from the training data generator, with their true
class (classification) or true mask (segmentation), indexed by a hash of their pixels so that the demo
recognises an uploaded example and shows its per-class IoU.

Regenerate (deterministic): ``python -m attnzoo.serve.examples`` (writes ``serve/examples/``).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
from PIL import Image

from attnzoo.fileio import atomic_path, atomic_write_text

__all__ = ["EXAMPLES_DIR", "pixel_hash", "index", "example_paths", "find_example", "true_mask", "generate"]

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
INDEX_NAME = "index.json"


def pixel_hash(image: Image.Image) -> str:
    """sha256 of an RGB image's size and pixels (the same for the PNG and any lossless copy of it)."""
    arr = np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))
    return hashlib.sha256(f"{arr.shape}".encode() + arr.tobytes()).hexdigest()


@functools.lru_cache(maxsize=4)
def index(folder: Path = EXAMPLES_DIR) -> Dict:
    """The parsed ``index.json`` (``{"examples": [...]}``); empty when the folder has none."""
    path = Path(folder) / INDEX_NAME
    return json.loads(path.read_text()) if path.is_file() else {"examples": []}


def example_paths(task: Optional[str] = None, folder: Path = EXAMPLES_DIR) -> List[str]:
    """Paths of the example images for ``task`` (``cls``/``seg``; all when None)."""
    return [str(Path(folder) / e["image"]) for e in index(folder)["examples"] if task in (None, e["task"])]


def find_example(image: Image.Image, folder: Path = EXAMPLES_DIR) -> Optional[Dict]:
    """The index entry of the example whose pixels equal ``image``'s, or None."""
    digest = pixel_hash(image)
    return next((e for e in index(folder)["examples"] if e["sha256"] == digest), None)


def true_mask(entry: Dict, folder: Path = EXAMPLES_DIR) -> Optional[np.ndarray]:
    """The true class-index mask of a segmentation example (None for a classification example)."""
    return np.asarray(Image.open(Path(folder) / entry["mask"]), dtype=np.uint8) if entry.get("mask") else None


def _save_png(array: np.ndarray, path: Path) -> None:
    with atomic_path(path) as tmp:
        Image.fromarray(array).save(tmp, format="PNG")


def generate(folder: Path = EXAMPLES_DIR, n_cls: int = 4, n_seg: int = 4, img_size: int = 128,
             seed: int = 0) -> Dict:
    """Write ``n_cls`` classification and ``n_seg`` segmentation scenes (PNG, masks as 8-bit class
    indices) and ``index.json`` into ``folder``; return the index.

    Scenes come from the ``test`` split of :func:`attnzoo.training.data.shapes_images` at ``img_size``
    pixels (the generator draws the same scenes at any size; the demo downscales them to the model's size).
    """
    from attnzoo.training.data import SHAPES_CLASSES, SHAPES_SEG_CLASSES, shapes_images

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for task, n in (("cls", n_cls), ("seg", n_seg)):
        images, labels, masks = shapes_images(n, img_size=img_size, split="test", seed=seed, task=task)
        for i in range(n):
            name = f"shapes_{task}_{i}"
            entry = {"image": f"{name}.png", "task": task, "sha256": pixel_hash(Image.fromarray(images[i]))}
            _save_png(images[i], folder / entry["image"])
            if task == "cls":
                entry["label"] = SHAPES_CLASSES[int(labels[i])]
            else:
                entry["mask"] = f"{name}_mask.png"
                entry["classes"] = sorted({SHAPES_SEG_CLASSES[c] for c in np.unique(masks[i])})
                _save_png(masks[i], folder / entry["mask"])
            entries.append(entry)
    data = {"generator": {"function": "attnzoo.training.data.shapes_images", "split": "test", "seed": seed,
                          "img_size": img_size},
            "classes": {"cls": list(SHAPES_CLASSES), "seg": list(SHAPES_SEG_CLASSES)},
            "examples": entries}
    atomic_write_text(folder / INDEX_NAME, json.dumps(data, indent=2) + "\n")
    index.cache_clear()
    return data


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m attnzoo.serve.examples [--out DIR] [--n-cls N] [--n-seg N] [--size PX]``."""
    parser = argparse.ArgumentParser(description="Regenerate the demo's example images.")
    parser.add_argument("--out", type=Path, default=EXAMPLES_DIR)
    parser.add_argument("--n-cls", type=int, default=4)
    parser.add_argument("--n-seg", type=int, default=4)
    parser.add_argument("--size", type=int, default=128)
    args = parser.parse_args(argv)
    data = generate(args.out, args.n_cls, args.n_seg, args.size)
    print(f"wrote {len(data['examples'])} examples to {args.out}")


if __name__ == "__main__":
    main()
