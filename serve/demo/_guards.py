"""The demo's ASGI guards: a request body over its route's limit gets 413 before the app reads it, an API request
naming a file the demo must not touch gets 400, and uploads have a quota per client and in all (429, 503).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from attnzoo.errors import quoted
from attnzoo.serve.demo._uploads import MAX_FILE_SIZE, UPLOAD_MAX_AGE_S, upload_roots

#: Largest body of any other request (an event's JSON: file references, a variant name, a number): refused with
#: 413 before it is read, by its Content-Length or as it streams in (:class:`BodyLimit`).
MAX_API_BODY = 2**20
#: Room for the multipart envelope on top of an uploaded file.
_MULTIPART_SLACK = 64 * 1024
#: What one client (IP address) may upload within :data:`UPLOAD_MAX_AGE_S`: files (one per upload request at
#: least, each file its answer lists) and bytes (each request's Content-Length); then 429 (:class:`UploadQuota`).
UPLOAD_FILES_PER_CLIENT = 100
UPLOAD_BYTES_PER_CLIENT = 128 * 2**20
#: What all clients together may upload within :data:`UPLOAD_MAX_AGE_S` (what the upload folder holds at most,
#: until the next sweep): then 503.
UPLOAD_BYTES_TOTAL = 2**30


class BodyLimit:
    """ASGI middleware: a request body over its route's limit gets 413 (one JSON line) before the app reads it. An
    upload (``.../upload``) may carry :data:`MAX_FILE_SIZE` plus its multipart envelope (Gradio streams it to disk
    and checks the file's size itself); any other request :data:`MAX_API_BODY`, read here in full (so it never
    reaches Gradio larger) and handed on."""

    def __init__(self, app, upload_limit: int = MAX_FILE_SIZE + _MULTIPART_SLACK, limit: int = MAX_API_BODY) -> None:
        self.app, self.upload_limit, self.limit = app, upload_limit, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        upload = scope.get("path", "").rstrip("/").endswith("/upload")
        limit = self.upload_limit if upload else self.limit
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await self._refuse(send, int(declared), limit)
        if upload:
            return await self.app(scope, receive, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return await self._refuse(send, None, limit)
        refused = _payload_problem(bytes(body))
        if refused:
            return await _answer(send, 400, refused)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()  # the app waits for a disconnect: pass it on
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send, size: int | None, limit: int) -> None:
        said = f"{size:,} bytes, " if size is not None else ""
        await _answer(send, 413, f"the request body is {said}over the {limit:,}-byte limit")


async def _answer(send, status: int, error: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """One JSON line ``{"error": ...}`` with ``status``; the connection is closed after it."""
    text = json.dumps({"error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(text)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": text})


def _paths(value: Any, depth: int = 0) -> Iterator[str]:
    """Every ``path`` / ``url`` string of a request's JSON (file payloads), a few levels deep."""
    if depth > 4:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("path", "url") and isinstance(item, str):
                yield item
            else:
                yield from _paths(item, depth + 1)
    elif isinstance(value, list):
        for item in value[:16]:
            yield from _paths(item, depth + 1)


def _payload_problem(body: bytes) -> str | None:
    """Why an API request's JSON names a file the demo must not touch, before Gradio sees it (Gradio itself would
    download a ``path`` that is a URL, and log a traceback for a path outside its cache): a URL, or a path outside
    :func:`upload_roots`. None for anything else (other requests, other JSON)."""
    try:
        data = json.loads(body) if body[:1] == b"{" else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    roots = upload_roots()
    for path in _paths(data.get("data")):
        shown = quoted(path)
        if "://" in path[:16]:
            if path.startswith(("http://", "https://")) and "/gradio_api/file=" in path:
                continue  # the demo's own file URL (a url field beside the path): Gradio does not fetch it
            return f"cannot read image {shown}: the demo works offline and reads only files uploaded to it"
        real = Path(os.path.realpath(path))
        if not any(real.is_relative_to(root) for root in roots):
            return f"cannot read image {shown}: the demo reads only files uploaded to it and its examples"
    return None


class UploadQuota:
    """ASGI middleware on the upload route: each client (IP address) may upload :data:`UPLOAD_FILES_PER_CLIENT`
    files and :data:`UPLOAD_BYTES_PER_CLIENT` bytes within :data:`UPLOAD_MAX_AGE_S` (then 429 with
    ``Retry-After``), all of them together :data:`UPLOAD_BYTES_TOTAL` (then 503); an upload without a
    Content-Length gets 411. Bytes are charged from the Content-Length before anything is written; files from the
    answer (the paths Gradio wrote), at least one per upload."""

    def __init__(
        self,
        app,
        files: int = UPLOAD_FILES_PER_CLIENT,
        per_client: int = UPLOAD_BYTES_PER_CLIENT,
        total: int = UPLOAD_BYTES_TOTAL,
        keep_s: float = UPLOAD_MAX_AGE_S,
    ) -> None:
        self.app, self.files, self.per_client, self.total, self.keep_s = app, files, per_client, total, keep_s
        self.log: list[list] = []  # [time, client, bytes, files], oldest first

    async def __call__(self, scope, receive, send) -> None:
        upload = scope.get("path", "").rstrip("/").endswith("/upload")
        if scope["type"] != "http" or scope.get("method") != "POST" or not upload:
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if not declared.isdigit():
            return await _answer(send, 411, "an upload must state its size (Content-Length)")
        now, size = time.monotonic(), int(declared)
        self.log = [e for e in self.log if now - e[0] < self.keep_s]
        client = (scope.get("client") or ("unknown",))[0]
        mine = [e for e in self.log if e[1] == client]
        files, used = sum(e[3] for e in mine), sum(e[2] for e in mine)
        if files + 1 > self.files or used + size > self.per_client:
            wait = int(self.keep_s - (now - mine[0][0])) + 1 if mine else int(self.keep_s)
            return await _answer(
                send,
                429,
                f"upload quota reached: {files} files, {used / 2**20:.1f} MiB of this client's {self.files} files "
                f"and {self.per_client / 2**20:.0f} MiB per {self.keep_s / 60:g} minutes; retry in {wait} s",
                [(b"retry-after", str(wait).encode())],
            )
        if sum(e[2] for e in self.log) + size > self.total:
            return await _answer(
                send,
                503,
                f"the demo holds its {self.total / 2**20:.0f} MiB of uploads; retry in a few minutes",
                [(b"retry-after", b"60")],
            )
        entry = [now, client, size, 1]
        self.log.append(entry)
        body = bytearray()

        async def counting(message) -> None:
            if message["type"] == "http.response.body" and len(body) < 2**20:
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    with contextlib.suppress(ValueError):
                        answer = json.loads(bytes(body))
                        entry[3] = max(1, len(answer)) if isinstance(answer, list) else 1
            await send(message)

        await self.app(scope, receive, counting)
