"""A runtime session scored on a data set: predictions batch by batch, refusing non-finite logits, and the
confusion matrix they give. Used by the int8 accuracy gate of ``export-model`` and the studies.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from attnzoo.lazy import lazy_import

metrics = lazy_import("attnzoo.metrics")  # torch: the runtime imports without it

__all__ = ["EVAL_BATCH", "predict_session", "evaluate_session"]

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
