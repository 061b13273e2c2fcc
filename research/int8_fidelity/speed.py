"""How fast the int8 files run: each file's batch-1, one-thread latency on ONNX Runtime and OpenVINO, the files'
runs interleaved so that a load on the machine hits them alike, and the versions of what quantizes and runs them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.benchmarks.timing import time_round_robin
from attnzoo.runtime.backends import onnx_reference
from attnzoo.targets.openvino import OPENVINO, OpenVINORuntimeSession

__all__ = ["ov_session", "openvino_outputs", "interleaved_ms", "speeds", "fp32_speed_line", "load_span", "versions"]


def ov_session(path: Path) -> OpenVINORuntimeSession:
    """The ``openvino`` backend's session of ``path`` (ONNX or IR), one thread, batch 1: the study's OpenVINO runs."""
    return OPENVINO.load(path, OPENVINO.options(threads=1, batch=1))


def openvino_outputs(path: Path, x: np.ndarray) -> np.ndarray:
    """An OpenVINO model's (ONNX or IR) outputs on ``x``, one input at a time."""
    with ov_session(path) as session:
        return session.run(x)


def interleaved_ms(runners: Mapping[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    """Per model, ``runs`` timed calls (ms), taken round-robin so that a load on the machine hits every model alike."""
    times = time_round_robin(dict(runners), runs, progress=False)
    return {key: [t * 1e3 for t in samples] for key, samples in times.items()}


def _ort_runner(path: Path, x: np.ndarray) -> Callable[[], object]:
    session = onnx_reference().session(path, 1).session
    return lambda: session.run(None, {"image": x})


def speeds(files: dict[str, Path], x: np.ndarray, runs: int = 40) -> dict[str, Any]:
    """Batch-1, one-thread latency of every file on ONNX Runtime and OpenVINO (``files["fp32"]`` the reference),
    interleaved per runtime: median ms and the median of the per-round fp32 / int8 ratios (speed-up), and the
    fastest run of each and their ratio (the runs least disturbed by other work on the machine)."""
    out: dict[str, Any] = {}
    makers: dict[str, Callable[[Path], Callable[[], object]]] = {
        "onnxruntime": lambda path: _ort_runner(path, x),
        "openvino": lambda path: ov_session(path).call(x).fn,
    }
    for runtime, make in makers.items():
        try:
            times = interleaved_ms({k: make(path) for k, path in files.items()}, runs)
        except Exception as exc:
            out[runtime] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
            continue
        ref = np.array(times["fp32"])
        out[runtime] = {
            k: {
                "ms": float(np.median(t)),
                "fastest_ms": float(np.min(t)),
                "speedup": float(np.median(ref / np.array(t))),
                "speedup_fastest": float(ref.min() / np.min(t)),
            }
            for k, t in times.items()
        }
    return out


def fp32_speed_line(fp32: Mapping[str, Any]) -> str:
    """``fp32: ONNX Runtime <ms> ms, OpenVINO <ms> ms``: the fp32 file's latency on each runtime (``-`` where none)."""
    ort = f"{fp32['onnxruntime']['ms']:.2f} ms" if "ms" in fp32["onnxruntime"] else "-"
    ov = f"{fp32['openvino']['ms']:.2f} ms" if "ms" in fp32.get("openvino", {}) else "-"
    return f"fp32: ONNX Runtime {ort}, OpenVINO {ov}"


def load_span(result: Mapping[str, Any], contended_note: str = " (contended)") -> str:
    """``load average <start> -> <end>`` of a result's run, and ``contended_note`` where other work shared it."""
    load = result["load_average"]
    return f"load average {load['start'][0]:.2f} -> {load['end'][0]:.2f}" + (
        contended_note if result["contended"] else ""
    )


def versions() -> dict[str, str]:
    """The versions of what quantizes and runs the int8 graphs."""
    return {name: version(name) for name in ("onnxruntime", "nvidia-modelopt", "torch")}
