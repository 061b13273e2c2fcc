"""The sweep: each variant's models at each size, exported once, every backend checked against eager fp32 and
timed, with the process's peak memory.

Every ONNX file is exported and verified as ``export-model`` does it; every backend's output must match eager
fp32 (the shared tolerance table) before it is timed. A call predicted (from the same backend's previous,
smaller size) to take longer than ``--max-call-s`` (the export's eager parity check at batch 3 included: its
ONNX rows are then skipped), or whose forward pass would not fit in the memory
available now (:func:`attnzoo.limits.forward_bytes`), is skipped with the reason. Peak memory is the
process's peak resident set size (Linux ``VmHWM``, reset before each measurement) above its size once the
backend was built: activations and workspace, not weights (``build_mb``).
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from tqdm import tqdm

from attnzoo import limits
from attnzoo.benchmarks.flops import count_variant
from attnzoo.benchmarks.rows import load_call, row_unavailable_reason, tolerance_for
from attnzoo.benchmarks.run import onnx_path
from attnzoo.benchmarks.timing import time_once
from attnzoo.errors import first_line
from attnzoo.export import export_verified
from attnzoo.export.verify import EXTRA_BATCH_SIZES
from attnzoo.fileio import atomic_write_text
from attnzoo.machine import environment, load_1min, load_average
from attnzoo.models import create_model
from attnzoo.models.memory import forward_bytes
from attnzoo.runtime.backends import get_backend
from attnzoo.runtime.parity import check as check_parity

from .fits import DEFAULT_VARIANTS, derive, families, family_of

if TYPE_CHECKING:
    from timm.models.vision_transformer import VisionTransformer

__all__ = ["SWEEPS", "Settings", "plan", "run_scaling"]

SWEEPS = ("tokens", "seg", "batch")
#: Fraction of the available memory a forward pass may be estimated to need.
MEMORY_HEADROOM = 0.7


@dataclass
class Settings:
    """What to run (the parsed command line)."""

    variants: Sequence[str] = DEFAULT_VARIANTS
    backends: Sequence[str] = ("eager", "ort-cpu")
    arch: str = "small"
    sizes: Sequence[int] = (224, 384, 512)
    seg_sizes: Sequence[int] = (512, 1024)
    batch_sizes: Sequence[int] = (1, 2, 4, 8, 16)
    batch_px: int = 224
    threads: int = 1
    min_time: float = 2.0
    min_iters: int = 2
    max_call_s: float = 120.0
    seed: int = 0
    out: Path = Path("scaling-out")
    cache_dir: Path = Path("scaling-cache")
    progress: bool = True
    command: str = ""
    quick: bool = False
    #: (task, size) -> sweeps and batch sizes measured there; filled by :func:`plan`.
    jobs: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)


def plan(settings: Settings) -> dict[tuple[str, int], dict[str, Any]]:
    """(task, image size) -> {"batches": [...], "sweeps": {batch: [sweep, ...]}}, sizes ascending."""
    jobs: dict[tuple[str, int], dict[str, Any]] = {}

    def add(task: str, size: int, batch: int, sweep: str) -> None:
        job = jobs.setdefault((task, size), {"batches": [], "sweeps": {}})
        if batch not in job["batches"]:
            job["batches"].append(batch)
        job["sweeps"].setdefault(batch, []).append(sweep)

    for size in settings.sizes:
        add("cls", size, 1, "tokens")
    for batch in settings.batch_sizes:
        add("cls", settings.batch_px, batch, "batch")
    for size in settings.seg_sizes:
        add("seg", size, 1, "seg")
    for job in jobs.values():
        job["batches"].sort()
    return dict(sorted(jobs.items(), key=lambda kv: (kv[0][0] == "seg", kv[0][1])))


# ------------------------------------------------------------------------------------------------ memory
def _rss_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            match = re.search(rf"^{field_name}:\s+(\d+) kB", fh.read(), re.M)
        return int(match.group(1)) if match else None
    except OSError:
        return None


def _release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``), so RSS is honest."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> bool:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS (Linux >= 4.0); False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _fits_in_memory(config: dict[str, Any], size: int, batch: int) -> str | None:
    """Why a forward pass would not fit in the memory available now, or ``None`` (any backend: eager's
    ``cdist`` and the exported MAE distance both avoid the (B, M, N, N, d) tensor)."""
    need, have = forward_bytes(config, (size, size), batch), limits.available_memory()
    if have is not None and need > MEMORY_HEADROOM * have:
        return (
            f"needs about {need / 2**30:.1f} GiB (attnzoo.limits.forward_bytes), more than "
            f"{MEMORY_HEADROOM:.0%} of the {have / 2**30:.1f} GiB available"
        )
    return None


# ------------------------------------------------------------------------------------------------- timing
def _time_calls(fn, min_time: float, min_iters: int) -> list[float]:
    """Seconds of each call of ``fn`` until ``min_time`` s and ``min_iters`` calls (warm-up done by the caller)."""
    samples: list[float] = []
    end = time.perf_counter() + min_time
    while len(samples) < min_iters or time.perf_counter() < end:
        samples.append(time_once(fn))
    return samples


# ------------------------------------------------------------------------------------------------ the run
@dataclass(frozen=True)
class _Point:
    """Where one row is measured: a variant's model at one input size and batch, in the sweeps that include it."""

    variant: str
    task: str
    size: int
    tokens: int
    batch: int
    sweeps: tuple[str, ...]
    #: The counted work of one image (:func:`attnzoo.benchmarks.flops.count_variant`).
    count: Any

    @property
    def work(self) -> float:
        """Matrix FLOPs and vector ops of the whole batch."""
        return (self.count.matrix_flops + self.count.vector_ops) * self.batch


class _Run:
    """State of one scaling run: rows, the last measurement per (variant, backend, task) for predictions."""

    def __init__(self, settings: Settings, bar) -> None:
        self.settings = settings
        self.bar = bar
        self.rows: list[dict[str, Any]] = []
        self.last: dict[tuple[str, str, str], tuple[float, float]] = {}  # -> (work, seconds per call)
        self.exact_peak = _reset_peak()

    def row(self, point: _Point, backend: str, status: str, reason: str = "", **extra: Any) -> None:
        """Keep one row (the measurement's fields in ``extra``, ``None`` where not measured)."""
        row = {
            "variant": point.variant,
            "family": family_of(point.variant),
            "backend": backend,
            "task": point.task,
            "arch": self.settings.arch,
            "img_size": point.size,
            "tokens": point.tokens,
            "batch": point.batch,
            "sweeps": list(point.sweeps),
            "status": status,
            "reason": reason,
            "matrix_gflop": point.count.matrix_flops * point.batch / 1e9,
            "vector_gop": point.count.vector_ops * point.batch / 1e9,
            **dict.fromkeys(("median_ms", "min_ms", "iterations", "per_image_ms", "achieved_gflop_s")),
            **dict.fromkeys(("peak_mb", "build_mb", "parity_error")),
            "load_1min": load_1min(),
        }
        row.update(extra)
        self.rows.append(row)
        self.bar.update(1)

    def too_slow(self, variant: str, backend: str, task: str, work: float, what: str) -> str | None:
        """Why a call of ``work`` ops is not made: predicted from the last one of ``backend`` to take longer than
        ``--max-call-s``; ``None`` where it is not (or nothing ran before it)."""
        last = self.last.get((variant, backend, task))
        if last is None:
            return None
        predicted = last[1] * work / last[0]
        if predicted <= self.settings.max_call_s:
            return None
        return what.format(
            predicted=f"{predicted:.0f}",
            last=f"{last[1]:.2f} s at {last[0] / 1e9:.1f} Gop",
            limit=self.settings.max_call_s,
        )

    def variant(self, variant: str) -> None:
        for (task, size), job in self.settings.jobs.items():
            self.model_size(variant, task, size, job)

    def model_size(self, variant: str, task: str, size: int, job: dict[str, Any]) -> None:
        """One model (variant, task, image size): export once, then every batch size and backend."""
        torch.manual_seed(self.settings.seed)
        model = create_model(variant, task=task, arch=self.settings.arch, img_size=size).eval()
        encoder = cast("VisionTransformer", model.encoder if task == "seg" else model)
        tokens = int(encoder.patch_embed.num_patches + encoder.num_prefix_tokens)
        count = count_variant(variant, task=task, arch=self.settings.arch, img_size=size)  # per image
        onnx = self.verified_onnx(model, _Point(variant, task, size, tokens, max(job["batches"]), (), count))
        for batch in job["batches"]:
            self.batch(model, _Point(variant, task, size, tokens, batch, tuple(job["sweeps"][batch]), count), onnx)
        del model
        _release_memory()

    def verified_onnx(self, model, largest: _Point) -> tuple[Path | None, str | None]:
        """The model's verified fp32 export where a backend of the run takes ONNX (``largest``: its largest batch),
        else why there is none; ``(None, None)`` where no backend takes it."""
        if not any(get_backend(b).takes == "onnx" for b in self.settings.backends):
            return None, None
        verify_batch = max(EXTRA_BATCH_SIZES)
        config = cast(dict[str, Any], model.attnzoo_config)
        reason = _fits_in_memory(config, largest.size, max(largest.batch, verify_batch))
        if reason is None:  # the parity check runs eager calls up to verify_batch
            reason = self.too_slow(
                largest.variant,
                "eager",
                largest.task,
                largest.work / largest.batch * verify_batch,
                f"export not verified: its eager batch-{verify_batch} check is predicted to take "
                "{predicted} s per call > --max-call-s {limit:g}",
            )
        if reason is not None:
            return None, reason
        self.bar.set_postfix_str(f"{largest.variant} {largest.task} {largest.size}px: export + verify")
        return self.export(model, largest.variant, largest.task, largest.size)

    def export(self, model, variant: str, task: str, size: int) -> tuple[Path | None, str | None]:
        path = onnx_path(self.settings.cache_dir, variant, task, self.settings.arch, "fp32", size)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # bench-latency's naming and reuse: a file this cache verified for the same weights is kept
            export_verified(
                model,
                path,
                model.attnzoo_config,
                dtype="fp32",
                input_hw=(size, size),
                batch_sizes=(1,),
                threads=self.settings.threads,
                reuse=True,
            )
        except Exception as exc:  # reported on every ONNX row of this model
            return None, f"export: {first_line(exc, typed=True)}"
        return path, None

    def skip_reason(self, model, point: _Point, backend: str, onnx: tuple[Path | None, str | None]) -> str | None:
        """Why ``backend`` is not timed at ``point``: not here, no verified export, no memory, predicted too slow."""
        reason = row_unavailable_reason(backend, "fp32", "cpu")
        if reason is None and get_backend(backend).takes == "onnx" and onnx[0] is None:
            reason = onnx[1]
        if reason is None:
            reason = _fits_in_memory(cast(dict[str, Any], model.attnzoo_config), point.size, point.batch)
        if reason is None:
            reason = self.too_slow(
                point.variant,
                backend,
                point.task,
                point.work,
                "predicted {predicted} s per call (from {last}, scaled by work) > --max-call-s {limit:g}",
            )
        return reason

    def batch(self, model, point: _Point, onnx: tuple[Path | None, str | None]) -> None:
        """Every backend at one batch size, the eager output the reference of each."""
        gen = torch.Generator().manual_seed(self.settings.seed + point.batch)
        x = torch.randn(point.batch, 3, point.size, point.size, generator=gen)
        ref: np.ndarray | None = None
        for backend in self.settings.backends:
            self.bar.set_postfix_str(f"{point.variant} {backend} {point.task} {point.size}px b{point.batch}")
            reason = self.skip_reason(model, point, backend, onnx)
            if reason:
                self.row(point, backend, "skipped", reason)
                continue
            if ref is None and not get_backend(backend).is_reference:
                with torch.inference_mode():
                    ref = model(x).float().numpy()
            ref = self.timed_row(model, point, backend, onnx[0], x, ref)

    def timed_row(self, model, point: _Point, backend: str, path: Path | None, x, ref) -> np.ndarray | None:
        """Measure ``backend`` at ``point`` and keep its row (failed where its output is not ``ref``'s); returns
        the reference output from then on (the reference backend's own where none was given)."""
        try:
            out, extra = self.measure(backend, model, path, x)
        except Exception as exc:  # a backend failure is a result to report, not a crash
            self.row(point, backend, "failed", f"build/run: {first_line(exc, typed=True)}")
            return ref
        if get_backend(backend).is_reference:
            ref = out if ref is None else ref
        assert ref is not None  # the eager output, or the reference backend's
        if ref is not out:
            ok, err = check_parity(out, ref, tolerance_for(backend, "fp32", "cpu"))
            extra["parity_error"] = err if math.isfinite(err) else None
            if not ok:
                reason = f"parity: max|out-ref|/max(1, max|ref|) = {err:.3g}"
                self.row(point, backend, "failed", reason, parity_error=extra["parity_error"])
                return ref
        self.last[(point.variant, backend, point.task)] = (point.work, extra["median_ms"] / 1e3)
        extra["achieved_gflop_s"] = point.work / 1e9 / (extra["median_ms"] / 1e3)
        self.row(point, backend, "ok", **extra)
        return ref

    def measure(self, backend: str, model, path: Path | None, x) -> tuple[np.ndarray, dict[str, Any]]:
        """Build, run once (warm-up, parity output), time; memory from the process's peak RSS."""
        _release_memory()
        rss0 = _rss_kib("VmRSS") or 0
        runner, _ = load_call(
            backend,
            model,
            path,
            x.numpy(),
            "fp32",
            threads=self.settings.threads,
            device="cpu",
            cache_dir=self.settings.cache_dir,
        )
        try:
            rss1 = _rss_kib("VmRSS") or 0
            self.exact_peak = _reset_peak() and self.exact_peak
            out = runner.output()  # the first call: warm-up and the parity output
            samples = _time_calls(runner.fn, self.settings.min_time, self.settings.min_iters)
            peak = _rss_kib("VmHWM") or 0
        finally:
            runner.close()
            _release_memory()
        ms = np.asarray(samples) * 1e3
        return out, {
            "median_ms": float(np.median(ms)),
            "min_ms": float(ms.min()),
            "iterations": int(ms.size),
            "per_image_ms": float(np.median(ms)) / x.shape[0],
            "peak_mb": max(peak - rss1, 0) / 1024,
            "build_mb": max(rss1 - rss0, 0) / 1024,
        }


# ------------------------------------------------------------------------------------------------ the result
def _contended(load_start: list[float], load_end: list[float], rows: list[dict[str, Any]], threads: int) -> bool:
    """Whether other work shared the CPU: a 1-minute load average above this run's own threads (+ 0.5) at the
    start, at the end or at any measurement."""
    loads = [
        v for v in [*(load_start or [])[:1], *(load_end or [])[:1], *(r["load_1min"] for r in rows)] if v is not None
    ]
    return bool(loads) and max(loads) > threads + 0.5


def _settings_record(settings: Settings, exact_peak: bool) -> dict[str, Any]:
    """The settings as ``scaling.json`` keeps them."""
    return {
        "variants": list(settings.variants),
        "backends": list(settings.backends),
        "arch": settings.arch,
        "sizes": list(settings.sizes),
        "seg_sizes": list(settings.seg_sizes),
        "batch_sizes": list(settings.batch_sizes),
        "batch_px": settings.batch_px,
        "threads": settings.threads,
        "min_time_s": settings.min_time,
        "min_iters": settings.min_iters,
        "max_call_s": settings.max_call_s,
        "seed": settings.seed,
        "quick": settings.quick,
        "seg_decoder": "linear",
        "seg_classes": 150,
        "peak_memory": "VmHWM reset per measurement" if exact_peak else "VmHWM (not resettable)",
    }


def _result(run: _Run, env: dict[str, Any], started: float, complete: bool) -> dict[str, Any]:
    """What ``scaling.json`` holds of the run so far (``complete``: every variant measured)."""
    load_end = load_average()
    return {
        "command": run.settings.command,
        "complete": complete,
        "settings": _settings_record(run.settings, run.exact_peak),
        "families": {k: list(v) for k, v in families().items()},
        "environment": env,
        "load_average_end": load_end,
        "contended": _contended(env["load_average"], load_end, run.rows, run.settings.threads),
        "wall_time_s": time.time() - started,
        "rows": run.rows,
    }


def run_scaling(settings: Settings, partial: Path | None = None) -> dict[str, Any]:
    """Run every sweep of ``settings``; return the result written to ``scaling.json``.

    ``partial``: after each variant, the result so far (``"complete": false``) is written there, so a long run
    that is stopped keeps what it measured (``--render`` turns it into tables and a plot).
    """
    torch.set_num_threads(settings.threads)
    settings.jobs = plan(settings)
    env = environment()
    total = len(settings.variants) * sum(len(j["batches"]) for j in settings.jobs.values()) * len(settings.backends)
    started = time.time()
    with tqdm(total=total, desc="scaling", unit="run", disable=not settings.progress, dynamic_ncols=True) as bar:
        run = _Run(settings, bar)
        for variant in settings.variants:
            run.variant(variant)
            if partial is not None:
                atomic_write_text(partial, json.dumps(_result(run, env, started, False), indent=1) + "\n")
    return derive(_result(run, env, started, True))
