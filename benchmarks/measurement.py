"""One row's measurement: the backend loaded (or its engine built ahead of time where it cannot run here), its
output checked against eager fp32 (the shared tolerance table, at the row's precision), then timed alone --
warm-up >= 200 ms, then >= ``min_time`` s and >= 10 iterations, CUDA events on a GPU
(:mod:`attnzoo.benchmarks.timing`) -- with its peak memory, then beside its partners
(:class:`attnzoo.benchmarks.pairing.Pairing`). Every failure is the row's result, never a crash.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from attnzoo.benchmarks.pairing import Pairing, Partner, baseline_dtype
from attnzoo.benchmarks.phases import Phases
from attnzoo.benchmarks.plan import Settings, compile_budget_reason, onnx_source, torch_device
from attnzoo.benchmarks.rows import load_call, tolerance_for
from attnzoo.benchmarks.stats import summarize
from attnzoo.benchmarks.timing import PeakRSS, measure
from attnzoo.errors import first_line
from attnzoo.machine import load_1min
from attnzoo.runtime.backends import Backend, Call, get_backend
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.runtime.parity import check as check_parity

__all__ = ["new_row", "Measurer"]

#: The keys of a row, after its parity, that say what it measured: ``None`` until it is timed.
_MEASURED = (
    *("iterations", "min_ms", "median_ms", "mean_ms", "p90_ms", "p95_ms", "p99_ms"),
    *("max_ms", "cv", "throughput_img_s", "peak_mem_mb", "mem_kind", "baseline", "speedup_vs_eager"),
    *("speedup_vs_eager_fp32", "speedup_pair_median", "speedup_pair_q1", "speedup_pair_q3", "speedup_pairs"),
    *("cuda_graph", "build_s", "gflop", "achieved_gflops", "ceiling_gflops", "ceiling_fraction", "roofline_us"),
    "roofline_fraction",
)


def new_row(
    variant: str, settings: Settings, backend: str, dtype: str, batch: int, status: str, reason: str = "", **extra: Any
) -> dict[str, Any]:
    """A row of the results: its place, status and reason, every measured key ``None`` unless ``extra`` has it."""
    key = tolerance_for(backend, dtype, torch_device(settings.device).type)
    row: dict[str, Any] = {
        "variant": variant,
        "task": settings.task,
        "arch": settings.arch,
        "backend": backend,
        "dtype": dtype,
        "batch": batch,
        "device": get_backend(backend).row_device(torch_device(settings.device).type),
        "status": status,
        "reason": reason,
        "parity_error": None,
        "parity_tol": TOLERANCES[key],
        **dict.fromkeys(_MEASURED),
        "load_1min": load_1min(),
        "info": {},
    }
    row.update(extra)
    return row


def _parity_reason(out: np.ndarray, ref: np.ndarray, err: float, key: str) -> str:
    if np.shape(out) != ref.shape:
        return f"parity: output shape {np.shape(out)} != eager {ref.shape}"
    if not np.all(np.isfinite(out)):
        return f"parity: {int(np.size(out) - np.isfinite(out).sum())} of {np.size(out)} outputs are NaN/inf"
    return f"parity: max|out-ref|/max(1, max|ref|) = {err:.3g} > {TOLERANCES[key]:g} ({key})"


class Measurer:
    """Measures the rows of one run, each handed to ``add`` (with its overhead entry) once it is final; keeps what
    the compile budget has spent."""

    def __init__(
        self,
        settings: Settings,
        phases: Phases,
        pairing: Pairing,
        add: Callable[[dict[str, Any], dict[str, Any] | None], None],
    ) -> None:
        self.settings, self.phases, self.pairing, self.add = settings, phases, pairing, add
        self.device = torch_device(settings.device)
        self.compile_spent = 0.0
        self.compile_count = 0

    def _fail(self, variant: str, backend: str, dtype: str, batch: int, reason: str, **extra: Any) -> None:
        self.add(new_row(variant, self.settings, backend, dtype, batch, "failed", reason, **extra), None)

    def job(
        self,
        variant: str,
        backend: str,
        dtype: str,
        batch: int,
        model: Any,
        onnx: dict[str, Path],
        x: torch.Tensor,
        ref: np.ndarray,
        eagers: dict[str, Partner],
    ) -> Call | None:
        """Build, check, time one combination; add its row (and overhead entry). Returns its call."""
        b = get_backend(backend)
        over = compile_budget_reason(self.compile_spent, self.compile_count, self.settings.compile_budget)
        if b.jit_compiles and over:
            self.add(new_row(variant, self.settings, backend, dtype, batch, "skipped", over), None)
            return None
        rss = PeakRSS()  # the sessions of earlier jobs were closed when they were no longer needed
        t0 = time.perf_counter()
        src = onnx.get(onnx_source(dtype))
        cannot_run = b.unavailable_reason(dtype, self.device.type) if b.builds_engine else None
        if cannot_run:  # built ahead of time instead: no GPU, or one TensorRT-RTX engines do not run on
            why = "no GPU" if not torch.cuda.is_available() else cannot_run
            self.built_not_run(variant, b, dtype, batch, src, why)
            return None
        loaded = self._load(variant, backend, dtype, batch, model, src, x)
        if loaded is None:
            return None
        runner, info, out = loaded
        build_s = time.perf_counter() - t0
        if b.jit_compiles:
            self.compile_spent += build_s
            self.compile_count += 1
        key = tolerance_for(backend, dtype, self.device.type)
        ok, err = check_parity(out, ref, key)
        common = dict(
            parity_error=err if math.isfinite(err) else None, build_s=build_s, info=info, cuda_graph=runner.cuda_graph
        )
        if not ok:
            runner.close()
            self._fail(variant, backend, dtype, batch, _parity_reason(out, ref, err, key), **common)
            return None
        try:
            self.time_row(variant, backend, dtype, batch, runner, rss, common, eagers)
        except Exception as exc:  # a timing failure is a result to report, not a crash
            runner.close()
            self._fail(variant, backend, dtype, batch, f"timing: {first_line(exc, typed=True)}", **common)
            return None
        return runner

    def _load(
        self, variant: str, backend: str, dtype: str, batch: int, model: Any, src: Path | None, x: torch.Tensor
    ) -> tuple[Call, dict[str, Any], np.ndarray] | None:
        """The row's runner, its load facts and its first output; ``None`` (the failed row added) if any fails."""
        runner: Call | None = None
        try:
            with self.phases.phase(f"load and first run: {backend}"):
                runner, info = load_call(
                    backend,
                    model,
                    src,
                    x.numpy(),
                    dtype,
                    threads=self.settings.threads,
                    device=self.device.type,
                    cache_dir=self.settings.cache_dir,
                    dynamic_batch=self.settings.dynamic_batch,
                )
                out = runner.output()
        except Exception as exc:  # any backend failure is a result to report, not a crash
            if runner is not None:
                runner.close()
            self._fail(variant, backend, dtype, batch, f"build/run: {first_line(exc, typed=True)}")
            return None
        return runner, info, out

    def built_not_run(self, variant: str, backend: Backend, dtype: str, batch: int, src: Path | None, why: str) -> None:
        """No GPU (or one whose engines cannot run here, ``why``): the engine of a backend that
        :attr:`~attnzoo.runtime.backends.Backend.builds_engine` built ahead of time, one per variant and dtype whose
        profile spans the run's batch sizes, kept in the cache and reused by every batch's row and by later runs;
        the rows say it was not run."""
        try:
            with self.phases.phase(f"engine build, not run: {backend.name}"):
                facts = backend.build_only(
                    src,
                    backend.options(
                        dtype=dtype, batch_sizes=self.settings.batch_sizes, cache_dir=self.settings.cache_dir
                    ),
                )
        except Exception as exc:  # a build failure is a result to report, not a crash
            self._fail(variant, backend.name, dtype, batch, f"build: {first_line(exc, typed=True)}")
            return None
        p = facts["profile"]
        how = "reused from the engine cache, built" if facts["cached"] else "built"
        reason = (
            f"built, not run ({why}): {facts['library']} {facts['library_version']} for "
            f"{facts['compute_capability']}, one engine for batch {p['min']}-{p['max']} "
            f"(opt {p['opt']}), {facts['engine_size'] / 1e6:.1f} MB, {how} in "
            f"{facts['build_time_s']:.1f} s"
        )
        row = new_row(
            variant,
            self.settings,
            backend.name,
            dtype,
            batch,
            "built",
            reason,
            build_s=facts["build_time_s"],
            info=facts,
        )
        self.add(row, None)
        return None

    def time_row(
        self,
        variant: str,
        backend: str,
        dtype: str,
        batch: int,
        runner: Call,
        rss: PeakRSS,
        common: dict[str, Any],
        eagers: dict[str, Partner],
    ) -> None:
        """Time a runner that passed parity, alone and then beside its partners; add its row (and overhead entry)
        only once every step succeeded, so a failure leaves one ``failed`` row and nothing else. May raise."""
        with rss, self.phases.phase("timing"):
            samples = measure(runner.fn, self.settings.min_time, cuda=runner.cuda)
        mem, kind = runner.memory() if runner.memory else (rss.delta_mb, "peak RSS while timed - RSS before build")
        base = baseline_dtype(backend, dtype, eagers)
        row = new_row(
            variant,
            self.settings,
            backend,
            dtype,
            batch,
            "ok",
            **common,
            **cast(dict[str, Any], summarize(samples, batch)),  # timing keys only, none of new_row's own
            peak_mem_mb=mem,
            mem_kind=kind,
            baseline=f"eager {base}" if base else None,
        )
        self.pairing.with_eager(row, runner, base, eagers)
        overhead = self.pairing.with_standard(variant, backend, dtype, batch, runner)
        self.add(row, overhead)
