"""Accuracy and speed of the dynamic-int8 ONNX Runtime CPU path on the zoo's test sets.

For every zoo model (micro arch; trained weights): export fp32 ONNX, quantize it
(:func:`attnzoo.benchmarks.ort_cpu.quantize_int8`), run the fp32 and int8 ``ort-cpu`` sessions over the
test split the model was trained for, and time the two alternately (A B A B) at one batch size.

Usage::

    python -m attnzoo.benchmarks.int8_accuracy --out benchmarks/results/cpu-int8-zoo
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
from tqdm import tqdm

from attnzoo.fileio import atomic_write_bytes, default_cache_dir, writable_dir
from attnzoo.zoo import DEFAULT_DATA

from .env import environment
from .ort_cpu import quantize_int8, tuned_cpu_session
from .report import _table
from .stats import ratio_stats
from .timing import measure_pair

__all__ = ["evaluate_session", "int8_rows", "main"]


def evaluate_session(sess, images: np.ndarray, targets: np.ndarray, num_classes: int, task: str,
                     batch_size: int = 64) -> np.ndarray:
    """Confusion matrix (true x predicted; pixels for seg) of an ONNX session on normalized NCHW images."""
    from attnzoo.training.train import confusion_matrix

    name = sess.get_inputs()[0].name
    conf = np.zeros((num_classes, num_classes), dtype=np.int64)
    for start in range(0, len(images), batch_size):
        logits = sess.run(None, {name: images[start:start + batch_size]})[0]
        pred = logits.argmax(1)
        truth = targets[start:start + batch_size]
        conf += confusion_matrix(truth, pred, num_classes).numpy()
    return conf


def _metric(conf: np.ndarray, task: str, class_names: Sequence[str]) -> float:
    import torch

    from attnzoo.training.train import metrics_from_confusion

    return float(metrics_from_confusion(torch.from_numpy(conf), task, class_names)["metric"])


def int8_rows(entries: List[Dict[str, Any]], cache_dir: Path, threads: int, batch: int, min_time: float,
              limit: Optional[int] = None, progress: bool = True) -> List[Dict[str, Any]]:
    """One row per zoo entry: fp32 / int8 metric on the test split, and the int8 speed-up (A B A B pairs)."""
    from attnzoo import zoo
    from attnzoo.export import export_onnx
    from attnzoo.preprocess import normalize
    from attnzoo.training.data import load_data

    rows = []
    cache_dir.mkdir(parents=True, exist_ok=True)
    for e in tqdm(entries, desc="int8 accuracy", unit="model", disable=not progress):
        model, cfg = zoo.load(e["variant"], e["task"], e["data"])
        stem = f"{e['variant']}_{e['task']}_{e['data']}"
        fp32 = export_onnx(model, cache_dir / f"{stem}.onnx", config=cfg, checkpoint_sha256=e.get("sha256", ""))
        int8 = quantize_int8(fp32, cache_dir / f"{stem}.int8.onnx")
        data = load_data(e["data"], "test", e["task"], cfg["img_size"], n=limit, seed=int(cfg.get("data_seed", 0)))
        x = normalize(data.images, cfg["mean"], cfg["std"])
        y = data.labels if e["task"] == "cls" else data.masks.astype(np.int64)
        k = len(data.class_names)
        sess32, _ = tuned_cpu_session(fp32, threads, cache_dir)
        sess8, _ = tuned_cpu_session(int8, threads, cache_dir)
        m32 = _metric(evaluate_session(sess32, x, y, k, e["task"]), e["task"], data.class_names)
        m8 = _metric(evaluate_session(sess8, x, y, k, e["task"]), e["task"], data.class_names)
        xb = {sess32.get_inputs()[0].name: x[:batch]}
        a, b = measure_pair(lambda: sess32.run(None, xb), lambda: sess8.run(None, xb), min_time)
        speed = ratio_stats(b, a)  # fp32 time / int8 time
        rows.append({"variant": e["variant"], "task": e["task"], "data": e["data"], "arch": cfg["arch"],
                     "checkpoint": e.get("file"), "checkpoint_sha256": e.get("sha256"),
                     "metric_name": e.get("metric_name", "top1" if e["task"] == "cls" else "miou"),
                     "zoo_metric": e.get("test_metric"), "ort_fp32_metric": m32, "ort_int8_metric": m8,
                     "delta": m8 - m32, "n_images": len(data), "batch": batch,
                     "fp32_median_ms": float(np.median(a) * 1e3), "int8_median_ms": float(np.median(b) * 1e3),
                     "int8_speedup_median": speed["ratio_median"], "int8_speedup_q1": speed["ratio_q1"],
                     "int8_speedup_q3": speed["ratio_q3"], "pairs": speed["pairs"]})
    return rows


def _markdown(result: Dict[str, Any]) -> str:
    rows = result["rows"]
    table = _table(["variant", "task", "metric", "zoo (eager)", "ORT fp32", "ORT int8", "int8 - fp32",
                    f"fp32 ms (b{result['batch']})", "int8 ms", "int8 speed-up [Q1, Q3]"],
                   [[r["variant"], r["task"], r["metric_name"],
                     "-" if r["zoo_metric"] is None else f"{r['zoo_metric']:.2f}", f"{r['ort_fp32_metric']:.2f}",
                     f"{r['ort_int8_metric']:.2f}", f"{r['delta']:+.2f}", f"{r['fp32_median_ms']:.2f}",
                     f"{r['int8_median_ms']:.2f}",
                     f"{r['int8_speedup_median']:.2f} [{r['int8_speedup_q1']:.2f}, {r['int8_speedup_q3']:.2f}]"]
                    for r in rows])
    env = result["environment"]
    return "\n".join([
        "# Dynamic int8 (ONNX Runtime CPU) on the zoo test sets", "", f"Command: `{result['command']}`", "",
        "MatMul/Gemm weights int8 (onnxruntime.quantization.quantize_dynamic, QInt8), activations quantized per "
        "run; everything else fp32. Metric in percent on the test split each model was trained for; speed-up = "
        "median of per-pair fp32/int8 latency ratios (A B A B), micro models.", "",
        f"CPU: {env['cpu']['model']} ({', '.join(env['cpu']['key_flags'])}); load average {env['load_average']}; "
        f"threads {result['threads']}.", "", table, ""])


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m attnzoo.benchmarks.int8_accuracy``."""
    from attnzoo import zoo

    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m attnzoo.benchmarks.int8_accuracy", description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=("cls", "seg", "all"), default="all")
    p.add_argument("--data", default=DEFAULT_DATA, help="zoo data set (zoo/manifest.json)")
    p.add_argument("--limit", type=int, default=None, help="first N test images only")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=8, help="batch size of the speed comparison")
    p.add_argument("--min-time", type=float, default=1.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cache-dir", type=Path, default=default_cache_dir() / "int8",
                   help="quantized models (default: <cache>/int8, <cache> as for bench-latency and serve-demo)")
    a = p.parse_args(argv)
    writable_dir(a.out, "--out folder")  # before the models are quantized and timed
    entries = [e for e in zoo.entries() if e["data"] == a.data and a.task in ("all", e["task"])]
    if not entries:
        raise SystemExit(f"error: the zoo has no {a.task} models for data {a.data!r} yet")
    rows = int8_rows(entries, a.cache_dir, a.threads, a.batch, a.min_time, a.limit)
    result = {"command": shlex.join(["python", "-m", "attnzoo.benchmarks.int8_accuracy", *argv]),
              "threads": a.threads, "batch": a.batch, "environment": environment(), "rows": rows}
    a.out.mkdir(parents=True, exist_ok=True)
    md = _markdown(result)
    atomic_write_bytes(a.out / "int8_accuracy.md", md.encode())
    atomic_write_bytes(a.out / "int8_accuracy.json", (json.dumps(result, indent=1) + "\n").encode())
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
