"""The trained model zoo shipped with attnzoo: one classifier and one segmenter per variant on Fashion-MNIST
(``fashion``, the default) and on the ``shapes`` smoke set, plus ``digits`` classifiers, each a ``.safetensors``
file (config in its metadata) listed in ``manifest.json``. The best classifier and segmenter of each data set also
ship as ONNX exports (``onnx/``, the manifest row's ``onnx`` entry) so that a fresh ``serve-demo`` answers in
seconds; they are verified against their checkpoint before use.

>>> from attnzoo import zoo
>>> model, config = zoo.load("belief2", "cls")          # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnzoo.fileio import sha256_file
from attnzoo.lazy import lazy_import

if TYPE_CHECKING:  # the zoo's listing loads without PyTorch (serve-models, the studies' --help)
    from torch import nn

# timm and PyTorch load at the first checkpoint lookup: serve-models and the studies' --help read the listing only
models = lazy_import("attnzoo.models")
checkpoint = lazy_import("attnzoo.models.checkpoint")

__all__ = [
    "ZOO_DIR",
    "DEFAULT_DATA",
    "manifest",
    "entries",
    "checkpoint_path",
    "load",
    "available",
    "best_entries",
    "onnx_name",
    "shipped_onnx",
]

ZOO_DIR = Path(__file__).resolve().parent
_MANIFEST = ZOO_DIR / "manifest.json"
#: The data set whose models are used when none is named (export-model, serve-demo, benchmarks).
DEFAULT_DATA = "fashion"


def manifest() -> dict[str, Any]:
    """The parsed ``manifest.json`` (``{"models": [...], "recipe": {...}}``); empty when no zoo is built."""
    if not _MANIFEST.is_file():
        return {"models": []}
    return json.loads(_MANIFEST.read_text())


def entries() -> list[dict[str, Any]]:
    """Manifest rows: variant, task, data, file, sha256, params, test metric, train time, ..."""
    return list(manifest().get("models", []))


def available(task: str | None = None, data: str = DEFAULT_DATA) -> list[str]:
    """Variants that have a zoo model for ``task`` (any task when None) trained on ``data``."""
    return [e["variant"] for e in entries() if (task is None or e["task"] == task) and e["data"] == data]


def checkpoint_path(variant: str, task: str = "cls", data: str = DEFAULT_DATA) -> Path:
    """Path of the zoo checkpoint; ``ValueError`` naming what the zoo has when there is none."""
    name = models.canonical_name(variant)
    for e in entries():
        if e["variant"] == name and e["task"] == task and e["data"] == data:
            return ZOO_DIR / e["file"]
    have = sorted(f"{e['variant']}/{e['task']}/{e['data']}" for e in entries()) or ["nothing (zoo not built)"]
    raise ValueError(f"the zoo has no {task!r} model of {name!r} trained on {data!r}; it has: {', '.join(have)}")


def load(variant: str, task: str = "cls", data: str = DEFAULT_DATA) -> tuple[nn.Module, dict[str, Any]]:
    """Load a zoo model in eval mode with its config (class names, mean/std, metrics ...)."""
    return checkpoint.load_checkpoint(checkpoint_path(variant, task, data))


def best_entries(data: str = DEFAULT_DATA) -> dict[str, dict[str, Any]]:
    """Per task, the manifest row trained on ``data`` with the highest test metric (the first listed on a tie)."""
    best: dict[str, dict[str, Any]] = {}
    for e in entries():
        if e["data"] == data and (
            e["task"] not in best or (e.get("test_metric") or 0) > (best[e["task"]].get("test_metric") or 0)
        ):
            best[e["task"]] = e
    return best


def onnx_name(variant: str, task: str, data: str = DEFAULT_DATA) -> str:
    """File name of a zoo model's ONNX export (shipped in ``onnx/`` or written to a cache)."""
    return f"{variant}_{task}_{data}.onnx"


def shipped_onnx(entry: dict[str, Any]) -> Path | None:
    """The shipped ONNX export of a manifest row when there is one and its sha256 matches, else None (the
    caller exports the checkpoint instead). Parity with the checkpoint is the caller's check."""
    ship = entry.get("onnx")
    if not ship:
        return None
    path = ZOO_DIR / ship["file"]
    return path if path.is_file() and sha256_file(path) == ship.get("sha256") else None
