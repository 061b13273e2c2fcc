"""Metrics in percent from a confusion matrix: top-1 for classifiers, mIoU with per-class IoU for segmenters; and
for segmenters, whether each garment of a scene is named right (what a person reads off the demo's picture).

One implementation for training's evaluation, the int8 accuracy gate of ``export-model`` and the studies.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["metric_name", "confusion_matrix", "metrics_from_confusion", "named_right"]


def metric_name(task: str) -> str:
    """``top1`` for classification, ``miou`` for segmentation (both in percent)."""
    return "top1" if task == "cls" else "miou"


def confusion_matrix(true, pred, num_classes: int) -> torch.Tensor:
    """Confusion matrix (true x predicted) of two equal-shape arrays or tensors of class indices."""
    true, pred = torch.as_tensor(true, dtype=torch.int64), torch.as_tensor(pred, dtype=torch.int64)
    return torch.bincount((true * num_classes + pred).reshape(-1), minlength=num_classes**2).reshape(
        num_classes, num_classes
    )


def metrics_from_confusion(conf: torch.Tensor, task: str, class_names) -> dict[str, Any]:
    """Top-1 (cls) or mIoU with per-class IoU (seg), in percent. mIoU averages the classes that occur in
    the ground truth or the prediction."""
    conf = conf.double()
    if task == "cls":
        total = conf.sum().item()
        return {"metric_name": "top1", "metric": 100.0 * conf.diag().sum().item() / max(total, 1.0), "n": int(total)}
    inter = conf.diag()
    union = conf.sum(0) + conf.sum(1) - inter
    iou = {
        name: (100.0 * inter[k].item() / union[k].item() if union[k] > 0 else None)
        for k, name in enumerate(class_names)
    }
    valid = [v for v in iou.values() if v is not None]
    return {
        "metric_name": "miou",
        "metric": float(np.mean(valid)) if valid else 0.0,
        "pixel_acc": 100.0 * inter.sum().item() / max(conf.sum().item(), 1.0),
        "per_class_iou": iou,
    }


def named_right(true, pred, num_classes: int, background: int = 0) -> dict[str, int]:
    """How many garments, and how many whole scenes, a segmenter names right.

    A garment class present in a scene's true mask (``background`` aside) is named right when the class painted on
    most of its pixels is that class, strictly more than any other (the background included: a garment painted
    mostly as background is not named). A scene is right when every garment class in it is.

    Args:
        true: ``(N, H, W)`` true class-index masks.
        pred: ``(N, H, W)`` predicted class indices.
        num_classes: classes, the background included.
        background: the background's index.

    Returns:
        ``garments``, ``garments_right``, ``scenes``, ``scenes_right`` (counts).
    """
    true, pred = torch.as_tensor(true, dtype=torch.int64), torch.as_tensor(pred, dtype=torch.int64)
    n, k = true.shape[0], num_classes
    image = torch.arange(n).reshape(n, *([1] * (true.dim() - 1)))
    rows = torch.bincount((image * k * k + true * k + pred).reshape(-1), minlength=n * k * k).reshape(n, k, k)
    own = rows.diagonal(dim1=1, dim2=2)  # (N, k): pixels of each true class painted as that class
    others = rows.masked_fill(torch.eye(k, dtype=torch.bool), -1).amax(2)  # the most painted as any other class
    present = rows.sum(2) > 0
    present[:, background] = False
    right = present & (own > others)
    return {
        "garments": int(present.sum()),
        "garments_right": int(right.sum()),
        "scenes": n,
        "scenes_right": int((right == present).all(1).sum()),
    }
