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

The parts: the replica's models (:mod:`attnzoo.serve.rayserve.replica_models`), its decode budget
(:mod:`attnzoo.serve.rayserve.budget`) and what goes in and out over HTTP (:mod:`attnzoo.serve.rayserve.http_io`);
this module holds the routes, the batch queue and the deployment.
"""

# no "from __future__ import annotations": FastAPI reads the route signatures of the class-based view

import asyncio
import contextlib
import dataclasses
import io
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnzoo.errors import quoted
from attnzoo.limits import MAX_SIDE
from attnzoo.preprocess import image_size
from attnzoo.serve import predict
from attnzoo.serve.admission import (
    DECODE_BYTES_PER_PIXEL,
    DECODE_MEMORY_CAP,
    DECODE_MEMORY_SHARE,
    RETURN_MEMORY_BYTES,
)
from attnzoo.serve.rayserve.budget import DECODE_WAIT_S, MemoryBudget, decode_budget, holding, replica_memory
from attnzoo.serve.rayserve.config import DEPLOYMENT
from attnzoo.serve.rayserve.environment import BODY_TIMEOUT_S
from attnzoo.serve.rayserve.http_io import (
    NPY_TYPE,
    HTTPError,
    _as_http_error,
    _body,
    _error,
    _load_npy,
    _npy_shape,
    _size,
    decode_mask,
    mask_png,
    read_image_upload,
)
from attnzoo.serve.rayserve.replica_models import ReplicaModels
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


@api.exception_handler(HTTPError)
async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
    return _error(exc.status, exc.message, exc.headers)


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
        self.settings = dict(settings)
        #: The models, loaded and pending, and the files that did not load (:class:`ReplicaModels`).
        self.store = ReplicaModels(folder, files, settings)
        #: The images being decoded (and ``/logits`` batches) share this many bytes (:func:`decode_budget`).
        self.decode = MemoryBudget(decode_budget(settings))
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
            logits = self.store.models[(task, name)].run(np.concatenate(xs) if len(xs) > 1 else xs[0])
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

    # ------------------------------------------------------------------------------------------- models
    def skipped_files(self) -> dict[str, str]:
        """``{file: why}`` for the files this replica could not load (called by the driver through a handle)."""
        return dict(self.store.skipped)

    async def _model(self, task: str, name: str | None):
        store = self.store
        names = store.names(task)
        if not names:
            kind = "classification" if task == "cls" else "segmentation"
            raise HTTPError(404, f"no {kind} models are served here")
        name = name or names[0]
        # loading (sha256, session, warm-up) runs off the event loop: other requests and health checks go on
        if (task, name) in store.pending and not await self._in_thread(store.load_pending, task, name):
            raise HTTPError(
                503,
                f"model {quoted(name)} is still being exported and verified; retry in a few seconds "
                f"(ready now: {', '.join(n for t, n in store.order if t == task)})",
            )
        if (task, name) not in store.models:
            if (task, name) in store.failed:  # a pending one that did not load
                raise HTTPError(
                    500, f"model {quoted(name)} could not be loaded on this replica; the server log says why"
                )
            raise HTTPError(404, f"unknown {task} model {quoted(name)}; valid: {', '.join(names)}")
        return store.models[(task, name)]

    # ----------------------------------------------------------------------------------------- helpers
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

    def _holding(self, need: int, what: str) -> "contextlib.AbstractAsyncContextManager[None]":
        """``need`` bytes of the decode budget held for a request's body (413 / 503 as
        :func:`~attnzoo.serve.rayserve.budget.holding` says)."""
        return holding(self.decode, need, what, self._in_thread)

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
        for key in self.store.order:
            m = self.store.models[key]
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
        return {"models": rows, "pending": [{"task": t, "name": n} for t, n in self.store.pending]}

    @api.get("/health")
    async def health(self):
        """200 with the replica and its model count while the replica runs."""
        return {"status": "ok", "replica": self.replica, "models": len(self.store.models)}

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
