"""What the servers serve: a :class:`ServedModel` (a float32 batch (N, 3, H, W) to logits, with the contract the
pages and routes need), made from an exported file's metadata or a checkpoint's config, and the bounds of a
tensor-route request."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnzoo.limits import MAX_UPLOAD_BYTES
from attnzoo.modelconfig import check_logits
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, input_style_of
from attnzoo.runtime.backends import ONNX_REFERENCE

__all__ = [
    "AUTO",
    "REFERENCE",
    "SLIDING_BATCH",
    "MAX_TENSOR_BATCH",
    "NPY_HEADER_ROOM",
    "MAX_TENSOR_BODY",
    "tensor_batch_limit",
    "ServedModel",
]


#: ``--backend auto``: the faster of the registry's CPU runtimes on this machine, measured at start-up on the
#: served files; any other value is a backend of :mod:`attnzoo.runtime.backends` (a name or an alias).
AUTO = "auto"
#: The backend the others are checked against: ONNX Runtime on the CPU, which verified every export.
REFERENCE = ONNX_REFERENCE
#: Most sliding windows run in one call (the TensorRT profile's largest batch).
SLIDING_BATCH = 16
#: Most images one request to serve-models' tensor route (``/models/{task}/{name}/logits``) carries; fewer where
#: they would not fit :data:`MAX_TENSOR_BODY` (:func:`tensor_batch_limit`).
MAX_TENSOR_BATCH = 64
#: Room for a ``.npy`` header on top of a tensor batch's data (numpy pads it to 64 bytes; 4 KiB is ample).
NPY_HEADER_ROOM = 4096
#: Largest tensor-route body: the largest upload with its multipart envelope, so that serve-models' ingress holds
#: it whole before a replica sees it (:data:`attnzoo.serve.rayserve.environment.INGRESS_BUFFER_BYTES`).
MAX_TENSOR_BODY = MAX_UPLOAD_BYTES + 64 * 1024


def tensor_batch_limit(input_size: Sequence[int]) -> int:
    """Most float32 ``(3, H, W)`` images of ``input_size`` one tensor-route request carries: at most
    :data:`MAX_TENSOR_BATCH`, and as many as fit :data:`MAX_TENSOR_BODY` (at least 1); the demo's
    ``--backend-url`` splits larger batches into requests of this many."""
    h, w = int(input_size[0]), int(input_size[1])
    return max(1, min(MAX_TENSOR_BATCH, (MAX_TENSOR_BODY - NPY_HEADER_ROOM) // (12 * h * w)))


@dataclass
class ServedModel:
    """One servable model.

    Attributes:
        name: Label shown in the variant dropdowns (the variant, or the file name when variants repeat).
        variant: Attention variant.
        task: ``cls`` or ``seg``.
        class_names: Class names, index = logit channel.
        input_size: (H, W) the model was exported / trained at.
        mean, std: Normalisation.
        fixed_size: True when the backend only takes ``input_size`` inputs (exported ONNX); segmentation then
            pads or tiles with windows of that size.
        run: Float32 (N, 3, H, W) -> float32 logits (N, K) or (N, K, H, W).
        source: File it was loaded from.
        backend: The registry's name of the backend that runs it (``ort-cpu``, ``openvino``, ``eager`` ...).
        arch: Architecture name (``micro`` ...), from the metadata.
        backend_note: Why this backend serves it (``auto``'s measurement), for the page.
        input_style: How an upload is converted before preprocessing (:data:`attnzoo.preprocess.INPUT_STYLES`).
        score: The zoo's measured test metric of the model (``score_name``: ``top1`` or ``miou``), or None.
        timm_name: A zoo model's timm name (:mod:`attnzoo.zoo.names`; its card, where one ships), else ``""``.
    """

    name: str
    variant: str
    task: str
    class_names: list[str]
    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    fixed_size: bool
    run: Callable[[np.ndarray], np.ndarray] = field(repr=False)
    source: str = ""
    backend: str = REFERENCE
    arch: str = ""
    backend_note: str = ""
    input_style: str = "rgb"
    score: float | None = None
    score_name: str = ""
    dtype: str = "fp32"
    timm_name: str = ""


def _from_config(
    config: dict,
    run: Callable,
    fixed: bool,
    source: Path,
    backend: str,
    input_size: Sequence[int] | None = None,
    input_style: str | None = None,
) -> ServedModel:
    size = input_size or (config["img_size"], config["img_size"])
    names = [str(c) for c in config.get("class_names") or range(int(config["num_classes"]))]
    return ServedModel(
        name=str(config["variant"]),
        variant=str(config["variant"]),
        task=str(config["task"]),
        class_names=names,
        input_size=(int(size[0]), int(size[1])),
        mean=tuple(config.get("mean", DEFAULT_MEAN)),
        std=tuple(config.get("std", DEFAULT_STD)),
        fixed_size=fixed,
        run=run,
        source=str(source),
        backend=backend,
        arch=str(config.get("arch", "")),
        input_style=input_style or input_style_of(config),
    )


def _warmed_up(model: ServedModel) -> ServedModel:
    """Run ``model`` once on zeros (the first call allocates, so the first latency shown is a real one) and check
    that it outputs one logit channel per class name; ``ValueError`` naming both counts otherwise."""
    out = model.run(np.zeros((1, 3, *model.input_size), np.float32))
    check_logits(model.class_names, out.shape, model.task, Path(model.source).name)
    return model
