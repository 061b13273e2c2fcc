"""Serving the zoo: its checkpoints run by PyTorch, or its ONNX exports (:mod:`attnzoo.export.zoo_cache`) ready
within seconds on a fresh install: the best classifier and segmenter loaded at once, every other model exported
and loaded on its first call or before that by a low-priority child process. Each carries its zoo test metric and
timm name."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from attnzoo import zoo
from attnzoo.errors import first_line
from attnzoo.export.zoo_cache import export_zoo, export_zoo_in_child, zoo_onnx_name, zoo_rows
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import LoadOptions, get_backend, reference_backend
from attnzoo.runtime.choice import choose_cpu_backend
from attnzoo.serve.folders import _warn, load_onnx_dir
from attnzoo.serve.served import AUTO, ServedModel, _from_config, _warmed_up
from attnzoo.zoo import DEFAULT_DATA
from attnzoo.zoo.names import entry_name

# imported on first use: only a lazy model's config needs the checkpoint reader (PyTorch, timm)
checkpoint = lazy_import("attnzoo.models.checkpoint")

__all__ = ["load_zoo_torch", "load_zoo_onnx"]


def load_zoo_torch(data: str = DEFAULT_DATA) -> list[ServedModel]:
    """The zoo's checkpoints trained on ``data``, run by PyTorch."""
    models, rows = [], zoo_rows(data)
    for e in rows:
        model, config = zoo.load(e["variant"], e["task"], data)
        path = zoo.checkpoint_path(e["variant"], e["task"], data)
        session = get_backend(reference_backend()).load(model, LoadOptions())
        models.append(_warmed_up(_from_config(config, session.run, session.fixed_size, path, session.backend)))
    return _with_scores(models, rows)


#: Serialises the exports and loads of :class:`_LazyZooRunner` (one torch export at a time).
_LAZY_LOCK = threading.Lock()


class _LazyZooRunner:
    """``run`` of a zoo model that is exported (verified), loaded and warmed up on its first call, or earlier by
    :func:`load_zoo_onnx`'s background export."""

    def __init__(
        self, row: dict, data: str, backend: str, threads: int | None, cache_dir: Path | None, dtype: str = "fp32"
    ):
        self.row, self.data, self.backend, self.threads, self.cache_dir = row, data, backend, threads, cache_dir
        self.dtype = dtype
        self._run: Callable[[np.ndarray], np.ndarray] | None = None

    def ready(self) -> Callable[[np.ndarray], np.ndarray]:
        """The loaded model's ``run`` (exporting and loading it first if needed); ``ValueError`` if it fails."""
        if self._run is None:
            with _LAZY_LOCK:
                if self._run is None:
                    v, t = self.row["variant"], self.row["task"]
                    folder = export_zoo(self.data, self.cache_dir, variants=[v], tasks=[t], dtype=self.dtype)
                    name = zoo_onnx_name(v, t, self.data, self.dtype)
                    loaded = load_onnx_dir(folder, self.backend, self.threads, self.cache_dir, only=[name])
                    if not loaded:
                        raise ValueError(f"the zoo's {v} {t} model could not be loaded (the server's log says why)")
                    self._run = loaded[0].run
        return self._run

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.ready()(x)


def _prefetch(runners: Sequence[_LazyZooRunner], data: str, cache_dir: Path | None) -> None:
    """Export every lazy model in a child process (:func:`export_zoo_in_child`), then load them here; a daemon
    thread's work. A failure is logged, not raised: the model's first call retries and reports it."""
    wanted = [(r.row["variant"], r.row["task"]) for r in runners]
    code = export_zoo_in_child(data, cache_dir, wanted, runners[0].dtype if runners else "fp32")
    if code != 0:
        _warn(
            f"exporting the other zoo models in the background failed (exit code {code}); each is "
            "exported on its first use instead"
        )
    for runner in runners:
        try:
            runner.ready()
        except Exception as exc:  # logged; the demo stays up for the other models
            _warn(f"preparing {runner.row['variant']} {runner.row['task']} failed: {first_line(exc)}")


def _with_scores(models: list[ServedModel], rows: Sequence[dict]) -> list[ServedModel]:
    """Give each zoo model its manifest test metric and its timm name."""
    by_key = {(e["variant"], e["task"]): e for e in rows}
    for m in models:
        row = by_key.get((m.variant, m.task), {})
        m.score, m.score_name = row.get("test_metric"), row.get("metric_name", "")
        m.timm_name = entry_name(row) if row else ""
    return models


def load_zoo_onnx(
    data: str = DEFAULT_DATA,
    backend: str = AUTO,
    threads: int | None = None,
    cache_dir: Path | None = None,
    prefetch: bool = True,
    dtype: str = "fp32",
) -> list[ServedModel]:
    """The zoo's models trained on ``data`` on an ONNX backend, ready to answer within seconds on a fresh
    install: the best classifier and segmenter (:func:`attnzoo.zoo.best_entries`, shipped as ONNX) are verified,
    loaded and warmed up now; every other model is listed at once and exported, verified and loaded on its first
    call, or before that by a low-priority child process (``prefetch``). Each model carries its zoo test
    metric. ``dtype="int8"``: the same with each model's verified int8 copy (:func:`export_zoo`)."""
    rows = zoo_rows(data)
    best = zoo.best_entries(data)
    for task, e in best.items():  # one folder per zoo: every call returns the same one
        folder = export_zoo(data, cache_dir, variants=[e["variant"]], tasks=[task], dtype=dtype)
    note = ""
    if backend == AUTO:
        backend, note = choose_cpu_backend(folder, threads, dtype)
    names = [zoo_onnx_name(e["variant"], e["task"], data, dtype) for e in best.values()]
    models = load_onnx_dir(folder, backend, threads, cache_dir, only=names)
    lazy = []
    first = {(e["variant"], e["task"]) for e in best.values()}
    for e in rows:
        if (e["variant"], e["task"]) in first:
            continue
        runner = _LazyZooRunner(e, data, backend, threads, cache_dir, dtype)
        config = checkpoint.read_config(zoo.checkpoint_path(e["variant"], e["task"], data))
        models.append(
            _from_config(config, runner, True, folder / zoo_onnx_name(e["variant"], e["task"], data, dtype), backend)
        )
        models[-1].dtype = dtype
        lazy.append(runner)
    for m in _with_scores(models, rows):
        m.backend_note = note
    if prefetch and lazy:
        threading.Thread(target=_prefetch, args=(lazy, data, cache_dir), name="attnzoo-prefetch", daemon=True).start()
    return models
