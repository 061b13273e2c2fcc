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

The parts, one concern a module: :mod:`~attnzoo.benchmarks.plan` (which rows, in which order, what is skipped and
why), :mod:`~attnzoo.benchmarks.exports` (the models and their verified ONNX files),
:mod:`~attnzoo.benchmarks.measurement` (one row: load, parity, timing, memory), :mod:`~attnzoo.benchmarks.pairing`
(each row timed beside its partners in the same rounds), :mod:`~attnzoo.benchmarks.resume` (the row log read back),
:mod:`~attnzoo.benchmarks.estimate` (the opening estimate) and :mod:`~attnzoo.benchmarks.summary` (the figures
derived from every row). This module runs them in order and puts the result together.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tqdm import tqdm

from attnzoo.benchmarks import timing
from attnzoo.benchmarks.ceiling import matmul_ceiling
from attnzoo.benchmarks.estimate import estimate_line, estimate_load, estimate_seconds
from attnzoo.benchmarks.exports import Exports, bench_export, bench_model, export_ahead
from attnzoo.benchmarks.flops import count_flops
from attnzoo.benchmarks.measurement import Measurer, new_row
from attnzoo.benchmarks.ort_cpu import gemm_gflops, profile_ops
from attnzoo.benchmarks.pairing import Pairing, Partner, baseline_dtype
from attnzoo.benchmarks.phases import Phases
from attnzoo.benchmarks.plan import (
    Plan,
    Settings,
    TimeUp,
    compile_budget_reason,
    on_cpu,
    onnx_path,
    onnx_source,
    run_key,
    takes_onnx,
    torch_device,
)
from attnzoo.benchmarks.resume import FINAL, results_from_log, resume_lines
from attnzoo.benchmarks.rowlog import LOG_NAME, RowLog, run_asks
from attnzoo.benchmarks.rows import load_call
from attnzoo.benchmarks.summary import efficiency, fastest_cpu, roofline_fractions, speedups
from attnzoo.errors import first_line
from attnzoo.machine import environment, load_average, usable_cores
from attnzoo.runtime.backends import ONNX_REFERENCE, Call, get_backend, onnx_reference
from attnzoo.runtime.parity import TOLERANCES
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
    "bench_model",
    "bench_export",
]

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
class _Group:
    """One variant at one batch size while its rows run: its model, files and input, the eager reference output
    (made when a row first needs it) and the runners that passed, kept as its later rows' A/B partners."""

    variant: str
    batch: int
    model: Any
    exports: Exports
    x: torch.Tensor
    ref: np.ndarray | None = None
    #: Eager runners that passed, by precision: the rows' A/B baselines.
    eagers: dict[str, Partner] = field(default_factory=dict)
    #: fp32 CPU runtimes that passed, for the head-to-head pair.
    cpu_runners: dict[str, Partner] = field(default_factory=dict)


class _Bench:
    """State of one run: its plan, the rows measured, the FLOP counts and profiles, the partners kept for A/B
    pairs (:class:`~attnzoo.benchmarks.pairing.Pairing`), where its time went."""

    def __init__(self, settings: Settings, log: RowLog | None = None) -> None:
        self.settings = settings
        self.log = log
        self.plan = Plan(settings, log)
        self.device = self.plan.device
        self.phases = Phases()  # seconds of this invocation by kind of work, in ``results.json``
        self.pairing = Pairing(settings, self.device, self.phases)
        self.measurer = Measurer(settings, self.phases, self.pairing, self.add)
        self.rows: list[dict[str, Any]] = []
        self.overheads: list[dict[str, Any]] = []
        self.profiles: list[dict[str, Any]] = []
        self.profile_errors: list[str] = []
        self.flops: dict[str, dict[str, Any]] = {}
        self.current = ""  # the job under way (named if the run is interrupted)

    def all_rows(self) -> list[dict[str, Any]]:
        """The rows kept from earlier runs, then this run's."""
        return [r["row"] for r in self.plan.done.values()] + self.rows

    def add(self, row: dict[str, Any], overhead: dict[str, Any] | None = None) -> None:
        """A finished row (and its overhead entry): kept, and appended to the row log at once."""
        self.rows.append(row)
        if overhead is not None:
            self.overheads.append(overhead)
        if self.log is not None:
            self.log.append({"kind": "row", "row": row, "overhead": overhead})

    def export_ahead(self, variants: Sequence[str]) -> None:
        """Export the ONNX files the rows still to measure will read before any row is timed, two at a time
        (:func:`attnzoo.benchmarks.exports.export_ahead`); not for fewer than two files, or on one core."""
        jobs = self.plan.onnx_jobs(variants)
        if len(jobs) < 2 or usable_cores() < 2:
            return
        self.current = "the ONNX exports"
        export_ahead(self.settings, self.phases, jobs)

    def inputs(self, model, batch: int) -> torch.Tensor:
        size = model.attnzoo_config["img_size"]
        gen = torch.Generator().manual_seed(self.settings.seed + batch)
        return torch.randn(batch, 3, size, size, generator=gen)

    def profile(self, variant: str, onnx_path: Path, x: torch.Tensor) -> None:
        """ORT profiler: per-op-type time of the naive session and of the tuned ``ort-cpu`` session."""
        xs = x.numpy()
        ort_cpu = onnx_reference()
        options = ort_cpu.options(threads=self.settings.threads, cache_dir=self.settings.cache_dir, batch=len(xs))
        naive = profile_ops(lambda prefix: ort_cpu.profiled(onnx_path, options, prefix, optimize=False).session, xs)
        tuned = profile_ops(lambda prefix: ort_cpu.profiled(onnx_path, options, prefix).session, xs)
        self.profiles.append({"variant": variant, "batch": int(x.shape[0]), "naive": naive, "tuned": tuned})

    def variant(self, variant: str, bar, needed_later: bool) -> None:
        """Count its FLOPs, then run every batch size (its ONNX files are exported when a row first needs them).
        A variant with every row and group in the log is passed over, unless later variants need its runners as
        A/B partners (``needed_later``: ``standard``)."""
        counted = {f["variant"]: f["flops"] for f in (self.log.of("flops") if self.log else [])}
        finished = self.plan.finished(variant)
        if variant in counted:
            self.flops[variant] = counted[variant]
        if finished and not needed_later:  # only the rows that say why they cannot run here are written again
            for batch in self.settings.batch_sizes:
                for backend, dtype in self.plan.combos:
                    if reason := self.plan.skip[(backend, dtype)]:
                        self.add(new_row(variant, self.settings, backend, dtype, batch, "skipped", reason))
            return
        model = bench_model(self.settings, variant)
        if variant not in self.flops:
            with self.phases.phase("FLOP count"):
                self.flops[variant] = count_flops(model, model.attnzoo_config["img_size"])
            if self.log is not None:
                self.log.append({"kind": "flops", "variant": variant, "flops": self.flops[variant]})
        exports = Exports(self.settings, self.phases, variant, model)
        for batch in self.settings.batch_sizes:
            self.batch(variant, model, batch, exports, bar)

    def _reload(self, backend: str, dtype: str, group: _Group) -> Call | None:
        """A runner of a row kept from an earlier run, loaded again to be an A/B partner (not re-measured)."""
        src = group.exports.get(onnx_source(dtype)) if takes_onnx(backend) else None
        if takes_onnx(backend) and src is None:
            return None
        return load_call(
            backend,
            group.model,
            src,
            group.x.numpy(),
            dtype,
            threads=self.settings.threads,
            device=self.device.type,
            cache_dir=self.settings.cache_dir,
            dynamic_batch=self.settings.dynamic_batch,
        )[0]

    def batch(self, variant: str, model, batch: int, exports: Exports, bar) -> None:
        """All backends of one variant at one batch size; eager first, fp32 first of all (reference twin and A/B
        partner). Rows already in the log are not measured again; their runners are loaded when a partner. A
        runner no later row needs is closed at once, the partners when the batch is done (``standard``'s at the
        end of the run: :meth:`close`)."""
        group: _Group | None = None
        try:
            group = _Group(variant, batch, model, exports, self.inputs(model, batch))
            for backend, dtype in self.plan.combos:
                self._combo(group, backend, dtype, bar)
            if (variant, batch) not in self.plan.groups_done:
                self._finish(group)
        finally:
            if group is not None and variant != "standard":  # standard's are partners of every later variant
                for partner in (*group.eagers.values(), *group.cpu_runners.values()):
                    partner.close()

    def _combo(self, group: _Group, backend: str, dtype: str, bar) -> None:
        """One (backend, dtype) of the group: skipped with its reason, kept from the log (its runner a partner, to
        be loaded when needed), or measured."""
        variant, batch = group.variant, group.batch
        reason = self.plan.skip[(backend, dtype)]
        if reason:
            self.add(new_row(variant, self.settings, backend, dtype, batch, "skipped", reason))
            return
        kept = self.plan.done.get((variant, backend, dtype, batch))
        if kept is not None:
            if kept["row"]["status"] == "ok":
                partner = Partner(load=functools.partial(self._reload, backend, dtype, group))
                self.pairing.keep(variant, backend, dtype, batch, partner, group.eagers, group.cpu_runners)
            return
        src = onnx_source(dtype)
        self.plan.check_deadline(f"{variant} {backend} {dtype} b{batch}")
        self.current = f"{variant} {backend} {dtype} b{batch}"
        bar.set_postfix_str(self.current)
        if takes_onnx(backend) and group.exports.get(src) is None:
            self.add(
                new_row(variant, self.settings, backend, dtype, batch, "failed", f"export: {group.exports.errors[src]}")
            )
        else:
            if group.ref is None:
                with torch.inference_mode(), self.phases.phase("eager reference"):
                    group.ref = group.model(group.x).float().numpy()
            runner = self.measurer.job(
                variant, backend, dtype, batch, group.model, group.exports.paths, group.x, group.ref, group.eagers
            )
            if runner is not None and not self.pairing.keep(
                variant, backend, dtype, batch, Partner(runner), group.eagers, group.cpu_runners
            ):
                runner.close()  # no later row pairs with it
        bar.update(1)

    def _finish(self, group: _Group) -> None:
        """The group's head-to-head and profiles, then its ``group`` line in the log."""
        variant, batch = group.variant, group.batch
        self.pairing.head_to_head(variant, batch, {k: v.get() for k, v in group.cpu_runners.items()}, self.all_rows())
        if self.settings.profile and group.exports.get("fp32") is not None:
            try:
                with self.phases.phase("ONNX Runtime profiles"):
                    self.profile(variant, group.exports.paths["fp32"], group.x)
            except Exception as exc:  # a profiler failure is a note, not a crash
                self.profile_errors.append(f"{variant} b{batch}: {first_line(exc, typed=True)}")
        if self.log is not None:
            self.log.append(
                {
                    "kind": "group",
                    "variant": variant,
                    "batch": batch,
                    "pairs": [p for p in self.pairing.pairs if (p["variant"], p["batch"]) == (variant, batch)],
                    "profiles": [p for p in self.profiles if (p["variant"], p["batch"]) == (variant, batch)],
                    "head_to_head_errors": [
                        e for e in self.pairing.head_to_head_errors if e.startswith(f"{variant} b{batch} ")
                    ],
                    "profile_errors": [e for e in self.profile_errors if e.startswith(f"{variant} b{batch}:")],
                }
            )

    def close(self) -> None:
        """Close the runners kept to the end of the run (``standard``'s, every later variant's partners)."""
        self.pairing.close()


class _Start(NamedTuple):
    """What a run measured and said before its first row: the ceiling, the estimate and the load it assumed, and
    the seconds the setup took (the ceiling and GEMM measurements before the estimate)."""

    ceiling: dict[str, Any] | None
    estimate: float | None
    load: dict[str, Any] | None
    setup: float
    todo: dict[str, int]


def run_benchmark(settings: Settings, hold_signals: Callable[[], object] | None = None) -> dict[str, Any]:
    """Run everything in ``settings`` not already in the row log of ``settings.out``; return the result dict written to
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
        ValueError: the log in ``settings.out`` was written with another :func:`run_key`, or has a line that is not
            valid (the file and line named; before anything is measured).
    """
    torch.set_num_threads(settings.threads)
    env = environment()
    Path(settings.out).mkdir(parents=True, exist_ok=True)
    started = time.time()
    log = RowLog(
        Path(settings.out) / LOG_NAME,
        run_key(settings, env),
        run_asks(settings.variants, settings.backends, settings.dtypes, settings.batch_sizes),
        {"command": settings.command, "started": started},
    )
    try:
        return _run(settings, env, log, started, hold_signals or (lambda: None))
    finally:
        log.close()


def _run(
    settings: Settings, env: dict[str, Any], log: RowLog, started: float, hold_signals: Callable[[], object]
) -> dict[str, Any]:
    bench = _Bench(settings, log)
    start = _start(settings, env, log, bench, started)
    interrupted = _jobs(settings, bench, log, start, hold_signals)
    return _result(settings, env, log, bench, start, started, interrupted)


def _start(settings: Settings, env: dict[str, Any], log: RowLog, bench: _Bench, started: float) -> _Start:
    """Before the first row: the GEMM throughput and the matmul ceiling measured, the estimate and the resume
    printed."""
    # the GEMM throughput of PyTorch and ONNX Runtime on this CPU, beside the rows of an ONNX Runtime CPU backend
    if any(
        get_backend(b).library == get_backend(ONNX_REFERENCE).library
        and on_cpu(b, bench.device)
        and not bench.plan.skip[(b, d)]
        for b, d in bench.plan.combos
    ):
        with bench.phases.phase("GEMM throughput"):
            env["gemm_gflops"] = gemm_gflops(settings.threads)
    # the ceiling of every CPU row: measured once, before any model, with the run's threads; kept for a resumed run
    ceiling = next((r["ceiling"] for r in log.of("ceiling")), None)
    if ceiling is None and settings.ceiling_size:
        with bench.phases.phase("matmul ceiling"):
            ceiling = matmul_ceiling(settings.threads, settings.ceiling_size)
        log.append({"kind": "ceiling", "ceiling": ceiling})
    variants = bench.plan.variants
    todo = {v: sum(len(bench.plan.todo(v, n)) for n in settings.batch_sizes) for v in variants}
    load = estimate_load(settings.threads)
    estimate = estimate_seconds(settings, bench.plan, variants, ceiling, load["slowdown"] if load else 1.0)
    if estimate is not None and any(todo.values()):
        print(estimate_line(estimate + time.time() - started, sum(todo.values()), load), flush=True)
    for line in resume_lines(log, len(bench.plan.done), sum(todo.values())):
        print(line, flush=True)
    return _Start(ceiling, estimate, load, time.time() - started, todo)


def _jobs(
    settings: Settings, bench: _Bench, log: RowLog, start: _Start, hold_signals: Callable[[], object]
) -> dict[str, Any] | None:
    """Every row and group still to measure, then the ceiling again; what stopped them early (``None``: nothing)."""
    variants, todo, ceiling = bench.plan.variants, start.todo, start.ceiling
    interrupted = None
    with tqdm(
        total=sum(todo.values()), desc="bench-latency", unit="job", disable=not settings.progress, dynamic_ncols=True
    ) as bar:
        try:
            bench.export_ahead(variants)
            for i, variant in enumerate(variants):
                bench.variant(variant, bar, needed_later=any(todo[v] for v in variants[i + 1 :]))
            if ceiling and settings.ceiling_size:  # measured again, to show how far the machine's load moved it
                with bench.phases.phase("matmul ceiling"):
                    end = matmul_ceiling(settings.threads, settings.ceiling_size, int8=False)["fp32"]["gflops"]
                ceiling["fp32_end_gflops"] = end
        except TimeUp as exc:  # no signal: the rows are written and the command ends normally
            interrupted = {
                "signal": None,
                "during": str(exc),
                "rows_kept": len(bench.rows),
                "note": f"stopped at --time-limit {settings.time_limit:g} s before {exc}; the "
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
    return interrupted


def _settings(
    settings: Settings, rows: list[dict[str, Any]], variants: list[str], device: torch.device
) -> dict[str, Any]:
    """``settings`` of the result: what the rows of the log cover and how they were measured."""
    return {
        "variants": list(dict.fromkeys(r["variant"] for r in rows)) or variants,
        "standard_added": "standard" not in settings.variants,
        "backends": list(dict.fromkeys(r["backend"] for r in rows)),
        "dtypes": list(dict.fromkeys(r["dtype"] for r in rows)),
        "batch_sizes": list(dict.fromkeys(r["batch"] for r in rows)),
        "task": settings.task,
        "arch": settings.arch,
        "img_size": settings.img_size,
        "threads": settings.threads,
        "min_time_s": settings.min_time,
        "time_limit_s": settings.time_limit,
        "warmup_s": timing.WARMUP_S,
        "min_iterations": timing.MIN_ITERS,
        "device": str(device),
        "seed": settings.seed,
        "compile_budget_s": settings.compile_budget,
        "dynamic_batch": settings.dynamic_batch,
        "tolerances": TOLERANCES,
        "ceiling_size": settings.ceiling_size,
        "parity_measure": "max|out - eager fp32| / max(1, max|eager fp32|)",
        "scope": settings.scope,
    }


def _result(
    settings: Settings,
    env: dict[str, Any],
    log: RowLog,
    bench: _Bench,
    start: _Start,
    started: float,
    interrupted: dict[str, Any] | None,
) -> dict[str, Any]:
    """The result dict written to ``results.json``, from every row of the log."""
    rows, overheads = results_from_log(log)
    groups = log.of("group")
    pairs = [p for g in groups for p in g["pairs"]]
    flops = {f["variant"]: f["flops"] for f in log.of("flops")}
    speedups(rows)
    efficiency(rows, flops, start.ceiling, bench.device)
    roofline_fractions(rows, (env.get("gpu") or {}).get("name"), settings.task, settings.arch, settings.img_size)
    runs = log.of("run")
    return {
        "command": settings.command,
        "interrupted": interrupted,
        "note": NOTE,
        "settings": _settings(settings, rows, bench.plan.variants, bench.device),
        "row_log": {
            "file": LOG_NAME,
            "runs": [{"command": r.get("command"), "started": r.get("started")} for r in runs],
            "rows_from_earlier_runs": len(bench.plan.done),
        },
        "environment": env,
        "ceiling": start.ceiling or {"status": "not measured", "reason": "--ceiling-size 0"},
        "flops": flops,
        "fastest_cpu": fastest_cpu(rows, pairs, bench.device),
        "cpu_head_to_head": pairs,
        "cpu_head_to_head_errors": [e for g in groups for e in g.get("head_to_head_errors", [])],
        "load_average_end": load_average(),
        "wall_time_s": time.time() - started,
        "estimate_s": None if start.estimate is None else round(start.estimate + start.setup, 1),
        "estimate_load": start.load,
        "phases_s": bench.phases.summary(time.time() - started),
        "results": rows,
        "overheads": overheads,
        "ort_profile": [p for g in groups for p in g["profiles"]],
        "ort_profile_errors": [e for g in groups for e in g.get("profile_errors", [])],
    }
