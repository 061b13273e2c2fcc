"""Which CPU runtime runs a set of ONNX files fastest on this machine: measured on the spot, not assumed.

Which runtime wins depends on the CPU (its instruction sets, caches, core count) and on the model (a micro
model is dominated by per-call overhead, a ViT-Ti by its matmuls), so a fixed order measured on one machine
would be a guess on the next. :func:`fastest_cpu_runtime` builds each candidate for a few probe files, times
them alternately (A B A B ..., so both see the same load) at batch 1 and picks the one with the smaller summed
median latency.

The precision is part of the question: an int8 Q/DQ graph and its fp32 original can rank the runtimes
differently (ONNX Runtime has int8 kernels for ModelOpt's Q/DQ graphs; OpenVINO gains little from them), so the
probes must be files of the precision that will be served (``dtype`` names it in the reason; a probe of another
precision is refused).

:func:`choose_cpu_backend` is the one place the choice is made for a folder of served files (the demo's and
serve-models' ``--backend auto``): it picks the probes (the first servable classifier and segmenter) and asks
:func:`fastest_cpu_runtime`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np

from attnzoo.machine import cpu_info

from .backends import ONNX_REFERENCE, backends_reading, cpu_runtimes
from .contract import ModelContract
from .sessions import IR_SUFFIX, verification_problem

__all__ = ["Choice", "fastest_cpu_runtime", "choose_cpu_backend"]

#: ``factory(path) -> runner``: a backend's :class:`~attnzoo.runtime.backends.Session` (its ``run``; closed once its
#: probe is timed), or a plain ``run(x: float32 (N, 3, H, W)) -> logits``.
RunnerFactory = Callable[[Path], Any]


def _close(runner: Any) -> None:
    """Close a runner that can be closed (a session); a plain function has nothing to free."""
    close = getattr(runner, "close", None)
    if callable(close):
        close()


@dataclass
class Choice:
    """The measured choice.

    Attributes:
        runtime: The winner.
        reason: One line saying what was measured, for the log and the page.
        median_ms: Per probe file, per runtime, the median latency at batch 1.
        failed: Per runtime that could not be built or run, the error (such a runtime cannot win).
    """

    runtime: str
    reason: str
    median_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def _alternate(fns: Sequence[Callable[[], object]], seconds: float, min_rounds: int = 10) -> list[list[float]]:
    """Call each of ``fns`` in turn, round after round, for ``seconds`` and ``min_rounds``; per-call times."""
    for fn in fns:  # warm-up: first calls allocate
        fn()
        fn()
    times: list[list[float]] = [[] for _ in fns]
    end = time.perf_counter() + seconds
    while len(times[0]) < min_rounds or time.perf_counter() < end:
        for fn, out in zip(fns, times, strict=False):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return times


def fastest_cpu_runtime(
    factories: Mapping[str, RunnerFactory],
    probes: Sequence[tuple[Path, tuple[int, int]]],
    seconds: float = 0.3,
    cpu: str = "",
    dtype: str = "",
) -> Choice:
    """Pick the fastest of ``factories`` on ``probes``.

    Args:
        factories: Runtime name -> runner factory, in order of preference on a tie (and when nothing can be
            measured, the first is chosen).
        probes: ``(ONNX file, (H, W))`` to time at batch 1 (e.g. one classifier and one segmenter).
        seconds: Timing per probe file (at least 10 rounds).
        cpu: The CPU's name, for the reason text.
        dtype: The precision to be served (e.g. ``int8``); every probe must be of it (its ONNX ``dtype``
            metadata, fp32 when absent). Empty: not checked.

    Returns:
        The :class:`Choice`; a runtime whose build or run raises is recorded in ``failed`` and cannot win.
    """
    names = list(factories)
    if not names:
        raise ValueError("no runtime to choose from")
    if dtype:
        other = [(Path(p).name, c.dtype) for p, _ in probes for c in [ModelContract.from_onnx(p)] if c.dtype != dtype]
        if other:
            raise ValueError(f"probe {other[0][0]} is {other[0][1]}, not the {dtype} to be served")
    failed: dict[str, str] = {}
    total = {n: 0.0 for n in names}
    medians: dict[str, dict[str, float]] = {}
    for path, (h, w) in probes:
        x = np.random.default_rng(0).standard_normal((1, 3, h, w), dtype=np.float32)
        fns, runners = {}, []
        try:
            for n in names:
                if n in failed:
                    continue
                try:
                    runner = factories[n](Path(path))
                    runners.append(runner)
                    run = cast(Callable[..., Any], getattr(runner, "run", runner))  # a session's run, or the function
                    run(x)
                    fns[n] = partial(run, x)
                except Exception as exc:  # a runtime that fails here is out, with its reason
                    failed[n] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            if not fns:
                continue
            times = _alternate(list(fns.values()), seconds)
        finally:
            for runner in runners:
                _close(runner)
        medians[Path(path).name] = {n: float(np.median(t) * 1e3) for n, t in zip(fns, times, strict=False)}
        for n, t in zip(fns, times, strict=False):
            total[n] += float(np.median(t))
    alive = [n for n in names if n not in failed]
    where = (f" on this CPU ({cpu})" if cpu else " on this CPU") + (f" for {dtype} models" if dtype else "")
    if not alive or not medians:
        why = "; ".join(f"{n}: {e}" for n, e in failed.items()) or "nothing to measure"
        return Choice(names[0], f"{names[0]} (nothing measured: {why})", medians, failed)
    best = min(alive, key=lambda n: total[n])  # min() keeps the first on a tie: the order of preference
    files = ", ".join(medians)
    if len(alive) == 1:
        others = "; ".join(f"{n} failed: {e}" for n, e in failed.items())
        return Choice(best, f"{best} (the only CPU runtime that ran{where}; {others})", medians, failed)
    runner_up = min((n for n in alive if n != best), key=lambda n: total[n])
    ratio = total[runner_up] / total[best] if total[best] > 0 else float("nan")
    reason = (
        f"{best}, {ratio:.2f}x faster than {runner_up}{where}: summed median latency at batch 1 "
        f"{total[best] * 1e3:.2f} vs {total[runner_up] * 1e3:.2f} ms on {files}, timed alternately"
    )
    return Choice(best, reason, medians, failed)


def choose_cpu_backend(folder: Path, threads: int | None = None, dtype: str | None = None) -> tuple[str, str]:
    """``auto``: the faster CPU runtime of the registry on this machine, timed on the first valid classifier and
    segmenter of ``folder`` (only files of precision ``dtype`` when given, and only servable ones: a quantized
    file must pass :func:`attnzoo.runtime.sessions.verification_problem`); returns ``(backend, one-line reason)``."""
    installed = {
        b.name: (lambda p, b=b: b.load(p, b.options(threads=threads, batch=1)))
        for b in cpu_runtimes()
        if b.unavailable_reason("fp32", "cpu") is None
    }
    if len(installed) < 2:
        only = next(iter(installed), ONNX_REFERENCE)
        return only, f"{only} (the only CPU runtime installed)"
    probes: dict[str, tuple[Path, tuple[int, int]]] = {}
    for path in sorted(Path(folder).glob("*.onnx")):
        if not path.is_file():  # never open a FIFO or a device; the server's loader warns about them
            continue
        try:
            contract = ModelContract.from_onnx(path)
        except Exception:  # an invalid file is not a probe; the server's loader says why it is skipped
            continue
        if (dtype and contract.dtype != dtype) or verification_problem(path, contract.dtype):
            continue
        probes.setdefault(contract.task, (path, contract.input_size))
    readers = backends_reading(IR_SUFFIX, installed)
    if not probes and readers and any(p.is_file() for p in Path(folder).glob(f"*{IR_SUFFIX}")):
        return readers[0], f"{readers[0]} (the folder holds OpenVINO IRs and no ONNX file)"
    choice = fastest_cpu_runtime(installed, list(probes.values()), cpu=cpu_info()["model"], dtype=dtype or "")
    return choice.runtime, choice.reason
