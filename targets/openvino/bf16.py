"""bf16 is served only once verified: the fp32 export at OpenVINO's bf16 precision (the extra math pinned to f32
and read back, :class:`~attnzoo.targets.openvino.backend.OpenVINOSession`) scored on the model's test split next to
the same file at OpenVINO's f32, on the same images, within :data:`ACCURACY_GATE`.

The gate is half of int8's (``attnzoo.export.quantize.ACCURACY_TOLERANCE``: 0.5 points top-1, 1.0 point mIoU): bf16
keeps fp32's exponent range and needs no calibration, and its logits stay within the bf16 parity tolerance of fp32
(6e-2 of the largest logit, :data:`attnzoo.runtime.parity.TOLERANCES`) where static int8's need 5e-1, so a bf16
model that loses as much as an int8 one points at a defect (extra math or normalisation off f32) rather than at
bf16's rounding. On Fashion-MNIST's 10,000 test images 0.25 points are 25 images net.

The report is kept in the cache (``<cache>/bf16/``), keyed by the file's SHA-256, and names the OpenVINO version and
the CPU (model and flags) it was measured on: bf16 kernels differ between CPUs (AVX-512 BF16, AMX), so a report
from another CPU or OpenVINO version is measured again rather than trusted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.fileio import atomic_write_text, default_cache_dir, sha256_file
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_info
from attnzoo.runtime.backends import LoadOptions
from attnzoo.runtime.sessions import read_report

from .backend import OPENVINO
from .library import precision_summary, version

# torch, by way of the data sets and the metrics: the runtime imports without it
datasets = lazy_import("attnzoo.data.datasets")
metrics_lib = lazy_import("attnzoo.metrics")
evaluate = lazy_import("attnzoo.runtime.evaluate")

__all__ = ["ACCURACY_GATE", "Bf16AccuracyError", "report_path", "verify_bf16", "bf16_verification_problem"]

#: Largest accuracy drop of bf16 under fp32 (points: top-1 for classifiers, mIoU for segmenters) that is served.
ACCURACY_GATE: dict[str, float] = {"cls": 0.25, "seg": 0.5}


class Bf16AccuracyError(ValueError):
    """bf16 lost more accuracy on the test split than :data:`ACCURACY_GATE` allows (the report says by how much)."""


def report_path(onnx_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Where the bf16 verification of ``onnx_path`` is kept: ``<cache>/bf16/<stem>-<sha256[:16]>.json``."""
    onnx_path = Path(onnx_path)
    return Path(cache_dir or default_cache_dir()) / "bf16" / f"{onnx_path.stem}-{sha256_file(onnx_path)[:16]}.json"


def _sessions(onnx_path: Path, keep_f32: Sequence[str], threads: int | None):
    """The fp32 and bf16 OpenVINO sessions of the file (bf16 refused where the CPU has no bf16 units)."""
    bf16 = OPENVINO.load(onnx_path, LoadOptions(dtype="bf16", threads=threads, keep_f32=tuple(keep_f32))).live()
    return OPENVINO.load(onnx_path, LoadOptions(threads=threads)).live(), bf16


def _machine() -> dict[str, Any]:
    cpu = cpu_info()
    return {"cpu": cpu["model"], "cpu_flags": cpu["key_flags"], "openvino": version()}


def bf16_verification_problem(onnx_path: str | Path, cache_dir: str | Path | None = None) -> str | None:
    """Why ``onnx_path`` must not be served at bf16 here (one line), or ``None``: its bf16 report
    (:func:`report_path`) must exist, have passed the gate on the whole test split, and be for this file, this
    OpenVINO version and this CPU."""
    path = report_path(onnx_path, cache_dir)
    if not path.is_file():
        return f"{Path(onnx_path).name} has not been verified at bf16 on this machine"
    try:
        rep = read_report(path)
    except ValueError as exc:
        return str(exc)
    here = _machine()
    for key in ("cpu", "cpu_flags", "openvino"):
        if rep.get(key) != here[key]:
            return f"its bf16 verification was measured with another {key.replace('_', ' ')} ({rep.get(key)})"
    acc = rep.get("accuracy") or {}
    if acc.get("limit"):
        return f"its bf16 verification scored only {acc.get('n_images')} test images"
    if not rep.get("passed"):
        return (
            f"bf16 is {acc.get('drop', float('nan')):.2f} points below fp32 on the test split (gate {acc.get('gate')})"
        )
    return None


def verify_bf16(
    onnx_path: str | Path,
    config: Mapping[str, Any],
    keep_f32: Sequence[str],
    *,
    cache_dir: str | Path | None = None,
    threads: int | None = None,
    limit: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Verify ``onnx_path`` (a verified fp32 export) at bf16 on this machine, or reuse the report that did.

    Args:
        onnx_path: The fp32 export.
        config: Its model config (data set, task, size, normalisation).
        keep_f32: Its extra-math node names (:func:`attnzoo.export.quantize.extra_math_nodes`).
        cache_dir: Root of the report (:func:`report_path`).
        threads: OpenVINO threads.
        limit: Score the first N test images only (a quick check: nothing is written, nothing served).

    Returns:
        The report: this machine (CPU, flags, OpenVINO), the file's SHA-256, the runtime-model read-back of the
        bf16 session, the accuracy of both precisions, the drop and the gate, and ``passed``.

    Raises:
        ValueError: bf16 cannot run here, or the model has no test split.
        Bf16AccuracyError: the drop exceeds the gate (the report is written, ``passed: false``, so the model is
            not served until measured again with another OpenVINO version or on another CPU).
    """
    onnx_path = Path(onnx_path)
    path = report_path(onnx_path, cache_dir)
    if limit is None and bf16_verification_problem(onnx_path, cache_dir) is None:
        return json.loads(path.read_text())
    start = time.perf_counter()
    fp32, bf16 = _sessions(onnx_path, keep_f32, threads)
    ev = evaluate.score_runs(
        {"fp32": fp32.run, "bf16": bf16.run}, config, limit=limit, progress=progress, desc="bf16 test-set accuracy"
    )
    gate = ACCURACY_GATE[config["task"]]
    drop = ev["metrics"]["fp32"] - ev["metrics"]["bf16"]
    report = {
        "dtype": "bf16",
        "file": onnx_path.name,
        "sha256": sha256_file(onnx_path),
        **_machine(),
        "passed": bool(drop <= gate and not limit),
        "accuracy": {**ev, "limit": limit, "drop": drop, "gate": gate, "within_gate": bool(drop <= gate)},
        "precision_check": precision_summary(bf16.precision_check),
        "time_s": round(time.perf_counter() - start, 1),
    }
    if limit is None:  # a quick check never replaces (or stands for) a verification of the whole split
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(report, indent=1) + "\n")
    if drop > gate:
        raise Bf16AccuracyError(
            f"{onnx_path.name}: bf16 {ev['metric_name']} {ev['metrics']['bf16']:.2f} is "
            f"{drop:.2f} points below fp32's {ev['metrics']['fp32']:.2f} (gate {gate})"
        )
    return report
