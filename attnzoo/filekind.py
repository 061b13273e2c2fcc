"""What a file given as a model is, from the file system and its first bytes: the words an error line uses to say
why a path is not the model it should be ("is a directory", "is a text file, not an ONNX model file").

Only a regular file is opened (a FIFO or a device never is), and only its first :data:`SNIFF_BYTES` are read. The
kinds come from each format's own signature: safetensors' 8-byte header length followed by its JSON header, a zip
archive's local-file header (PyTorch's ``torch.save``, AOTInductor packages), a pickle's protocol opcode (PyTorch's
older saves), an ONNX model's first protobuf fields, XML's declaration, and a few formats a user may pick up by
mistake (images, NumPy arrays, gzip).
"""

from __future__ import annotations

import stat
import struct
from pathlib import Path

from attnzoo.fileio import PathLike

__all__ = [
    "SNIFF_BYTES",
    "MISSING",
    "DIRECTORY",
    "SAFETENSORS",
    "ZIP",
    "PICKLE",
    "ONNX",
    "TEXT",
    "BINARY",
    "file_kind",
    "CHECKPOINT_FORMS",
    "checkpoint_kind",
]

#: How much of a file is read to tell its kind.
SNIFF_BYTES = 512
MISSING = "no such file"
DIRECTORY = "a directory"
SAFETENSORS = "a safetensors file"
ZIP = "a zip archive"
PICKLE = "a pickle"
ONNX = "an ONNX model"
TEXT = "a text file"
BINARY = "binary data"

_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", ZIP),
    (b"PK\x05\x06", ZIP),
    (b"\x93NUMPY", "a NumPy array"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"\x1f\x8b", "a gzip file"),
    (b"<?xml", "an XML file"),
)
#: Protobuf tags of an ONNX ``ModelProto``'s usual second field (``producer_name`` ... ``opset_import``, ``graph``:
#: fields 2 to 8, length-delimited), after its first, ``ir_version`` (field 1, a varint: tag ``0x08``).
_ONNX_NEXT_TAGS = frozenset({0x12, 0x1A, 0x22, 0x2A, 0x32, 0x3A, 0x42})


def _special(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return DIRECTORY
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return None if stat.S_ISREG(mode) else "not a regular file"


def _is_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    (header,) = struct.unpack("<Q", head[:8])
    return 2 <= header <= size - 8 and head[8:9] == b"{"


def _is_onnx(head: bytes) -> bool:
    """``ir_version`` (a varint under 128 in any ONNX so far) followed by another field of the model."""
    return len(head) >= 3 and head[0] == 0x08 and head[1] < 0x80 and head[2] in _ONNX_NEXT_TAGS


def _is_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a multi-byte character cut at the end of the sample is still text
        if exc.start < len(head) - 3:
            return False
        text = head[: exc.start].decode("utf-8")
    return all(c.isprintable() or c in "\t\n\r\f\v" for c in text)


def file_kind(path: PathLike) -> str:
    """``path``'s kind in words: :data:`MISSING`, :data:`DIRECTORY`, ``a FIFO``, ``a socket``, ``a device``, ``an
    empty file``, or (a regular file, from its first bytes) :data:`SAFETENSORS`, :data:`ZIP`, :data:`PICKLE`,
    :data:`ONNX`, ``a NumPy array``, ``a PNG image`` ..., :data:`TEXT`, else :data:`BINARY`; ``unreadable
    (<reason>)`` when it cannot be opened. A symbolic link is followed."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        return MISSING
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    special = _special(info.st_mode)
    if special:
        return special
    if info.st_size == 0:
        return "an empty file"
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    for signature, kind in _SIGNATURES:
        if head.startswith(signature):
            return kind
    if _is_safetensors(head, info.st_size):
        return SAFETENSORS
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return PICKLE
    if _is_onnx(head):
        return ONNX
    return TEXT if _is_text(head) else BINARY


#: What a checkpoint is, in words, for the line that refuses something else.
CHECKPOINT_FORMS = "a .safetensors checkpoint from train-model, or a PyTorch state dict"


def checkpoint_kind(path: PathLike) -> str:
    """Whether the checkpoint ``path`` is read as safetensors (:data:`SAFETENSORS`: by its content, or by its name
    where its first bytes are of no kind :func:`file_kind` knows, so that safetensors itself says what is wrong with
    it, a cut header for instance) or as a PyTorch save (:data:`ZIP` or :data:`PICKLE`, by their content).

    Raises:
        ValueError: one line saying what ``path`` is instead: missing, a directory or another non-regular file (never
            opened), empty, an ONNX model, a text file, an image, binary data of no known format ...
    """
    path = Path(path)
    kind = file_kind(path)
    if kind == MISSING:
        raise ValueError(f"{path}: {MISSING}")
    if kind in (SAFETENSORS, ZIP, PICKLE):
        return kind
    if kind == BINARY and path.suffix == ".safetensors":
        return SAFETENSORS
    what = f"{BINARY} of no known format" if kind == BINARY else kind
    raise ValueError(f"{path}: is {what}, not a checkpoint ({CHECKPOINT_FORMS})")
