"""The timing loops: warm-up, then at least ``min_time`` seconds and ``min_iters`` iterations (as trtexec).

A callable is timed one call at a time: with ``perf_counter`` on the CPU, with CUDA events around the call
on the GPU (inputs already on the device, so nothing crosses the bus inside the timed region).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tqdm import tqdm

from attnzoo.lazy import lazy_import
from attnzoo.machine import rss_bytes

torch = lazy_import("torch")

__all__ = [
    "time_once",
    "warmup",
    "measure",
    "measure_pair",
    "one_sided",
    "time_round_robin",
    "PeakRSS",
    "SETTLED_PAIRS",
]

WARMUP_S = 0.2
MIN_ITERS = 10
#: Fewest pairs of an A/B run that :func:`measure_pair` may stop at once its answer is settled (``settled``).
SETTLED_PAIRS = 5


def time_once(fn: Callable[[], object], cuda: bool = False) -> float:
    """Seconds one call of ``fn`` takes; with ``cuda`` measured by CUDA events on the current stream."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start_ev.record()
    fn()
    end_ev.record()
    end_ev.synchronize()
    return start_ev.elapsed_time(end_ev) / 1e3


def warmup(fn: Callable[[], object], seconds: float = WARMUP_S, cuda: bool = False) -> int:
    """Call ``fn`` for at least ``seconds`` (and at least twice); return the number of calls."""
    n, end = 0, time.perf_counter() + seconds
    while n < 2 or time.perf_counter() < end:
        time_once(fn, cuda)
        n += 1
    return n


def measure(
    fn: Callable[[], object],
    min_time: float,
    min_iters: int = MIN_ITERS,
    cuda: bool = False,
    warmup_s: float = WARMUP_S,
) -> list[float]:
    """Warm up, then time ``fn`` call by call until ``min_time`` seconds and ``min_iters`` calls passed."""
    warmup(fn, warmup_s, cuda)
    samples: list[float] = []
    end = time.perf_counter() + min_time
    while len(samples) < min_iters or time.perf_counter() < end:
        samples.append(time_once(fn, cuda))
    return samples


def measure_pair(
    fn_a: Callable[[], object],
    fn_b: Callable[[], object],
    min_time: float,
    min_pairs: int = MIN_ITERS,
    cuda_a: bool = False,
    cuda_b: bool = False,
    warmup_s: float = WARMUP_S,
    settled: bool = False,
) -> tuple[list[float], list[float]]:
    """Time two callables alternating A B A B ... for ``min_time`` seconds and ``min_pairs`` pairs.

    Both members of a pair run under about the same machine load, so per-pair ratios are robust to the
    slow load changes of a shared machine (see :func:`attnzoo.benchmarks.stats.ratio_stats`).

    ``settled``: stop as soon as ``min_time`` passed and, after at least :data:`SETTLED_PAIRS` pairs, which of the
    two is faster is no longer in doubt (the per-pair ratios' interquartile range lies wholly on one side of 1);
    a close call still runs to ``min_pairs``. The pairing time goes where it can change the answer.
    """
    warmup(fn_a, warmup_s / 2, cuda_a)
    warmup(fn_b, warmup_s / 2, cuda_b)
    a: list[float] = []
    b: list[float] = []
    end = time.perf_counter() + min_time
    while len(a) < min_pairs or time.perf_counter() < end:
        a.append(time_once(fn_a, cuda_a))
        b.append(time_once(fn_b, cuda_b))
        if settled and len(a) >= SETTLED_PAIRS and time.perf_counter() >= end and one_sided(a, b):
            break
    return a, b


def one_sided(a: list[float], b: list[float]) -> bool:
    """Whether the interquartile range of the per-pair ratios ``b / a`` lies wholly above or below 1."""
    ratios = sorted(y / x for x, y in zip(a, b, strict=True))
    n = len(ratios)
    q1, q3 = ratios[(n - 1) // 4], ratios[-1 - (n - 1) // 4]  # inner quartiles: no interpolation needed
    return q1 > 1 or q3 < 1


def time_round_robin(
    runners: dict[str, Callable[[], object]], rounds: int, progress: bool = True
) -> dict[str, list[float]]:
    """Seconds per call of every runner, ``rounds`` rounds of one call each in a fixed order (after a warm-up), so
    that every runner sees about the same load."""
    for fn in runners.values():
        warmup(fn)
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in tqdm(range(rounds), desc="rounds", disable=not progress, leave=False):
        for name, fn in runners.items():
            times[name].append(time_once(fn))
    return times


class PeakRSS:
    """Context manager sampling this process's RSS every ``interval`` s; ``delta_mb`` = peak - baseline.

    The baseline is taken when the object is created (before the backend allocates anything).
    """

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.baseline = rss_bytes()
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRSS:
        self.peak = max(self.peak, rss_bytes())
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.baseline) / 2**20
