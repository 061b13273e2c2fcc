"""A runtime session scored on a data set: predictions batch by batch, refusing non-finite logits, the confusion
matrix they give, and runs of any runtime scored side by side on a model's test split. Used by the accuracy gates
of ``export-model`` (int8 ONNX and OpenVINO IR), bf16 serving and the studies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from tqdm import tqdm

from attnzoo.lazy import lazy_import
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize

# torch, by way of the data sets and the metrics: the runtime imports without it
metrics = lazy_import("attnzoo.metrics")
datasets = lazy_import("attnzoo.data.datasets")

__all__ = ["EVAL_BATCH", "predict_session", "evaluate_session", "score_runs", "load_test_split"]

#: Test images per inference call while scoring (the timed batch sizes are ``--batch-sizes``).
EVAL_BATCH = 64


def predict_session(
    run: Callable[[np.ndarray], np.ndarray], images: np.ndarray, batch_size: int = EVAL_BATCH
) -> np.ndarray:
    """Argmax over the class axis of a session's logits, batch by batch (labels (N,) or masks (N, H, W)).
    ``run``: images -> logits, a backend session's :meth:`~attnzoo.runtime.backends.Session.run`.

    Raises:
        FloatingPointError: a batch's logits are not all finite (an argmax of NaN would still name a class, and
            the model would be scored as merely inaccurate).
    """
    preds = []
    for i in range(0, len(images), batch_size):
        logits = run(images[i : i + batch_size])
        if not np.isfinite(logits).all():
            raise FloatingPointError(
                f"the ONNX model gives non-finite logits on test images {i}-{min(i + batch_size, len(images)) - 1}"
            )
        preds.append(logits.argmax(1))
    return np.concatenate(preds)


def evaluate_session(
    run: Callable[[np.ndarray], np.ndarray],
    images: np.ndarray,
    targets: np.ndarray,
    num_classes: int,
    task: str,
    batch_size: int = EVAL_BATCH,
) -> np.ndarray:
    """Confusion matrix (true x predicted; pixels for seg) of a session's ``run`` on normalized NCHW images."""
    return metrics.confusion_matrix(targets, predict_session(run, images, batch_size), num_classes).numpy()


def score_runs(
    runs: Mapping[str, Callable[[np.ndarray], np.ndarray]],
    config: Mapping[str, Any],
    *,
    limit: int | None = None,
    progress: bool = False,
    desc: str = "test-set accuracy",
) -> dict[str, Any]:
    """Score each ``run(x) -> logits`` (a session of any runtime) on the model's test split, all on the same images.

    Classifiers: top-1 on the test split (Fashion-MNIST: the official 10,000 test images); segmenters: mIoU on the
    test scenes. Data loading, preprocessing and metrics are the training code's
    (:func:`attnzoo.data.datasets.load_data`, :func:`attnzoo.preprocess.normalize`,
    :func:`attnzoo.metrics.metrics_from_confusion`; the split, size, data seed, scene and normalisation of the
    model's config); predictions come from :func:`predict_session`, which refuses non-finite logits.

    Args:
        runs: ``{label: run}``, e.g. ``{"fp32": ..., "int8": ...}``.
        config: The model config (``data``, ``task``, ``img_size``, ``data_seed``, ``scene``, ``mean``, ``std``).
        limit: First ``limit`` test images only (default: the whole split).

    Returns:
        ``{"data", "split": "test", "n_images", "metric_name", "metrics": {label: percent},
        "agreement": {label: share of predictions equal to the first run's}}``.

    Raises:
        ValueError: the config names no data set (an untrained model has no test split).
    """
    if not config.get("data") or config.get("untrained"):
        raise ValueError("the model names no data set (untrained or config-less): it has no test split to score on")
    task = config["task"]
    x, y, class_names = load_test_split(config, limit)
    k = len(class_names)
    scores, preds, name = {}, {}, "top1"
    for label, run in tqdm(list(runs.items()), desc=desc, unit="model", disable=not progress):
        pred = predict_session(run, x, EVAL_BATCH)
        m = metrics.metrics_from_confusion(metrics.confusion_matrix(y, pred, k), task, class_names)
        scores[label], name, preds[label] = float(m["metric"]), m["metric_name"], pred
    first = next(iter(preds.values()))
    return {
        "data": config["data"],
        "split": "test",
        "n_images": len(x),
        "metric_name": name,
        "metrics": scores,
        "agreement": {k_: float(np.mean(p == first)) for k_, p in preds.items()},
    }


def load_test_split(config: Mapping[str, Any], limit: int | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The model's test split as its config says (data set, size, data seed, scene), normalised as the model
    expects: ``(images NCHW float32, labels or masks, class names)``; the first ``limit`` images only when given."""
    task, size = config["task"], int(config["img_size"])
    data = datasets.load_data(
        config["data"], "test", task, size, n=limit, seed=int(config.get("data_seed", 0)), scene=config.get("scene")
    )
    x = normalize(data.images, config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))
    if task == "cls":
        return x, data.labels, list(data.class_names)
    assert data.masks is not None  # load_data's seg sets carry masks
    return x, data.masks.astype(np.int64), list(data.class_names)
