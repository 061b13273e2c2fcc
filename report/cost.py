"""The cost side of a report, measured by the benchmarks' own calls: the latency rows against ``standard``
(:func:`latency`), latency and memory against tokens (:func:`scaling`), and the GPU plan's committed rows
(:func:`gpu_rows`, marked as not measured in the run)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.gpu_plan import MODELS, ROOT
from attnzoo.lazy import lazy_import
from attnzoo.machine import bf16_problem
from attnzoo.runtime.backends import backend_names
from attnzoo.signals import Interrupted, Terminated

from .settings import BATCH_SIZES, Budget

# torch and the benchmarks: imported at their first use
bench_run = lazy_import("attnzoo.benchmarks.run")
scaling_bench = lazy_import("attnzoo.benchmarks.scaling")

__all__ = ["latency", "scaling", "gpu_rows"]


def latency(variant: str, budget: Budget, work: Path, command: str) -> dict[str, Any]:
    """:func:`attnzoo.benchmarks.run.run_benchmark` of ``variant`` (``standard`` added by it) on every backend,
    batch 1 and 8, fp32 and bf16 where this CPU has bf16 units.

    One batch size at a time, resuming the same row log: the benchmark measures ``standard`` (the baseline) before
    the variant, so a run over both batch sizes that reached its time limit would keep standard's batch-8 rows and
    lose the variant's own. Batch by batch, the variant's batch-1 rows are measured before any batch-8 row.

    Raises:
        Terminated, Interrupted: SIGTERM / Ctrl-C arrived while it measured (the benchmark returns the rows it
            kept; the report stops there, as on a signal in any other step).
    """
    bf16 = bf16_problem()
    started, interrupted = time.monotonic(), None
    result: dict[str, Any] = {}  # the last batch's benchmark result (the first batch always runs)
    for i, batch in enumerate(BATCH_SIZES):
        left = budget.latency_time_limit - (time.monotonic() - started)
        if i and left <= 0:
            interrupted = {
                "signal": None,
                "during": f"batch {batch}",
                "rows_kept": len(result["results"]),
                "note": f"stopped at the latency time limit ({budget.latency_time_limit:g} s) before "
                f"batch {', '.join(map(str, BATCH_SIZES[i:]))}",
            }
            break
        settings = bench_run.Settings(
            variants=[variant],
            backends=list(backend_names()),
            dtypes=["fp32"] + ([] if bf16 else ["bf16"]),
            batch_sizes=[batch],
            arch=budget.latency_arch,
            threads=1,
            min_time=budget.latency_min_time,
            out=work / "bench",
            cache_dir=work / "bench-cache",
            compile_budget=budget.compile_budget,
            ceiling_size=0,
            progress=False,
            pair_eager=False,
            time_limit=max(left, 0.0),
            command=command,
        )
        result = bench_run.run_benchmark(settings)
        if (result["interrupted"] or {}).get("signal"):  # the benchmark keeps its rows on a signal; the report stops
            raise Terminated() if result["interrupted"]["signal"] == "SIGTERM" else Interrupted()
        if result["interrupted"]:
            interrupted = result["interrupted"]
            break
    return {
        "settings": result["settings"],
        "bf16": {"rows": bf16 is None, "reason": bf16},
        "rows": result["results"],
        "overheads": result["overheads"],
        "fastest_cpu": result["fastest_cpu"],
        "interrupted": interrupted,
        "note": result["note"],
        "wall_time_s": time.monotonic() - started,
    }


def scaling(variant: str, budget: Budget, work: Path, command: str, quick: bool) -> dict[str, Any]:
    """:func:`attnzoo.benchmarks.scaling.run_scaling` of ``standard`` and ``variant``: latency and peak memory against
    tokens (classifier; a Segmenter encoder where ``budget.seg_sizes``), batch 1.

    Its exports share :func:`latency`'s cache: the seeded model at the latency rows' size is exported once for both
    (``export_verified(reuse=True)``), which is most of the time of a variant whose export is slow."""
    settings = scaling_bench.Settings(
        variants=list(dict.fromkeys(["standard", variant])),
        backends=budget.scaling_backends,
        arch=budget.scaling_arch,
        sizes=budget.scaling_sizes,
        seg_sizes=budget.seg_sizes,
        batch_sizes=(),
        threads=1,
        min_time=budget.scaling_min_time,
        max_call_s=budget.max_call_s,
        out=work / "scaling",
        cache_dir=work / "bench-cache",
        progress=False,
        command=command,
        quick=quick,
    )
    return scaling_bench.run_scaling(settings)


def gpu_rows(variant: str) -> dict[str, Any]:
    """Rows of ``variant`` and ``standard`` from the GPU plan's committed results (``results/gpu-h100/<model>/
    results.json``), each marked with the file it comes from; ``status: absent`` where none are committed."""
    found = []
    for model in MODELS:
        path = ROOT / "results" / "gpu-h100" / model / "results.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        gpu = ((result.get("environment") or {}).get("gpu") or {}).get("name")
        over = {
            (o["backend"], o["dtype"], o["batch"]): o
            for o in result.get("overheads", [])
            if o.get("variant") == variant
        }
        for r in result.get("results", []):
            # the variant's measured and failed rows (a failed parity check is what its author needs to see),
            # standard's measured rows beside them; skipped rows (a backend not on that machine) are left out
            mine = r.get("variant") == variant and r.get("status") in ("ok", "failed")
            if mine or (r.get("variant") == "standard" and r.get("status") == "ok"):
                o = over.get((r["backend"], r["dtype"], r["batch"])) if r["variant"] == variant else None
                found.append(
                    {
                        "from": str(path.relative_to(ROOT)),
                        "model": model,
                        "gpu": gpu,
                        "variant": r["variant"],
                        "backend": r["backend"],
                        "dtype": r["dtype"],
                        "batch": r["batch"],
                        "status": r["status"],
                        "median_ms": r.get("median_ms") if r["status"] == "ok" else None,
                        "reason": r.get("reason") or "",
                        "overhead": o.get("ratio_median") if o else None,
                    }
                )
    if not any(r["variant"] == variant for r in found):
        return {
            "status": "absent",
            "reason": f"the GPU plan's committed results (results/gpu-h100/) hold no row of {variant} yet",
            "rows": [],
        }
    return {"status": "ok", "note": "from the GPU plan's committed results, not measured in this run", "rows": found}
