"""Quantized zoo: test-set accuracy of fp32, int8, int8 with the extra math quantized and FP8, and int8 speed.

Accuracy (every chosen zoo model, trained weights; by default the Fashion-MNIST classifiers on the official
10,000 test images, segmenters' mIoU on the test scenes with ``--task seg|all``): the fp32 export verified as
``export-model`` verifies it, then three ModelOpt post-training quantizations of it, all calibrated on the same
training-split images (:func:`attnzoo.export.quantize.calibration_images`):

- ``int8``: the variant's extra-math nodes excluded (fp32), as ``export-model --dtype int8`` makes it;
- ``int8 xm``: the extra math quantized too (``--quantize-extra-math``, the ablation); variants without extra
  math have no such column;
- ``fp8``: ModelOpt's FP8 Q/DQ graph (extra math excluded) scored through
  :func:`attnzoo.runtime.fp8.simulate_fp8` (exact e4m3 round trip at the same Q/DQ points): ONNX
  Runtime's CPU provider refuses the float8 graph itself.

All four run in ONNX Runtime (CPU) on the same images. Whether quantizing the extra math costs accuracy is
tested per classifier with McNemar's exact test on the paired predictions of ``int8`` and ``int8 xm`` (images
one gets right and the other wrong); a variant "loses accuracy" when ``int8 xm`` is lower with p < 0.05.

Speed (``--speed-arch``, default ViT-S 224, random-init ``standard`` by default, one thread): per CPU runtime
the fp32 export against its int8 model (``ort-cpu``: ModelOpt's Q/DQ graph; ``openvino``: NNCF's own
quantization, extra math in the ignored scope; :mod:`attnzoo.benchmarks.rows`), each checked against
eager fp32 under the shared tolerance table, then timed alternately (A B A B) so both see the same load; each
row has its fraction of the machine's matmul ceiling (fp32 or int8) measured in the same run.

Usage::

    python -m research.quantized --out results/studies/quantized-fashion
    python -m research.quantized --out results/studies/quantized-fashion --timing-only  # quiet machine
    python -m research.quantized --table results/studies/quantized-fashion/quantized.json
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx
import torch
from tqdm import tqdm

from attnzoo import zoo
from attnzoo.benchmarks.ceiling import ceiling_for, fraction, matmul_ceiling
from attnzoo.benchmarks.flops import count_flops
from attnzoo.benchmarks.report import markdown_table
from attnzoo.benchmarks.rows import load_call, row_unavailable_reason, tolerance_for
from attnzoo.benchmarks.stats import ratio_stats
from attnzoo.benchmarks.timing import measure_pair
from attnzoo.cli import add_debug_flag, entry_point, parse_batch_sizes
from attnzoo.errors import UsageError
from attnzoo.export import export_verified
from attnzoo.export import quantize as q
from attnzoo.export.quantize import (
    CPU_QDQ_PLACEMENT,
    DEFAULT_CALIBRATION_COUNT,
    DEFAULT_CALIBRATION_SEED,
    TENSORRT_QDQ_PLACEMENT,
)
from attnzoo.fileio import atomic_write_text, default_cache_dir, writable_dir
from attnzoo.machine import cpu_summary, environment, load_1min, load_average
from attnzoo.metrics import confusion_matrix, metrics_from_confusion
from attnzoo.models import canonical_name, create_model
from attnzoo.runtime.backends import get_backend
from attnzoo.runtime.backends.ort_cpu import ORT_CPU
from attnzoo.runtime.evaluate import EVAL_BATCH, load_test_split, predict_session
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.runtime.parity import check as check_parity
from attnzoo.runtime.precision import get_precision
from research.int8_accuracy import _verified_fp32
from research.study import add_zoo_selection, contended, reprint, require_out, write_report, zoo_entries

__all__ = ["MODELS", "mcnemar_p", "accuracy_row", "speed_rows", "markdown", "main"]

#: The scored models, in table order: label -> what it is.
MODELS: dict[str, str] = {
    "fp32": "the verified fp32 export",
    "int8": "ModelOpt int8, extra math excluded (fp32)",
    "int8 xm": "ModelOpt int8, extra math quantized too",
    "fp8": "ModelOpt fp8 (e4m3), extra math excluded, simulated (simulate_fp8)",
}
#: Significance level of "loses accuracy when its extra math is quantized".
ALPHA = 0.05
#: The speed comparison's int8 runs: (runtime, ModelOpt Q/DQ placement): ONNX Runtime with the CPU placement
#: (what bench-latency and the demo run) and with ModelOpt's default (TensorRT's) for comparison, OpenVINO with
#: NNCF's own quantization.
SPEED_JOBS = (("ort-cpu", CPU_QDQ_PLACEMENT), ("ort-cpu", TENSORRT_QDQ_PLACEMENT), ("openvino", None))


def mcnemar_p(right_a: np.ndarray, right_b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value of paired correctness vectors (binomial test on the discordant pairs)."""
    from scipy.stats import binomtest  # heavy: scipy, for this test only

    a_only = int(np.sum(right_a & ~right_b))
    b_only = int(np.sum(right_b & ~right_a))
    if a_only + b_only == 0:
        return 1.0
    return float(binomtest(a_only, a_only + b_only, 0.5).pvalue)


def _predict(models: Mapping[str, Any], config: Mapping[str, Any], limit: int | None, threads: int | None):
    """Predictions of each model on the test split (the split, preprocessing and batching of
    :func:`attnzoo.export.quantize.evaluate_onnx`), the targets and the class names."""
    x, y, class_names = load_test_split(config, limit)
    preds = {label: predict_session(ORT_CPU.session(m, threads).run, x, EVAL_BATCH) for label, m in models.items()}
    return preds, y, class_names


def accuracy_row(
    entry: Mapping[str, Any],
    cache_dir: Path,
    *,
    calibration_count: int,
    seed: int,
    limit: int | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Quantize one zoo model three ways and score all four on its test split (see the module docstring)."""
    model, cfg = zoo.load(entry["variant"], entry["task"], entry["data"])
    stem = f"{entry['variant']}_{entry['task']}_{entry['data']}"
    fp32 = _verified_fp32(model, cfg, cache_dir / f"{stem}.onnx", entry.get("sha256", ""), threads or 1)
    extra = q.extra_math_nodes(onnx.load(str(fp32)), cfg)
    calibration = q.calibration_images(cfg, calibration_count, seed)
    source = f"{len(calibration)} {cfg['data']} training images, seed {seed}"
    plan = {"int8": ("int8", extra), "fp8": ("fp8", extra)}
    if extra:
        plan["int8 xm"] = ("int8", [])
    paths: dict[str, Any] = {"fp32": fp32}
    quant: dict[str, Any] = {}
    for label in [m for m in MODELS if m in plan]:
        dtype, exclude = plan[label]
        out = cache_dir / f"{stem}.{label.replace(' ', '-')}.onnx"
        rep = q.quantize_onnx(
            fp32,
            out,
            dtype=dtype,
            calibration=calibration,
            exclude_nodes=exclude,
            calibration_source=source,
            calibration_seed=seed,
            extra_nodes=extra,
        )
        quant[label] = {
            "quantized_ops": rep.qdq["quantized_ops"],
            "extra_math_quantized": len(rep.qdq["extra_math_quantized"]),
            "excluded_nodes": len(exclude),
            "calibration": rep.calibration,
            "quantizer": f"{rep.quantizer} {rep.quantizer_version}",
            "time_s": rep.time_s,
        }
        if exclude and rep.qdq["extra_math_quantized"]:
            raise RuntimeError(
                f"{out.name}: {len(rep.qdq['extra_math_quantized'])} excluded extra-math op(s) read quantized values"
            )
        precision = get_precision(dtype)
        paths[label] = precision.ort_graph(onnx.load(str(out))) if precision.ort_simulated else out
    preds, y, class_names = _predict(paths, cfg, limit, threads)
    k = len(class_names)
    metrics, metric_name = {}, "top1"
    for label, pred in preds.items():
        m = metrics_from_confusion(confusion_matrix(y, pred, k), cfg["task"], class_names)
        metrics[label], metric_name = float(m["metric"]), m["metric_name"]
        if not math.isfinite(metrics[label]):
            raise RuntimeError(f"{stem} {label}: metric is not finite")
    row: dict[str, Any] = {
        "variant": entry["variant"],
        "task": entry["task"],
        "data": entry["data"],
        "arch": cfg["arch"],
        "checkpoint_sha256": entry.get("sha256"),
        "metric_name": metric_name,
        "n_images": int(len(y)),
        "extra_math_nodes": len(extra),
        "metrics": metrics,
        "delta": {k_: v - metrics["fp32"] for k_, v in metrics.items() if k_ != "fp32"},
        "agreement": {k_: float(np.mean(p == preds["fp32"])) for k_, p in preds.items() if k_ != "fp32"},
        "tolerance": q.ACCURACY_TOLERANCE[cfg["task"]],
        "quantization": quant,
    }
    row["int8_within_tolerance"] = -row["delta"]["int8"] <= row["tolerance"]
    if "int8 xm" in preds:
        cost = metrics["int8 xm"] - metrics["int8"]
        p = mcnemar_p(preds["int8"] == y, preds["int8 xm"] == y) if cfg["task"] == "cls" else None
        row["extra_math_cost"] = {
            "points": cost,
            "mcnemar_p": p,
            "loses": bool(cost < 0 and (p is None or p < ALPHA))
            if cfg["task"] == "cls"
            else bool(cost < -row["tolerance"]),
        }
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
        x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
        with torch.inference_mode():
            ref = model(x).float().numpy()
        runners, infos, parity = {}, {}, {}
        try:
            for dtype in ("fp32", "int8"):
                runners[dtype], infos[dtype] = load_call(
                    backend,
                    model,
                    fp32,
                    x.numpy(),
                    dtype,
                    threads=threads,
                    device="cpu",
                    cache_dir=cache_dir,
                    int8_placement=placement or CPU_QDQ_PLACEMENT,
                )
                key = tolerance_for(backend, dtype, "cpu")
                ok, err = check_parity(runners[dtype].output(), ref, key)
                if not ok:
                    raise RuntimeError(
                        f"{backend} {dtype} b{batch}: parity error {err:.3g} beyond the {key} tolerance "
                        f"{TOLERANCES[key]:g}"
                    )
                parity[dtype] = err
            load = load_1min()
            t32, t8 = measure_pair(runners["fp32"].fn, runners["int8"].fn, min_time)
            r = ratio_stats(t8, t32)  # per pair: fp32 time / int8 time = the int8 speed-up
            row = {
                "backend": backend,
                "placement": placement,
                "batch": batch,
                "speedup_median": r["ratio_median"],
                "speedup_q1": r["ratio_q1"],
                "speedup_q3": r["ratio_q3"],
                "pairs": r["pairs"],
                "load_1min": load,
                "int8_model": infos["int8"].get("int8"),
            }
            for dtype, t in (("fp32", t32), ("int8", t8)):
                med = float(np.median(t) * 1e3)
                row[dtype] = {
                    "median_ms": med,
                    "parity_error": parity[dtype],
                    **fraction(flops * batch, med, ceiling_for(ceiling, backend, dtype, "cpu")),
                }
            rows.append(row)
        finally:  # each runner owns its session: freed now, not by the garbage collector
            for runner in runners.values():
                runner.close()
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


# ------------------------------------------------------------------------------------------------ report
def _f(v: float | None, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def accuracy_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The accuracy table: metric per model, drops, and the extra-math verdict."""
    body = []
    for r in rows:
        m, d = r["metrics"], r["delta"]
        xm = r.get("extra_math_cost")
        verdict = "-" if xm is None else ("**loses**" if xm["loses"] else "no loss")
        p = "-" if not xm or xm["mcnemar_p"] is None else f"{xm['mcnemar_p']:.2g}"
        body.append(
            [
                r["variant"],
                r["task"],
                r["metric_name"],
                f"{m['fp32']:.2f}",
                f"{m['int8']:.2f} ({d['int8']:+.2f})",
                "-" if "int8 xm" not in m else f"{m['int8 xm']:.2f} ({d['int8 xm']:+.2f})",
                f"{m['fp8']:.2f} ({d['fp8']:+.2f})",
                str(r["extra_math_nodes"]),
                "-" if xm is None else f"{xm['points']:+.2f}",
                p,
                verdict,
            ]
        )
    return markdown_table(
        [
            "variant",
            "task",
            "metric",
            "fp32",
            "int8 (- fp32)",
            "int8 xm (- fp32)",
            "fp8 sim (- fp32)",
            "extra-math nodes",
            "xm - int8",
            "McNemar p",
            "extra math quantized",
        ],
        body,
    )


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


def markdown(result: Mapping[str, Any]) -> str:
    """The whole report: machine, command, accuracy table, verdicts, speed table."""

    def machine(section: Mapping[str, Any]) -> list[str]:
        """The CPU a section was measured on (files written before sections kept their own: the run's)."""
        cpus = section.get("cpus") or [(section.get("environment") or result["environment"])["cpu"]]
        return [
            f"CPU: {'; '.join(cpu_summary(c) for c in cpus)}, "
            f"{'/'.join(str(c.get('usable_cores', '?')) for c in cpus)} usable cores.",
            "",
        ]

    parts = [
        "# Quantized zoo: accuracy on the test sets and int8 speed on the CPU",
        "",
        f"Last command: `{result['command']}`",
        "",
    ]
    acc = result.get("accuracy")
    if acc:
        rows = acc["rows"]
        n = sorted({r["n_images"] for r in rows})
        parts += [
            "## Accuracy (ONNX Runtime CPU, percent)",
            "",
            *([f"Measured by `{acc['command']}`.", ""] if acc.get("command") else []),
            *machine(acc),
            f"{acc['data']} test split ({', '.join(map(str, n))} images); calibration: "
            f"{acc['calibration_count']} training images, seed {acc['seed']}, ModelOpt's default method per "
            f"dtype. int8: extra math excluded (fp32); int8 xm: extra math quantized too; fp8 sim: ModelOpt's "
            "FP8 graph through simulate_fp8 (exact e4m3 round trip at the same Q/DQ points). xm - int8: "
            f"points lost by quantizing the extra math; **loses**: lower with McNemar p < {ALPHA} "
            "(classifiers; segmenters: beyond the 1-point tolerance). Load average "
            f"{acc['load_start']} at the start, {acc['load_end']} at the end (accuracy does not depend on it).",
            "",
            accuracy_table(rows),
            "",
        ]
        within = [r["variant"] for r in rows if not r["int8_within_tolerance"]]
        losers = [r["variant"] for r in rows if (r.get("extra_math_cost") or {}).get("loses")]
        parts += [
            f"int8 within the tolerance of fp32 (0.5 points top-1, 1 point mIoU): "
            f"{'all' if not within else 'all but ' + ', '.join(within)}.",
            f"Lose accuracy when their extra math is quantized: {', '.join(losers) or 'none'}.",
            "",
        ]
    sp = result.get("speed")
    if sp:
        busy = sp["contended"]
        parts += [
            f"## int8 speed ({sp['variant']}, arch {sp['arch']}, {sp['img_size']} px, {sp['threads']} thread(s))",
            "",
            *([f"Measured by `{sp['command']}`.", ""] if sp.get("command") else []),
            *machine(sp),
            f"Random-init model ({sp['gflop_per_image']:.2f} GFLOP per image); both models of a row pass "
            "the parity gate against eager fp32 (fp32 1e-4; static int8 of a random-init model calibrated on random "
            "inputs 0.5, a sanity gate) before they are timed alternately "
            f"(A B A B, {sp['min_time']:g} s); speed-up = median [Q1, Q3] of per-pair fp32/int8 ratios. Ceiling: "
            f"this machine's fp32 matmul {sp['ceiling']['fp32']['gflops']:.0f} GFLOP/s, int8 "
            + (f"{sp['ceiling']['int8']['gops']:.0f} GOP/s" if sp["ceiling"]["int8"].get("gops") else "not measured")
            + f", {sp['threads']} thread(s). Load average {sp['load_start']} at the start, {sp['load_end']} at "
            "the end"
            + (
                ": **measured under load (shared machine), re-run with --timing-only when quiet**"
                if busy
                else " (quiet)"
            )
            + ".",
            "",
            speed_table(sp),
            "",
        ]
        for b, best in sp["fastest_int8"].items():
            parts.append(
                f"- batch {b}: fastest int8 runtime {best['backend']}, {best['speedup_median']:.2f}x its fp32."
            )
        for b, why in sp["skipped"].items():
            parts.append(f"- {b}: skipped ({why}).")
        parts.append("")
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------ CLI
def _unique(items: Sequence[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def _kept_accuracy(
    old: Mapping[str, Any] | None, settings: Mapping[str, Any], measured: set[tuple[str, str]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``--accuracy-only``: the earlier run's rows of the models not measured now, and the CPUs they were
    measured on; none when that run used other settings (data, limit, calibration), whose rows would be
    reported under this run's settings."""
    if not old:
        return [], []
    differ = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    if differ:
        print(
            "note: the rows of the earlier run in --out are not kept: it used other settings ("
            + ", ".join(f"{k} {was} -> {now}" for k, (was, now) in differ.items())
            + ")",
            file=sys.stderr,
        )
        return [], []
    kept = [r for r in old.get("rows", []) if (r["variant"], r["task"]) not in measured]
    if not kept:
        return [], []
    return kept, old.get("cpus") or [old["environment"]["cpu"]]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m research.quantized",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_zoo_selection(p)
    p.add_argument(
        "--calibration-count", type=int, default=DEFAULT_CALIBRATION_COUNT, help="training images to calibrate on"
    )
    p.add_argument("--seed", type=int, default=DEFAULT_CALIBRATION_SEED, help="seed of the calibration draw")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads of the scoring (default: all)")
    p.add_argument(
        "--speed-arch",
        default="small",
        choices=("micro", "tiny", "small", "base"),
        help="architecture of the speed comparison (small: ViT-S 224)",
    )
    p.add_argument("--speed-variant", default="standard", help="variant of the speed comparison")
    p.add_argument("--speed-threads", type=int, default=1)
    p.add_argument("--batch-sizes", default="1,8", help="batch sizes of the speed comparison")
    p.add_argument("--min-time", type=float, default=3.0, help="seconds of A B A B timing per runtime and batch")
    grp = p.add_mutually_exclusive_group()
    grp.add_argument(
        "--timing-only",
        action="store_true",
        help="measure speed only; the accuracy of an existing quantized.json in --out is kept",
    )
    grp.add_argument(
        "--accuracy-only",
        action="store_true",
        help="measure accuracy only; the speed, and the rows of models not chosen now, of an existing "
        "quantized.json in --out are kept",
    )
    p.add_argument("--out", type=Path, default=None, help="output folder (quantized.md/.json)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="exported and quantized models (default: <cache>/quantized, <cache> as for bench-latency)",
    )
    p.add_argument(
        "--table",
        type=Path,
        metavar="JSON",
        default=None,
        help="print the markdown report of this quantized.json; runs nothing",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return add_debug_flag(p)


def _check(a: argparse.Namespace) -> list[int]:

    batches = parse_batch_sizes(a.batch_sizes)
    for flag, v in (
        ("--speed-threads", a.speed_threads),
        ("--calibration-count", a.calibration_count),
        ("--threads", a.threads if a.threads is not None else 1),
        ("--limit", a.limit if a.limit is not None else 1),
    ):
        if v < 1:
            raise UsageError(f"{flag} must be >= 1, got {v}")
    if not a.min_time > 0:
        raise UsageError(f"--min-time must be > 0, got {a.min_time}")
    return batches


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.quantized``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if reprint(a.table, markdown):
        return 0
    require_out(a.out)
    batches = _check(a)
    try:
        speed_variant = canonical_name(a.speed_variant)
    except ValueError as exc:
        raise UsageError(f"--speed-variant: {exc}") from None
    entries = [] if a.timing_only else zoo_entries(a)
    writable_dir(a.out, "--out folder")
    cache = a.cache_dir or default_cache_dir() / "quantized"
    writable_dir(cache, "--cache-dir folder")
    old_path = a.out / "quantized.json"
    old = json.loads(old_path.read_text()) if old_path.is_file() and (a.timing_only or a.accuracy_only) else {}
    for section in ("accuracy", "speed"):  # files from before sections kept their own machine: the run's
        if old.get(section) and "environment" not in old[section]:
            old[section]["environment"] = old["environment"]
    env = environment()
    result: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "research.quantized", *argv]),
        "environment": env,
        "accuracy": old.get("accuracy"),
        "speed": old.get("speed"),
    }
    if not a.timing_only:
        start = load_average()
        rows: list[dict[str, Any]] = []
        for e in tqdm(entries, desc="quantized accuracy", unit="model", disable=a.no_progress):
            rows.append(
                accuracy_row(
                    e, cache, calibration_count=a.calibration_count, seed=a.seed, limit=a.limit, threads=a.threads
                )
            )
            # the rows so far, kept if a later model fails or the run is stopped (the report is written at the end)
            atomic_write_text(a.out / "quantized.partial.json", json.dumps(rows, indent=1) + "\n")
        settings = {"data": a.data, "limit": a.limit, "calibration_count": a.calibration_count, "seed": a.seed}
        kept, cpus = _kept_accuracy(old.get("accuracy"), settings, {(r["variant"], r["task"]) for r in rows})
        result["accuracy"] = {
            **settings,
            "load_start": start,
            "load_end": load_average(),
            "rows": rows + kept,
            "command": result["command"],
            "environment": env,
            "cpus": _unique([env["cpu"], *cpus]),
        }
    if not a.accuracy_only:
        start = load_average()
        speed = speed_rows(
            a.speed_arch, speed_variant, batches, a.speed_threads, a.min_time, cache, progress=not a.no_progress
        )
        end = load_average()
        speed.update(
            load_start=start,
            load_end=end,
            contended=contended(start, end, a.speed_threads),
            command=result["command"],
            environment=env,
        )
        result["speed"] = speed
    md = markdown(result)
    write_report(a.out, "quantized", result, md)
    (a.out / "quantized.partial.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
