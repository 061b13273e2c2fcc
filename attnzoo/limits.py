"""The bounds every command checks before it starts work, in one place (the README's "Errors" section
quotes them).

A request past a bound is refused with one line naming the bound, before anything is allocated or written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_IMAGE_PIXELS",
    "MAX_UPLOAD_BYTES",
    "MAX_ONNX_BYTES",
    "MAX_SIDE",
    "MAX_CLASSES",
    "check_batch_sizes",
    "check_side",
    "available_memory",
]

#: Largest batch size ``export-model`` verifies (and puts in a TensorRT profile) and ``bench-latency`` times.
MAX_BATCH_SIZE = 1024
#: Largest image (width x height) decoded by :func:`attnzoo.preprocess.load_image`: 40 megapixels, checked
#: from the file's header before any pixel is decoded (a decompression-bomb guard).
MAX_IMAGE_PIXELS = 40_000_000
#: Largest uploaded file the servers take (the demo's upload cap; serve-models answers 413 past it).
MAX_UPLOAD_BYTES = 10 * 2**20
#: Largest ONNX file read (protobuf's own 2 GiB cap; bigger models keep their weights in external data): checked
#: from the file's size before any byte is parsed.
MAX_ONNX_BYTES = 2**31 - 1
#: Largest model input side in pixels: a checkpoint's ``img_size``, an ONNX file's input size, ``--input-size``.
MAX_SIDE = 2048
#: Most classes a model config may declare (ImageNet-21k has 21,841).
MAX_CLASSES = 100_000


def check_batch_sizes(sizes: Sequence[int], flag: str = "--batch-sizes") -> None:
    """``ValueError`` unless every size is in ``1..MAX_BATCH_SIZE``."""
    bad = [b for b in sizes if not 1 <= b <= MAX_BATCH_SIZE]
    if bad:
        raise ValueError(f"{flag}: {', '.join(map(str, bad))} out of range; batch sizes must be in 1..{MAX_BATCH_SIZE}")


def check_side(value: Any, what: str) -> int:
    """``value`` as an int in ``1..MAX_SIDE``; ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIDE:
        raise ValueError(f"{what} must be an integer in 1..{MAX_SIDE}, got {value!r}")
    return value


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``), or None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
