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
row has its fraction of the machine's matmul ceiling (fp32 or int8) measured in the same run
(:mod:`research.quantized_speed`).

Usage::

    python -m research.quantized --out results/studies/quantized-fashion
    python -m research.quantized --out results/studies/quantized-fashion --timing-only  # quiet machine
    python -m research.quantized --table results/studies/quantized-fashion/quantized.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from tqdm import tqdm

from attnzoo import zoo
from attnzoo.benchmarks.tables import markdown_table
from attnzoo.cli import entry_point, parse_batch_sizes
from attnzoo.errors import UsageError
from attnzoo.export import quantize as q
from attnzoo.export.quantize import (
    DEFAULT_CALIBRATION_COUNT,
    DEFAULT_CALIBRATION_SEED,
)
from attnzoo.fileio import default_cache_dir, writable_dir
from attnzoo.machine import environment, load_average
from attnzoo.metrics import confusion_matrix, metrics_from_confusion
from attnzoo.models import canonical_name
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.evaluate import EVAL_BATCH, load_test_split, predict_session
from attnzoo.runtime.precision import get_precision
from research.int8_accuracy import verified_fp32
from research.quantized_speed import machine_lines, speed_rows, speed_section
from research.study import (
    add_output_flags,
    add_speed_arch,
    add_zoo_selection,
    check_above_zero,
    check_at_least,
    command_line,
    contended,
    parse_study,
    study_parser,
    write_json,
    write_report,
    zoo_entries,
)

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
    preds = {
        label: predict_session(onnx_reference().session(m, threads).run, x, EVAL_BATCH) for label, m in models.items()
    }
    return preds, y, class_names


def _quantized(fp32: Path, cfg: Mapping[str, Any], stem: str, cache_dir: Path, seed: int, count: int):
    """The three ModelOpt quantizations of ``fp32`` (see the module docstring), calibrated on the same images:
    ``({label: the file to score}, {label: what its quantization reported})``, fp32 first."""
    extra = q.extra_math_nodes(onnx.load(str(fp32)), cfg)
    calibration = q.calibration_images(cfg, count, seed)
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
    return paths, quant, len(extra)


def _extra_math_cost(preds: Mapping[str, np.ndarray], y: np.ndarray, metrics: Mapping[str, float], row) -> dict:
    """What quantizing the extra math costs: the points, McNemar's p (classifiers) and whether it loses."""
    cost = metrics["int8 xm"] - metrics["int8"]
    cls = row["task"] == "cls"
    p_value = mcnemar_p(preds["int8"] == y, preds["int8 xm"] == y) if cls else None
    loses = bool(cost < 0 and (p_value is None or p_value < ALPHA)) if cls else bool(cost < -row["tolerance"])
    return {"points": cost, "mcnemar_p": p_value, "loses": loses}


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
    fp32 = verified_fp32(model, cfg, cache_dir / f"{stem}.onnx", entry.get("sha256", ""), threads or 1)
    paths, quant, extra_nodes = _quantized(fp32, cfg, stem, cache_dir, seed, calibration_count)
    preds, y, class_names = _predict(paths, cfg, limit, threads)
    metrics, metric_name = {}, "top1"
    for label, pred in preds.items():
        scored = metrics_from_confusion(confusion_matrix(y, pred, len(class_names)), cfg["task"], class_names)
        metrics[label], metric_name = float(scored["metric"]), scored["metric_name"]
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
        "extra_math_nodes": extra_nodes,
        "metrics": metrics,
        "delta": {k: v - metrics["fp32"] for k, v in metrics.items() if k != "fp32"},
        "agreement": {k: float(np.mean(p == preds["fp32"])) for k, p in preds.items() if k != "fp32"},
        "tolerance": q.ACCURACY_TOLERANCE[cfg["task"]],
        "quantization": quant,
    }
    row["int8_within_tolerance"] = -row["delta"]["int8"] <= row["tolerance"]
    if "int8 xm" in preds:
        row["extra_math_cost"] = _extra_math_cost(preds, y, metrics, row)
    return row


# ------------------------------------------------------------------------------------------------ report
def accuracy_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The accuracy table: metric per model, drops, and the extra-math verdict."""
    body = []
    for row in rows:
        metrics, delta = row["metrics"], row["delta"]
        xm = row.get("extra_math_cost")
        verdict = "-" if xm is None else ("**loses**" if xm["loses"] else "no loss")
        p_text = "-" if not xm or xm["mcnemar_p"] is None else f"{xm['mcnemar_p']:.2g}"
        body.append(
            [
                row["variant"],
                row["task"],
                row["metric_name"],
                f"{metrics['fp32']:.2f}",
                f"{metrics['int8']:.2f} ({delta['int8']:+.2f})",
                "-" if "int8 xm" not in metrics else f"{metrics['int8 xm']:.2f} ({delta['int8 xm']:+.2f})",
                f"{metrics['fp8']:.2f} ({delta['fp8']:+.2f})",
                str(row["extra_math_nodes"]),
                "-" if xm is None else f"{xm['points']:+.2f}",
                p_text,
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


def _accuracy_section(acc: Mapping[str, Any], result: Mapping[str, Any]) -> list[str]:
    """The accuracy table, how it was measured and its two verdicts."""
    rows = acc["rows"]
    n = sorted({r["n_images"] for r in rows})
    within = [r["variant"] for r in rows if not r["int8_within_tolerance"]]
    losers = [r["variant"] for r in rows if (r.get("extra_math_cost") or {}).get("loses")]
    return [
        "## Accuracy (ONNX Runtime CPU, percent)",
        "",
        *([f"Measured by `{acc['command']}`.", ""] if acc.get("command") else []),
        *machine_lines(acc, result),
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
        f"int8 within the tolerance of fp32 (0.5 points top-1, 1 point mIoU): "
        f"{'all' if not within else 'all but ' + ', '.join(within)}.",
        f"Lose accuracy when their extra math is quantized: {', '.join(losers) or 'none'}.",
        "",
    ]


def markdown(result: Mapping[str, Any]) -> str:
    """The whole report: machine, command, accuracy table, verdicts, speed table."""
    parts = [
        "# Quantized zoo: accuracy on the test sets and int8 speed on the CPU",
        "",
        f"Last command: `{result['command']}`",
        "",
    ]
    if result.get("accuracy"):
        parts += _accuracy_section(result["accuracy"], result)
    if result.get("speed"):
        parts += speed_section(result["speed"], result)
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


COMMAND = "python -m research.quantized"


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(COMMAND, __doc__)
    add_zoo_selection(parser)
    parser.add_argument(
        "--calibration-count", type=int, default=DEFAULT_CALIBRATION_COUNT, help="training images to calibrate on"
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_CALIBRATION_SEED, help="seed of the calibration draw")
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads of the scoring (default: all)")
    add_speed_arch(parser)
    parser.add_argument("--speed-variant", default="standard", help="variant of the speed comparison")
    parser.add_argument("--speed-threads", type=int, default=1)
    parser.add_argument("--batch-sizes", default="1,8", help="batch sizes of the speed comparison")
    parser.add_argument("--min-time", type=float, default=3.0, help="seconds of A B A B timing per runtime and batch")
    only = parser.add_mutually_exclusive_group()
    only.add_argument(
        "--timing-only",
        action="store_true",
        help="measure speed only; the accuracy of an existing quantized.json in --out is kept",
    )
    only.add_argument(
        "--accuracy-only",
        action="store_true",
        help="measure accuracy only; the speed, and the rows of models not chosen now, of an existing "
        "quantized.json in --out are kept",
    )
    return add_output_flags(
        parser,
        "quantized.md/.json",
        "exported and quantized models (default: <cache>/quantized, <cache> as for bench-latency)",
        "print the markdown report of this quantized.json",
    )


def _check(args: argparse.Namespace) -> tuple[list[int], str]:
    """The batch sizes and the speed comparison's variant; ``UsageError`` for a bad value, before any work."""
    batches = parse_batch_sizes(args.batch_sizes)
    check_at_least(
        ("--speed-threads", args.speed_threads, 1),
        ("--calibration-count", args.calibration_count, 1),
        ("--threads", args.threads if args.threads is not None else 1, 1),
        ("--limit", args.limit if args.limit is not None else 1, 1),
    )
    check_above_zero("--min-time", args.min_time)
    try:
        return batches, canonical_name(args.speed_variant)
    except ValueError as exc:
        raise UsageError(f"--speed-variant: {exc}") from None


def _earlier(args: argparse.Namespace) -> dict[str, Any]:
    """With ``--timing-only`` or ``--accuracy-only``, the ``quantized.json`` already in ``--out`` (each section
    naming its machine), else nothing."""
    path = args.out / "quantized.json"
    old = json.loads(path.read_text()) if path.is_file() and (args.timing_only or args.accuracy_only) else {}
    for section in ("accuracy", "speed"):  # files from before sections kept their own machine: the run's
        if old.get(section) and "environment" not in old[section]:
            old[section]["environment"] = old["environment"]
    return old


def _accuracy(args: argparse.Namespace, entries, cache: Path, old: Mapping[str, Any], env, command: str) -> dict:
    """The accuracy section: every chosen model scored now, and the earlier run's rows of the others it keeps."""
    start = load_average()
    rows: list[dict[str, Any]] = []
    for entry in tqdm(entries, desc="quantized accuracy", unit="model", disable=args.no_progress):
        count, seed = args.calibration_count, args.seed
        rows.append(
            accuracy_row(entry, cache, calibration_count=count, seed=seed, limit=args.limit, threads=args.threads)
        )
        # the rows so far, kept if a later model fails or the run is stopped (the report is written at the end)
        write_json(args.out / "quantized.partial.json", rows)
    settings = {"data": args.data, "limit": args.limit, "calibration_count": args.calibration_count, "seed": args.seed}
    kept, cpus = _kept_accuracy(old.get("accuracy"), settings, {(r["variant"], r["task"]) for r in rows})
    return {
        **settings,
        "load_start": start,
        "load_end": load_average(),
        "rows": rows + kept,
        "command": command,
        "environment": env,
        "cpus": _unique([env["cpu"], *cpus]),
    }


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.quantized``."""
    argv, args = parse_study(build_parser(), argv, markdown)
    if args is None:
        return 0
    batches, speed_variant = _check(args)
    entries = [] if args.timing_only else zoo_entries(args)
    writable_dir(args.out, "--out folder")
    cache = writable_dir(args.cache_dir or default_cache_dir() / "quantized", "--cache-dir folder")
    old = _earlier(args)
    env = environment()
    command = command_line(COMMAND, argv)
    result: dict[str, Any] = {
        "command": command,
        "environment": env,
        "accuracy": old.get("accuracy"),
        "speed": old.get("speed"),
    }
    if not args.timing_only:
        result["accuracy"] = _accuracy(args, entries, cache, old, env, command)
    if not args.accuracy_only:
        start = load_average()
        speed = speed_rows(
            args.speed_arch, speed_variant, batches, args.speed_threads, args.min_time, cache, not args.no_progress
        )
        end = load_average()
        contention = contended(start, end, args.speed_threads)
        speed.update(load_start=start, load_end=end, contended=contention, command=command, environment=env)
        result["speed"] = speed
    write_report(args.out, "quantized", result, markdown(result))
    (args.out / "quantized.partial.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
