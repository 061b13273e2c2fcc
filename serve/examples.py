"""The example images the demo ships: Fashion-MNIST test images and composed test scenes, with their true
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

import numpy as np
from PIL import Image

from attnzoo.fileio import atomic_path, atomic_write_text
from attnzoo.lazy import lazy_import

# used by generate() only: the demo reads the shipped examples without torch and the training code
fashion_mnist = lazy_import("attnzoo.data.fashion")
training_zoo = lazy_import("attnzoo.training.zoo")

__all__ = ["EXAMPLES_DIR", "pixel_hash", "index", "title", "example_paths", "find_example", "true_mask", "generate"]

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"
INDEX_NAME = "index.json"


def pixel_hash(image: Image.Image) -> str:
    """sha256 of an RGB image's size and pixels (the same for the PNG and any lossless copy of it)."""
    arr = np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))
    return hashlib.sha256(f"{arr.shape}".encode() + arr.tobytes()).hexdigest()


@functools.lru_cache(maxsize=4)
def index(folder: Path = EXAMPLES_DIR) -> dict:
    """The parsed ``index.json`` (``{"examples": [...]}``); empty when the folder has none."""
    path = Path(folder) / INDEX_NAME
    return json.loads(path.read_text()) if path.is_file() else {"examples": []}


def title(folder: Path = EXAMPLES_DIR) -> str:
    """What the examples are, for the demo's labels."""
    return index(folder).get("title", "examples")


def example_paths(task: str | None = None, folder: Path = EXAMPLES_DIR) -> list[str]:
    """Paths of the example images for ``task`` (``cls``/``seg``; all when None)."""
    return [str(Path(folder) / e["image"]) for e in index(folder)["examples"] if task in (None, e["task"])]


def find_example(image: Image.Image, folder: Path = EXAMPLES_DIR) -> dict | None:
    """The index entry of the example whose pixels equal ``image``'s, or None."""
    digest = pixel_hash(image)
    return next((e for e in index(folder)["examples"] if e["sha256"] == digest), None)


def true_mask(entry: dict, folder: Path = EXAMPLES_DIR) -> np.ndarray | None:
    """The true class-index mask of a segmentation example (None for a classification example)."""
    return np.asarray(Image.open(Path(folder) / entry["mask"]), dtype=np.uint8) if entry.get("mask") else None


def _save_png(array: np.ndarray, path: Path) -> None:
    with atomic_path(path) as tmp:
        Image.fromarray(array).save(tmp, format="PNG")


def generate(folder: Path = EXAMPLES_DIR, n_cls: int = 6, n_seg: int = 4, seed: int = 0) -> dict:
    """Write ``n_cls`` classification images and ``n_seg`` segmentation scenes (PNG, masks as 8-bit class
    indices) and ``index.json`` into ``folder``; return the index.

    Both come from the official Fashion-MNIST test split at the zoo recipes' sizes: the first test image of each
    of the first ``n_cls`` classes, and the first ``n_seg`` composed test scenes
    (:func:`attnzoo.data.fashion.fashion`).
    """
    fashion, recipes = fashion_mnist.fashion, training_zoo.RECIPES
    cls_names, seg_names = fashion_mnist.FASHION_CLASSES, fashion_mnist.FASHION_SEG_CLASSES
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    cls = fashion("test", "cls", recipes["fashion/cls"]["img_size"])
    firsts = [int(np.flatnonzero(cls.labels == c)[0]) for c in range(min(n_cls, len(cls_names)))]
    for i, j in enumerate(firsts):
        name = f"fashion_cls_{i}"
        entry = {
            "image": f"{name}.png",
            "task": "cls",
            "sha256": pixel_hash(Image.fromarray(cls.images[j])),
            "label": cls_names[int(cls.labels[j])],
            "test_index": j,
        }
        _save_png(cls.images[j], folder / entry["image"])
        entries.append(entry)
    seg = fashion(
        "test", "seg", recipes["fashion/seg"]["img_size"], n_seg, seed, scene=recipes["fashion/seg"].get("scene")
    )
    for i in range(n_seg):
        name = f"fashion_seg_{i}"
        entry = {
            "image": f"{name}.png",
            "task": "seg",
            "sha256": pixel_hash(Image.fromarray(seg.images[i])),
            "mask": f"{name}_mask.png",
            "classes": sorted({seg_names[c] for c in np.unique(seg.masks[i])}),
        }
        _save_png(seg.images[i], folder / entry["image"])
        _save_png(seg.masks[i], folder / entry["mask"])
        entries.append(entry)
    data = {
        "title": "Fashion-MNIST test images",
        "generator": {"function": "attnzoo.serve.examples.generate", "split": "test", "seed": seed},
        "classes": {"cls": list(cls_names), "seg": list(seg_names)},
        "examples": entries,
    }
    keep = {e["image"] for e in entries} | {e["mask"] for e in entries if "mask" in e}
    for old in folder.glob("*.png"):  # examples of an earlier generator
        if old.name not in keep:
            old.unlink()
    atomic_write_text(folder / INDEX_NAME, json.dumps(data, indent=2) + "\n")
    index.cache_clear()
    return data


def main(argv: list[str] | None = None) -> None:
    """``python -m attnzoo.serve.examples [--out DIR] [--n-cls N] [--n-seg N]``."""
    parser = argparse.ArgumentParser(description="Regenerate the demo's example images.")
    parser.add_argument("--out", type=Path, default=EXAMPLES_DIR)
    parser.add_argument("--n-cls", type=int, default=6)
    parser.add_argument("--n-seg", type=int, default=4)
    args = parser.parse_args(argv)
    data = generate(args.out, args.n_cls, args.n_seg)
    print(f"wrote {len(data['examples'])} examples to {args.out}")


if __name__ == "__main__":
    main()
