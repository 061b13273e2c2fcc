"""The plan of a ``bench-latency`` run: what it was asked (:class:`Settings`), which rows it measures and in which
order (eager first, fp32 first of all: the parity reference's twin and every row's A/B baseline), which it leaves
out and why (the backend cannot run here, the compile budget is spent, the row is already in the log), and when it
stops starting rows (``--time-limit``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnzoo.benchmarks.ceiling import DEFAULT_SIZE
from attnzoo.benchmarks.resume import groups_done, kept_rows
from attnzoo.benchmarks.rowlog import RowLog, run_asks
from attnzoo.benchmarks.rows import row_unavailable_reason
from attnzoo.runtime.backends import get_backend, reference_backend

__all__ = [
    "Settings",
    "Plan",
    "TimeUp",
    "torch_device",
    "takes_onnx",
    "on_cpu",
    "onnx_path",
    "onnx_source",
    "compile_budget_reason",
    "run_key",
]


@dataclass
class Settings:
    """What to run (the parsed command line)."""

    variants: Sequence[str]
    backends: Sequence[str]
    dtypes: Sequence[str]
    batch_sizes: Sequence[int]
    task: str = "cls"
    arch: str = "tiny"
    #: Input side in pixels (``None``: the arch's own, 224 for tiny/small/base).
    img_size: int | None = None
    threads: int = 1
    min_time: float = 3.0
    out: Path = Path("bench-out")
    cache_dir: Path = Path("bench-cache")
    device: str = "auto"
    seed: int = 0
    compile_budget: float = 600.0
    profile: bool = False
    pair_eager: bool = True
    #: Side of the ceiling's square matmul (0: no ceiling measured).
    ceiling_size: int = DEFAULT_SIZE
    command: str = ""
    progress: bool = True
    #: What the run leaves out against ``--all`` (:func:`attnzoo.benchmarks.cli.scope`).
    scope: dict[str, Any] = field(default_factory=dict)
    #: Seconds after which no new row is started (``None``: no limit); the rows measured are kept and the same
    #: command measures the rest.
    time_limit: float | None = None
    #: A backend that compiles the module (``compile``) compiles it once per variant with the batch dimension
    #: dynamic, for every batch size, instead of once per batch size.
    dynamic_batch: bool = False


def torch_device(requested: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def takes_onnx(backend: str) -> bool:
    """The backend runs the exported ONNX file (not the PyTorch module)."""
    return get_backend(backend).takes == "onnx"


def on_cpu(backend: str, device: torch.device) -> bool:
    """Rows of ``backend`` compute on the CPU in a run whose PyTorch device is ``device`` (the candidates of the
    report's fastest CPU runtime)."""
    return get_backend(backend).row_device(device.type) == "cpu"


def onnx_path(cache_dir: Path, variant: str, task: str, arch: str, dtype: str, img_size: int) -> Path:
    """Where a run exports (and verifies) the ONNX file it times, kept for reuse (``export_verified(reuse=True)``:
    the same seeded model is exported once per cache); ``serving.loadtest`` serves the same file, and the scaling
    study names its files the same way."""
    return Path(cache_dir) / f"{variant}_{task}_{arch}_{img_size}px_{dtype}.onnx"


def onnx_source(dtype: str) -> str:
    """The exported file a row at ``dtype`` reads: the ``fp16`` export for fp16, the ``fp32`` one otherwise."""
    return "fp16" if dtype == "fp16" else "fp32"


def compile_budget_reason(spent: float, count: int, budget: float) -> str | None:
    """Why a compile job is not started (``--compile-budget``), or ``None``: the budget is spent, or the next compile,
    predicted to take as long as the ones before it on this machine, would pass it (a budget is a limit, not a
    threshold one last compile may run far over)."""
    if count == 0:
        return None if budget > 0 else f"--compile-budget {budget:g} s allows no compile"
    each = spent / count
    if spent + each <= budget:
        return None
    return (
        f"--compile-budget {budget:g} s: {count} compile(s) took {spent:.0f} s, {each:.0f} s each on this machine; "
        "another would pass it"
    )


def run_key(settings: Settings, env: dict[str, Any]) -> dict[str, Any]:
    """What a row's numbers depend on beyond its own variant, backend, precision and batch: a run resumed from a
    row log must have the same (the machine included)."""
    gpu = env.get("gpu") or {}
    dynamic = {"dynamic_batch": True} if settings.dynamic_batch else {}  # absent when off: older logs still match
    return {
        **dynamic,
        "task": settings.task,
        "arch": settings.arch,
        "img_size": settings.img_size,
        "threads": settings.threads,
        "min_time_s": settings.min_time,
        "seed": settings.seed,
        "device": torch_device(settings.device).type,
        "pair_eager": settings.pair_eager,
        "ceiling_size": settings.ceiling_size,
        "cpu": env["cpu"].get("model"),
        "gpu": gpu.get("name"),
        "torch": env["versions"].get("torch"),
    }


class TimeUp(Exception):
    """``--time-limit`` passed: no new row is started (the argument names the next one)."""


class Plan:
    """The rows of one run: the (backend, dtype) combinations in the order they run, why each one that cannot run
    here is skipped, the rows and groups an earlier run in the log finished, and the deadline."""

    def __init__(self, settings: Settings, log: RowLog | None = None) -> None:
        self.settings = settings
        self.device = torch_device(settings.device)
        self.done = kept_rows(log)
        self.groups_done = groups_done(log)
        self.deadline = time.time() + settings.time_limit if settings.time_limit else None
        self.combos = [
            (b, d)
            for b, d in run_asks(settings.variants, settings.backends, settings.dtypes, settings.batch_sizes)["combos"]
        ]
        self.skip = {c: row_unavailable_reason(c[0], c[1], self.device.type) for c in self.combos}
        reference = (reference_backend(), "fp32")
        self.skip[reference] = None  # the reference backend always runs
        # eager first, fp32 first of all: the parity reference's twin and every row's A/B baseline run before them
        self.combos.sort(key=lambda c: (not get_backend(c[0]).is_reference, c != reference))
        #: standard first: the overhead baseline
        self.variants: list[str] = list(dict.fromkeys(["standard", *settings.variants]))

    def todo(self, variant: str, batch: int) -> list[tuple[str, str]]:
        """The runnable combinations of ``variant`` at ``batch`` without a finished row in the log."""
        return [(b, d) for b, d in self.combos if not self.skip[(b, d)] and (variant, b, d, batch) not in self.done]

    def finished(self, variant: str) -> bool:
        """Every row and group of ``variant`` is in the log."""
        return all(not self.todo(variant, n) and (variant, n) in self.groups_done for n in self.settings.batch_sizes)

    def onnx_jobs(self, variants: Sequence[str]) -> list[tuple[str, str]]:
        """The ``(variant, fp32 / fp16)`` ONNX files the rows still to measure read, in the order they run."""
        return [
            (v, src)
            for v in variants
            for src in dict.fromkeys(
                onnx_source(d) for n in self.settings.batch_sizes for b, d in self.todo(v, n) if takes_onnx(b)
            )
        ]

    def check_deadline(self, job: str) -> None:
        """Raise :class:`TimeUp` (naming ``job``, the next one) once ``--time-limit`` has passed."""
        if self.deadline is not None and time.time() > self.deadline:
            raise TimeUp(job)
