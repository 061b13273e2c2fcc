"""A model's config, as checkpoints and exported files carry it: its tasks, its check and its logits' check.

Plain Python (no torch): the runtime reads an exported file's contract, and a serving replica checks a model's
logits, without importing PyTorch or timm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from attnzoo.limits import MAX_CLASSES, check_side

__all__ = ["TASKS", "validate_config", "check_logits"]

#: What a model does: ``cls`` (one label per image) or ``seg`` (one label per pixel).
TASKS = ("cls", "seg")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_config(config: Any, source: Any = "model") -> dict[str, Any]:
    """Check a model config (a checkpoint's, or an ONNX file's ``attnzoo.config``) before anything is built.

    Checks that it is a JSON object with variant, task, arch, ``num_classes`` (1..``MAX_CLASSES``) and
    ``img_size`` (1..``MAX_SIDE``); that ``class_names``, when given, has ``num_classes`` entries; and that
    ``mean``/``std``, when given, are 3 finite numbers (std non-zero). Returns ``config``.

    Raises:
        ValueError: one line naming ``source`` and the first problem found.
    """
    if not isinstance(config, dict):
        raise ValueError(f"{source}: the model config is a JSON {type(config).__name__}, not an object")
    missing = [k for k in ("variant", "task", "arch", "num_classes", "img_size") if k not in config]
    if missing:
        raise ValueError(f"{source}: not an attnzoo model config (missing {', '.join(missing)})")
    if config["task"] not in TASKS:
        raise ValueError(f"{source}: unknown task {config['task']!r}; valid: {', '.join(TASKS)}")
    k = config["num_classes"]
    if not _is_int(k) or not 1 <= k <= MAX_CLASSES:
        raise ValueError(f"{source}: num_classes must be an integer in 1..{MAX_CLASSES}, got {k!r}")
    check_side(config["img_size"], f"{source}: img_size")
    names = config.get("class_names")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, (str, int)) for n in names):
            raise ValueError(f"{source}: class_names must be a list of names")
        if len(names) != k:
            raise ValueError(f"{source}: {len(names)} class names for {k} classes")
    for key in ("mean", "std"):
        v = config.get(key)
        if v is not None and (
            not isinstance(v, list)
            or len(v) != 3
            or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)
            or (key == "std" and not all(v))
        ):
            raise ValueError(
                f"{source}: {key} must be 3 finite numbers{' (non-zero)' if key == 'std' else ''}, got {v!r}"
            )
    if not isinstance(config.get("options", {}), dict):
        raise ValueError(f"{source}: options must be a JSON object")
    return config


def check_logits(class_names: Sequence[str], logits_shape: Sequence[int], task: str, source: Any = "model") -> None:
    """The model's output must have one logit channel per class name (axis 1; rank 2 cls, rank 4 seg).

    Raises:
        ValueError: naming both counts.
    """
    rank = 2 if task == "cls" else 4
    if len(logits_shape) != rank:
        raise ValueError(f"{source}: a {task} model must output rank-{rank} logits, got shape {tuple(logits_shape)}")
    if logits_shape[1] != len(class_names):
        raise ValueError(
            f"{source}: {len(class_names)} class names but the model outputs {logits_shape[1]} "
            "logits per " + ("image" if task == "cls" else "pixel")
        )
