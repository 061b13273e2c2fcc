"""What a fusable export gains: one model's opset-20 file (attention as MatMul / Softmax / MatMul) against its
opset-23 file (each dot-product core one standard ``Attention`` op), timed round-robin on each CPU runtime after
each runtime's output passed the parity check.

``report-variant``'s fusable-export section times the two files this way.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from attnzoo.benchmarks.stats import ratio_stats, summarize
from attnzoo.benchmarks.timing import time_round_robin
from attnzoo.runtime.backends import cpu_runtimes, reference_backend
from attnzoo.runtime.parity import check

__all__ = ["OPSETS", "time_opsets", "speedups"]

#: The unfused form (the package's default export) and the fusable one.
OPSETS = (20, 23)


def time_opsets(
    paths: dict[int, Path],
    x: np.ndarray,
    ref: np.ndarray,
    threads: int,
    cache: Path,
    rounds: int,
    *,
    eager: Callable[[], object] | None = None,
    progress: bool = False,
    reference: str = "eager",
) -> dict[str, list[float]]:
    """Seconds per call of each file (``{opset: path}``) on each of the registry's CPU runtimes that runs here
    (:func:`~attnzoo.runtime.backends.cpu_runtimes`: ONNX Runtime's CPU session, OpenVINO where installed), and of
    ``eager`` when given, timed round-robin after each runner's output passed the fp32 parity check against
    ``ref`` (what computed it: ``reference``, named in the error). Keys: ``"<backend> opset<N>"``
    (``"ort-cpu opset20"``, ...), ``"eager"``.

    Raises:
        RuntimeError: a runner's output fails the parity check.
    """
    runners: dict[str, Callable[[], object]] = {reference_backend(): eager} if eager is not None else {}
    runtimes = [b for b in cpu_runtimes() if b.unavailable_reason("fp32") is None]
    for opset, path in paths.items():
        for backend in runtimes:
            session = backend.load(path, backend.options(threads=threads, batch=x.shape[0], cache_dir=cache))
            name = f"{backend.name} opset{opset}"
            ok, err = check(np.asarray(session.run(x)), ref, "fp32")  # bench-latency's parity gate (shared table)
            if not ok:
                raise RuntimeError(f"{name}: parity error {err:.1e} against {reference}")
            runners[name] = partial(session.run, x)
    return time_round_robin(runners, rounds, progress=progress)


def speedups(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per runtime: the opset-23 file's speed-up over the opset-20 one (median and quartiles of the per-round
    ratio of their times) and both medians in ms."""
    out = {}
    for runtime in [backend.name for backend in cpu_runtimes()]:
        opset20, opset23 = times.get(f"{runtime} opset20"), times.get(f"{runtime} opset23")
        if opset20 is None or opset23 is None:
            continue
        ratios = ratio_stats(opset23, opset20)  # opset-20 time / opset-23 time per round: the fusable file's speed-up
        out[runtime] = {
            "opset20_ms": summarize(opset20, 1)["median_ms"],
            "opset23_ms": summarize(opset23, 1)["median_ms"],
            "speedup": ratios["ratio_median"],
            "speedup_q1": ratios["ratio_q1"],
            "speedup_q3": ratios["ratio_q3"],
        }
    return out
