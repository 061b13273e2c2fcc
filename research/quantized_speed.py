"""The quantized study's int8 speed (``python -m research.quantized``, ``--timing-only`` for this part alone): a
random-init model's fp32 export against its int8 model on each CPU runtime (``ort-cpu``: ModelOpt's Q/DQ graph with
the CPU placement and with TensorRT's; ``openvino``: NNCF's own quantization), each checked against eager fp32
under the shared tolerance table, timed alternately (A B A B), with its fraction of the machine's matmul ceiling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from tqdm import tqdm

from attnzoo.benchmarks.ceiling import ceiling_for, fraction, matmul_ceiling
from attnzoo.benchmarks.flops import count_flops
from attnzoo.benchmarks.rows import row_unavailable_reason
from attnzoo.benchmarks.tables import markdown_table
from attnzoo.benchmarks.timing import measure_pair
from attnzoo.export import export_verified
from attnzoo.export.quantize import CPU_QDQ_PLACEMENT, TENSORRT_QDQ_PLACEMENT
from attnzoo.machine import cpu_summary, load_1min
from attnzoo.models import create_model
from attnzoo.runtime.backends import get_backend
from research.study import gated_calls, paired_speedup

__all__ = ["SPEED_JOBS", "speed_rows", "speed_table", "speed_section", "machine_lines"]

#: The speed comparison's int8 runs: (runtime, ModelOpt Q/DQ placement): ONNX Runtime with the CPU placement
#: (what bench-latency and the demo run) and with ModelOpt's default (TensorRT's) for comparison, OpenVINO with
#: NNCF's own quantization.
SPEED_JOBS = (("ort-cpu", CPU_QDQ_PLACEMENT), ("ort-cpu", TENSORRT_QDQ_PLACEMENT), ("openvino", None))


def _speed_row(backend: str, placement: str | None, batch: int, model, fp32: Path, flops: float, **run: Any) -> dict:
    """One runtime at one batch size: fp32 and int8 parity-gated, timed A B A B, with their ceiling fractions.
    ``run``: ``threads``, ``min_time``, ``cache_dir`` and ``ceiling`` (the machine's matmul ceiling)."""
    size = int(model.attnzoo_config["img_size"])
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
    with torch.inference_mode():
        ref = model(x).float().numpy()
    name = f"{backend} {{dtype}} b{batch}"
    load = dict(threads=run["threads"], cache_dir=run["cache_dir"], int8_placement=placement or CPU_QDQ_PLACEMENT)
    calls, infos, parity = gated_calls(backend, model, fp32, x, ref, ("fp32", "int8"), name, **load)
    try:
        load_1 = load_1min()
        t32, t8 = measure_pair(calls["fp32"].fn, calls["int8"].fn, run["min_time"])
    finally:  # each call owns its session: freed now, not by the garbage collector
        for call in calls.values():
            call.close()
    row = {
        "backend": backend,
        "placement": placement,
        "batch": batch,
        **paired_speedup(t32, t8),
        "load_1min": load_1,
        "int8_model": infos["int8"].get("int8"),
    }
    for dtype, times in (("fp32", t32), ("int8", t8)):
        med = float(np.median(times) * 1e3)
        ceiling = ceiling_for(run["ceiling"], backend, dtype, "cpu")
        row[dtype] = {"median_ms": med, "parity_error": parity[dtype], **fraction(flops * batch, med, ceiling)}
    return row


def speed_rows(
    arch: str,
    variant: str,
    batch_sizes: Sequence[int],
    threads: int,
    min_time: float,
    cache_dir: Path,
    progress: bool = True,
) -> dict[str, Any]:
    """fp32 against int8 per CPU runtime on a random-init model: parity-gated, timed A B A B, ceiling fractions."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = create_model(variant, task="cls", arch=arch).eval()
    cfg = cast(dict[str, Any], model.attnzoo_config)
    size = int(cfg["img_size"])
    fp32 = cache_dir / f"{variant}_cls_{arch}_fp32.onnx"
    export_verified(model, fp32, cfg, dtype="fp32", input_hw=(size, size), batch_sizes=(1,), threads=threads)
    flops = count_flops(model, size)["flops_per_image"]
    ceiling = matmul_ceiling(threads)
    rows, skipped = [], {}
    jobs = [(b, p, n) for b, p in SPEED_JOBS for n in batch_sizes]
    for backend, placement, batch in tqdm(jobs, desc="int8 speed", unit="job", disable=not progress):
        reason = row_unavailable_reason(backend, "fp32", "cpu") or row_unavailable_reason(backend, "int8", "cpu")
        if reason:
            skipped[backend] = reason
            continue
        run = dict(threads=threads, min_time=min_time, cache_dir=cache_dir, ceiling=ceiling)
        rows.append(_speed_row(backend, placement, batch, model, fp32, flops, **run))
    best = {}
    for n in batch_sizes:
        mine = [r for r in rows if r["batch"] == n]
        if mine:
            top = min(mine, key=lambda r: r["int8"]["median_ms"])
            best[str(n)] = {"backend": _runtime_label(top), "speedup_median": top["speedup_median"]}
    return {
        "arch": arch,
        "variant": variant,
        "img_size": size,
        "threads": threads,
        "batch_sizes": list(batch_sizes),
        "min_time": min_time,
        "gflop_per_image": flops / 1e9,
        "ceiling": ceiling,
        "rows": rows,
        "skipped": skipped,
        "fastest_int8": best,
    }


def _f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _runtime_label(row: Mapping[str, Any]) -> str:
    """``ort-cpu (Q/DQ cpu)``, ``openvino``: the runtime and, for a backend whose int8 rows run ModelOpt's Q/DQ
    graph (:attr:`~attnzoo.runtime.backends.Backend.int8_model`), its Q/DQ placement (rows written before
    placements were compared used ModelOpt's default, ``tensorrt``)."""
    if get_backend(row["backend"]).int8_model != "qdq":
        return row["backend"]
    return f"{row['backend']} (Q/DQ {row.get('placement') or TENSORRT_QDQ_PLACEMENT})"


def speed_table(speed: Mapping[str, Any]) -> str:
    """The speed table: per runtime and batch, fp32 and int8 latency, speed-up [Q1, Q3], ceiling fractions."""
    body = [
        [
            _runtime_label(r),
            str(r["batch"]),
            f"{r['fp32']['median_ms']:.2f}",
            f"{r['int8']['median_ms']:.2f}",
            f"{r['speedup_median']:.2f} [{r['speedup_q1']:.2f}, {r['speedup_q3']:.2f}]",
            _percent(r["fp32"]["ceiling_fraction"]),
            _percent(r["int8"]["ceiling_fraction"]),
            _f(r["load_1min"]),
        ]
        for r in speed["rows"]
    ]
    return markdown_table(
        [
            "runtime",
            "batch",
            "fp32 ms",
            "int8 ms",
            "int8 speed-up [Q1, Q3]",
            "fp32 of fp32 ceiling",
            "int8 of int8 ceiling",
            "load (1 min)",
        ],
        body,
    )


def _percent(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def machine_lines(section: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """The CPU a section was measured on (files written before sections kept their own: the run's)."""
    cpus = section.get("cpus") or [(section.get("environment") or result["environment"])["cpu"]]
    return [
        f"CPU: {'; '.join(cpu_summary(c) for c in cpus)}, "
        f"{'/'.join(str(c.get('usable_cores', '?')) for c in cpus)} usable cores.",
        "",
    ]


def speed_section(sp: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """The speed table, how it was measured, the fastest int8 runtime per batch and the runtimes skipped."""
    int8_ceiling = f"{sp['ceiling']['int8']['gops']:.0f} GOP/s" if sp["ceiling"]["int8"].get("gops") else "not measured"
    load = ": **measured under load (shared machine), re-run with --timing-only when quiet**"
    return [
        f"## int8 speed ({sp['variant']}, arch {sp['arch']}, {sp['img_size']} px, {sp['threads']} thread(s))",
        "",
        *([f"Measured by `{sp['command']}`.", ""] if sp.get("command") else []),
        *machine_lines(sp, result),
        f"Random-init model ({sp['gflop_per_image']:.2f} GFLOP per image); both models of a row pass "
        "the parity gate against eager fp32 (fp32 1e-4; static int8 of a random-init model calibrated on random "
        "inputs 0.5, a sanity gate) before they are timed alternately "
        f"(A B A B, {sp['min_time']:g} s); speed-up = median [Q1, Q3] of per-pair fp32/int8 ratios. Ceiling: "
        f"this machine's fp32 matmul {sp['ceiling']['fp32']['gflops']:.0f} GFLOP/s, int8 {int8_ceiling}, "
        f"{sp['threads']} thread(s). Load average {sp['load_start']} at the start, {sp['load_end']} at the end"
        + (load if sp["contended"] else " (quiet)")
        + ".",
        "",
        speed_table(sp),
        "",
        *[
            f"- batch {b}: fastest int8 runtime {best['backend']}, {best['speedup_median']:.2f}x its fp32."
            for b, best in sp["fastest_int8"].items()
        ],
        *[f"- {b}: skipped ({why})." for b, why in sp["skipped"].items()],
        "",
    ]
