"""The Ray Serve application behind ``serve-models``: one routed deployment over the verified ONNX models.

Each replica loads the models with the demo's loader (:func:`attnzoo.serve.loading.load_models`: the model
contract, one reused ONNX Runtime session or TensorRT engine per model, a warm-up that checks the logits
against the class names), after checking that every file has the sha256 the driver selected. Requests are
answered by the demo's own functions (:func:`attnzoo.serve.predict.classify` / ``segment``: the one
preprocessing path, sliding windows, the NaN check); their model calls go through one ``@serve.batch`` queue
per replica, which groups concurrent requests into dynamic batches per model (``max_batch_size``,
``batch_wait_ms``) and runs one batch at a time on a model thread.

HTTP routes (JSON unless said otherwise; errors are ``{"error": "one line"}`` with status 400, 404, 408, 413, 503
or, for a fault of the server, 500 without a traceback; a request whose client left counts as 499 in ``/stats``):

- ``POST /classify[?model=NAME&k=5]``: an image (multipart field ``file``, or the raw body) -> top classes;
- ``POST /segment[?model=NAME&max_side=PX]``: an image -> class-id mask as a base64 PNG, and pixel shares;
- ``POST /models/{task}/{name}/logits``: a preprocessed float32 batch as ``.npy`` -> logits as ``.npy`` (the
  demo's ``--backend-url`` uses it);
- ``GET /models``, ``GET /health``, ``GET /stats`` (this replica's counters and batch sizes).

Memory: the images a replica decodes at once share a budget (:class:`MemoryBudget`, sized by
:func:`decode_budget` from the memory the replica has): each upload reserves :data:`DECODE_BYTES_PER_PIXEL` per
pixel of its header's size before a pixel is decoded; one that finds no room within :data:`DECODE_WAIT_S` gets 503
(``Retry-After``), one larger than the whole budget 413. A ``/logits`` batch reserves its bytes the same way. A
large request hands the memory it freed back to the system before its reservation ends
(:data:`RETURN_MEMORY_BYTES`).
"""

# no "from __future__ import annotations": FastAPI reads the route signatures of the class-based view

import asyncio
import base64
import collections
import contextlib
import dataclasses
import io
import json
import os
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from PIL import Image
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from attnzoo.errors import first_line, quoted
from attnzoo.fileio import sha256_file
from attnzoo.limits import MAX_SIDE, MAX_UPLOAD_BYTES, available_memory, return_free_memory
from attnzoo.preprocess import ImageTooLargeError, UnreadableImageError, image_size
from attnzoo.serve import predict
from attnzoo.serve.admission import (
    DECODE_BYTES_PER_PIXEL,
    DECODE_MEMORY_CAP,
    DECODE_MEMORY_SHARE,
    RETURN_MEMORY_BYTES,
)
from attnzoo.serve.folders import recording_skips
from attnzoo.serve.loading import load_models
from attnzoo.serve.rayserve.config import DEPLOYMENT
from attnzoo.serve.rayserve.environment import BODY_TIMEOUT_S
from attnzoo.serve.served import MAX_TENSOR_BATCH, NPY_HEADER_ROOM, tensor_batch_limit

__all__ = [
    "ModelServer",
    "HTTPError",
    "build_app",
    "api",
    "MAX_TENSOR_BATCH",
    "NPY_TYPE",
    "mask_png",
    "decode_mask",
    "MemoryBudget",
    "decode_budget",
    "replica_memory",
    "DECODE_BYTES_PER_PIXEL",
    "DECODE_MEMORY_SHARE",
    "DECODE_MEMORY_CAP",
    "DECODE_WAIT_S",
    "RETURN_MEMORY_BYTES",
    "BODY_TIMEOUT_S",
]

#: Content type of the tensor route's body and answer.
NPY_TYPE = "application/x-npy"
#: Room for the multipart envelope (boundaries, part headers, form fields) on top of the file itself.
_MULTIPART_SLACK = 64 * 1024
#: Seconds a request waits for room in the decode budget before it gets 503 with ``Retry-After``.
DECODE_WAIT_S = 10.0
#: The settings ``GET /stats`` shows (not the file paths nor the pending models' files).
_PUBLIC_SETTINGS = (
    "backend",
    "threads",
    "dtype",
    "max_batch_size",
    "batch_wait_s",
    "replicas",
    "decode_memory_mb",
    "max_ongoing_requests",
)

api = FastAPI(title="attnzoo serve-models", docs_url=None, redoc_url=None)  # offline: no CDN-loaded docs pages


def _replica_grpc_on_loopback() -> None:
    """In a replica of the local Ray that ``serve-models`` starts (``ATTNZOO_SERVE_LOOPBACK=1``, see
    :data:`attnzoo.serve.rayserve.environment._LOOPBACK_ENV`): Ray Serve 2.60 binds each replica's inter-deployment gRPC
    server to ``[::]:0`` (all interfaces; ``Replica._on_initialized``, not a setting). This module is imported in
    the replica before that runs, so the address is rewritten to ``127.0.0.1:0`` here; a cluster joined with
    ``--address`` is left as Ray makes it. ``tests/serve/test_serve_models_lifecycle.py`` lists every listening
    socket."""
    from ray.serve._private import replica  # Ray's replica internals: loaded only in a replica, by this patch

    original = replica.add_port_to_grpc_server
    if getattr(original, "attnzoo_loopback", False):
        return

    def add_port(server, address: str):
        if address.startswith("[::]:"):
            address = "127.0.0.1:" + address.rsplit(":", 1)[1]
        return original(server, address)

    add_port.attnzoo_loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port


if os.environ.get("ATTNZOO_SERVE_LOOPBACK") == "1":
    _replica_grpc_on_loopback()


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


@api.exception_handler(HTTPError)
async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
    return _error(exc.status, exc.message, exc.headers)


def _size(n: float) -> str:
    """Bytes for a message: ``612 KiB``, ``1.2 GiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}" if n < 10 * scale else f"{n / scale:.0f} {unit}"
    return f"{int(n)} bytes"


def replica_memory() -> int | None:
    """Bytes this process can still take: the machine's available memory, or less where a cgroup (v2 or v1) limits
    this container's memory; None when neither is known."""
    known = [m for m in (available_memory(), _cgroup_room()) if m is not None]
    return min(known) if known else None


def _cgroup_room() -> int | None:
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            cap = Path(limit).read_text().strip()
            if cap == "max" or int(cap) >= 2**60:  # no limit
                return None
            return max(0, int(cap) - int(Path(usage).read_text()))
        except (OSError, ValueError):
            continue
    return None


def decode_budget(settings: Mapping[str, Any], memory: int | None = None) -> int:
    """Bytes the images one replica decodes at once may hold: ``decode_memory_mb`` when set, else
    :data:`DECODE_MEMORY_SHARE` of the replica's memory, i.e. of what this machine had available when the replica
    started (``memory``, default :func:`replica_memory`) split between the deployment's ``replicas`` (a local Ray
    runs them all here; on a cluster this is on the safe side), and at most :data:`DECODE_MEMORY_CAP` (also where
    the memory is unknown)."""
    if settings.get("decode_memory_mb"):
        return int(float(settings["decode_memory_mb"]) * 2**20)
    memory = replica_memory() if memory is None else memory
    if memory is None:
        return DECODE_MEMORY_CAP
    return min(DECODE_MEMORY_CAP, int(memory * DECODE_MEMORY_SHARE / max(1, int(settings.get("replicas", 1)))))


class MemoryBudget:
    """Bytes that concurrent work may hold at once, handed out first come, first served: a request that does not
    fit waits, and so does every request after it, so a large image is not starved by a stream of small ones.
    Used from the replica's event loop only."""

    def __init__(self, total: int) -> None:
        self.total = int(total)
        self.used = 0
        self.peak = 0
        self.waited = 0
        self.refused = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def _grant(self) -> None:
        while self._waiting:
            n, fut = self._waiting[0]
            if fut.done():  # given up
                self._waiting.popleft()
                continue
            if self.used + n > self.total:
                return
            self._waiting.popleft()
            self._take(n)
            fut.set_result(None)

    async def acquire(self, n: int, timeout: float) -> bool:
        """Take ``n`` bytes, waiting up to ``timeout`` s for them (in arrival order); False when they were not
        free in time. ``n`` over :attr:`total` never fits: check that first."""
        if not self._waiting and self.used + n <= self.total:
            self._take(n)
            return True
        self.waited += 1
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(entry[1]), timeout)
            return True
        except asyncio.TimeoutError:
            if entry[1].done():  # granted just as the wait ended
                return True
            self.refused += 1
            self._give_up(entry)
            return False
        except BaseException:  # the request was cancelled (its client went away) while it waited
            if entry[1].done() and not entry[1].cancelled():
                self.release(n)
            else:
                self._give_up(entry)
            raise

    def _give_up(self, entry: tuple[int, "asyncio.Future"]) -> None:
        entry[1].cancel()
        with contextlib.suppress(ValueError):
            self._waiting.remove(entry)
        self._grant()  # the requests behind it may fit

    def release(self, n: int) -> None:
        """Give back ``n`` bytes taken by :meth:`acquire`."""
        self.used -= n
        self._grant()

    def as_dict(self) -> dict[str, int]:
        return {
            "bytes": self.total,
            "in_use": self.used,
            "peak": self.peak,
            "waited": self.waited,
            "refused": self.refused,
        }


@api.exception_handler(StarletteHTTPException)
async def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404:
        detail = f"no route {request.method} {quoted(request.url.path)}; routes: {', '.join(ROUTES)}"
    return _error(exc.status_code, detail)


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path"))
    return _error(400, f"{where or 'request'}: {first.get('msg', 'invalid value')}")


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
        f = io.BytesIO(head)
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(f)
        return tuple(shape), str(dtype)
    except Exception:  # not .npy, or a header cut short
        return None


def _load_npy(data: bytes) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # numpy raises ValueError, OSError, EOFError ... for a body that is not .npy
        raise HTTPError(400, f"the body is not a .npy array ({type(exc).__name__}: {first_line(exc)})") from None


class _Stats:
    """This replica's counters (``GET /stats``)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: Counter = Counter()
        self.statuses: Counter = Counter()
        self.batches = 0
        self.batch_requests: Counter = Counter()  # requests per batch -> how many batches
        self.images = 0
        self.model_s = 0.0

    def as_dict(self) -> dict[str, Any]:
        n = sum(self.batch_requests.values())
        return {
            "uptime_s": round(time.time() - self.started, 3),
            "requests": dict(self.requests),
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "batches": self.batches,
            "images": self.images,
            "model_s": round(self.model_s, 4),
            "mean_requests_per_batch": (
                round(sum(k * v for k, v in self.batch_requests.items()) / n, 3) if n else None
            ),
            "requests_per_batch": {str(k): v for k, v in sorted(self.batch_requests.items())},
        }


#: Every route, for the 404 message.
ROUTES = (
    "POST /classify",
    "POST /segment",
    "POST /models/{task}/{name}/logits",
    "GET /models",
    "GET /health",
    "GET /stats",
)


@serve.deployment(name=DEPLOYMENT)
@serve.ingress(api)
class ModelServer:
    """One replica: the models, a batch queue, a model thread and a pool of request threads.

    Args:
        folder: Folder of the ONNX files (the same path on every node of a cluster).
        files: ``{file name: sha256}`` to load; a file with another hash stops the replica.
        settings: ``backend``, ``threads``, ``cache_dir``, ``max_batch_size``, ``batch_wait_s``,
            ``max_ongoing_requests``; ``pending`` (``[{"task", "name", "file"}]``) and ``ready_file``: zoo models
            the driver is still exporting, loaded on first use once ``ready_file`` lists them.
    """

    def __init__(self, folder: str, files: Mapping[str, str], settings: Mapping[str, Any]) -> None:
        for name, digest in files.items():
            if sha256_file(Path(folder) / name) != digest:
                raise RuntimeError(f"{Path(folder) / name} is not the file the driver verified (sha256 differs)")
        self.settings = dict(settings)
        self.folder = Path(folder)
        #: Files this replica could not load: file name -> the reason (the driver prints them, see ``skipped``).
        self.skipped: dict[str, str] = {}
        models = self._load(sorted(files))
        self.models = {(m.task, m.name): m for m in models}
        self.order = [(m.task, m.name) for m in models]
        #: The images being decoded (and ``/logits`` batches) share this many bytes (:func:`decode_budget`).
        self.decode = MemoryBudget(decode_budget(settings))
        #: Zoo models still being exported by the driver: (task, name) -> file; loaded on first use once the
        #: driver lists them in ``ready_file`` (``{file: sha256}``, written whole) with the sha256 to check.
        self.pending = {(p["task"], p["name"]): p["file"] for p in settings.get("pending", ())}
        self.ready_file = settings.get("ready_file")
        self.failed: set = set()  # pending models whose file did not load (the reason is in ``skipped``)
        self._load_lock = threading.Lock()
        # serve.batch makes _infer a batching wrapper with these setters; ray types it as the plain method.
        self._infer.set_max_batch_size(int(settings["max_batch_size"]))  # type: ignore[attr-defined]
        self._infer.set_batch_wait_timeout_s(float(settings["batch_wait_s"]))  # type: ignore[attr-defined]
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="attnzoo-model")
        self.request_threads = ThreadPoolExecutor(
            int(settings["max_ongoing_requests"]), thread_name_prefix="attnzoo-request"
        )
        self.stats = _Stats()
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside a replica (never in serve-models)
            self.replica = "local"

    # ------------------------------------------------------------------------------------------- batching
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def _infer(self, items: list[tuple[str, str, np.ndarray]]) -> list[np.ndarray]:
        """One dynamic batch: ``(task, name, float32 (n, 3, H, W))`` requests -> their logits, run on the
        model thread so the event loop keeps taking requests meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.model_thread, self._run_batch, items)

    def _run_batch(self, items: Sequence[tuple[str, str, np.ndarray]]) -> list[np.ndarray]:
        """Concatenate the requests of each model (and input shape), run each group once, split the logits."""
        start = time.perf_counter()
        groups: dict[tuple[str, str, tuple[int, ...]], list[int]] = {}
        for i, (task, name, x) in enumerate(items):
            groups.setdefault((task, name, tuple(x.shape[1:])), []).append(i)
        out: list[np.ndarray | None] = [None] * len(items)
        for (task, name, _), idx in groups.items():
            xs = [items[i][2] for i in idx]
            logits = self.models[(task, name)].run(np.concatenate(xs) if len(xs) > 1 else xs[0])
            offset = 0
            for i, x in zip(idx, xs, strict=False):
                out[i] = logits[offset : offset + len(x)]
                offset += len(x)
        self.stats.batches += 1
        self.stats.batch_requests[len(items)] += 1
        self.stats.images += sum(len(x) for _, _, x in items)
        self.stats.model_s += time.perf_counter() - start
        return out  # type: ignore[return-value]

    def _batched(self, model, loop: asyncio.AbstractEventLoop):
        """``model`` whose ``run`` (called from a request thread) waits for its slot in a dynamic batch."""

        def run(x: np.ndarray) -> np.ndarray:
            x = np.ascontiguousarray(x, np.float32)
            return asyncio.run_coroutine_threadsafe(self._infer((model.task, model.name, x)), loop).result()

        return dataclasses.replace(model, run=run)

    # ----------------------------------------------------------------------------------------- loading
    def _load(self, files: Sequence[str]) -> list:
        """The models of ``files`` (the loader's sessions, warm-up and names); a file the loader skips is left out
        with its reason in :attr:`skipped` (the replica's stderr goes to Ray's log, not to the user: the driver
        prints these)."""
        cache = self.settings.get("cache_dir")
        with recording_skips() as skipped:
            try:
                models = load_models(
                    self.folder,
                    self.settings["backend"],
                    threads=self.settings["threads"],
                    cache_dir=Path(cache) if cache else None,
                    only=list(files),
                    dtype=self.settings.get("dtype"),
                )
            except Exception as exc:  # nothing servable (the loader's ValueError) or a loader fault
                models, reason = [], first_line(exc)
            else:
                reason = "the loader served nothing from it"
        loaded = {Path(m.source).name for m in models}
        self.skipped.update({f: skipped.get(f, reason) for f in files if f not in loaded})
        return models

    def skipped_files(self) -> dict[str, str]:
        """``{file: why}`` for the files this replica could not load (called by the driver through a handle)."""
        return dict(self.skipped)

    # ----------------------------------------------------------------------------------------- helpers
    async def _model(self, task: str, name: str | None):
        names = [n for t, n in [*self.order, *self.pending] if t == task]
        if not names:
            kind = "classification" if task == "cls" else "segmentation"
            raise HTTPError(404, f"no {kind} models are served here")
        name = name or names[0]
        # loading (sha256, session, warm-up) runs off the event loop: other requests and health checks go on
        if (task, name) in self.pending and not await self._in_thread(self._load_pending, task, name):
            raise HTTPError(
                503,
                f"model {quoted(name)} is still being exported and verified; retry in a few seconds "
                f"(ready now: {', '.join(n for t, n in self.order if t == task)})",
            )
        if (task, name) not in self.models:
            if (task, name) in self.failed:  # a pending one that did not load
                raise HTTPError(
                    500, f"model {quoted(name)} could not be loaded on this replica; the server log says why"
                )
            raise HTTPError(404, f"unknown {task} model {quoted(name)}; valid: {', '.join(names)}")
        return self.models[(task, name)]

    def _load_pending(self, task: str, name: str) -> bool:
        """Load a pending zoo model if the driver has listed it as ready (its sha256 checked first)."""
        with self._load_lock:
            if (task, name) in self.models:
                return True
            try:
                ready = json.loads(Path(self.ready_file).read_text()) if self.ready_file else {}
            except (OSError, ValueError):
                ready = {}
            file = self.pending[(task, name)]
            if file not in ready:
                return False
            if sha256_file(self.folder / file) != ready[file]:
                raise RuntimeError(f"{self.folder / file} is not the file the driver verified (sha256 differs)")
            for m in self._load([file]):
                self.models[(m.task, m.name)] = m
                self.order.append((m.task, m.name))
            del self.pending[(task, name)]
            if (task, name) not in self.models:
                self.failed.add((task, name))
            return True

    async def _answer(self, route: str, work) -> Any:
        """Run ``work()`` (a coroutine factory), count it, turn failures into one-line JSON errors."""
        self.stats.requests[route] += 1
        try:
            result = await work()
            self.stats.statuses[200] += 1
            return result
        except Exception as exc:  # every failure becomes {"error": ...}; a traceback only for a server fault
            err = _as_http_error(exc)
            self.stats.statuses[err.status] += 1
            return _error(err.status, err.message, err.headers)

    async def _in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.request_threads, fn, *args)

    @contextlib.asynccontextmanager
    async def _holding(self, need: int, what: str) -> AsyncIterator[None]:
        """Hold ``need`` bytes of the decode budget for the body: 413 when they never fit, 503 with
        ``Retry-After`` when they are not free within :data:`DECODE_WAIT_S`."""
        budget = self.decode
        if need > budget.total:
            raise HTTPError(
                413,
                f"{what} takes about {_size(need)} of memory to decode, over this replica's decode "
                f"budget of {_size(budget.total)} ({budget.total // DECODE_BYTES_PER_PIXEL / 1e6:.1f} "
                "MP); send a smaller one",
            )
        if not await budget.acquire(need, DECODE_WAIT_S):
            raise HTTPError(
                503,
                f"busy: the work in progress holds {_size(budget.used)} of this replica's "
                f"{_size(budget.total)} decode budget and {what} ({_size(need)}) found no room "
                f"within {DECODE_WAIT_S:g} s; retry",
                headers={"Retry-After": "5"},
            )
        try:
            yield
        finally:
            try:
                if need >= RETURN_MEMORY_BYTES:
                    await self._in_thread(return_free_memory)
            finally:
                budget.release(need)

    async def _decoding(self, data: bytes) -> "contextlib.AbstractAsyncContextManager[None]":
        """The decode budget held for an uploaded image, sized from its header (400 / 413 as for a bad image)."""
        w, h = await self._in_thread(image_size, data)
        return self._holding(w * h * DECODE_BYTES_PER_PIXEL, f"a {w}x{h} image")

    # ------------------------------------------------------------------------------------------- routes
    @api.post("/classify")
    async def classify(self, request: Request, model: str | None = None, k: int = 5):
        """Top-``k`` classes of the uploaded image (``model``: a classifier of ``GET /models``)."""

        async def work():
            served = await self._model("cls", model)
            if not 1 <= k <= len(served.class_names):
                raise HTTPError(400, f"k must be in 1..{len(served.class_names)}, got {k}")
            data = await read_image_upload(request)
            batched = self._batched(served, asyncio.get_running_loop())
            async with await self._decoding(data):
                probs, ms = await self._in_thread(predict.classify, batched, data, k)
            return {
                "model": served.name,
                "variant": served.variant,
                "top": [{"class": c, "probability": p} for c, p in probs.items()],
                "latency_ms": round(ms, 3),
                "replica": self.replica,
            }

        return await self._answer("classify", work)

    @api.post("/segment")
    async def segment(self, request: Request, model: str | None = None, max_side: int | None = None):
        """Class-id mask of the uploaded image at its own size (``max_side``: the longest side the model sees,
        default its input size; larger runs sliding windows)."""

        async def work():
            served = await self._model("seg", model)
            if max_side is not None and not 1 <= max_side <= MAX_SIDE:
                raise HTTPError(400, f"max_side must be in 1..{MAX_SIDE}, got {max_side}")
            data = await read_image_upload(request)
            batched = self._batched(served, asyncio.get_running_loop())
            async with await self._decoding(data):
                mask, ms = await self._in_thread(predict.segment, batched, data, max_side)
                shares = predict.pixel_shares(mask, len(served.class_names))
                png = await self._in_thread(mask_png, mask)
            return {
                "model": served.name,
                "variant": served.variant,
                "height": int(mask.shape[0]),
                "width": int(mask.shape[1]),
                "class_names": served.class_names,
                "mask_png": png,
                "shares": {served.class_names[i]: round(float(s), 6) for i, s in enumerate(shares) if s > 0},
                "latency_ms": round(ms, 3),
                "replica": self.replica,
            }

        return await self._answer("segment", work)

    @api.post("/models/{task}/{name}/logits")
    async def logits(self, request: Request, task: str, name: str):
        """Logits of a preprocessed float32 (N, 3, H, W) batch sent as ``.npy``; answered as ``.npy``."""

        async def work():
            if task not in ("cls", "seg"):
                raise HTTPError(404, f"unknown task {quoted(task)}; valid: cls, seg")
            served = await self._model(task, name)
            h, w = served.input_size
            most = tensor_batch_limit((h, w))
            want = f"float32 (N, 3, {h}, {w}) with N in 1..{most}"
            limit = most * 3 * 4 * h * w + NPY_HEADER_ROOM

            def too_large(size: int | None, limit: int, head: bytes) -> str:
                shape = _npy_shape(head)
                if shape and len(shape[0]) == 4 and shape[0][0] > most:
                    return f"the batch holds {shape[0][0]} images; at most {most} per request ({want})"
                return (
                    f"the body is {f'{_size(size)}, ' if size is not None else ''}over the {_size(limit)} that "
                    f"{most} images of float32 (3, {h}, {w}) take; send {want}"
                )

            body = await _body(request, limit, too_large, peek=NPY_HEADER_ROOM)
            async with self._holding(2 * len(body), f"a {len(body):,}-byte tensor batch"):  # the body, the array
                x = _load_npy(body)
                del body
                if (
                    x.dtype != np.float32
                    or x.ndim != 4
                    or x.shape[1] != 3
                    or not 1 <= len(x) <= most
                    or (served.fixed_size and tuple(x.shape[2:]) != (h, w))
                ):
                    raise HTTPError(400, f"expected {want}, got {x.dtype} {tuple(x.shape)}")
                if not np.isfinite(x).all():
                    raise HTTPError(400, "the input holds NaN or infinite values")
                out = await self._infer((served.task, served.name, x))
                if not np.isfinite(out).all():  # finite but huge inputs overflow: the input's fault, named
                    raise HTTPError(
                        400,
                        f"the input (values {float(x.min()):.3g} to {float(x.max()):.3g}) makes model "
                        f"{served.name!r} produce non-finite outputs (NaN or inf); it takes "
                        f"preprocessed pixels, (x/255 - mean) / std with mean {list(served.mean)} and "
                        f"std {list(served.std)}, as GET /models lists",
                    )
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(out, np.float32), allow_pickle=False)
                return Response(buf.getvalue(), media_type=NPY_TYPE)

        return await self._answer("logits", work)

    @api.get("/models")
    async def list_models(self):
        """The served models with what a client needs to preprocess for them (the model contract)."""
        rows = []
        for key in self.order:
            m = self.models[key]
            rows.append(
                {
                    "name": m.name,
                    "variant": m.variant,
                    "task": m.task,
                    "arch": m.arch,
                    "class_names": m.class_names,
                    "input_size": list(m.input_size),
                    "mean": list(m.mean),
                    "std": list(m.std),
                    "fixed_size": m.fixed_size,
                    "backend": m.backend,
                    "input_style": m.input_style,
                    "file": Path(m.source).name,
                }
            )
        return {"models": rows, "pending": [{"task": t, "name": n} for t, n in self.pending]}

    @api.get("/health")
    async def health(self):
        """200 with the replica and its model count while the replica runs."""
        return {"status": "ok", "replica": self.replica, "models": len(self.models)}

    @api.get("/stats")
    async def replica_stats(self):
        """This replica's counters: requests, statuses, dynamic batches and their sizes, model time."""
        settings = {k: self.settings[k] for k in _PUBLIC_SETTINGS if k in self.settings}
        return {
            "replica": self.replica,
            "settings": settings,
            **self.stats.as_dict(),
            "decode_budget": self.decode.as_dict(),
        }


def build_app(
    folder: Path,
    files: Mapping[str, str],
    *,
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float = 0.0,
    max_ongoing_requests: int = 64,
    settings: Mapping[str, Any],
):
    """The bound application (``serve.run`` it): ``replicas`` copies of :class:`ModelServer`."""
    return ModelServer.options(  # type: ignore[attr-defined]  # serve.deployment made it a Deployment
        num_replicas=replicas,
        max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
    ).bind(str(folder), dict(files), {**settings, "max_ongoing_requests": max_ongoing_requests})
