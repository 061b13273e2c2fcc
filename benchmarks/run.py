"""The benchmark run: build, export, parity-check, time and compare every (variant, backend, dtype, batch).

For each variant: a seeded random-init model (no trained weights exist for tiny/small/base), exported once
per dtype with :func:`attnzoo.export.export_onnx`; ONNX Runtime and TensorRT run that file, eager and compile
the same weights in PyTorch. For each batch size the eager fp32 output on the CPU is the parity reference.
Each runnable backend is then (1) checked against it, (2) timed alone (warm-up >= 200 ms, then >= min_time s
and >= 10 iterations), (3) timed alternating with eager of the same variant at the row's precision -- eager fp16
for an fp16 row, where that eager row ran; else, and for eager's own rows, eager fp32 (speed-up with its spread;
the ratio to eager fp32's median is kept beside it) -- and (4) alternating with ``standard`` on the same backend,
dtype and batch (variant overhead).

Rows on disk as they finish: every finished row goes to ``<out>/rows.jsonl`` at once
(:class:`attnzoo.benchmarks.rowlog.RowLog`). The same command run again with the same ``--out`` (and any
``--variants`` / ``--backends`` / ``--dtypes`` / ``--batch-sizes``, but the same settings the numbers depend on:
:func:`run_key`) keeps the rows already there and measures the rest; a row it needs as an A/B partner (eager, or
``standard`` for the overheads) is loaded again, not re-measured. The result covers every row in the log, each one
asked for by a run recorded in it; a line that is not valid is refused with the file and line, nothing deleted.

Efficiency: at the start the machine's own matmul ceiling is measured with the run's threads
(:mod:`attnzoo.benchmarks.ceiling`), each variant's FLOPs are counted once on the eager model
(:mod:`attnzoo.benchmarks.flops`), and every CPU row gets its achieved GFLOP/s and its fraction of the ceiling.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tqdm import tqdm

from attnzoo.benchmarks import timing
from attnzoo.benchmarks.ceiling import DEFAULT_SIZE, ceiling_for, fraction, matmul_ceiling
from attnzoo.benchmarks.flops import count_flops, count_variant, meta_model
from attnzoo.benchmarks.ort_cpu import gemm_gflops, profile_ops
from attnzoo.benchmarks.roofline import GPUS, WIDTH, bound, gpu_key
from attnzoo.benchmarks.rowlog import LOG_NAME, RowLog, run_asks
from attnzoo.benchmarks.rows import load_call, row_unavailable_reason, tolerance_for
from attnzoo.benchmarks.stats import ratio_stats, summarize
from attnzoo.benchmarks.timing import PeakRSS, measure, measure_pair
from attnzoo.errors import first_line
from attnzoo.export import export_verified
from attnzoo.machine import environment, load_1min, load_average, load_slowdown, others_load, usable_cores
from attnzoo.models import create_model
from attnzoo.runtime.backends import ONNX_REFERENCE, Backend, Call, get_backend, onnx_reference, reference_backend
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.runtime.parity import check as check_parity
from attnzoo.signals import Interrupted, Terminated

__all__ = [
    "Settings",
    "run_benchmark",
    "onnx_path",
    "NOTE",
    "torch_device",
    "takes_onnx",
    "on_cpu",
    "baseline_dtype",
    "run_key",
    "roofline_fractions",
    "compile_budget_reason",
    "FINAL",
]

#: Row statuses a resumed run keeps (a ``skipped`` row is only written again: no GPU, budget spent ...).
FINAL = ("ok", "failed", "built")
NOTE = (
    "Models: attnzoo.models.create_model(variant, task, arch) with a seeded random init (torch.manual_seed), "
    "because trained weights exist only for the micro zoo; latency does not depend on the weight values. "
    "ONNX Runtime / TensorRT run the file written by attnzoo.export.export_onnx from those weights; eager "
    "and compile run the same weights in PyTorch. x eager = median eager / median backend from separate "
    "runs, eager at the row's precision where that eager row ran (column 'vs': eager fp16 for an fp16 row), "
    "else eager fp32; x eager (pairs) = median [Q1, Q3] of per-pair ratios from an A B A B run against that "
    "same eager row (robust to load changes); x eager fp32 = median eager fp32 / median backend. Where x eager "
    "and x eager (pairs) differ by much, the machine's load changed between the separate runs (each row records "
    "its load_1min): the paired figure is the one measured under the same load."
)


@dataclass
class Settings:
    """What to run (the parsed command line)."""

    variants: Sequence[str]
    backends: Sequence[str]
    dtypes: Sequence[str]
    batch_sizes: Sequence[int]
    task: str = "cls"
    arch: str = "tiny"
    #: Input side in pixels (``None``: the arch's own, 224 for tiny/small/base).
    img_size: int | None = None
    threads: int = 1
    min_time: float = 3.0
    out: Path = Path("bench-out")
    cache_dir: Path = Path("bench-cache")
    device: str = "auto"
    seed: int = 0
    compile_budget: float = 600.0
    profile: bool = False
    pair_eager: bool = True
    #: Side of the ceiling's square matmul (0: no ceiling measured).
    ceiling_size: int = DEFAULT_SIZE
    command: str = ""
    progress: bool = True
    #: What the run leaves out against ``--all`` (:func:`attnzoo.benchmarks.cli.scope`).
    scope: dict[str, Any] = field(default_factory=dict)
    #: Seconds after which no new row is started (``None``: no limit); the rows measured are kept and the same
    #: command measures the rest.
    time_limit: float | None = None
    #: A backend that compiles the module (``compile``) compiles it once per variant with the batch dimension
    #: dynamic, for every batch size, instead of once per batch size.
    dynamic_batch: bool = False
    #: Test hook: backend -> function applied to its parity output (to prove the gate rejects a bad backend).
    perturb: dict[str, Any] = field(default_factory=dict)


def torch_device(requested: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def takes_onnx(backend: str) -> bool:
    """The backend runs the exported ONNX file (not the PyTorch module)."""
    return get_backend(backend).takes == "onnx"


def on_cpu(backend: str, device: torch.device) -> bool:
    """Rows of ``backend`` compute on the CPU in a run whose PyTorch device is ``device`` (the candidates of the
    report's fastest CPU runtime)."""
    return get_backend(backend).row_device(device.type) == "cpu"


def onnx_path(cache_dir: Path, variant: str, task: str, arch: str, dtype: str, img_size: int) -> Path:
    """Where a run exports (and verifies) the ONNX file it times, kept for reuse (``export_verified(reuse=True)``:
    the same seeded model is exported once per cache); ``serving.loadtest`` serves the same file, and the scaling
    study names its files the same way."""
    return Path(cache_dir) / f"{variant}_{task}_{arch}_{img_size}px_{dtype}.onnx"


def _row(
    variant: str, s: Settings, backend: str, dtype: str, batch: int, status: str, reason: str = "", **extra: Any
) -> dict[str, Any]:
    key = tolerance_for(backend, dtype, torch_device(s.device).type)
    row = {
        "variant": variant,
        "task": s.task,
        "arch": s.arch,
        "backend": backend,
        "dtype": dtype,
        "batch": batch,
        "device": get_backend(backend).row_device(torch_device(s.device).type),
        "status": status,
        "reason": reason,
        "parity_error": None,
        "parity_tol": TOLERANCES[key],
        "iterations": None,
        "min_ms": None,
        "median_ms": None,
        "mean_ms": None,
        "p90_ms": None,
        "p95_ms": None,
        "p99_ms": None,
        "max_ms": None,
        "cv": None,
        "throughput_img_s": None,
        "peak_mem_mb": None,
        "mem_kind": None,
        "baseline": None,
        "speedup_vs_eager": None,
        "speedup_vs_eager_fp32": None,
        "speedup_pair_median": None,
        "speedup_pair_q1": None,
        "speedup_pair_q3": None,
        "speedup_pairs": None,
        "cuda_graph": None,
        "build_s": None,
        "gflop": None,
        "achieved_gflops": None,
        "ceiling_gflops": None,
        "ceiling_fraction": None,
        "roofline_us": None,
        "roofline_fraction": None,
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


class _TimeUp(Exception):
    """``--time-limit`` passed: no new row is started (the argument names the next one)."""


class _Partner:
    """A runner another row is timed against (A/B): the one just measured, or -- for a row a resumed run kept --
    loaded again when first needed (``None`` if that fails: the pairs are then left out)."""

    def __init__(self, runner: Call | None = None, load: Any | None = None) -> None:
        self.runner, self.load = runner, load

    def get(self) -> Call | None:
        if self.runner is None and self.load is not None:
            load, self.load = self.load, None
            try:
                self.runner = load()
            except Exception:  # a partner that will not load: no pairs, the row says nothing wrong
                self.runner = None
        return self.runner

    def close(self) -> None:
        """Close the runner's session (if it was loaded); it is not loaded again."""
        runner, self.runner, self.load = self.runner, None, None
        if runner is not None:
            runner.close()


class _Exports:
    """A variant's verified ONNX files, exported on first use (a resumed run exports only what it still needs)."""

    def __init__(self, bench: _Bench, variant: str, model) -> None:
        self.bench, self.variant, self.model = bench, variant, model
        self.paths: dict[str, Path] = {}
        self.errors: dict[str, str] = {}

    def get(self, src: str) -> Path | None:
        """The ``fp32`` / ``fp16`` file, or ``None`` when its export failed (:attr:`errors` says why)."""
        if src not in self.paths and src not in self.errors:
            try:
                with self.bench.phase("ONNX export and its check"):
                    self.paths[src] = self.bench.export(self.model, self.variant, src)
            except Exception as exc:  # reported on every ONNX row of this variant
                self.errors[src] = first_line(exc, typed=True)
        return self.paths.get(src)


def bench_model(s: Settings, variant: str):
    """The run's model of ``variant``: seeded random init (:data:`NOTE`)."""
    torch.manual_seed(s.seed)
    return create_model(variant, task=s.task, arch=s.arch, img_size=s.img_size).eval()


def bench_export(s: Settings, model, variant: str, dtype: str) -> Path:
    """The verified ONNX file of ``model`` in the run's cache, exported as export-model verifies (projection check,
    ORT vs eager at batch 1 and 3); a file this cache verified for the same weights and versions is kept (a run
    resumed, the scaling sweep beside it, the exports made ahead)."""
    cfg = model.attnzoo_config
    path = onnx_path(s.cache_dir, variant, s.task, s.arch, dtype, cfg["img_size"])
    path.parent.mkdir(parents=True, exist_ok=True)
    export_verified(
        model,
        path,
        cfg,
        dtype=dtype,
        input_hw=(cfg["img_size"], cfg["img_size"]),
        batch_sizes=(1,),
        threads=s.threads,
        reuse=True,
    )
    return path


def _export_jobs(s: Settings, jobs: Sequence[tuple[str, str]]) -> None:
    """A child process of :meth:`_Bench.export_ahead`: export each ``(variant, precision)``, quietly (a failure is
    met again, and reported, by the row that needs the file)."""
    torch.set_num_threads(s.threads)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        for variant, src in jobs:
            with contextlib.suppress(Exception):
                bench_export(s, bench_model(s, variant), variant, src)


class _Bench:
    """State of one run: models, exports, references, the standard and eager runners kept for A/B pairs."""

    def __init__(self, s: Settings, log: RowLog | None = None) -> None:
        self.s = s
        self.log = log
        self.device = torch_device(s.device)
        kept = [r for r in (log.of("row") if log else []) if r["row"]["status"] in FINAL]
        self.done: dict[tuple[str, str, str, int], dict[str, Any]] = {
            (r["row"]["variant"], r["row"]["backend"], r["row"]["dtype"], r["row"]["batch"]): r for r in kept
        }
        self.groups_done = {(g["variant"], g["batch"]) for g in (log.of("group") if log else [])}
        self.rows: list[dict[str, Any]] = []
        self.overheads: list[dict[str, Any]] = []
        self.profiles: list[dict[str, Any]] = []
        self.profile_errors: list[str] = []
        self.standard: dict[tuple[str, str, int], _Partner] = {}
        self.flops: dict[str, dict[str, Any]] = {}
        self.pairs: list[dict[str, Any]] = []  # head-to-head fp32 CPU runtimes (b time / a time)
        self.head_to_head_errors: list[str] = []
        self.compile_spent = 0.0
        self.compile_count = 0
        self.current = ""  # the job under way (named if the run is interrupted)
        self.phases: dict[str, float] = {}  # seconds of this invocation by kind of work (:meth:`phase`)
        self.deadline = time.time() + s.time_limit if s.time_limit else None
        self.combos = [(b, d) for b, d in run_asks(s.variants, s.backends, s.dtypes, s.batch_sizes)["combos"]]
        self.skip = {c: row_unavailable_reason(c[0], c[1], self.device.type) for c in self.combos}
        reference = (reference_backend(), "fp32")
        self.skip[reference] = None  # the reference backend always runs
        # eager first, fp32 first of all: the parity reference's twin and every row's A/B baseline run before them
        self.combos.sort(key=lambda c: (not get_backend(c[0]).is_reference, c != reference))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the block to :attr:`phases` under ``name``: where a run's time goes (export, engine
        builds, loading and compiling per backend, timing, the A/B pairs, ...), in ``results.json``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t0

    def all_rows(self) -> list[dict[str, Any]]:
        """The rows kept from earlier runs, then this run's."""
        return [r["row"] for r in self.done.values()] + self.rows

    def add(self, row: dict[str, Any], overhead: dict[str, Any] | None = None) -> None:
        """A finished row (and its overhead entry): kept, and appended to the row log at once."""
        self.rows.append(row)
        if overhead is not None:
            self.overheads.append(overhead)
        if self.log is not None:
            self.log.append({"kind": "row", "row": row, "overhead": overhead})

    # ---------------------------------------------------------------------------------------- models
    def model(self, variant: str):
        return bench_model(self.s, variant)

    def export(self, model, variant: str, dtype: str) -> Path:
        return bench_export(self.s, model, variant, dtype)

    def export_ahead(self, variants: Sequence[str]) -> None:
        """Export the ONNX files the rows still to measure will read before any row is timed, a child process
        exporting every other one beside this process: an export is mostly single-threaded tracing, so on two
        cores they take about half as long, and nothing is timed while they run. Each is kept in the cache
        (:func:`bench_export`), and the rows' own export reuses it after checking it again; a file the child could
        not make is made when a row needs it, whose failure that row reports."""
        jobs = [
            (v, src)
            for v in variants
            for src in dict.fromkeys(
                "fp16" if d == "fp16" else "fp32"
                for n in self.s.batch_sizes
                for b, d in self.todo(v, n)
                if takes_onnx(b)
            )
        ]
        if len(jobs) < 2 or usable_cores() < 2:
            return
        self.current = "the ONNX exports"
        child = mp.get_context("spawn").Process(
            target=_export_jobs, args=(replace(self.s, perturb={}, threads=1), jobs[1::2]), daemon=True
        )
        with self.phase("ONNX export and its check"):
            child.start()
            try:
                for variant, src in jobs[0::2]:
                    with contextlib.suppress(Exception):  # made again, and reported, by the row that needs it
                        self.export(self.model(variant), variant, src)
                child.join()
            finally:
                if child.is_alive():  # stopped by a signal: the child's half-made file is never renamed into place
                    child.terminate()
                    child.join()

    def inputs(self, model, batch: int) -> torch.Tensor:
        size = model.attnzoo_config["img_size"]
        gen = torch.Generator().manual_seed(self.s.seed + batch)
        return torch.randn(batch, 3, size, size, generator=gen)

    # ------------------------------------------------------------------------------------------- jobs
    def job(
        self,
        variant: str,
        backend: str,
        dtype: str,
        batch: int,
        model,
        onnx: dict[str, Path],
        x: torch.Tensor,
        ref: np.ndarray,
        eagers: dict[str, _Partner],
    ) -> Call | None:
        """Build, check, time one combination; append its row (and overhead row). Returns its call."""
        s = self.s
        b = get_backend(backend)
        over = compile_budget_reason(self.compile_spent, self.compile_count, s.compile_budget)
        if b.jit_compiles and over:
            self.add(_row(variant, s, backend, dtype, batch, "skipped", over))
            return None
        rss = PeakRSS()  # the sessions of earlier jobs were closed when they were no longer needed
        t0 = time.perf_counter()
        src = onnx.get("fp16" if dtype == "fp16" else "fp32")
        cannot_run = b.unavailable_reason(dtype, self.device.type) if b.builds_engine else None
        if cannot_run:  # built ahead of time instead: no GPU, or one TensorRT-RTX engines do not run on
            why = "no GPU" if not torch.cuda.is_available() else cannot_run
            self.built_not_run(variant, b, dtype, batch, src, why)
            return None
        runner: Call | None = None
        try:
            with self.phase(f"load and first run: {backend}"):
                runner, info = load_call(
                    backend,
                    model,
                    src,
                    x.numpy(),
                    dtype,
                    threads=s.threads,
                    device=self.device.type,
                    cache_dir=s.cache_dir,
                    dynamic_batch=s.dynamic_batch,
                )
                out = runner.output()
        except Exception as exc:  # any backend failure is a result to report, not a crash
            if runner is not None:
                runner.close()
            self.add(_row(variant, s, backend, dtype, batch, "failed", f"build/run: {first_line(exc, typed=True)}"))
            return None
        build_s = time.perf_counter() - t0
        if b.jit_compiles:
            self.compile_spent += build_s
            self.compile_count += 1
        if backend in s.perturb:
            out = s.perturb[backend](out)
        key = tolerance_for(backend, dtype, self.device.type)
        ok, err = check_parity(out, ref, key)
        common = dict(
            parity_error=err if math.isfinite(err) else None, build_s=build_s, info=info, cuda_graph=runner.cuda_graph
        )
        if not ok:
            runner.close()
            self.add(_row(variant, s, backend, dtype, batch, "failed", _parity_reason(out, ref, err, key), **common))
            return None
        try:
            self._time(variant, backend, dtype, batch, runner, rss, common, eagers)
        except Exception as exc:  # a timing failure is a result to report, not a crash
            runner.close()
            self.add(
                _row(variant, s, backend, dtype, batch, "failed", f"timing: {first_line(exc, typed=True)}", **common)
            )
            return None
        return runner

    def built_not_run(self, variant: str, b: Backend, dtype: str, batch: int, src: Path | None, why: str) -> None:
        """No GPU (or one whose engines cannot run here, ``why``): the engine of a backend that
        :attr:`~attnzoo.runtime.backends.Backend.builds_engine` built ahead of time, one per variant and dtype whose
        profile spans the run's batch sizes, kept in the cache and reused by every batch's row and by later runs;
        the rows say it was not run."""
        try:
            with self.phase(f"engine build, not run: {b.name}"):
                facts = b.build_only(
                    src, b.options(dtype=dtype, batch_sizes=self.s.batch_sizes, cache_dir=self.s.cache_dir)
                )
        except Exception as exc:  # a build failure is a result to report, not a crash
            self.add(_row(variant, self.s, b.name, dtype, batch, "failed", f"build: {first_line(exc, typed=True)}"))
            return None
        p = facts["profile"]
        how = "reused from the engine cache, built" if facts["cached"] else "built"
        self.add(
            _row(
                variant,
                self.s,
                b.name,
                dtype,
                batch,
                "built",
                f"built, not run ({why}): {facts['library']} {facts['library_version']} for "
                f"{facts['compute_capability']}, one engine for batch {p['min']}-{p['max']} "
                f"(opt {p['opt']}), {facts['engine_size'] / 1e6:.1f} MB, {how} in "
                f"{facts['build_time_s']:.1f} s",
                build_s=facts["build_time_s"],
                info=facts,
            )
        )
        return None

    def _time(
        self, variant: str, backend: str, dtype: str, batch: int, runner: Call, rss, common, eagers: dict[str, _Partner]
    ) -> None:
        """Time a runner that passed parity; append its row (and overhead entry). May raise."""
        s = self.s
        with rss, self.phase("timing"):
            samples = measure(runner.fn, s.min_time, cuda=runner.cuda)
        mem, kind = runner.memory() if runner.memory else (rss.delta_mb, "peak RSS while timed - RSS before build")
        base = baseline_dtype(backend, dtype, eagers)
        row = _row(
            variant,
            s,
            backend,
            dtype,
            batch,
            "ok",
            **common,
            **cast(dict[str, Any], summarize(samples, batch)),  # timing keys only, none of _row's own
            peak_mem_mb=mem,
            mem_kind=kind,
            baseline=f"eager {base}" if base else None,
        )
        eager = eagers[base].get() if base in eagers and s.pair_eager else None
        if eager is not None and eager is not runner:
            with self.phase("A/B pairs with eager"):
                a, b = measure_pair(
                    eager.fn, runner.fn, s.min_time, cuda_a=eager.cuda, cuda_b=runner.cuda, settled=True
                )
            pair = ratio_stats(b, a)  # eager time / backend time = speed-up
            row.update(
                speedup_pair_median=pair["ratio_median"],
                speedup_pair_q1=pair["ratio_q1"],
                speedup_pair_q3=pair["ratio_q3"],
                speedup_pairs=pair["pairs"],
            )
        std = self.standard[(backend, dtype, batch)].get() if (backend, dtype, batch) in self.standard else None
        overhead = None
        if variant != "standard" and std is not None:
            with self.phase("A/B pairs with standard"):
                a, b = measure_pair(std.fn, runner.fn, s.min_time, cuda_a=std.cuda, cuda_b=runner.cuda, settled=True)
            overhead = {
                "variant": variant,
                "backend": backend,
                "dtype": dtype,
                "batch": batch,
                **ratio_stats(a, b),
                "variant_median_ms": float(np.median(b) * 1e3),
                "standard_median_ms": float(np.median(a) * 1e3),
            }
        # appended only once every step succeeded, so a failure leaves one ``failed`` row and nothing else
        self.add(row, overhead)
        if variant == "standard":
            self.standard[(backend, dtype, batch)] = _Partner(runner)

    def head_to_head(self, variant: str, batch: int, runners: dict[str, Call | None]) -> None:
        """Time the two fastest fp32 CPU runtimes (by speed-up over eager) against each other, A B A B, so the
        report's "fastest" rests on a direct comparison, not on two comparisons with eager made at different
        times. A timing failure is a note in ``head_to_head_errors``."""
        live = {k: v for k, v in runners.items() if v is not None}
        if len(live) < 2:
            return
        speedup = {
            r["backend"]: r["speedup_pair_median"] or 0.0
            for r in self.all_rows()
            if (r["variant"], r["batch"], r["dtype"], r["status"]) == (variant, batch, "fp32", "ok")
            and r["backend"] in live
        }
        a, b = sorted(live, key=lambda k: -speedup.get(k, 0.0))[:2]
        try:
            with self.phase("CPU head-to-head"):
                ta, tb = measure_pair(live[a].fn, live[b].fn, self.s.min_time, settled=True)
        except Exception as exc:  # a timing failure is a note, not a crash
            self.head_to_head_errors.append(f"{variant} b{batch} {a}/{b}: {first_line(exc, typed=True)}")
            return
        self.pairs.append(
            {
                "variant": variant,
                "batch": batch,
                "a": a,
                "b": b,
                **ratio_stats(ta, tb),
                "a_median_ms": float(np.median(ta) * 1e3),
                "b_median_ms": float(np.median(tb) * 1e3),
            }
        )

    def profile(self, variant: str, onnx_path: Path, x: torch.Tensor) -> None:
        """ORT profiler: per-op-type time of the naive session and of the tuned ``ort-cpu`` session."""
        xs = x.numpy()
        ort_cpu = onnx_reference()
        options = ort_cpu.options(threads=self.s.threads, cache_dir=self.s.cache_dir, batch=len(xs))
        naive = profile_ops(lambda prefix: ort_cpu.profiled(onnx_path, options, prefix, optimize=False).session, xs)
        tuned = profile_ops(lambda prefix: ort_cpu.profiled(onnx_path, options, prefix).session, xs)
        self.profiles.append({"variant": variant, "batch": int(x.shape[0]), "naive": naive, "tuned": tuned})

    def todo(self, variant: str, batch: int) -> list[tuple[str, str]]:
        """The runnable combinations of ``variant`` at ``batch`` without a finished row in the log."""
        return [(b, d) for b, d in self.combos if not self.skip[(b, d)] and (variant, b, d, batch) not in self.done]

    def variant(self, variant: str, bar, needed_later: bool) -> None:
        """Count its FLOPs, then run every batch size (its ONNX files are exported when a row first needs them).
        A variant with every row and group in the log is passed over, unless later variants need its runners as
        A/B partners (``needed_later``: ``standard``)."""
        counted = {f["variant"]: f["flops"] for f in (self.log.of("flops") if self.log else [])}
        finished = all(not self.todo(variant, n) and (variant, n) in self.groups_done for n in self.s.batch_sizes)
        if variant in counted:
            self.flops[variant] = counted[variant]
        if finished and not needed_later:  # only the rows that say why they cannot run here are written again
            for batch in self.s.batch_sizes:
                for backend, dtype in self.combos:
                    if reason := self.skip[(backend, dtype)]:
                        self.add(_row(variant, self.s, backend, dtype, batch, "skipped", reason))
            return
        model = self.model(variant)
        if variant not in self.flops:
            with self.phase("FLOP count"):
                self.flops[variant] = count_flops(model, model.attnzoo_config["img_size"])
            if self.log is not None:
                self.log.append({"kind": "flops", "variant": variant, "flops": self.flops[variant]})
        exports = _Exports(self, variant, model)
        for batch in self.s.batch_sizes:
            self.batch(variant, model, batch, exports, bar)

    def _reload(self, backend: str, dtype: str, model, exports: _Exports, x: torch.Tensor) -> Call | None:
        """A runner of a row kept from an earlier run, loaded again to be an A/B partner (not re-measured)."""
        src = exports.get("fp16" if dtype == "fp16" else "fp32") if takes_onnx(backend) else None
        if takes_onnx(backend) and src is None:
            return None
        return load_call(
            backend,
            model,
            src,
            x.numpy(),
            dtype,
            threads=self.s.threads,
            device=self.device.type,
            cache_dir=self.s.cache_dir,
            dynamic_batch=self.s.dynamic_batch,
        )[0]

    def batch(self, variant: str, model, batch: int, exports: _Exports, bar) -> None:
        """All backends of one variant at one batch size; eager first, fp32 first of all (reference twin and A/B
        partner). Rows already in the log are not measured again; their runners are loaded when a partner. A
        runner no later row needs is closed at once, the partners when the batch is done (``standard``'s at the
        end of the run: :meth:`close`)."""
        eagers: dict[str, _Partner] = {}  # eager runners that passed, by precision: the rows' A/B baselines
        cpu_runners: dict[str, _Partner] = {}  # fp32 CPU runtimes that passed, for the head-to-head pair
        try:
            self._batch(variant, model, batch, exports, bar, eagers, cpu_runners)
        finally:
            if variant != "standard":  # standard's are in self.standard, partners of every later variant
                for partner in (*eagers.values(), *cpu_runners.values()):
                    partner.close()

    def _batch(
        self,
        variant: str,
        model,
        batch: int,
        exports: _Exports,
        bar,
        eagers: dict[str, _Partner],
        cpu_runners: dict[str, _Partner],
    ) -> None:
        x = self.inputs(model, batch)
        ref: np.ndarray | None = None
        for backend, dtype in self.combos:
            reason = self.skip[(backend, dtype)]
            if reason:
                self.add(_row(variant, self.s, backend, dtype, batch, "skipped", reason))
                continue
            kept = self.done.get((variant, backend, dtype, batch))
            if kept is not None:
                if kept["row"]["status"] == "ok":
                    partner = _Partner(load=lambda b=backend, d=dtype: self._reload(b, d, model, exports, x))
                    self._partner(variant, backend, dtype, batch, partner, eagers, cpu_runners)
                continue
            src = "fp16" if dtype == "fp16" else "fp32"
            if self.deadline is not None and time.time() > self.deadline:
                raise _TimeUp(f"{variant} {backend} {dtype} b{batch}")
            self.current = f"{variant} {backend} {dtype} b{batch}"
            bar.set_postfix_str(self.current)
            if takes_onnx(backend) and exports.get(src) is None:
                self.add(_row(variant, self.s, backend, dtype, batch, "failed", f"export: {exports.errors[src]}"))
            else:
                if ref is None:
                    with torch.inference_mode(), self.phase("eager reference"):
                        ref = model(x).float().numpy()
                runner = self.job(variant, backend, dtype, batch, model, exports.paths, x, ref, eagers)
                if runner is not None and not self._partner(
                    variant, backend, dtype, batch, _Partner(runner), eagers, cpu_runners
                ):
                    runner.close()  # no later row pairs with it
            bar.update(1)
        if (variant, batch) in self.groups_done:
            return
        self.head_to_head(variant, batch, {k: v.get() for k, v in cpu_runners.items()})
        if self.s.profile and exports.get("fp32") is not None:
            try:
                with self.phase("ONNX Runtime profiles"):
                    self.profile(variant, exports.paths["fp32"], x)
            except Exception as exc:  # a profiler failure is a note, not a crash
                self.profile_errors.append(f"{variant} b{batch}: {first_line(exc, typed=True)}")
        if self.log is not None:
            self.log.append(
                {
                    "kind": "group",
                    "variant": variant,
                    "batch": batch,
                    "pairs": [p for p in self.pairs if (p["variant"], p["batch"]) == (variant, batch)],
                    "profiles": [p for p in self.profiles if (p["variant"], p["batch"]) == (variant, batch)],
                    "head_to_head_errors": [
                        e for e in self.head_to_head_errors if e.startswith(f"{variant} b{batch} ")
                    ],
                    "profile_errors": [e for e in self.profile_errors if e.startswith(f"{variant} b{batch}:")],
                }
            )

    def _partner(
        self,
        variant: str,
        backend: str,
        dtype: str,
        batch: int,
        partner: _Partner,
        eagers: dict[str, _Partner],
        cpu_runners: dict[str, _Partner],
    ) -> bool:
        """Keep a runner where later rows look for their A/B partners; whether it was kept."""
        kept = variant == "standard"
        if get_backend(backend).is_reference:
            eagers[dtype], kept = partner, True
        elif dtype == "fp32" and on_cpu(backend, self.device):
            cpu_runners[backend], kept = partner, True
        if variant == "standard":
            self.standard[(backend, dtype, batch)] = partner
        return kept

    def close(self) -> None:
        """Close the runners kept to the end of the run (``standard``'s, every later variant's partners)."""
        for partner in self.standard.values():
            partner.close()
        self.standard.clear()


def baseline_dtype(backend: str, dtype: str, eagers: dict[str, Any]) -> str | None:
    """The precision of the eager row a ``backend`` row at ``dtype`` is compared with: eager at the same precision
    where that row ran (an fp16 row against eager fp16, not fp32), else -- and for eager's own rows -- eager fp32;
    ``None`` without an eager fp32 row. Eager fp32 is its own baseline."""
    reference = get_backend(backend).is_reference
    if not reference and dtype in eagers:
        return dtype
    return "fp32" if "fp32" in eagers or (reference and dtype == "fp32") else None


def _speedups(rows: list[dict[str, Any]]) -> None:
    """Fill ``speedup_vs_eager`` = median of the row's baseline eager row (``baseline``) / row median and
    ``speedup_vs_eager_fp32`` = eager fp32 median / row median (same variant, batch)."""
    eager = {
        (r["variant"], r["batch"], r["dtype"]): r["median_ms"]
        for r in rows
        if r["status"] == "ok" and r["backend"] == reference_backend()
    }
    for r in rows:
        if r["status"] != "ok":
            continue
        fp32 = eager.get((r["variant"], r["batch"], "fp32"))
        base = eager.get((r["variant"], r["batch"], (r.get("baseline") or "eager fp32").split()[-1]))
        r["speedup_vs_eager"] = base / r["median_ms"] if base else None
        r["speedup_vs_eager_fp32"] = fp32 / r["median_ms"] if fp32 else None


def _efficiency(
    rows: list[dict[str, Any]], flops: dict[str, dict[str, Any]], ceiling: dict[str, Any] | None, device: torch.device
) -> None:
    """Fill ``gflop`` (counted FLOPs of one call: per image x batch), ``achieved_gflops`` (= gflop / median s),
    ``ceiling_gflops`` (the ceiling of the row's precision on its device) and ``ceiling_fraction``."""
    for r in rows:
        count = flops.get(r["variant"])
        if count is None:
            continue
        r["gflop"] = count["flops_per_image"] * r["batch"] / 1e9
        if r["status"] == "ok":
            top = ceiling_for(ceiling, r["backend"], r["dtype"], get_backend(r["backend"]).row_device(device.type))
            r.update(fraction(r["gflop"] * 1e9, r["median_ms"], top))


def roofline_fractions(
    rows: list[dict[str, Any]], gpu_name: str | None, task: str, arch: str, img_size: int | None = None
) -> None:
    """Fill ``roofline_us`` (the lower bound of the row's forward pass on this GPU at the row's precision:
    :func:`attnzoo.benchmarks.roofline.bound`, the one table of GPU peaks) and ``roofline_fraction`` (bound /
    median: 1 = at the roof) of every GPU row that ran, where the GPU is in that table."""
    key = gpu_key(gpu_name) if gpu_name else None
    if key is None:
        return
    counts: dict[tuple[str, int], Any] = {}
    for r in rows:
        if r["status"] != "ok" or r.get("device") != "cuda" or r["dtype"] not in WIDTH:
            continue
        where = (r["variant"], r["batch"])
        if where not in counts:
            counts[where] = count_variant(
                r["variant"], batch=r["batch"], model=meta_model(r["variant"], task, arch, img_size)
            )
        c = counts[where]
        b = bound(c.matrix_flops, c.vector_ops, c.bytes(WIDTH[r["dtype"]]), GPUS[key], r["dtype"])
        if b["bound_s"] is not None:
            r.update(roofline_us=b["bound_s"] * 1e6, roofline_fraction=b["bound_s"] / (r["median_ms"] / 1e3))


def _fastest_cpu(rows: list[dict[str, Any]], pairs: list[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    """The fastest fp32 CPU runtime per (variant, batch), with the runner-up and by how much.

    Candidates are ranked by speed-up over eager fp32 (the paired median where measured, else the ratio of
    medians; eager itself counts as 1). Where the two best were also timed head to head (A B A B), that
    direct comparison decides between them and gives ``x_runner_up`` (``how``: ``head-to-head pairs``).
    int8 is a change of precision, not of runtime, and is left out.
    """
    groups: dict[tuple[str, int], list[tuple[float, dict[str, Any]]]] = {}
    for r in rows:
        if r["status"] != "ok" or r["dtype"] != "fp32" or not on_cpu(r["backend"], device):
            continue
        score = (
            1.0
            if r["backend"] == reference_backend()
            else (r["speedup_pair_median"] if r.get("speedup_pair_median") is not None else r["speedup_vs_eager"])
        )
        if score:
            groups.setdefault((r["variant"], r["batch"]), []).append((score, r))
    direct = {(p["variant"], p["batch"], frozenset((p["a"], p["b"]))): p for p in pairs}
    out = []
    for (variant, batch), scored in groups.items():
        scored.sort(key=lambda t: -t[0])
        ranked = [r["backend"] for _, r in scored]
        x_next = scored[0][0] / scored[1][0] if len(scored) > 1 else None
        how = "speed-ups over eager" if len(scored) > 1 else None
        pair = direct.get((variant, batch, frozenset(ranked[:2]))) if len(ranked) > 1 else None
        if pair is not None:
            # ratio_median = b time / a time: above 1, a is faster
            faster, slower = (pair["a"], pair["b"]) if pair["ratio_median"] >= 1 else (pair["b"], pair["a"])
            ranked[:2] = [faster, slower]
            x_next = max(pair["ratio_median"], 1 / pair["ratio_median"])
            how = "head-to-head pairs"
        best = next(r for _, r in scored if r["backend"] == ranked[0])
        score = next(sc for sc, r in scored if r["backend"] == ranked[0])
        out.append(
            {
                "variant": variant,
                "batch": batch,
                "backend": ranked[0],
                "median_ms": best["median_ms"],
                "x_eager": score,
                "runner_up": ranked[1] if len(ranked) > 1 else None,
                "x_runner_up": x_next,
                "how": how,
            }
        )
    return out


#: The estimate's model (:func:`estimate_seconds`): an ONNX export and its verification cost a fixed part (tracing,
#: the ONNX checker, sessions, the verification's Python) plus as long as this many batch-1 forward passes; a whole
#: ViT forward pass reaches this fraction of the matmul ceiling (the committed default runs' rows: 20-80 %). The
#: fixed part is a quiet machine's: the committed default run on a quiet 2-core AMD EPYC spent 72 s on its three
#: variants' exports (``phases_s`` in ``results/bench-latency/default-avx2/results.json``), of which their forward
#: passes were under a second each. Rough on purpose: it says minutes.
EXPORT_FIXED_S, EXPORT_CALLS, FORWARD_EFFICIENCY = 20.0, 40, 0.5


def estimate_seconds(
    s: Settings, bench: _Bench, variants: list[str], ceiling: dict[str, Any] | None, slowdown: float = 1.0
) -> float | None:
    """How long the rows still to measure take (``None`` without a measured fp32 ceiling): per row its timed
    calls (warm-up, ``min_time`` and at least 10 calls), its A/B pairs with eager and ``standard`` (each up to
    ``min_time`` and 10 pairs), the head-to-head per group, a forward pass costing counted FLOPs over
    :data:`FORWARD_EFFICIENCY` of the ceiling; one export per variant; and the compile budget.

    The ceiling is measured under the machine's load of the moment, so the forward passes' share already counts
    it; the exports' fixed part is a quiet machine's and takes ``slowdown`` times as long
    (:func:`attnzoo.machine.load_slowdown`). The compile budget is a limit, counted as it is."""
    gflops = ((ceiling or {}).get("fp32") or {}).get("gflops")
    if not gflops:
        return None
    total, compiles = 0.0, False
    for variant in variants:
        rows = [(n, b, d) for n in s.batch_sizes for b, d in bench.todo(variant, n)]
        if not rows:
            continue
        count = count_variant(variant, batch=1, model=meta_model(variant, s.task, s.arch, s.img_size))
        call1 = (count.matrix_flops + count.vector_ops) / (gflops * 1e9 * FORWARD_EFFICIENCY)
        if any(takes_onnx(b) for _, b, _ in rows):
            total += EXPORT_FIXED_S * slowdown + EXPORT_CALLS * call1
        for n, backend, _ in rows:
            t = call1 * n
            calls = max(timing.MIN_ITERS, s.min_time / t) + max(2, timing.WARMUP_S / t)
            pair = 2 * max(timing.MIN_ITERS, s.min_time / (2 * t)) + 2 * max(2, timing.WARMUP_S / t)
            calls += pair * ((not get_backend(backend).is_reference) + (variant != "standard")) + 1
            total += calls * t
            compiles = compiles or get_backend(backend).jit_compiles
        for n in s.batch_sizes:  # the head-to-head of two runtimes, the eager reference
            total += (2 * max(timing.MIN_ITERS, s.min_time / (2 * call1 * n)) + 1) * call1 * n
    return total + (s.compile_budget if compiles else 0.0)


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 300 else f"{seconds:.0f} s"


def estimate_line(seconds: float, rows: int, load: dict[str, Any] | None) -> str:
    """The opening ``estimate: ...`` line: ``seconds`` for ``rows`` rows, and the load it assumed (``load``:
    ``{"others", "cpus", "slowdown"}``, :func:`estimate_load`), or that the system reports none."""
    head = f"estimate: about {_duration(seconds)} for {rows} row(s)"
    how = "from this machine's matmul speed and the rows' counted FLOPs"
    if load is None:
        return f"{head} ({how}; this system reports no load average, so other work beside this run is not counted)"
    beside = f"load {load['others']:.1f} beside this run on {load['cpus']} CPUs"
    if load["slowdown"] < 1.05:
        return f"{head} ({how}, at the {beside}; more load makes it longer)"
    return (
        f"{head} at the {beside} ({how}, measured under it; the exports' fixed work is counted "
        f"{load['slowdown']:.1f}x a quiet machine's); a load that changes moves it"
    )


def estimate_load(threads: int) -> dict[str, Any] | None:
    """The load :func:`estimate_seconds` assumes: other work's share of the 1-minute load average
    (:func:`attnzoo.machine.others_load`, this process's CPU time so far taken out), the CPUs it shares, and the
    slowdown of ``threads`` threads beside it (:func:`attnzoo.machine.load_slowdown`); None where the system
    reports no load average."""
    load = load_1min()
    if load is None:
        return None
    others, cpus = others_load(load, time.process_time(), threads), os.cpu_count() or 1
    return {
        "load_1min": load,
        "others": round(others, 2),
        "cpus": cpus,
        "slowdown": load_slowdown(others, cpus, threads),
    }


def compile_budget_reason(spent: float, count: int, budget: float) -> str | None:
    """Why a compile job is not started (``--compile-budget``), or ``None``: the budget is spent, or the next compile,
    predicted to take as long as the ones before it on this machine, would pass it (a budget is a limit, not a
    threshold one last compile may run far over)."""
    if count == 0:
        return None if budget > 0 else f"--compile-budget {budget:g} s allows no compile"
    each = spent / count
    if spent + each <= budget:
        return None
    return (
        f"--compile-budget {budget:g} s: {count} compile(s) took {spent:.0f} s, {each:.0f} s each on this machine; "
        "another would pass it"
    )


def _phases(phases: dict[str, float], wall: float) -> dict[str, float]:
    """This invocation's seconds by kind of work, largest first, and ``other`` (setup, model creation, parity checks,
    the report's arithmetic: the wall time no phase covered)."""
    out = {k: round(v, 2) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])}
    out["other"] = round(max(wall - sum(phases.values()), 0.0), 2)
    return out


def run_key(s: Settings, env: dict[str, Any]) -> dict[str, Any]:
    """What a row's numbers depend on beyond its own variant, backend, precision and batch: a run resumed from a
    row log must have the same (the machine included)."""
    gpu = env.get("gpu") or {}
    dynamic = {"dynamic_batch": True} if s.dynamic_batch else {}  # absent when off: older logs still match
    return {
        **dynamic,
        "task": s.task,
        "arch": s.arch,
        "img_size": s.img_size,
        "threads": s.threads,
        "min_time_s": s.min_time,
        "seed": s.seed,
        "device": torch_device(s.device).type,
        "pair_eager": s.pair_eager,
        "ceiling_size": s.ceiling_size,
        "cpu": env["cpu"].get("model"),
        "gpu": gpu.get("name"),
        "torch": env["versions"].get("torch"),
    }


def _from_log(log: RowLog) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every row of the log, one per (variant, backend, dtype, batch) -- the finished one, else the latest skipped
    one -- grouped by variant and batch in the order they first appear; and the overhead entries of those rows."""
    chosen: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    for record in log.of("row"):
        r = record["row"]
        key = (r["variant"], r["backend"], r["dtype"], r["batch"])
        if key not in chosen or chosen[key]["row"]["status"] not in FINAL:
            chosen[key] = record
    order = {k: i for i, k in enumerate(dict.fromkeys((k[0], k[3]) for k in chosen))}
    records = sorted(chosen.values(), key=lambda rec: order[(rec["row"]["variant"], rec["row"]["batch"])])
    return [rec["row"] for rec in records], [rec["overhead"] for rec in records if rec.get("overhead")]


def run_benchmark(s: Settings, hold_signals: Callable[[], object] | None = None) -> dict[str, Any]:
    """Run everything in ``s`` not already in the row log of ``s.out``; return the result dict written to
    ``results.json``: every row of the log, this run's and the earlier runs' with the same :func:`run_key`.

    Ctrl-C or SIGTERM during the jobs ends them: the rows measured so far are returned, with ``interrupted``
    saying by what and during which job (``None`` for a complete run); the caller writes them, then exits as
    the signal asks (:func:`attnzoo.benchmarks.cli.main`). Any other end, SIGKILL included, leaves the log.

    Args:
        hold_signals: Called once, as soon as the jobs end (done, timed out or stopped by a signal): the caller
            defers signals from there until it has written the results
            (:func:`attnzoo.signals.signals_deferred`), so that a second Ctrl-C or SIGTERM cannot cut the
            writing of what was measured.

    Raises:
        ValueError: the log in ``s.out`` was written with another :func:`run_key`, or has a line that is not
            valid (the file and line named; before anything is measured).
    """
    torch.set_num_threads(s.threads)
    env = environment()
    Path(s.out).mkdir(parents=True, exist_ok=True)
    started = time.time()
    log = RowLog(
        Path(s.out) / LOG_NAME,
        run_key(s, env),
        run_asks(s.variants, s.backends, s.dtypes, s.batch_sizes),
        {"command": s.command, "started": started},
    )
    try:
        return _run(s, env, log, started, hold_signals or (lambda: None))
    finally:
        log.close()


def _run(
    s: Settings, env: dict[str, Any], log: RowLog, started: float, hold_signals: Callable[[], object]
) -> dict[str, Any]:
    bench = _Bench(s, log)
    # the GEMM throughput of PyTorch and ONNX Runtime on this CPU, beside the rows of an ONNX Runtime CPU backend
    if any(
        get_backend(b).library == get_backend(ONNX_REFERENCE).library
        and on_cpu(b, bench.device)
        and not bench.skip[(b, d)]
        for b, d in bench.combos
    ):
        with bench.phase("GEMM throughput"):
            env["gemm_gflops"] = gemm_gflops(s.threads)
    # the ceiling of every CPU row: measured once, before any model, with the run's threads; kept for a resumed run
    ceiling = next((r["ceiling"] for r in log.of("ceiling")), None)
    if ceiling is None and s.ceiling_size:
        with bench.phase("matmul ceiling"):
            ceiling = matmul_ceiling(s.threads, s.ceiling_size)
        log.append({"kind": "ceiling", "ceiling": ceiling})
    variants = list(dict.fromkeys(["standard", *s.variants]))  # standard first: the overhead baseline
    todo = {v: sum(len(bench.todo(v, n)) for n in s.batch_sizes) for v in variants}
    load = estimate_load(s.threads)
    estimate = estimate_seconds(s, bench, variants, ceiling, load["slowdown"] if load else 1.0)
    if estimate is not None and any(todo.values()):
        print(estimate_line(estimate + time.time() - started, sum(todo.values()), load), flush=True)
    if log.torn:
        print(
            f"{log.path.name}: dropped its torn last line ({log.torn} bytes without a newline: a write cut by a "
            "kill); every whole line was kept",
            flush=True,
        )
    if bench.done:
        print(
            f"resuming: {len(bench.done)} finished row(s) kept from {log.path}; {sum(todo.values())} to measure",
            flush=True,
        )
    setup = time.time() - started  # the ceiling and GEMM measurements before the estimate
    interrupted = None
    with tqdm(
        total=sum(todo.values()), desc="bench-latency", unit="job", disable=not s.progress, dynamic_ncols=True
    ) as bar:
        try:
            bench.export_ahead(variants)
            for i, variant in enumerate(variants):
                bench.variant(variant, bar, needed_later=any(todo[v] for v in variants[i + 1 :]))
            if ceiling and s.ceiling_size:  # measured again, to show how far the machine's load moved it
                with bench.phase("matmul ceiling"):
                    end = matmul_ceiling(s.threads, s.ceiling_size, int8=False)["fp32"]["gflops"]
                ceiling["fp32_end_gflops"] = end
        except _TimeUp as exc:  # no signal: the rows are written and the command ends normally
            interrupted = {
                "signal": None,
                "during": str(exc),
                "rows_kept": len(bench.rows),
                "note": f"stopped at --time-limit {s.time_limit:g} s before {exc}; the "
                f"{len(bench.rows)} row(s) measured are kept (in {log.path.name} too: the same "
                "command measures the rest)",
            }
        except (Interrupted, Terminated, KeyboardInterrupt) as exc:  # keep what was measured, then stop
            signal = "SIGTERM" if isinstance(exc, Terminated) else "SIGINT"
            interrupted = {
                "signal": signal,
                "during": bench.current,
                "rows_kept": len(bench.rows),
                "note": f"stopped by {'SIGTERM' if signal == 'SIGTERM' else 'Ctrl-C (SIGINT)'} "
                f"during {bench.current or 'the first job'}; the {len(bench.rows)} row(s) "
                f"measured before it are kept (in {log.path.name} too: the same command "
                "measures the rest)",
            }
        finally:
            hold_signals()  # from here until the results are written, a further signal waits
            bench.close()
    rows, overheads = _from_log(log)
    groups = log.of("group")
    pairs = [p for g in groups for p in g["pairs"]]
    flops = {f["variant"]: f["flops"] for f in log.of("flops")}
    _speedups(rows)
    _efficiency(rows, flops, ceiling, bench.device)
    roofline_fractions(rows, (env.get("gpu") or {}).get("name"), s.task, s.arch, s.img_size)
    runs = log.of("run")
    return {
        "command": s.command,
        "interrupted": interrupted,
        "note": NOTE,
        "settings": {
            "variants": list(dict.fromkeys(r["variant"] for r in rows)) or variants,
            "standard_added": "standard" not in s.variants,
            "backends": list(dict.fromkeys(r["backend"] for r in rows)),
            "dtypes": list(dict.fromkeys(r["dtype"] for r in rows)),
            "batch_sizes": list(dict.fromkeys(r["batch"] for r in rows)),
            "task": s.task,
            "arch": s.arch,
            "img_size": s.img_size,
            "threads": s.threads,
            "min_time_s": s.min_time,
            "time_limit_s": s.time_limit,
            "warmup_s": timing.WARMUP_S,
            "min_iterations": timing.MIN_ITERS,
            "device": str(bench.device),
            "seed": s.seed,
            "compile_budget_s": s.compile_budget,
            "dynamic_batch": s.dynamic_batch,
            "tolerances": TOLERANCES,
            "ceiling_size": s.ceiling_size,
            "parity_measure": "max|out - eager fp32| / max(1, max|eager fp32|)",
            "scope": s.scope,
        },
        "row_log": {
            "file": LOG_NAME,
            "runs": [{"command": r.get("command"), "started": r.get("started")} for r in runs],
            "rows_from_earlier_runs": len(bench.done),
        },
        "environment": env,
        "ceiling": ceiling or {"status": "not measured", "reason": "--ceiling-size 0"},
        "flops": flops,
        "fastest_cpu": _fastest_cpu(rows, pairs, bench.device),
        "cpu_head_to_head": pairs,
        "cpu_head_to_head_errors": [e for g in groups for e in g.get("head_to_head_errors", [])],
        "load_average_end": load_average(),
        "wall_time_s": time.time() - started,
        "estimate_s": None if estimate is None else round(estimate + setup, 1),
        "estimate_load": load,
        "phases_s": _phases(bench.phases, time.time() - started),
        "results": rows,
        "overheads": overheads,
        "ort_profile": [p for g in groups for p in g["profiles"]],
        "ort_profile_errors": [e for g in groups for e in g.get("profile_errors", [])],
    }
