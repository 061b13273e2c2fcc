"""Dynamic int8 on the trained zoo: test accuracy of fp32 and int8 ONNX Runtime beside the int8 speed-up.

For every chosen zoo model (trained weights; by default the Fashion-MNIST classifiers, scored on the official
10,000 test images): export fp32 ONNX verified as ``export-model`` does it, quantize it
(:func:`attnzoo.benchmarks.ort_cpu.quantize_int8`: MatMul/Gemm weights int8, activations per run), run both
tuned ``ort-cpu`` sessions over the whole test split, and time them alternately (A B A B) at each batch size,
in the same run on the same machine. The int8 model is not parity-checked against fp32 (quantization moves
the logits): its test accuracy, and how often its top-1 agrees with fp32's, are the measurement.

Accuracy can differ between machines: ONNX Runtime's u8 x s8 kernels use VNNI where the CPU has it and
16-bit pair sums (which can saturate) on AVX2 without it. So every result file names its CPU and flags,
and ``--table`` puts the machines side by side.

Usage::

    python -m research.int8_accuracy --out results/studies/int8-fashion-avx2
    python -m research.int8_accuracy --table results/int8-fashion-*/int8_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from attnzoo import zoo
from attnzoo.benchmarks.ort_cpu import quantize_int8
from attnzoo.benchmarks.tables import markdown_table
from attnzoo.benchmarks.timing import measure_pair
from attnzoo.cli import entry_point, parse_batch_sizes
from attnzoo.data.datasets import load_data
from attnzoo.errors import UsageError
from attnzoo.fileio import default_cache_dir, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import environment, load_average
from attnzoo.metrics import confusion_matrix, metrics_from_confusion
from attnzoo.preprocess import normalize
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.evaluate import predict_session
from research.study import (
    add_output_flags,
    add_zoo_selection,
    check_above_zero,
    check_at_least,
    command_line,
    contended,
    paired_speedup,
    require_out,
    study_parser,
    write_report,
    zoo_entries,
)

export = lazy_import("attnzoo.export")  # onnx and timm: --help and --table load without them

__all__ = ["verified_fp32", "int8_rows", "markdown", "readme_table", "machine_label", "main"]


def _metric(conf: np.ndarray, task: str, class_names: Sequence[str]) -> float:
    return float(metrics_from_confusion(torch.from_numpy(conf), task, class_names)["metric"])


def verified_fp32(model, cfg: dict[str, Any], path: Path, sha256: str, threads: int) -> Path:
    """The model's fp32 ONNX, exported and verified as ``export-model`` does it (raises if it fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = int(cfg["img_size"])
    export.export_verified(
        model,
        path,
        cfg,
        dtype="fp32",
        input_hw=(size, size),
        batch_sizes=(1, 8),
        checkpoint_sha256=sha256,
        threads=threads,
    )
    return path


def _test_split(entry: dict[str, Any], cfg: dict[str, Any], *, limit: int | None, loaded: dict) -> Any:
    """The test split the model was trained for (loaded once per data set, size, seed and scene: ``loaded``)."""
    key = (
        entry["data"],
        entry["task"],
        int(cfg["img_size"]),
        int(cfg.get("data_seed", 0)),
        json.dumps(cfg.get("scene"), sort_keys=True),
    )
    if key not in loaded:
        loaded[key] = load_data(
            entry["data"], "test", entry["task"], key[2], n=limit, seed=key[3], scene=cfg.get("scene")
        )
    return loaded[key]


def _speed(fp32: Path, int8: Path, x: np.ndarray, threads: int, batch: int, min_time: float, cache: Path) -> dict:
    """fp32 against int8 at one batch size, A B A B: both medians and the per-pair speed-up."""
    ort_cpu = onnx_reference()
    fixed = ort_cpu.options(threads=threads, cache_dir=cache, batch=batch)
    s32, s8 = ort_cpu.load(fp32, fixed).session, ort_cpu.load(int8, fixed).session
    feed = {s32.get_inputs()[0].name: x[:batch]}
    t32, t8 = measure_pair(partial(s32.run, None, feed), partial(s8.run, None, feed), min_time)
    return {
        "fp32_median_ms": float(np.median(t32) * 1e3),
        "int8_median_ms": float(np.median(t8) * 1e3),
        **paired_speedup(t32, t8),
    }


def _int8_row(entry: dict[str, Any], cache_dir: Path, threads: int, batch_sizes, min_time: float, split) -> dict:
    """One zoo model: fp32 and int8 scored on its test split (``split(cfg)``), then timed at each batch size."""
    model, cfg = zoo.load(entry["variant"], entry["task"], entry["data"])
    data = split(cfg)
    stem = f"{entry['variant']}_{entry['task']}_{entry['data']}"
    fp32 = verified_fp32(model, cfg, cache_dir / f"{stem}.onnx", entry.get("sha256", ""), threads)
    int8 = quantize_int8(fp32, cache_dir / f"{stem}.int8.onnx")
    x = normalize(data.images, cfg["mean"], cfg["std"])
    y = data.labels if entry["task"] == "cls" else data.masks.astype(np.int64)
    k = len(data.class_names)
    ort_cpu = onnx_reference()
    tuned = ort_cpu.options(threads=threads, cache_dir=cache_dir)
    with ort_cpu.load(fp32, tuned) as sess32, ort_cpu.load(int8, tuned) as sess8:
        p32, p8 = predict_session(sess32.run, x), predict_session(sess8.run, x)
    m32 = _metric(confusion_matrix(y, p32, k).numpy(), entry["task"], data.class_names)
    m8 = _metric(confusion_matrix(y, p8, k).numpy(), entry["task"], data.class_names)
    return {
        "variant": entry["variant"],
        "task": entry["task"],
        "data": entry["data"],
        "arch": cfg["arch"],
        "checkpoint": entry.get("file"),
        "checkpoint_sha256": entry.get("sha256"),
        "metric_name": entry.get("metric_name", "top1" if entry["task"] == "cls" else "miou"),
        "zoo_metric": entry.get("test_metric"),
        "ort_fp32_metric": m32,
        "ort_int8_metric": m8,
        "delta": m8 - m32,
        "agreement": float(np.mean(p32 == p8)),
        "n_images": len(data),
        "speed": {str(b): _speed(fp32, int8, x, threads, b, min_time, cache_dir) for b in batch_sizes},
    }


def int8_rows(
    entries: list[dict[str, Any]],
    cache_dir: Path,
    threads: int,
    batch_sizes: Sequence[int],
    min_time: float,
    limit: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """One row per zoo entry: fp32 / int8 metric on the test split, top-1 agreement, and the int8 speed-up
    (median of per-pair fp32/int8 latency ratios) at each batch size."""
    rows = []
    loaded: dict[tuple[str, str, int, int, str], Any] = {}
    cache_dir.mkdir(parents=True, exist_ok=True)
    for entry in tqdm(entries, desc="int8 accuracy", unit="model", disable=not progress):
        split = partial(_test_split, entry, limit=limit, loaded=loaded)
        rows.append(_int8_row(entry, cache_dir, threads, batch_sizes, min_time, split))
    return rows


def machine_label(env: dict[str, Any]) -> str:
    """``CPU model (key flags)``, e.g. ``AMD EPYC (avx2, fma)``."""
    cpu = env["cpu"]
    return f"{cpu['model']} ({', '.join(cpu['key_flags']) or 'no AVX2'})"


def _speed_cell(row: dict[str, Any], batch: str) -> str:
    speed = row["speed"].get(batch)
    return (
        "-"
        if speed is None
        else f"{speed['speedup_median']:.2f} [{speed['speedup_q1']:.2f}, {speed['speedup_q3']:.2f}]"
    )


def markdown(result: dict[str, Any]) -> str:
    """The run's table: metrics, agreement, and per batch size the latencies and speed-up."""
    batches = [str(b) for b in result["batch_sizes"]]
    table = markdown_table(
        [
            "variant",
            "task",
            "metric",
            "zoo (eager)",
            "ORT fp32",
            "ORT int8",
            "int8 - fp32",
            "top-1 agreement",
            *[h for b in batches for h in (f"fp32 ms b{b}", f"int8 ms b{b}", f"speed-up b{b} [Q1, Q3]")],
        ],
        [
            [
                r["variant"],
                r["task"],
                r["metric_name"],
                "-" if r["zoo_metric"] is None else f"{r['zoo_metric']:.2f}",
                f"{r['ort_fp32_metric']:.2f}",
                f"{r['ort_int8_metric']:.2f}",
                f"{r['delta']:+.2f}",
                f"{100 * r['agreement']:.2f} %",
                *[
                    c
                    for b in batches
                    for c in (
                        f"{r['speed'][b]['fp32_median_ms']:.3f}",
                        f"{r['speed'][b]['int8_median_ms']:.3f}",
                        _speed_cell(r, b),
                    )
                ],
            ]
            for r in result["rows"]
        ],
    )
    env = result["environment"]
    n = sorted({r["n_images"] for r in result["rows"]})
    return "\n".join(
        [
            "# Dynamic int8 (ONNX Runtime CPU) on the zoo's test set",
            "",
            f"Command: `{result['command']}`",
            "",
            "MatMul/Gemm weights int8 (onnxruntime.quantization.quantize_dynamic, QInt8), activations quantized "
            "per run; everything else fp32. Metric in percent on the test split each model was trained for "
            f"({', '.join(map(str, n))} images); top-1 agreement: share of test images (pixels for seg) where int8 "
            "predicts what fp32 predicts. Speed-up: median [Q1, Q3] of per-pair fp32/int8 latency ratios (A B A B), "
            "measured in this run.",
            "",
            f"CPU: {machine_label(env)}; threads {result['threads']}; load average {env['load_average']} at the start, "
            f"{result['load_average_end']} at the end"
            f"{' (shared with other jobs: contended)' if result['contended'] else ''}.",
            "",
            table,
            "",
        ]
    )


def readme_table(results: Sequence[dict[str, Any]]) -> str:
    """One table for the README from several result files: fp32 top-1, then per machine int8 - fp32 and the
    int8 speed-up at each batch size; the machines listed under it."""
    if not results:
        raise ValueError("no result files given")
    keys = list(dict.fromkeys((row["variant"], row["task"]) for res in results for row in res["rows"]))
    cell = [{(row["variant"], row["task"]): row for row in res["rows"]} for res in results]
    header = ["variant", "task", "ORT fp32"]
    for i, res in enumerate(results, 1):
        header += [f"int8 - fp32 (M{i})", *[f"int8 speed-up b{b} (M{i})" for b in res["batch_sizes"]]]
    rows = []
    for key in keys:
        fp32 = [c[key]["ort_fp32_metric"] for c in cell if key in c]
        line = [key[0], key[1], f"{fp32[0]:.2f}" if len(set(fp32)) == 1 else " / ".join(f"{v:.2f}" for v in fp32)]
        for c, res in zip(cell, results, strict=False):
            row = c.get(key)
            line.append("-" if row is None else f"{row['delta']:+.2f}")
            line += [
                "-" if row is None else f"{row['speed'][str(b)]['speedup_median']:.2f}" for b in res["batch_sizes"]
            ]
        rows.append(line)
    notes = [
        f"M{i}: {machine_label(res['environment'])}, {res['threads']} thread(s)"
        f"{', shared with other jobs (contended)' if res.get('contended') else ''}; `{res['command']}`"
        for i, res in enumerate(results, 1)
    ]
    return "\n".join([markdown_table(header, rows), "", *[f"- {n}" for n in notes]])


COMMAND = "python -m research.int8_accuracy"


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(COMMAND, __doc__)
    add_zoo_selection(parser)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-sizes", default="1,8", help="batch sizes of the speed comparison")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of A B A B timing per batch size")
    parser.add_argument(
        "--table",
        nargs="+",
        type=Path,
        metavar="JSON",
        default=None,
        help="print the README table from these int8_accuracy.json files (one per machine); runs nothing",
    )
    return add_output_flags(
        parser,
        "int8_accuracy.md/.json",
        "exported and quantized models (default: <cache>/int8, <cache> as for bench-latency)",
        table=None,
    )


def _reprint(tables: Sequence[Path]) -> None:
    """``--table FILE...``: the README table of those result files."""
    missing = [str(p) for p in tables if not p.is_file()]
    if missing:
        raise UsageError(f"--table: no such file: {', '.join(missing)}")
    print(readme_table([json.loads(p.read_text()) for p in tables]))


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.int8_accuracy``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.table is not None:
        _reprint(args.table)
        return 0
    require_out(args.out, "print the README table")
    batches = parse_batch_sizes(args.batch_sizes)
    check_at_least(("--threads", args.threads, 1), ("--limit", args.limit if args.limit is not None else 1, 1))
    check_above_zero("--min-time", args.min_time)
    entries = zoo_entries(args)
    writable_dir(args.out, "--out folder")  # before the models are exported, quantized and timed
    cache = writable_dir(args.cache_dir or default_cache_dir() / "int8", "--cache-dir folder")
    env = environment()
    rows = int8_rows(entries, cache, args.threads, batches, args.min_time, args.limit, progress=not args.no_progress)
    load_end = load_average()
    result = {
        "command": command_line(COMMAND, argv),
        "threads": args.threads,
        "batch_sizes": batches,
        "data": args.data,
        "limit": args.limit,
        "environment": env,
        "load_average_end": load_end,
        "contended": contended(env["load_average"], load_end, args.threads),
        "rows": rows,
    }
    write_report(args.out, "int8_accuracy", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
