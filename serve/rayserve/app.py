"""The Ray Serve application behind ``serve-models``: one routed deployment over the verified ONNX models.

Each replica loads the models with the demo's loader (:func:`attnzoo.serve.loading.load_models`: the model
contract, one reused ONNX Runtime session or TensorRT engine per model, a warm-up that checks the logits
against the class names), after checking that every file has the sha256 the driver selected. Requests are
answered by the demo's own functions (:func:`attnzoo.serve.predict.classify` / ``segment``: the one
preprocessing path, sliding windows, the NaN check); their model calls go through one ``@serve.batch`` queue
per replica, which groups concurrent requests into dynamic batches per model (``max_batch_size``,
``batch_wait_ms``) and runs one batch at a time on a model thread.

HTTP routes (JSON unless said otherwise; errors are ``{"error": "one line"}`` with status 400, 404, 413 or,
for a fault of the server, 500 without a traceback):

- ``POST /classify[?model=NAME&k=5]``: an image (multipart field ``file``, or the raw body) -> top classes;
- ``POST /segment[?model=NAME&max_side=PX]``: an image -> class-id mask as a base64 PNG, and pixel shares;
- ``POST /models/{task}/{name}/logits``: a preprocessed float32 batch as ``.npy`` -> logits as ``.npy`` (the
  demo's ``--backend-url`` uses it);
- ``GET /models``, ``GET /health``, ``GET /stats`` (this replica's counters and batch sizes).
"""

# no "from __future__ import annotations": FastAPI reads the route signatures of the class-based view

import asyncio
import base64
import dataclasses
import io
import os
import sys
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnzoo.cli import first_line
from attnzoo.limits import MAX_UPLOAD_BYTES

__all__ = ["ModelServer", "HTTPError", "build_app", "api", "MAX_TENSOR_BATCH", "NPY_TYPE", "DEPLOYMENT",
           "mask_png", "decode_mask"]

#: Deployment (and Ray Serve application) name.
DEPLOYMENT = "attnzoo"
#: Most images one ``/logits`` request may carry (the demo sends at most its sliding-window batch, 16).
MAX_TENSOR_BATCH = 64
#: Content type of the tensor route's body and answer.
NPY_TYPE = "application/x-npy"
#: Room for the multipart envelope (boundaries, part headers, form fields) on top of the file itself.
_MULTIPART_SLACK = 64 * 1024

api = FastAPI(title="attnzoo serve-models", docs_url=None, redoc_url=None)  # offline: no CDN-loaded docs pages


def _replica_grpc_on_loopback() -> None:
    """In a replica of the local Ray that ``serve-models`` starts (``ATTNZOO_SERVE_LOOPBACK=1``, see
    :data:`attnzoo.serve.rayserve.launch._LOOPBACK_ENV`): Ray Serve 2.60 binds each replica's inter-deployment gRPC
    server to ``[::]:0`` (all interfaces; ``Replica._on_initialized``, not a setting). This module is imported in
    the replica before that runs, so the address is rewritten to ``127.0.0.1:0`` here; a cluster joined with
    ``--address`` is left as Ray makes it. ``tests/test_serving_lifecycle.py`` lists every listening socket."""
    from ray.serve._private import replica

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
    """An answer other than 200: ``status`` and one line for ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


@api.exception_handler(HTTPError)
async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
    return _error(exc.status, exc.message)


@api.exception_handler(StarletteHTTPException)
async def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404:
        detail = f"no route {request.method} {request.url.path}; routes: {', '.join(ROUTES)}"
    return _error(exc.status_code, detail)


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path"))
    return _error(400, f"{where or 'request'}: {first.get('msg', 'invalid value')}")



def _as_http_error(exc: BaseException) -> HTTPError:
    """The answer for an exception raised while handling a request (a traceback only goes to the log)."""
    from attnzoo.preprocess import ImageTooLargeError, UnreadableImageError

    if isinstance(exc, HTTPError):
        return exc
    if isinstance(exc, ImageTooLargeError):
        return HTTPError(413, first_line(exc))
    if isinstance(exc, UnreadableImageError):
        return HTTPError(400, "cannot read the image: not an image file, or a damaged one (PNG, JPEG, WebP, BMP, "
                              "GIF, TIFF ... are read)")
    if isinstance(exc, ValueError):  # the demo's own messages for bad input (e.g. non-finite outputs)
        return HTTPError(400, first_line(exc))
    traceback.print_exception(exc, file=sys.stderr)
    return HTTPError(500, f"internal error ({type(exc).__name__}); see the server log")


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` (the Content-Length header, when
    sent, is checked before anything is read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"the request is {int(declared) / 2**20:.1f} MiB, over the {limit / 2**20:.0f} MiB "
                             "upload limit")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPError(413, f"the request is over the {limit / 2**20:.0f} MiB upload limit")
    return bytes(body)


async def read_image_upload(request: Request) -> bytes:
    """The uploaded file's bytes: the first file of a ``multipart/form-data`` body (field ``file``), or the
    raw body otherwise; 413 over :data:`attnzoo.limits.MAX_UPLOAD_BYTES`, 400 when there is none."""
    from starlette.formparsers import MultiPartException, MultiPartParser

    ctype = request.headers.get("content-type", "")
    if not ctype.startswith("multipart/form-data"):
        data = await _body(request, MAX_UPLOAD_BYTES)
    else:
        raw = await _body(request, MAX_UPLOAD_BYTES + _MULTIPART_SLACK)

        async def one_chunk() -> AsyncIterator[bytes]:
            yield raw

        try:
            form = await MultiPartParser(request.headers, one_chunk(), max_files=1, max_fields=16).parse()
        except MultiPartException as exc:
            raise HTTPError(400, f"malformed multipart body: {exc.message}") from None
        files = [v for v in form.values() if hasattr(v, "read")]
        if not files:
            raise HTTPError(400, "no file in the multipart body; send the image as field 'file' "
                                 "(curl -F file=@image.png)")
        data = await files[0].read()
        if len(data) > MAX_UPLOAD_BYTES:
            raise HTTPError(413, f"the file is {len(data) / 2**20:.1f} MiB, over the "
                                 f"{MAX_UPLOAD_BYTES / 2**20:.0f} MiB upload limit")
    if not data:
        raise HTTPError(400, "no image: send it as multipart field 'file' (curl -F file=@image.png) or as the "
                             "request body (curl --data-binary @image.png)")
    return data


def mask_png(mask: np.ndarray) -> str:
    """A class-id mask as a base64 PNG: 8-bit gray for up to 256 classes, else 16-bit (pixel value = class)."""
    from PIL import Image

    arr = mask.astype(np.uint8) if mask.max(initial=0) < 256 else mask.astype(np.uint16)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode_mask(text: str) -> np.ndarray:
    """The inverse of :func:`mask_png` (for clients and tests)."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(text))))


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

    def as_dict(self) -> Dict[str, Any]:
        n = sum(self.batch_requests.values())
        return {"uptime_s": round(time.time() - self.started, 3), "requests": dict(self.requests),
                "statuses": {str(k): v for k, v in self.statuses.items()}, "batches": self.batches,
                "images": self.images, "model_s": round(self.model_s, 4),
                "mean_requests_per_batch": (round(sum(k * v for k, v in self.batch_requests.items()) / n, 3)
                                            if n else None),
                "requests_per_batch": {str(k): v for k, v in sorted(self.batch_requests.items())}}


#: Every route, for the 404 message.
ROUTES = ("POST /classify", "POST /segment", "POST /models/{task}/{name}/logits", "GET /models", "GET /health",
          "GET /stats")


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
        from attnzoo.fileio import sha256_file

        for name, digest in files.items():
            if sha256_file(Path(folder) / name) != digest:
                raise RuntimeError(f"{Path(folder) / name} is not the file the driver verified (sha256 differs)")
        self.settings = dict(settings)
        self.folder = Path(folder)
        #: Files this replica could not load: file name -> the reason (the driver prints them, see ``skipped``).
        self.skipped: Dict[str, str] = {}
        models = self._load(sorted(files))
        self.models = {(m.task, m.name): m for m in models}
        self.order = [(m.task, m.name) for m in models]
        #: Zoo models still being exported by the driver: (task, name) -> file; loaded on first use once the
        #: driver lists them in ``ready_file`` (``{file: sha256}``, written whole) with the sha256 to check.
        self.pending = {(p["task"], p["name"]): p["file"] for p in settings.get("pending", ())}
        self.ready_file = settings.get("ready_file")
        self.failed: set = set()  # pending models whose file did not load (the reason is in ``skipped``)
        self._load_lock = threading.Lock()
        self._infer.set_max_batch_size(int(settings["max_batch_size"]))
        self._infer.set_batch_wait_timeout_s(float(settings["batch_wait_s"]))
        self.model_thread = ThreadPoolExecutor(1, thread_name_prefix="attnzoo-model")
        self.request_threads = ThreadPoolExecutor(int(settings["max_ongoing_requests"]),
                                                  thread_name_prefix="attnzoo-request")
        self.stats = _Stats()
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside a replica (never in serve-models)
            self.replica = "local"

    # ------------------------------------------------------------------------------------------- batching
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)
    async def _infer(self, items: List[Tuple[str, str, np.ndarray]]) -> List[np.ndarray]:
        """One dynamic batch: ``(task, name, float32 (n, 3, H, W))`` requests -> their logits, run on the
        model thread so the event loop keeps taking requests meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.model_thread, self._run_batch, items)

    def _run_batch(self, items: Sequence[Tuple[str, str, np.ndarray]]) -> List[np.ndarray]:
        """Concatenate the requests of each model (and input shape), run each group once, split the logits."""
        start = time.perf_counter()
        groups: Dict[Tuple[str, str, Tuple[int, ...]], List[int]] = {}
        for i, (task, name, x) in enumerate(items):
            groups.setdefault((task, name, tuple(x.shape[1:])), []).append(i)
        out: List[Optional[np.ndarray]] = [None] * len(items)
        for (task, name, _), idx in groups.items():
            xs = [items[i][2] for i in idx]
            logits = self.models[(task, name)].run(np.concatenate(xs) if len(xs) > 1 else xs[0])
            offset = 0
            for i, x in zip(idx, xs):
                out[i] = logits[offset:offset + len(x)]
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
        from attnzoo.serve.loading import load_models, recording_skips

        cache = self.settings.get("cache_dir")
        with recording_skips() as skipped:
            try:
                models = load_models(self.folder, self.settings["backend"], threads=self.settings["threads"],
                                     cache_dir=Path(cache) if cache else None, only=list(files),
                                     dtype=self.settings.get("dtype"))
            except Exception as exc:  # noqa: BLE001 - nothing servable (the loader's ValueError) or a loader fault
                models, reason = [], first_line(exc)
            else:
                reason = "the loader served nothing from it"
        loaded = {Path(m.source).name for m in models}
        self.skipped.update({f: skipped.get(f, reason) for f in files if f not in loaded})
        return models

    def skipped_files(self) -> Dict[str, str]:
        """``{file: why}`` for the files this replica could not load (called by the driver through a handle)."""
        return dict(self.skipped)

    # ----------------------------------------------------------------------------------------- helpers
    async def _model(self, task: str, name: Optional[str]):
        names = [n for t, n in [*self.order, *self.pending] if t == task]
        if not names:
            kind = "classification" if task == "cls" else "segmentation"
            raise HTTPError(404, f"no {kind} models are served here")
        name = name or names[0]
        # loading (sha256, session, warm-up) runs off the event loop: other requests and health checks go on
        if (task, name) in self.pending and not await self._in_thread(self._load_pending, task, name):
            raise HTTPError(503, f"model {name!r} is still being exported and verified; retry in a few seconds "
                                 f"(ready now: {', '.join(n for t, n in self.order if t == task)})")
        if (task, name) not in self.models:
            if (task, name) in self.failed:  # a pending one that did not load
                raise HTTPError(500, f"model {name!r} could not be loaded on this replica; the server log says why")
            raise HTTPError(404, f"unknown {task} model {name!r}; valid: {', '.join(names)}")
        return self.models[(task, name)]

    def _load_pending(self, task: str, name: str) -> bool:
        """Load a pending zoo model if the driver has listed it as ready (its sha256 checked first)."""
        import json

        from attnzoo.fileio import sha256_file

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
            return _error(err.status, err.message)

    async def _in_thread(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.request_threads, fn, *args)

    # ------------------------------------------------------------------------------------------- routes
    @api.post("/classify")
    async def classify(self, request: Request, model: Optional[str] = None, k: int = 5):
        """Top-``k`` classes of the uploaded image (``model``: a classifier of ``GET /models``)."""

        async def work():
            from attnzoo.serve import predict

            served = await self._model("cls", model)
            if not 1 <= k <= len(served.class_names):
                raise HTTPError(400, f"k must be in 1..{len(served.class_names)}, got {k}")
            data = await read_image_upload(request)
            batched = self._batched(served, asyncio.get_running_loop())
            probs, ms = await self._in_thread(predict.classify, batched, data, k)
            return {"model": served.name, "variant": served.variant,
                    "top": [{"class": c, "probability": p} for c, p in probs.items()],
                    "latency_ms": round(ms, 3), "replica": self.replica}

        return await self._answer("classify", work)

    @api.post("/segment")
    async def segment(self, request: Request, model: Optional[str] = None, max_side: Optional[int] = None):
        """Class-id mask of the uploaded image at its own size (``max_side``: the longest side the model sees,
        default its input size; larger runs sliding windows)."""

        async def work():
            from attnzoo.limits import MAX_SIDE
            from attnzoo.serve import predict

            served = await self._model("seg", model)
            if max_side is not None and not 1 <= max_side <= MAX_SIDE:
                raise HTTPError(400, f"max_side must be in 1..{MAX_SIDE}, got {max_side}")
            data = await read_image_upload(request)
            batched = self._batched(served, asyncio.get_running_loop())
            mask, ms = await self._in_thread(predict.segment, batched, data, max_side)
            shares = predict.pixel_shares(mask, len(served.class_names))
            return {"model": served.name, "variant": served.variant, "height": int(mask.shape[0]),
                    "width": int(mask.shape[1]), "class_names": served.class_names, "mask_png": mask_png(mask),
                    "shares": {served.class_names[i]: round(float(s), 6) for i, s in enumerate(shares) if s > 0},
                    "latency_ms": round(ms, 3), "replica": self.replica}

        return await self._answer("segment", work)

    @api.post("/models/{task}/{name}/logits")
    async def logits(self, request: Request, task: str, name: str):
        """Logits of a preprocessed float32 (N, 3, H, W) batch sent as ``.npy``; answered as ``.npy``."""

        async def work():
            if task not in ("cls", "seg"):
                raise HTTPError(404, f"unknown task {task!r}; valid: cls, seg")
            served = await self._model(task, name)
            x = _load_npy(await _body(request, MAX_TENSOR_BATCH * 3 * 4 * int(np.prod(served.input_size)) + 1024))
            want = f"float32 (N, 3, {served.input_size[0]}, {served.input_size[1]}) with N in 1..{MAX_TENSOR_BATCH}"
            if (x.dtype != np.float32 or x.ndim != 4 or x.shape[1] != 3 or not 1 <= len(x) <= MAX_TENSOR_BATCH
                    or (served.fixed_size and tuple(x.shape[2:]) != tuple(served.input_size))):
                raise HTTPError(400, f"expected {want}, got {x.dtype} {tuple(x.shape)}")
            if not np.isfinite(x).all():
                raise HTTPError(400, "the input holds NaN or infinite values")
            out = await self._infer((served.task, served.name, x))
            if not np.isfinite(out).all():
                raise HTTPError(500, f"model {served.name!r} produced non-finite outputs (NaN or inf)")
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
            rows.append({"name": m.name, "variant": m.variant, "task": m.task, "arch": m.arch,
                         "class_names": m.class_names, "input_size": list(m.input_size), "mean": list(m.mean),
                         "std": list(m.std), "fixed_size": m.fixed_size, "backend": m.backend,
                         "input_style": m.input_style,
                         "file": Path(m.source).name})
        return {"models": rows, "pending": [{"task": t, "name": n} for t, n in self.pending]}

    @api.get("/health")
    async def health(self):
        """200 with the replica and its model count while the replica runs."""
        return {"status": "ok", "replica": self.replica, "models": len(self.models)}

    @api.get("/stats")
    async def replica_stats(self):
        """This replica's counters: requests, statuses, dynamic batches and their sizes, model time."""
        return {"replica": self.replica, "pid": os.getpid(), "settings": self.settings, **self.stats.as_dict()}


def build_app(folder: Path, files: Mapping[str, str], *, replicas: int = 1, cpus_per_replica: float = 1.0,
              gpus_per_replica: float = 0.0, max_ongoing_requests: int = 64, settings: Mapping[str, Any]):
    """The bound application (``serve.run`` it): ``replicas`` copies of :class:`ModelServer`."""
    return ModelServer.options(
        num_replicas=replicas, max_ongoing_requests=max_ongoing_requests,
        ray_actor_options={"num_cpus": cpus_per_replica, "num_gpus": gpus_per_replica},
    ).bind(str(folder), dict(files), {**settings, "max_ongoing_requests": max_ongoing_requests})
