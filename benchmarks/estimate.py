"""The opening estimate of a ``bench-latency`` run: how long the rows still to measure take, from the machine's
matmul speed (the ceiling, measured under the load of the moment), the rows' counted FLOPs and the exports' fixed
work of a quiet machine times the slowdown the load average says the run's threads will see.
"""

from __future__ import annotations

import os
import time
from typing import Any, Protocol

from attnzoo.benchmarks import timing
from attnzoo.benchmarks.flops import count_variant, meta_model
from attnzoo.benchmarks.plan import Settings, takes_onnx
from attnzoo.machine import load_1min, load_slowdown, others_load
from attnzoo.runtime.backends import get_backend

__all__ = ["EXPORT_FIXED_S", "EXPORT_CALLS", "FORWARD_EFFICIENCY", "estimate_seconds", "estimate_line", "estimate_load"]


class _Rows(Protocol):
    def todo(self, variant: str, batch: int) -> list[tuple[str, str]]: ...


#: The estimate's model (:func:`estimate_seconds`): an ONNX export and its verification cost a fixed part (tracing,
#: the ONNX checker, sessions, the verification's Python) plus as long as this many batch-1 forward passes; a whole
#: ViT forward pass reaches this fraction of the matmul ceiling (the committed default runs' rows: 20-80 %). The
#: fixed part is a quiet machine's: the committed default run on a quiet 2-core AMD EPYC spent 72 s on its three
#: variants' exports (``phases_s`` in ``results/bench-latency/default-avx2/results.json``), of which their forward
#: passes were under a second each. Rough on purpose: it says minutes.
EXPORT_FIXED_S, EXPORT_CALLS, FORWARD_EFFICIENCY = 20.0, 40, 0.5


def estimate_seconds(
    settings: Settings, plan: _Rows, variants: list[str], ceiling: dict[str, Any] | None, slowdown: float = 1.0
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
        rows = [(n, b, d) for n in settings.batch_sizes for b, d in plan.todo(variant, n)]
        if not rows:
            continue
        count = count_variant(
            variant, batch=1, model=meta_model(variant, settings.task, settings.arch, settings.img_size)
        )
        call1 = (count.matrix_flops + count.vector_ops) / (gflops * 1e9 * FORWARD_EFFICIENCY)
        if any(takes_onnx(b) for _, b, _ in rows):
            total += EXPORT_FIXED_S * slowdown + EXPORT_CALLS * call1
        for n, backend, _ in rows:
            t = call1 * n
            calls = max(timing.MIN_ITERS, settings.min_time / t) + max(2, timing.WARMUP_S / t)
            pair = 2 * max(timing.MIN_ITERS, settings.min_time / (2 * t)) + 2 * max(2, timing.WARMUP_S / t)
            calls += pair * ((not get_backend(backend).is_reference) + (variant != "standard")) + 1
            total += calls * t
            compiles = compiles or get_backend(backend).jit_compiles
        for n in settings.batch_sizes:  # the head-to-head of two runtimes, the eager reference
            total += (2 * max(timing.MIN_ITERS, settings.min_time / (2 * call1 * n)) + 1) * call1 * n
    return total + (settings.compile_budget if compiles else 0.0)


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
