"""What the demo reads from a client: only regular files in its upload folder or its examples, at most
:data:`MAX_FILE_SIZE` bytes, opened without blocking and decoded only once admitted by their size; and the
server's own upload folder, removed with everything in it when the server stops.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gradio.utils import get_upload_folder
from PIL import Image

from attnzoo.errors import quoted
from attnzoo.limits import MAX_UPLOAD_BYTES
from attnzoo.preprocess import UnreadableImageError, image_size, load_image
from attnzoo.serve import examples as ex
from attnzoo.serve.admission import SizeGate

MAX_FILE_SIZE = MAX_UPLOAD_BYTES  # bytes; the one upload cap (attnzoo.limits), serve-models too
#: Uploads are kept this long (seconds) for a user to re-run them, then deleted by a sweep this often.
UPLOAD_MAX_AGE_S = 600
UPLOAD_SWEEP_S = 60


def upload_roots() -> tuple[Path, ...]:
    """The only folders the demo reads images from: Gradio's upload cache (where every file a client sends
    lands, ``GRADIO_TEMP_DIR``) and the shipped examples."""
    return tuple(Path(os.path.realpath(p)) for p in (get_upload_folder(), ex.EXAMPLES_DIR))


def _upload_bytes(payload: Any, roots: Sequence[Path] | None = None) -> tuple[bytes, str]:
    """Raw ``gr.Image`` payload (dict with ``path``, or a path) -> the file's bytes and its name as messages show
    it; ``ValueError`` if none.

    The handlers take payloads unprocessed, so a client can put any path in one: only a regular file inside
    :func:`upload_roots` is read (the path resolved first, so a link cannot lead out), opened without blocking
    (a FIFO or device never holds the model slot) and at most ``MAX_FILE_SIZE`` bytes of it.
    """
    name = None
    if isinstance(payload, dict):
        name = payload.get("orig_name")
        payload = payload.get("path")
    if not payload:
        raise ValueError("no image: upload one (or pick an example) first")
    if not isinstance(payload, (str, os.PathLike)):
        raise ValueError("no image: the request's image is not a file uploaded to this demo")
    shown = quoted(str(name or Path(payload).name))
    real = Path(os.path.realpath(payload))
    if not any(real.is_relative_to(root) for root in (roots or upload_roots())):
        raise ValueError(f"cannot read image {shown}: the demo reads only files uploaded to it and its examples")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        raise ValueError(f"cannot read image {shown}: no such upload (upload it again)") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a folder, FIFO or device: refused before Python's file object opens it
        os.close(fd)
        raise ValueError(f"cannot read image {shown}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > MAX_FILE_SIZE:
            raise ValueError(
                f"cannot read image {shown}: {info.st_size / 2**20:.1f} MiB, over the "
                f"{MAX_FILE_SIZE / 2**20:.0f} MiB upload limit"
            )
        return f.read(MAX_FILE_SIZE + 1), shown


def _unreadable(shown: str) -> ValueError:
    return ValueError(
        f"cannot read image {shown}: not an image file, or a damaged one (PNG, JPEG, WebP, BMP, GIF, TIFF ... are read)"
    )


def _decoded(data: bytes, shown: str) -> Image.Image:
    try:
        img = load_image(data)  # over the pixel cap or a decompression bomb: its own message passes through
    except UnreadableImageError:
        raise _unreadable(shown) from None
    if img.width * img.height == 0:
        raise ValueError("cannot read image: it has no pixels")
    return img


def _read_upload(payload: Any, roots: Sequence[Path] | None = None) -> Image.Image:
    """Raw ``gr.Image`` payload -> RGB PIL image (:func:`_upload_bytes`, then decoded); ``ValueError`` if none."""
    return _decoded(*_upload_bytes(payload, roots))


@contextlib.contextmanager
def _admitted_upload(payload: Any, roots: Sequence[Path], gate: SizeGate) -> Iterator[Image.Image]:
    """The upload decoded once ``gate`` admits it by the size its header gives (nothing decoded before), held
    until the block ends."""
    data, shown = _upload_bytes(payload, roots)
    try:
        w, h = image_size(data)  # over the pixel cap: its own message passes through
    except UnreadableImageError:
        raise _unreadable(shown) from None
    with gate.admitted(w * h, f"image {shown} ({w}x{h})"):
        yield _decoded(data, shown)


@contextlib.contextmanager
def private_upload_folder() -> Iterator[Path]:
    """Uploads of this server go to a folder of its own (``GRADIO_TEMP_DIR``), removed with everything in it
    when the block ends; a ``GRADIO_TEMP_DIR`` the user set is used as it is and left in place."""
    given = os.environ.get("GRADIO_TEMP_DIR")
    if given:
        yield Path(given)
        return
    folder = Path(tempfile.mkdtemp(prefix="attnzoo-demo-uploads-"))
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop("GRADIO_TEMP_DIR", None)
        shutil.rmtree(folder, ignore_errors=True)
