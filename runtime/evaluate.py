"""A runtime session scored on a data set: predictions batch by batch, refusing non-finite logits, and the
confusion matrix they give. Used by the int8 accuracy gate of ``export-model`` and the studies.
"""

from __future__ import annotations

import numpy as np

from attnzoo.lazy import lazy_import

from .sessions import ort_session

metrics = lazy_import("attnzoo.metrics")  # torch: the runtime imports without it

__all__ = ["EVAL_BATCH", "cpu_session", "predict_session", "evaluate_session"]

#: Test images per inference call while scoring (the timed batch sizes are ``--batch-sizes``).
EVAL_BATCH = 64


def predict_session(sess, images: np.ndarray, batch_size: int = EVAL_BATCH) -> np.ndarray:
    """Argmax over the class axis of an ONNX session's logits, batch by batch (labels (N,) or masks (N, H, W)).
    ``sess``: an ONNX Runtime session, or any ``run(x) -> logits`` (a backend session's ``run``).

    Raises:
        FloatingPointError: a batch's logits are not all finite (an argmax of NaN would still name a class, and
            the model would be scored as merely inaccurate).
    """
    name = None if callable(sess) else sess.get_inputs()[0].name
    run = sess if callable(sess) else (lambda x: sess.run(None, {name: x})[0])
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
    sess, images: np.ndarray, targets: np.ndarray, num_classes: int, task: str, batch_size: int = EVAL_BATCH
) -> np.ndarray:
    """Confusion matrix (true x predicted; pixels for seg) of an ONNX session on normalized NCHW images."""
    return metrics.confusion_matrix(targets, predict_session(sess, images, batch_size), num_classes).numpy()


def cpu_session(model, threads=None):
    """An ONNX Runtime CPU session of an ONNX file or of an in-memory ``onnx.ModelProto``."""
    data = model.SerializeToString() if hasattr(model, "SerializeToString") else model
    return ort_session(data, "cpu", threads=threads)
