"""What goes in and out of serve-models over HTTP: the one-line errors (:class:`HTTPError`, and the answer for any
exception a request raises), a request body read within its size and time limits, an uploaded image, a ``.npy``
tensor batch, and a segmentation mask as a base64 PNG."""

from __future__ import annotations

import asyncio
import base64
import io
import sys
import traceback
from collections.abc import AsyncGenerator, Mapping

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse
from PIL import Image
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from attnzoo.errors import first_line
from attnzoo.limits import MAX_UPLOAD_BYTES
from attnzoo.preprocess import ImageTooLargeError, UnreadableImageError
from attnzoo.serve.rayserve.environment import BODY_TIMEOUT_S

__all__ = ["HTTPError", "NPY_TYPE", "read_image_upload", "mask_png", "decode_mask", "BODY_TIMEOUT_S"]

#: Content type of the tensor route's body and answer.
NPY_TYPE = "application/x-npy"
#: Room for the multipart envelope (boundaries, part headers, form fields) on top of the file itself.
_MULTIPART_SLACK = 64 * 1024


class HTTPError(Exception):
    """An answer other than 200: ``status`` and one line for ``{"error": ...}`` (and ``headers``, e.g.
    ``Retry-After``)."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=dict(headers or {}) or None)


def _size(n: float) -> str:
    """Bytes for a message: ``612 KiB``, ``1.2 GiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{int(n)} bytes"


def _as_http_error(exc: BaseException) -> HTTPError:
    """The answer for an exception raised while handling a request (a traceback only goes to the log)."""
    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, ClientDisconnect):  # nobody reads the answer; counted apart from the server's faults
        return HTTPError(499, "the client closed the connection before its request arrived")
    if isinstance(exc, ImageTooLargeError):
        return HTTPError(413, first_line(exc))
    if isinstance(exc, UnreadableImageError):
        return HTTPError(
            400,
            "cannot read the image: not an image file, or a damaged one (PNG, JPEG, WebP, BMP, GIF, TIFF ... are read)",
        )
    if isinstance(exc, ValueError):  # the demo's own messages for bad input (e.g. non-finite outputs)
        return HTTPError(400, first_line(exc))
    traceback.print_exception(exc, file=sys.stderr)
    return HTTPError(500, f"internal error ({type(exc).__name__}); see the server log")


def _upload_too_large(size: int | None, limit: int, head: bytes) -> str:
    said = f"{_size(size)}, " if size is not None else ""
    return f"the request is {said}over the {_size(limit)} upload limit"


async def _body(request: Request, limit: int, too_large=_upload_too_large, peek: int = 0) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit``; a Content-Length over it is refused
    before anything is read, or once ``peek`` bytes are (what ``too_large(declared size or None, limit, the first
    bytes)`` needs to say why in one line). 408 when it has not arrived within :data:`BODY_TIMEOUT_S`."""
    declared = request.headers.get("content-length")
    size = int(declared) if declared is not None and declared.isdigit() else None
    over = size is not None and size > limit
    body = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit or (over and len(body) >= peek):
                break

    if not over or peek:
        try:  # asyncio.wait_for, not asyncio.timeout: Python 3.10 has no asyncio.timeout
            await asyncio.wait_for(read(), BODY_TIMEOUT_S)
        except asyncio.TimeoutError:  # TimeoutError from 3.11 on, its own class on 3.10
            raise HTTPError(
                408,
                f"the request body did not arrive within {BODY_TIMEOUT_S:g} s ({_size(len(body))} came); send it again",
            ) from None
    if over or len(body) > limit:
        raise HTTPError(413, too_large(size, limit, bytes(body[: max(peek, 1)])))
    return bytes(body)


async def read_image_upload(request: Request) -> bytes:
    """The uploaded file's bytes: the first file of a ``multipart/form-data`` body (field ``file``), or the
    raw body otherwise; 413 over :data:`attnzoo.limits.MAX_UPLOAD_BYTES`, 400 when there is none."""
    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        data = await _body(request, MAX_UPLOAD_BYTES)
    else:
        raw = await _body(request, MAX_UPLOAD_BYTES + _MULTIPART_SLACK)

        async def one_chunk() -> AsyncGenerator[bytes, None]:
            yield raw

        try:
            form = await MultiPartParser(request.headers, one_chunk(), max_files=1, max_fields=16).parse()
        except MultiPartException as exc:
            raise HTTPError(400, f"malformed multipart body: {exc.message}") from None
        files = [v for v in form.values() if hasattr(v, "read")]
        if not files:
            raise HTTPError(
                400, "no file in the multipart body; send the image as field 'file' (curl -F file=@image.png)"
            )
        data = await files[0].read()
        if len(data) > MAX_UPLOAD_BYTES:
            raise HTTPError(
                413,
                f"the file is {len(data) / 2**20:.1f} MiB, over the {MAX_UPLOAD_BYTES / 2**20:.0f} MiB upload limit",
            )
    if not data:
        raise HTTPError(
            400,
            "no image: send it as multipart field 'file' (curl -F file=@image.png) or as the "
            "request body (curl --data-binary @image.png)",
        )
    return data


def mask_png(mask: np.ndarray) -> str:
    """A class-id mask as a base64 PNG: 8-bit gray for up to 256 classes, else 16-bit (pixel value = class)."""
    arr = mask.astype(np.uint8) if mask.max(initial=0) < 256 else mask.astype(np.uint16)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode_mask(text: str) -> np.ndarray:
    """The inverse of :func:`mask_png` (for clients and tests)."""
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(text))))


def _npy_shape(head: bytes) -> tuple[tuple[int, ...], str] | None:
    """(shape, dtype) from the start of a ``.npy`` body, or None when it is not one."""
    try:
        header_file = io.BytesIO(head)
        version = np.lib.format.read_magic(header_file)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(header_file)
        return tuple(shape), str(dtype)
    except Exception:  # not .npy, or a header cut short
        return None


def _load_npy(data: bytes) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # numpy raises ValueError, OSError, EOFError ... for a body that is not .npy
        raise HTTPError(400, f"the body is not a .npy array ({type(exc).__name__}: {first_line(exc)})") from None
