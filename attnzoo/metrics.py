"""Metrics in percent from a confusion matrix: top-1 for classifiers, mIoU with per-class IoU for segmenters.

One implementation for training's evaluation, the int8 accuracy gate of ``export-model`` and the studies.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np
import torch

__all__ = ["metric_name", "confusion_matrix", "metrics_from_confusion"]


def metric_name(task: str) -> str:
    """``top1`` for classification, ``miou`` for segmentation (both in percent)."""
    return "top1" if task == "cls" else "miou"


def confusion_matrix(true, pred, num_classes: int) -> torch.Tensor:
    """Confusion matrix (true x predicted) of two equal-shape arrays or tensors of class indices."""
    true, pred = torch.as_tensor(true, dtype=torch.int64), torch.as_tensor(pred, dtype=torch.int64)
    return torch.bincount((true * num_classes + pred).reshape(-1),
                          minlength=num_classes ** 2).reshape(num_classes, num_classes)


def metrics_from_confusion(conf: torch.Tensor, task: str, class_names) -> Dict[str, Any]:
    """Top-1 (cls) or mIoU with per-class IoU (seg), in percent. mIoU averages the classes that occur in
    the ground truth or the prediction."""
    conf = conf.double()
    if task == "cls":
        total = conf.sum().item()
        return {"metric_name": "top1", "metric": 100.0 * conf.diag().sum().item() / max(total, 1.0),
                "n": int(total)}
    inter = conf.diag()
    union = conf.sum(0) + conf.sum(1) - inter
    iou = {name: (100.0 * inter[k].item() / union[k].item() if union[k] > 0 else None)
           for k, name in enumerate(class_names)}
    valid = [v for v in iou.values() if v is not None]
    return {"metric_name": "miou", "metric": float(np.mean(valid)) if valid else 0.0,
            "pixel_acc": 100.0 * inter.sum().item() / max(conf.sum().item(), 1.0), "per_class_iou": iou}
