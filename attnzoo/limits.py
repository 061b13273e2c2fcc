"""The bounds every command checks before it starts work, in one place (the README's "Errors" section
quotes them).

A request past a bound is refused with one line naming the bound, before anything is allocated or written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Sequence
from typing import Any

from attnzoo.errors import MAX_NAME_SHOWN, quoted

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_IMAGE_PIXELS",
    "MAX_UPLOAD_BYTES",
    "MAX_ONNX_BYTES",
    "MAX_SIDE",
    "MAX_CLASSES",
    "MAX_NAME_SHOWN",  # (defined beside attnzoo.errors.quoted, which cuts to it)
    "PLUGIN_REGISTER_TIMEOUT_S",
    "check_batch_sizes",
    "check_side",
    "available_memory",
    "return_free_memory",
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
#: Longest a variant plugin's entry point (its import and its ``register()``) may take before it is skipped with
#: one warning (:func:`attnzoo.models.registry.load_plugins`): a plugin that hangs never blocks a command.
PLUGIN_REGISTER_TIMEOUT_S = 30.0


def check_batch_sizes(sizes: Sequence[int], flag: str = "--batch-sizes") -> None:
    """``ValueError`` unless every size is in ``1..MAX_BATCH_SIZE``."""
    bad = [b for b in sizes if not 1 <= b <= MAX_BATCH_SIZE]
    if bad:
        raise ValueError(f"{flag}: {', '.join(map(str, bad))} out of range; batch sizes must be in 1..{MAX_BATCH_SIZE}")


def check_side(value: Any, what: str) -> int:
    """``value`` as an int in ``1..MAX_SIDE``; ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIDE:
        raise ValueError(f"{what} must be an integer in 1..{MAX_SIDE}, got {quoted(value)}")
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


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (another C library, or none found)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def return_free_memory() -> bool:
    """Hand the memory this process has freed back to the system (glibc's ``malloc_trim(0)``, every arena); True
    when it was called. The servers call it after a large decode: glibc keeps the freed pages of blocks below its
    mmap threshold (up to 32 MiB, e.g. Pillow's 16 MiB image blocks) in its per-thread arenas, so without it a
    server's resident memory only grows, round after round of large images."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
