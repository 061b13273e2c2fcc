"""bf16 on the CPU: the zoo's accuracy at fp32 and OpenVINO bf16, ViT-S speed at fp32 / bf16 / int8, and the
check that the extra math runs at f32.

1. Extra-math check (every zoo model chosen, every CPU): the model's verified fp32 export, its extra-math ops
   pinned to f32 (:func:`attnzoo.runtime.openvino.pin_f32`) and compiled by OpenVINO at bf16 where the CPU has bf16
   units, else at f32; OpenVINO's runtime model is read back (:func:`attnzoo.runtime.openvino.runtime_precisions`):
   the kernels that compute extra-math ops, their runtime precisions, the matmuls' precisions, and the "unpinned"
   kernels (an extra-math op inside a kernel whose own op carries no pin, which OpenVINO is then free to run at
   the inference precision). At f32 the precisions say nothing about bf16; the pins and kernels do.
2. Accuracy (CPUs with bf16 units): the test split at OpenVINO f32 and bf16 on the same images
   (:func:`attnzoo.runtime.evaluate.score_runs`), the drop against :data:`attnzoo.runtime.bf16.ACCURACY_GATE`.
3. Speed (CPUs with bf16 units): random-init ``--speed-arch`` models (ViT-S 224 by default) of
   ``--speed-variants``: OpenVINO fp32, bf16 (extra math pinned, read back) and NNCF int8
   (:mod:`attnzoo.benchmarks.rows`), each gated against eager fp32 by the shared tolerance table, then timed
   against fp32 alternately (A B A B) at each batch size and thread count.

On a CPU without bf16 units 2 and 3 are not measured: the report says why (one line) and names the command.

Usage::

    python -m research.bf16 --out results/studies/bf16-amx
    python -m research.bf16 --table results/studies/bf16-amx/bf16.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from attnzoo.benchmarks.cli import variant_list
from attnzoo.benchmarks.report import markdown_table
from attnzoo.benchmarks.stats import ratio_stats
from attnzoo.benchmarks.timing import measure_pair
from attnzoo.cli import add_debug_flag, entry_point, parse_batch_sizes
from attnzoo.errors import UsageError, first_line
from attnzoo.fileio import atomic_write_text, default_cache_dir, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary, environment, load_1min, load_average
from attnzoo.runtime.backends import LoadOptions
from attnzoo.runtime.backends.openvino import OPENVINO
from attnzoo.runtime.bf16 import ACCURACY_GATE
from attnzoo.runtime.contract import metadata_props
from attnzoo.runtime.evaluate import score_runs
from attnzoo.runtime.openvino import (
    PrecisionCheckError,
    bf16_unavailable_reason,
    check_runtime_precisions,
    unavailable_reason,
)
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.runtime.parity import check as check_parity
from attnzoo.runtime.sessions import verification_problem
from research.study import add_zoo_selection, reprint, require_out, write_report, zoo_entries

# --table loads without torch, onnx and timm: these import at their first use
onnx = lazy_import("onnx")
torch = lazy_import("torch")
models = lazy_import("attnzoo.models")
checkpoint = lazy_import("attnzoo.models.checkpoint")
zoo = lazy_import("attnzoo.zoo")
export = lazy_import("attnzoo.export")
quantize = lazy_import("attnzoo.export.quantize")
bench_rows = lazy_import("attnzoo.benchmarks.rows")

__all__ = ["zoo_row", "speed_rows", "markdown", "main"]

#: Labels of the precisions timed against fp32 in the speed rows.
SPEED_DTYPES = ("bf16", "int8")


def _fp32_export(entry: Mapping[str, Any], cache: Path, threads: int | None) -> Path:
    """The zoo model's verified fp32 export, made once (reused while its report holds and it names the checkpoint)."""
    path = cache / f"{entry['variant']}_{entry['task']}_{entry['data']}.onnx"
    if (
        path.is_file()
        and verification_problem(path, "fp32") is None
        and metadata_props(path).get("checkpoint_sha256") == entry.get("sha256")
    ):
        return path
    model, cfg = zoo.load(entry["variant"], entry["task"], entry["data"])
    path.parent.mkdir(parents=True, exist_ok=True)
    export.export_verified(
        model, path, cfg, batch_sizes=(1,), checkpoint_sha256=entry.get("sha256", ""), threads=threads
    )
    return path


def zoo_row(
    entry: Mapping[str, Any], cache: Path, *, bf16: bool, threads: int | None = None, limit: int | None = None
) -> dict[str, Any]:
    """One zoo model: the extra-math check (at bf16 when ``bf16``, else f32) and, with ``bf16``, the accuracy of
    both precisions on its test split. A model whose check or scoring fails is a row with the reason."""
    cfg = checkpoint.read_config(zoo.checkpoint_path(entry["variant"], entry["task"], entry["data"]))
    row: dict[str, Any] = {
        "variant": entry["variant"],
        "task": entry["task"],
        "data": entry["data"],
        "arch": cfg.get("arch"),
        "checkpoint_sha256": entry.get("sha256"),
    }
    path = _fp32_export(entry, cache, threads)
    names = quantize.extra_math_nodes(onnx.load(str(path), load_external_data=False), cfg)
    precision = "bf16" if bf16 else "fp32"
    try:
        session = OPENVINO.load(path, LoadOptions(dtype=precision, threads=threads, keep_f32=tuple(names))).live()
    except PrecisionCheckError as exc:  # the check itself failed: a result, with the reason
        return {**row, "status": "failed", "reason": first_line(exc), "extra_math_nodes": len(names)}
    check = session.precision_check
    assert check is not None  # keep_f32 given: the session checked its precisions
    row.update(
        status="ok",
        extra_math_nodes=len(names),
        compiled_at=check["inference_precision"],
        extra_math=check["extra_math"],
        matmuls=check["matmuls"]["by_precision"],
    )
    if not bf16:
        return row
    try:
        check_runtime_precisions(check, "bf16")
        ev = score_runs(
            {"fp32": OPENVINO.load(path, LoadOptions(threads=threads)).run, "bf16": session.run}, cfg, limit=limit
        )
    except (PrecisionCheckError, FloatingPointError) as exc:
        return {**row, "status": "failed", "reason": first_line(exc)}
    drop = ev["metrics"]["fp32"] - ev["metrics"]["bf16"]
    gate = ACCURACY_GATE[entry["task"]]
    row["accuracy"] = {**ev, "limit": limit, "drop": drop, "gate": gate, "within_gate": drop <= gate}
    return row


def _threads(spec: str) -> list[int]:
    """``1,all`` -> [1, the cores this process may use]."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        n = usable if part == "all" else int(part)
        if n < 1:
            raise ValueError(f"thread counts must be >= 1 or 'all', got {part}")
        out.append(n)
    return list(dict.fromkeys(out))


def speed_rows(
    arch: str,
    variants: Sequence[str],
    batch_sizes: Sequence[int],
    thread_counts: Sequence[int],
    min_time: float,
    cache: Path,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """OpenVINO fp32 against bf16 and NNCF int8, per variant, thread count and batch size: each model gated
    against eager fp32 under the tolerance table, then timed A B A B against fp32."""
    rows = []
    jobs = [(v, t, n) for v in variants for t in thread_counts for n in batch_sizes]
    for variant, threads, batch in tqdm(jobs, desc="bf16 speed", unit="job", disable=not progress):
        torch.manual_seed(0)
        torch.set_num_threads(threads)
        model = models.create_model(variant, task="cls", arch=arch).eval()
        cfg = model.attnzoo_config
        size = int(cfg["img_size"])
        fp32 = cache / f"{variant}_cls_{arch}_fp32.onnx"
        if not fp32.is_file():
            export.export_verified(model, fp32, cfg, input_hw=(size, size), batch_sizes=(1,), threads=threads)
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
        with torch.inference_mode():
            ref = model(x).float().numpy()
        calls, infos, parity = {}, {}, {}
        try:
            for dtype in ("fp32", *SPEED_DTYPES):
                calls[dtype], infos[dtype] = bench_rows.load_call(
                    "openvino", model, fp32, x.numpy(), dtype, threads=threads, device="cpu", cache_dir=cache
                )
                key = bench_rows.tolerance_for("openvino", dtype, "cpu")
                ok, err = check_parity(calls[dtype].output(), ref, key)
                if not ok:
                    raise RuntimeError(
                        f"{variant} {dtype} b{batch} t{threads}: parity error {err:.3g} beyond the "
                        f"{key} tolerance {TOLERANCES[key]:g}"
                    )
                parity[dtype] = err
            row: dict[str, Any] = {
                "variant": variant,
                "arch": arch,
                "batch": batch,
                "threads": threads,
                "load_1min": load_1min(),
                "precision_check": infos["bf16"].get("precision_check"),
                "fp32": {},
            }
            fp32_ms = []
            for dtype in SPEED_DTYPES:
                t32, tx = measure_pair(calls["fp32"].fn, calls[dtype].fn, min_time)
                r = ratio_stats(tx, t32)  # per pair: fp32 time / dtype time = the speed-up
                fp32_ms += t32
                row[dtype] = {
                    "median_ms": float(np.median(tx) * 1e3),
                    "speedup_median": r["ratio_median"],
                    "speedup_q1": r["ratio_q1"],
                    "speedup_q3": r["ratio_q3"],
                    "pairs": r["pairs"],
                    "parity_error": parity[dtype],
                }
            row["fp32"] = {"median_ms": float(np.median(fp32_ms) * 1e3), "parity_error": parity["fp32"]}
            rows.append(row)
        finally:  # each call owns its compiled model: freed now, not by the garbage collector
            for call in calls.values():
                call.close()
    return rows


# ------------------------------------------------------------------------------------------------ report
def _f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def _check_cell(row: Mapping[str, Any]) -> str:
    x = row.get("extra_math") or {}
    if row.get("status") != "ok" and not x:
        return f"failed: {row.get('reason')}"
    if not row.get("extra_math_nodes"):
        return "no extra math"
    kernels = ", ".join(f"{n} {p}" for p, n in sorted((x.get("by_precision") or {}).items()))
    unpinned = len(x.get("unpinned") or [])
    return f"{kernels} kernel(s); {'all pinned' if not unpinned else f'{unpinned} unpinned'}"


def markdown(result: Mapping[str, Any]) -> str:
    """The report: machine, the refusal (if any), the extra-math check and accuracy table, the speed table."""
    env = result["environment"]
    versions = env.get("versions", {})
    parts = [
        "# bf16 on the CPU: zoo accuracy, extra-math precision, ViT-S speed",
        "",
        f"Command: `{result['command']}`",
        "",
        f"CPU: {cpu_summary(env['cpu'])}, {env['cpu']['usable_cores']} usable cores; OpenVINO "
        f"{versions.get('openvino')}, torch {versions.get('torch')}. Load average {result.get('load_start')} at "
        f"the start, {result.get('load_end')} at the end.",
        "",
    ]
    if result.get("bf16_unavailable"):
        parts += [
            f"**bf16 is refused on this CPU:** {result['bf16_unavailable']}",
            "",
            "Not measured here: the zoo's bf16 accuracy and the bf16 speed (they need a CPU with bf16 units). "
            "The extra-math check below compiled each model at f32: its pins and kernels are what bf16 would "
            "compile from, its precisions are f32 by construction.",
            "",
        ]
    zoo = result.get("zoo") or []
    if zoo:
        bf16 = not result.get("bf16_unavailable")
        head = [
            "model",
            "task",
            "extra-math ops",
            f"extra-math kernels (compiled at {'bf16' if bf16 else 'f32'})",
            "matmul kernels",
        ]
        if bf16:
            head += ["metric", "fp32", "bf16", "drop", "gate", "agreement"]
        body = []
        for r in zoo:
            cells = [
                r["variant"],
                r["task"],
                str(r.get("extra_math_nodes", "-")),
                _check_cell(r),
                ", ".join(f"{n} {p}" for p, n in sorted((r.get("matmuls") or {}).items())) or "-",
            ]
            if bf16:
                a = r.get("accuracy") or {}
                m = a.get("metrics") or {}
                cells += [
                    a.get("metric_name", "-"),
                    _f(m.get("fp32")),
                    _f(m.get("bf16")),
                    _f(a.get("drop")),
                    _f(a.get("gate")),
                    _f((a.get("agreement") or {}).get("bf16"), ".4f"),
                ]
            body.append(cells)
        n_img = {n for r in zoo if (n := (r.get("accuracy") or {}).get("n_images")) is not None}
        parts += [
            "## Zoo models: the extra-math check" + (" and test-split accuracy" if bf16 else ""),
            "",
            markdown_table(head, body),
            "",
        ]
        if n_img:
            parts += [f"Test images per model: {', '.join(str(n) for n in sorted(n_img))}.", ""]
        unpinned = [
            f"{r['variant']} {r['task']}: {', '.join((r.get('extra_math') or {}).get('unpinned', [])[:3])}"
            for r in zoo
            if (r.get("extra_math") or {}).get("unpinned")
        ]
        if unpinned:
            parts += [
                "Unpinned extra-math kernels (their own op carries no pin):",
                "",
                *[f"- {u}" for u in unpinned],
                "",
            ]
    speed = result.get("speed") or []
    if speed:
        head = [
            "variant",
            "threads",
            "batch",
            "fp32 ms",
            "bf16 ms",
            "bf16 speed-up [Q1, Q3]",
            "int8 ms",
            "int8 speed-up [Q1, Q3]",
            "extra-math kernels at f32",
            "load (1 min)",
        ]
        body = []
        for r in speed:
            pc = r.get("precision_check") or {}
            kernels = pc.get("extra_math_runtime_nodes") or {}
            body.append(
                [
                    r["variant"],
                    str(r["threads"]),
                    str(r["batch"]),
                    _f(r["fp32"]["median_ms"]),
                    _f(r["bf16"]["median_ms"]),
                    f"{_f(r['bf16']['speedup_median'])} [{_f(r['bf16']['speedup_q1'])}, {_f(r['bf16']['speedup_q3'])}]",
                    _f(r["int8"]["median_ms"]),
                    f"{_f(r['int8']['speedup_median'])} [{_f(r['int8']['speedup_q1'])}, {_f(r['int8']['speedup_q3'])}]",
                    f"{kernels.get('f32', 0)} of {sum(kernels.values())}" if kernels else "no extra math",
                    _f(r.get("load_1min")),
                ]
            )
        s = result["speed_settings"]
        parts += [
            f"## Speed: OpenVINO, {s['arch']} random init, fp32 against bf16 and NNCF int8",
            "",
            f"Each model passes the parity gate against eager fp32 (fp32 1e-4, bf16 6e-2, static int8 0.5) "
            f"before it is timed alternately with fp32 (A B A B, {s['min_time']:g} s); speed-up = median "
            "[Q1, Q3] of per-pair fp32 / other ratios.",
            "",
            markdown_table(head, body),
            "",
        ]
    elif result.get("speed_not_measured"):
        parts += ["## Speed", "", f"Not measured: {result['speed_not_measured']}", ""]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------ command
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m research.bf16",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_zoo_selection(p, task="all")
    p.add_argument(
        "--threads", type=int, default=None, help="OpenVINO threads of the zoo check and scoring (default: all cores)"
    )
    p.add_argument(
        "--speed-arch",
        default="small",
        choices=("micro", "tiny", "small", "base"),
        help="architecture of the speed comparison (small: ViT-S 224)",
    )
    p.add_argument("--speed-variants", default="standard,belief2", help="variants of the speed comparison")
    p.add_argument(
        "--speed-threads", default="1,all", help="thread counts of the speed comparison ('all': every usable core)"
    )
    p.add_argument("--batch-sizes", default="1,8", help="batch sizes of the speed comparison")
    p.add_argument("--min-time", type=float, default=3.0, help="seconds of A B A B timing per pair")
    p.add_argument("--no-speed", action="store_true", help="the zoo only")
    p.add_argument("--out", type=Path, default=None, help="output folder (bf16.md/.json)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="exported and quantized models (default: <cache>/bf16-study, <cache> as for bench-latency)",
    )
    p.add_argument(
        "--table",
        type=Path,
        metavar="JSON",
        default=None,
        help="print the markdown report of this bf16.json; runs nothing",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return add_debug_flag(p)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.bf16``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if reprint(a.table, markdown):
        return 0
    require_out(a.out)
    batches = parse_batch_sizes(a.batch_sizes)
    try:
        thread_counts = _threads(a.speed_threads)
        speed_variants = variant_list(a.speed_variants)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if a.threads is not None and a.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {a.threads}")
    if a.min_time <= 0:
        raise UsageError(f"--min-time must be > 0, got {a.min_time}")
    reason = unavailable_reason()
    if reason:
        raise ValueError(reason)
    entries = zoo_entries(a)
    writable_dir(a.out, "--out folder")
    cache = a.cache_dir or default_cache_dir() / "bf16-study"
    writable_dir(cache, "--cache-dir folder")
    refused = bf16_unavailable_reason()
    if refused:
        print(f"bf16 not measured on this CPU: {refused}", file=sys.stderr)
    result: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "research.bf16", *argv]),
        "environment": environment(),
        "bf16_unavailable": refused,
        "load_start": load_average(),
    }
    rows: list[dict[str, Any]] = []
    for e in tqdm(entries, desc="bf16 zoo", unit="model", disable=a.no_progress):
        rows.append(zoo_row(e, cache, bf16=refused is None, threads=a.threads, limit=a.limit))
        atomic_write_text(a.out / "bf16.partial.json", json.dumps(rows, indent=1) + "\n")  # kept if stopped
    result["zoo"] = rows
    result["speed_settings"] = {
        "arch": a.speed_arch,
        "variants": speed_variants,
        "batch_sizes": batches,
        "threads": thread_counts,
        "min_time": a.min_time,
    }
    if a.no_speed:
        result["speed_not_measured"] = "--no-speed"
    elif refused:
        result["speed_not_measured"] = refused
    else:
        result["speed"] = speed_rows(
            a.speed_arch, speed_variants, batches, thread_counts, a.min_time, cache, progress=not a.no_progress
        )
    result["load_end"] = load_average()
    md = markdown(result)
    write_report(a.out, "bf16", result, md)
    (a.out / "bf16.partial.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
