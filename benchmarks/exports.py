"""The models a run times and their verified ONNX files: a seeded random-init model per variant, exported as
``export-model`` verifies it into the run's cache, ahead of the rows (a child process exporting every other file)
and on a row's first use (a resumed run exports only what it still needs).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from attnzoo.benchmarks.phases import Phases
from attnzoo.benchmarks.plan import Settings, onnx_path
from attnzoo.errors import first_line
from attnzoo.export import export_verified
from attnzoo.models import create_model

__all__ = ["bench_model", "bench_export", "Exports", "export_ahead"]


def bench_model(settings: Settings, variant: str):
    """The run's model of ``variant``: seeded random init (:data:`attnzoo.benchmarks.run.NOTE`)."""
    torch.manual_seed(settings.seed)
    return create_model(variant, task=settings.task, arch=settings.arch, img_size=settings.img_size).eval()


def bench_export(settings: Settings, model, variant: str, dtype: str) -> Path:
    """The verified ONNX file of ``model`` in the run's cache, exported as export-model verifies (projection check,
    ORT vs eager at batch 1 and 3); a file this cache verified for the same weights and versions is kept (a run
    resumed, the scaling sweep beside it, the exports made ahead)."""
    cfg = model.attnzoo_config
    path = onnx_path(settings.cache_dir, variant, settings.task, settings.arch, dtype, cfg["img_size"])
    path.parent.mkdir(parents=True, exist_ok=True)
    export_verified(
        model,
        path,
        cfg,
        dtype=dtype,
        input_hw=(cfg["img_size"], cfg["img_size"]),
        batch_sizes=(1,),
        threads=settings.threads,
        reuse=True,
    )
    return path


class Exports:
    """A variant's verified ONNX files, exported on first use (a resumed run exports only what it still needs)."""

    def __init__(self, settings: Settings, phases: Phases, variant: str, model: Any) -> None:
        self.settings, self.phases, self.variant, self.model = settings, phases, variant, model
        self.paths: dict[str, Path] = {}
        self.errors: dict[str, str] = {}

    def get(self, src: str) -> Path | None:
        """The ``fp32`` / ``fp16`` file, or ``None`` when its export failed (:attr:`errors` says why)."""
        if src not in self.paths and src not in self.errors:
            try:
                with self.phases.phase("ONNX export and its check"):
                    self.paths[src] = bench_export(self.settings, self.model, self.variant, src)
            except Exception as exc:  # reported on every ONNX row of this variant
                self.errors[src] = first_line(exc, typed=True)
        return self.paths.get(src)


def _export_jobs(settings: Settings, jobs: Sequence[tuple[str, str]]) -> None:
    """A child process of :func:`export_ahead`: export each ``(variant, precision)``, quietly (a failure is met
    again, and reported, by the row that needs the file)."""
    torch.set_num_threads(settings.threads)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        for variant, src in jobs:
            with contextlib.suppress(Exception):
                bench_export(settings, bench_model(settings, variant), variant, src)


def export_ahead(settings: Settings, phases: Phases, jobs: Sequence[tuple[str, str]]) -> None:
    """Export the ONNX files ``jobs`` names (``(variant, fp32 / fp16)``, those the rows still to measure read)
    before any row is timed, a child process exporting every other one beside this process: an export is mostly
    single-threaded tracing, so on two cores they take about half as long, and nothing is timed while they run.
    Each is kept in the cache (:func:`bench_export`), and the rows' own export reuses it after checking it again; a
    file the child could not make is made when a row needs it, whose failure that row reports."""
    child = mp.get_context("spawn").Process(
        target=_export_jobs, args=(replace(settings, threads=1), jobs[1::2]), daemon=True
    )
    with phases.phase("ONNX export and its check"):
        child.start()
        try:
            for variant, src in jobs[0::2]:
                with contextlib.suppress(Exception):  # made again, and reported, by the row that needs it
                    bench_export(settings, bench_model(settings, variant), variant, src)
            child.join()
        finally:
            if child.is_alive():  # stopped by a signal: the child's half-made file is never renamed into place
                child.terminate()
                child.join()
