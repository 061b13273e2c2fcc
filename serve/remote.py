"""The demo's ``--backend-url``: the models of a running ``serve-models`` deployment, each run on the server
through its tensor route."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from attnzoo.errors import quoted
from attnzoo.lazy import lazy_import
from attnzoo.preprocess import input_style_of
from attnzoo.serve.served import MAX_TENSOR_BATCH, ServedModel, tensor_batch_limit

httpx = lazy_import("httpx")  # imported on first use: only --backend-url needs it

__all__ = ["RemoteError", "load_remote"]


class RemoteError(RuntimeError):
    """A ``serve-models`` deployment answered with an error or could not be reached."""


def _remote_runner(client, url: str, task: str, name: str, most: int = MAX_TENSOR_BATCH) -> Callable:
    """``run(x) -> logits`` that posts the float32 batch as ``.npy`` to ``<url>/models/<task>/<name>/logits``, in
    requests of at most ``most`` images (:func:`tensor_batch_limit`)."""

    def run(x: np.ndarray) -> np.ndarray:
        if len(x) > most:
            return np.concatenate([run(x[i : i + most]) for i in range(0, len(x), most)])
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(x, np.float32), allow_pickle=False)
        try:
            r = client.post(
                f"{url}/models/{task}/{name}/logits",
                content=buf.getvalue(),
                headers={"Content-Type": "application/x-npy"},
            )
        except Exception as exc:  # httpx transport errors: one line naming the server
            raise RemoteError(f"the model server {url} did not answer: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            try:
                message = r.json().get("error", r.text)
            except ValueError:
                message = r.text[:200]
            raise RemoteError(f"the model server answered {r.status_code}: {message}")
        return np.load(io.BytesIO(r.content), allow_pickle=False)

    return run


def load_remote(url: str, timeout: float = 60.0) -> list[ServedModel]:
    """The models of a running ``serve-models`` deployment at ``url``, each run on the server.

    ``GET <url>/models`` lists them with their contract (task, class names, input size, mean/std); each
    :class:`ServedModel`'s ``run`` posts a preprocessed float32 batch to the server's tensor route, where it
    joins the deployment's dynamic batches. Preprocessing, sliding windows and the pictures stay in
    :mod:`attnzoo.serve.predict`, exactly as with a local backend.

    Raises:
        ValueError: the server cannot be reached, is not a serve-models deployment, or serves no model.
    """
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--backend-url must start with http:// or https://, got {quoted(url)}")
    client = httpx.Client(timeout=timeout)
    try:
        listed = client.get(f"{url}/models")
        listed.raise_for_status()
        rows = listed.json()["models"]
    except Exception as exc:  # connection refused, HTTP errors, not JSON: one line
        client.close()
        raise ValueError(
            f"cannot list the models of {url} ({type(exc).__name__}: {exc}); is serve-models running there?"
        ) from None
    models = [
        ServedModel(
            name=r["name"],
            variant=r["variant"],
            task=r["task"],
            class_names=list(r["class_names"]),
            input_size=(int(r["input_size"][0]), int(r["input_size"][1])),
            mean=tuple(r["mean"]),
            std=tuple(r["std"]),
            fixed_size=bool(r["fixed_size"]),
            run=_remote_runner(client, url, r["task"], r["name"], tensor_batch_limit(r["input_size"])),
            source=f"{url}/models/{r['task']}/{r['name']}",
            backend=f"serve-models at {url}",
            arch=r.get("arch", ""),
            input_style=input_style_of(r),
        )
        for r in rows
    ]
    if not models:
        raise ValueError(f"the model server {url} serves no models")
    return models
