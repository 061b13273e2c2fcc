"""Scaling: latency and peak memory against tokens and batch size, one variant per cost family, eager and ONNX.

Three sweeps on seeded random-init models (speed does not depend on the weights):

- ``tokens``: a ViT-S classifier at 224, 384 and 512 px (197, 577, 1025 tokens), batch 1;
- ``seg``: the Segmenter (ViT-S encoder, linear decoder, 150 classes) at 512 and 1024 px (1025, 4097 tokens);
- ``batch``: the ViT-S classifier at 224 px, batch 1 to 16.

Every ONNX file is exported and verified as ``export-model`` does it; every backend's output must match eager
fp32 (the shared tolerance table) before it is timed. A call predicted (from the same backend's previous,
smaller size) to take longer than ``--max-call-s`` (the export's eager parity check at batch 3 included: its
ONNX rows are then skipped), or whose forward pass would not fit in the memory
available now (:func:`attnzoo.limits.forward_bytes`), is skipped with the reason. Peak memory is the
process's peak resident set size (Linux ``VmHWM``, reset before each measurement) above its size once the
backend was built: activations and workspace, not weights (``build_mb``). The fits (log-log slope of latency
and memory against tokens or batch) and the FLOP cost model per family come out in ``scaling.md``.

Usage::

    python -m attnzoo.benchmarks.scaling --out results/studies/scaling-cpu
    python -m attnzoo.benchmarks.scaling --quick --out /tmp/scaling      # micro models, a minute or two
    python -m attnzoo.benchmarks.scaling --render DIR/scaling.json --out DIR   # tables and plot again
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import re
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from tqdm import tqdm

from attnzoo import limits
from attnzoo.benchmarks.cli import variant_list
from attnzoo.benchmarks.flops import count_forward, count_variant, meta_model
from attnzoo.benchmarks.report import markdown_table
from attnzoo.benchmarks.rows import load_call, row_unavailable_reason, tolerance_for
from attnzoo.benchmarks.run import onnx_path
from attnzoo.benchmarks.timing import time_once
from attnzoo.cli import add_debug_flag, entry_point, one_of, parse_names
from attnzoo.errors import UsageError, first_line
from attnzoo.export import export_verified
from attnzoo.export.verify import EXTRA_BATCH_SIZES
from attnzoo.fileio import atomic_path, atomic_write_text, default_cache_dir, writable_dir
from attnzoo.limits import check_batch_sizes, check_side
from attnzoo.machine import environment, load_1min, load_average
from attnzoo.models import ARCHS, BUILTIN_VARIANTS, VARIANT_NAMES, VARIANTS, canonical_name, create_model
from attnzoo.models.memory import forward_bytes
from attnzoo.runtime.backends import backends, get_backend
from attnzoo.runtime.parity import check as check_parity

if TYPE_CHECKING:
    from timm.models.vision_transformer import VisionTransformer

__all__ = [
    "FAMILIES",
    "DEFAULT_VARIANTS",
    "families",
    "family_of",
    "Settings",
    "run_scaling",
    "derive",
    "fit_exponent",
    "cost_model",
    "crossover_tokens",
    "write_outputs",
    "main",
]


def families(names: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
    """Variants grouped by their spec's ``cost_family`` (default: every variant registered now, plugins
    included); in each, the one named like its family (else the first registered) leads."""
    grouped: dict[str, list[str]] = {}
    for name in VARIANT_NAMES if names is None else names:
        grouped.setdefault(VARIANTS[name].cost_family, []).append(name)
    return {family: tuple(sorted(members, key=lambda v: v != family)) for family, members in grouped.items()}


#: The built-in variants by how their cost grows; the first of each family is the one timed by default. A plugin
#: variant is in the family its registration names, by default one of its own (:func:`family_of`).
FAMILIES: dict[str, tuple[str, ...]] = families(BUILTIN_VARIANTS)
DEFAULT_VARIANTS: tuple[str, ...] = tuple(members[0] for members in FAMILIES.values())
SWEEPS = ("tokens", "seg", "batch")
#: Fraction of the available memory a forward pass may be estimated to need.
MEMORY_HEADROOM = 0.7
#: --quick: the defaults it sets (micro models at small sizes, short timing; the test suite's run).
QUICK = dict(
    arch="micro", sizes=(32, 64), seg_sizes=(32, 64), batch_sizes=(1, 4), batch_px=32, min_time=0.05, min_iters=2
)


def family_of(variant: str) -> str:
    """The cost family of a registered variant (built-in or plugin; aliases accepted)."""
    return VARIANTS[canonical_name(variant)].cost_family


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


def plan(s: Settings) -> dict[tuple[str, int], dict[str, Any]]:
    """(task, image size) -> {"batches": [...], "sweeps": {batch: [sweep, ...]}}, sizes ascending."""
    jobs: dict[tuple[str, int], dict[str, Any]] = {}

    def add(task: str, size: int, batch: int, sweep: str) -> None:
        job = jobs.setdefault((task, size), {"batches": [], "sweeps": {}})
        if batch not in job["batches"]:
            job["batches"].append(batch)
        job["sweeps"].setdefault(batch, []).append(sweep)

    for size in s.sizes:
        add("cls", size, 1, "tokens")
    for batch in s.batch_sizes:
        add("cls", s.batch_px, batch, "batch")
    for size in s.seg_sizes:
        add("seg", size, 1, "seg")
    for job in jobs.values():
        job["batches"].sort()
    return dict(sorted(jobs.items(), key=lambda kv: (kv[0][0] == "seg", kv[0][1])))


# ------------------------------------------------------------------------------------------------ memory
def _rss_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            m = re.search(rf"^{field_name}:\s+(\d+) kB", fh.read(), re.M)
        return int(m.group(1)) if m else None
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


# ------------------------------------------------------------------------------------------------- timing
def _time_calls(fn, min_time: float, min_iters: int) -> list[float]:
    """Seconds of each call of ``fn`` until ``min_time`` s and ``min_iters`` calls (warm-up done by the caller)."""
    samples: list[float] = []
    end = time.perf_counter() + min_time
    while len(samples) < min_iters or time.perf_counter() < end:
        samples.append(time_once(fn))
    return samples


# ------------------------------------------------------------------------------------------------ the run


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


class _Run:
    """State of one scaling run: rows, the last measurement per (variant, backend, task) for predictions."""

    def __init__(self, s: Settings, bar) -> None:
        self.s = s
        self.bar = bar
        self.rows: list[dict[str, Any]] = []
        self.last: dict[tuple[str, str, str], tuple[float, float]] = {}  # -> (work, seconds per call)
        self.exact_peak = _reset_peak()

    def row(
        self,
        variant: str,
        backend: str,
        task: str,
        size: int,
        tokens: int,
        batch: int,
        sweeps,
        count,
        status: str,
        reason: str = "",
        **extra: Any,
    ) -> None:
        r = {
            "variant": variant,
            "family": family_of(variant),
            "backend": backend,
            "task": task,
            "arch": self.s.arch,
            "img_size": size,
            "tokens": tokens,
            "batch": batch,
            "sweeps": list(sweeps),
            "status": status,
            "reason": reason,
            "matrix_gflop": count.matrix_flops * batch / 1e9,
            "vector_gop": count.vector_ops * batch / 1e9,
            "median_ms": None,
            "min_ms": None,
            "iterations": None,
            "per_image_ms": None,
            "achieved_gflop_s": None,
            "peak_mb": None,
            "build_mb": None,
            "parity_error": None,
            "load_1min": load_1min(),
        }
        r.update(extra)
        self.rows.append(r)

    def variant(self, variant: str) -> None:
        for (task, size), job in self.s.jobs.items():
            self.model_size(variant, task, size, job)

    def model_size(self, variant: str, task: str, size: int, job: dict[str, Any]) -> None:
        """One model (variant, task, image size): export once, then every batch size and backend."""
        torch.manual_seed(self.s.seed)
        model = create_model(variant, task=task, arch=self.s.arch, img_size=size).eval()
        config = cast(dict[str, Any], model.attnzoo_config)
        encoder = cast("VisionTransformer", model.encoder if task == "seg" else model)
        tokens = int(encoder.patch_embed.num_patches + encoder.num_prefix_tokens)
        count = count_variant(variant, task=task, arch=self.s.arch, img_size=size)  # per image
        onnx_path, onnx_reason = None, None
        if any(get_backend(b).takes == "onnx" for b in self.s.backends):  # a backend runs the export
            verify_batch = max(EXTRA_BATCH_SIZES)
            onnx_reason = _fits_in_memory(config, size, max(max(job["batches"]), verify_batch))
            last = self.last.get((variant, "eager", task))
            if onnx_reason is None and last is not None:  # the parity check runs eager calls up to verify_batch
                predicted = last[1] * (count.matrix_flops + count.vector_ops) * verify_batch / last[0]
                if predicted > self.s.max_call_s:
                    onnx_reason = (
                        f"export not verified: its eager batch-{verify_batch} check is predicted to take "
                        f"{predicted:.0f} s per call > --max-call-s {self.s.max_call_s:g}"
                    )
            if onnx_reason is None:
                self.bar.set_postfix_str(f"{variant} {task} {size}px: export + verify")
                onnx_path, onnx_reason = self.export(model, variant, task, size)
        for batch in job["batches"]:
            self.batch(variant, model, task, size, tokens, batch, job["sweeps"][batch], count, onnx_path, onnx_reason)
        del model
        _release_memory()

    def export(self, model, variant: str, task: str, size: int) -> tuple[Path | None, str | None]:
        path = onnx_path(self.s.cache_dir, variant, task, self.s.arch, "fp32", size)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:  # bench-latency's naming and reuse: a file this cache verified for the same weights is kept
            export_verified(
                model,
                path,
                model.attnzoo_config,
                dtype="fp32",
                input_hw=(size, size),
                batch_sizes=(1,),
                threads=self.s.threads,
                reuse=True,
            )
        except Exception as exc:  # reported on every ONNX row of this model
            return None, f"export: {first_line(exc, typed=True)}"
        return path, None

    def batch(
        self,
        variant: str,
        model,
        task: str,
        size: int,
        tokens: int,
        batch: int,
        sweeps,
        count,
        onnx_path: Path | None,
        onnx_reason: str | None,
    ) -> None:
        gen = torch.Generator().manual_seed(self.s.seed + batch)
        x = torch.randn(batch, 3, size, size, generator=gen)
        ref: np.ndarray | None = None
        work = (count.matrix_flops + count.vector_ops) * batch
        for backend in self.s.backends:
            self.bar.set_postfix_str(f"{variant} {backend} {task} {size}px b{batch}")
            common = (variant, backend, task, size, tokens, batch, sweeps, count)
            reason = row_unavailable_reason(backend, "fp32", "cpu")
            if reason is None and get_backend(backend).takes == "onnx" and onnx_path is None:
                reason = onnx_reason
            if reason is None:
                reason = _fits_in_memory(cast(dict[str, Any], model.attnzoo_config), size, batch)
            last = self.last.get((variant, backend, task))
            if reason is None and last is not None:
                predicted = last[1] * work / last[0]
                if predicted > self.s.max_call_s:
                    reason = (
                        f"predicted {predicted:.0f} s per call (from {last[1]:.2f} s at {last[0] / 1e9:.1f} "
                        f"Gop, scaled by work) > --max-call-s {self.s.max_call_s:g}"
                    )
            if reason:
                self.row(*common, status="skipped", reason=reason)
                self.bar.update(1)
                continue
            if ref is None and not get_backend(backend).is_reference:
                with torch.inference_mode():
                    ref = model(x).float().numpy()
            try:
                result = self.measure(backend, model, onnx_path, x, ref)
            except Exception as exc:  # a backend failure is a result to report, not a crash
                self.row(*common, status="failed", reason=f"build/run: {first_line(exc, typed=True)}")
                self.bar.update(1)
                continue
            out, extra = result
            if get_backend(backend).is_reference:
                ref = out if ref is None else ref
            assert ref is not None  # the eager output, or the reference backend's
            if ref is not out:
                ok, err = check_parity(out, ref, tolerance_for(backend, "fp32", "cpu"))
                extra["parity_error"] = err if math.isfinite(err) else None
                if not ok:
                    self.row(
                        *common,
                        status="failed",
                        reason=f"parity: max|out-ref|/max(1, max|ref|) = {err:.3g}",
                        **{k: v for k, v in extra.items() if k == "parity_error"},
                    )
                    self.bar.update(1)
                    continue
            self.last[(variant, backend, task)] = (work, extra["median_ms"] / 1e3)
            extra["achieved_gflop_s"] = work / 1e9 / (extra["median_ms"] / 1e3)
            self.row(*common, status="ok", **extra)
            self.bar.update(1)

    def measure(self, backend: str, model, onnx_path: Path | None, x, ref) -> tuple[np.ndarray, dict[str, Any]]:
        """Build, run once (warm-up, parity output), time; memory from the process's peak RSS."""
        _release_memory()
        rss0 = _rss_kib("VmRSS") or 0
        runner, _ = load_call(
            backend,
            model,
            onnx_path,
            x.numpy(),
            "fp32",
            threads=self.s.threads,
            device="cpu",
            cache_dir=self.s.cache_dir,
        )
        try:
            rss1 = _rss_kib("VmRSS") or 0
            self.exact_peak = _reset_peak() and self.exact_peak
            out = runner.output()  # the first call: warm-up and the parity output
            samples = _time_calls(runner.fn, self.s.min_time, self.s.min_iters)
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


# ------------------------------------------------------------------------------------------------- fits
def fit_exponent(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Least-squares slope of ``log y`` against ``log x`` (``y ~ x^slope``); ``None`` below two points."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = (xa > 0) & (ya > 0)
    if keep.sum() < 2 or np.unique(xa[keep]).size < 2:
        return None
    return float(np.polyfit(np.log(xa[keep]), np.log(ya[keep]), 1)[0])


def fits(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (sweep, variant, backend): exponents of latency, peak memory and counted work against the sweep's
    variable (tokens, or batch), over the sizes that ran."""
    out = []
    keys = dict.fromkeys((sw, r["variant"], r["backend"]) for r in rows for sw in r["sweeps"])
    for sweep, variant, backend in keys:
        pts = sorted(
            (
                r
                for r in rows
                if sweep in r["sweeps"] and r["variant"] == variant and r["backend"] == backend and r["status"] == "ok"
            ),
            key=lambda r: (r["tokens"], r["batch"]),
        )
        var = "batch" if sweep == "batch" else "tokens"
        xs = [r[var] for r in pts]
        out.append(
            {
                "sweep": sweep,
                "variant": variant,
                "family": family_of(variant),
                "backend": backend,
                "variable": var,
                "points": len(pts),
                "range": [min(xs), max(xs)] if xs else None,
                "latency_exponent": fit_exponent(xs, [r["median_ms"] for r in pts]),
                "memory_exponent": fit_exponent(xs, [r["peak_mb"] for r in pts]),
                "work_exponent": fit_exponent(xs, [r["matrix_gflop"] + r["vector_gop"] for r in pts]),
                "per_image_ms": {str(r[var]): r["per_image_ms"] for r in pts},
            }
        )
    return out


def cost_model(variant: str, arch: str) -> dict[str, Any]:
    """FLOPs of one encoder block as ``a N + b N^2`` (N tokens), from the counter at two token counts.

    Returns ``a`` in units of D^2 (FLOPs per token) and ``b`` in units of D (FLOPs per token pair), split
    into matrix FLOPs and vector ops, for the arch's width D.
    """
    dim = ARCHS[arch]["embed_dim"]
    block = cast(torch.nn.Sequential, meta_model(variant, "cls", arch).blocks)[0]
    n1, n2 = 100, 400
    c1, c2 = (count_forward(block, torch.empty(1, n, dim, device="meta")) for n in (n1, n2))

    def split(v1: float, v2: float) -> tuple[float, float]:
        b = (v2 / n2 - v1 / n1) / (n2 - n1)
        return (v1 / n1 - b * n1) / dim**2, b / dim

    (am, bm), (av, bv) = split(c1.matrix_flops, c2.matrix_flops), split(c1.vector_ops, c2.vector_ops)
    return {
        "variant": variant,
        "family": family_of(variant),
        "arch": arch,
        "D": dim,
        "matrix_linear_D2": round(am, 3),
        "matrix_quadratic_D": round(bm, 3),
        "vector_linear_D2": round(av, 3),
        "vector_quadratic_D": round(bv, 3),
    }


def crossover_tokens(c: dict[str, Any]) -> float:
    """Tokens at which the per-pair (attention) work equals the per-token work: ``N = a D / (b + c)``."""
    return c["matrix_linear_D2"] * c["D"] / (c["matrix_quadratic_D"] + c["vector_quadratic_D"])


# ------------------------------------------------------------------------------------------------ output
def markdown(result: dict[str, Any]) -> str:
    """Tables: the cost model, the fitted exponents, every measurement."""

    def f(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    env = result["environment"]["cpu"]
    cost = markdown_table(
        [
            "family",
            "variant",
            "a: matrix FLOPs per token (x D^2)",
            "b: matrix FLOPs per token pair (x D)",
            "c: vector ops per token pair (x D)",
            f"N where b + c terms = a term (D = {result['cost_model'][0]['D']})",
        ],
        [
            [
                c["family"],
                c["variant"],
                f(c["matrix_linear_D2"], "{:g}"),
                f(c["matrix_quadratic_D"], "{:g}"),
                f(c["vector_quadratic_D"], "{:g}"),
                f"{crossover_tokens(c):,.0f}",
            ]
            for c in result["cost_model"]
        ],
    )
    fit_rows = [
        [
            x["sweep"],
            x["variant"],
            x["backend"],
            f"{x['range'][0]}-{x['range'][1]}" if x["range"] else "-",
            str(x["points"]),
            f(x["work_exponent"]),
            f(x["latency_exponent"]),
            f(x["memory_exponent"]),
        ]
        for x in result["fits"]
    ]
    fit_table = markdown_table(
        [
            "sweep",
            "variant",
            "backend",
            "tokens / batch",
            "points",
            "work exponent",
            "latency exponent",
            "peak-memory exponent",
        ],
        fit_rows,
    )
    rows = markdown_table(
        [
            "variant",
            "backend",
            "task",
            "px",
            "tokens",
            "batch",
            "GFLOP",
            "median ms",
            "ms / image",
            "GFLOP/s",
            "peak MB",
            "status",
        ],
        [
            [
                r["variant"],
                r["backend"],
                r["task"],
                str(r["img_size"]),
                str(r["tokens"]),
                str(r["batch"]),
                f(r["matrix_gflop"] + r["vector_gop"], "{:.1f}"),
                f(r["median_ms"], "{:.1f}"),
                f(r["per_image_ms"], "{:.1f}"),
                f(r["achieved_gflop_s"], "{:.1f}"),
                f(r["peak_mb"], "{:.0f}"),
                r["status"] + (f": {r['reason']}" if r["reason"] else ""),
            ]
            for r in result["rows"]
        ],
    )
    s = result["settings"]
    return "\n".join(
        [
            "# Scaling: latency and peak memory against tokens and batch size",
            "",
            *(
                []
                if result.get("complete", True)
                else ["**Partial run**: stopped before every variant was measured.", ""]
            ),
            f"Command: `{result['command']}`",
            "",
            f"CPU: {env['model']} ({', '.join(env['key_flags'])}), {s['threads']} thread(s); load average at the start "
            f"{result['environment']['load_average']}, at the end {result['load_average_end']}; wall time "
            f"{result['wall_time_s'] / 60:.0f} min. Models: {s['arch']} with seeded random weights. "
            "Peak MB: the process's peak RSS above its size once the backend was built (activations and workspace).",
            "",
            "## Cost model (FLOPs of one encoder block, from attnzoo.benchmarks.flops)",
            "",
            "Per block with N tokens of width D: matrix FLOPs = a N D^2 + b N^2 D, vector ops (the MAE distance) "
            "= c N^2 D. Beyond the last column's N, attention is most of the work.",
            "",
            cost,
            "",
            "## Fitted exponents (log-log least squares over the sizes that ran)",
            "",
            "work = counted matrix FLOPs + vector ops; latency ~ tokens^exponent (or batch^exponent).",
            "",
            fit_table,
            "",
            "## Measurements",
            "",
            rows,
            "",
        ]
    )


def plot(result: dict[str, Any], path: Path) -> Path:
    """Six panels: latency (top) and peak memory (bottom) against ViT tokens, Segmenter tokens and batch."""
    # heavy: matplotlib, for the plot only
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = [r for r in result["rows"] if r["status"] == "ok"]
    variants = list(dict.fromkeys(r["variant"] for r in result["rows"]))
    backends = list(dict.fromkeys(r["backend"] for r in result["rows"]))
    colors = {v: plt.cm.tab10(i % 10) for i, v in enumerate(variants)}
    styles = {b: s for b, s in zip(backends, [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")], strict=False)}
    arch = result["settings"]["arch"]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9.5), squeeze=False)
    panels = [
        ("tokens", "tokens", f"{arch} classifier, batch 1"),
        ("seg", "tokens", f"Segmenter ({arch}), batch 1"),
        ("batch", "batch", f"{arch} classifier, {result['settings']['batch_px']} px"),
    ]
    for col, (sweep, var, title) in enumerate(panels):
        for v in variants:
            for b in backends:
                pts = sorted(
                    (r for r in rows if sweep in r["sweeps"] and r["variant"] == v and r["backend"] == b),
                    key=lambda r: r[var],
                )
                if not pts:
                    continue
                ls, mk = styles[b]
                xs = [r[var] for r in pts]
                lat = [r["per_image_ms"] if sweep == "batch" else r["median_ms"] for r in pts]
                axes[0][col].plot(xs, lat, ls, marker=mk, color=colors[v], ms=4)
                axes[1][col].plot(xs, [max(r["peak_mb"], 0.1) for r in pts], ls, marker=mk, color=colors[v], ms=4)
        axes[0][col].set_title(title)
        axes[0][col].set_ylabel("ms per image" if sweep == "batch" else "latency (ms)")
        axes[1][col].set_ylabel("peak memory above the built model (MB)")
        for row in (0, 1):
            ax = axes[row][col]
            ax.set_xscale("log", base=2 if sweep == "batch" else 10)
            ax.set_yscale("log")
            ax.set_xlabel("batch size" if sweep == "batch" else "tokens")
            ax.grid(True, which="both", alpha=0.3)
    handles = [Line2D([], [], color=colors[v], lw=2, label=v) for v in variants]
    handles += [Line2D([], [], color="k", ls=styles[b][0], marker=styles[b][1], label=b) for b in backends]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 9), frameon=False)
    cpu = result["environment"]["cpu"]
    fig.suptitle(
        f"Scaling on {cpu['model']} ({', '.join(cpu['key_flags'])}), {result['settings']['threads']} "
        f"thread(s){' - machine shared with other jobs' if result.get('contended') else ''}"
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------- run
def run_scaling(s: Settings, partial: Path | None = None) -> dict[str, Any]:
    """Run every sweep of ``s``; return the result written to ``scaling.json``.

    ``partial``: after each variant, the result so far (``"complete": false``) is written there, so a long run
    that is stopped keeps what it measured (``--render`` turns it into tables and a plot).
    """
    torch.set_num_threads(s.threads)
    s.jobs = plan(s)
    env = environment()
    total = len(s.variants) * sum(len(j["batches"]) for j in s.jobs.values()) * len(s.backends)
    started = time.time()

    def result(run: _Run, complete: bool) -> dict[str, Any]:
        load_end = load_average()
        return {
            "command": s.command,
            "complete": complete,
            "settings": {
                "variants": list(s.variants),
                "backends": list(s.backends),
                "arch": s.arch,
                "sizes": list(s.sizes),
                "seg_sizes": list(s.seg_sizes),
                "batch_sizes": list(s.batch_sizes),
                "batch_px": s.batch_px,
                "threads": s.threads,
                "min_time_s": s.min_time,
                "min_iters": s.min_iters,
                "max_call_s": s.max_call_s,
                "seed": s.seed,
                "quick": s.quick,
                "seg_decoder": "linear",
                "seg_classes": 150,
                "peak_memory": "VmHWM reset per measurement" if run.exact_peak else "VmHWM (not resettable)",
            },
            "families": {k: list(v) for k, v in families().items()},
            "environment": env,
            "load_average_end": load_end,
            "contended": _contended(env["load_average"], load_end, run.rows, s.threads),
            "wall_time_s": time.time() - started,
            "rows": run.rows,
        }

    with tqdm(total=total, desc="scaling", unit="run", disable=not s.progress, dynamic_ncols=True) as bar:
        run = _Run(s, bar)
        for variant in s.variants:
            run.variant(variant)
            if partial is not None:
                atomic_write_text(partial, json.dumps(result(run, False), indent=1) + "\n")
    return derive(result(run, True))


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """Add what follows from the measurements and the code: the fits, and the cost model of every member of
    the families measured (so ``--render`` can redo it from a results file)."""
    measured = dict.fromkeys(family_of(v) for v in result["settings"]["variants"])
    result["fits"] = fits(result["rows"])
    result["cost_model"] = [
        cost_model(v, result["settings"]["arch"])
        for family, members in families().items()
        if family in measured
        for v in members
    ]
    return result


def _contended(load_start: list[float], load_end: list[float], rows: list[dict[str, Any]], threads: int) -> bool:
    """Whether other work shared the CPU: a 1-minute load average above this run's own threads (+ 0.5) at the
    start, at the end or at any measurement."""
    loads = [
        v for v in [*(load_start or [])[:1], *(load_end or [])[:1], *(r["load_1min"] for r in rows)] if v is not None
    ]
    return bool(loads) and max(loads) > threads + 0.5


def write_outputs(result: dict[str, Any], out: Path) -> dict[str, Path]:
    """scaling.json, scaling.md and scaling.png in ``out`` (written atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "scaling.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "scaling.md", markdown(result))
    return {"json": out / "scaling.json", "markdown": out / "scaling.md", "plot": plot(result, out / "scaling.png")}


def _ints(value: str, flag: str) -> list[int]:
    if not value.strip():
        return []
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {value!r}") from None
    return list(dict.fromkeys(out))


def cpu_backends() -> list[str]:
    """The registry's backends that compute on the CPU (the ones this command times)."""
    return [b.name for b in backends() if b.row_device("cpu") == "cpu"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attnzoo.benchmarks.scaling",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="'all' or comma-separated variant names (default: one per cost family)",
    )
    p.add_argument(
        "--backends",
        default="eager,ort-cpu",
        help=f"comma-separated, from the registry's CPU backends: {', '.join(cpu_backends())}",
    )
    p.add_argument("--arch", default="small", choices=("micro", "tiny", "small", "base"))
    p.add_argument("--sizes", default="224,384,512", help="classifier input sizes (px), batch 1")
    p.add_argument("--seg-sizes", default="512,1024", help="Segmenter input sizes (px), batch 1; '' for none")
    p.add_argument("--batch-sizes", default="1,2,4,8,16", help="batch sweep at --batch-px; '' for none")
    p.add_argument("--batch-px", type=int, default=224, help="classifier input size of the batch sweep")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads of PyTorch and ONNX Runtime")
    p.add_argument("--min-time", type=float, default=2.0, help="seconds timed per measurement")
    p.add_argument("--min-iters", type=int, default=2, help="timed calls per measurement, at least")
    p.add_argument(
        "--max-call-s",
        type=float,
        default=120.0,
        help="skip a call predicted (from the previous size) to take longer than this",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="micro models at 32/64 px, batch 1/4, short timing: checks the pipeline in a minute or two",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("scaling-out"), help="output folder")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="exported models (default: <cache>/scaling, <cache> as for bench-latency)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        default=None,
        help="measure nothing: redo the fits, cost model, scaling.md and scaling.png of a scaling.json into --out",
    )
    return add_debug_flag(p)


def parse_settings(argv: Sequence[str]) -> Settings:
    """Command line -> :class:`Settings`; ``UsageError`` (one line) for a bad value, before any work."""
    parser = build_parser()
    if parser.parse_args(list(argv)).quick:  # --quick changes the defaults; flags given explicitly still win
        parser.set_defaults(**{k: ",".join(map(str, v)) if isinstance(v, tuple) else v for k, v in QUICK.items()})
    a = parser.parse_args(list(argv))
    backends = parse_names(a.backends, one_of(cpu_backends()), "backend", ", ".join(cpu_backends()))
    arch, batch_px = a.arch, a.batch_px
    sizes, seg_sizes = _ints(a.sizes, "--sizes"), _ints(a.seg_sizes, "--seg-sizes")
    batch_sizes = _ints(a.batch_sizes, "--batch-sizes")
    patch = ARCHS[arch]["patch_size"]
    if not (sizes or seg_sizes or batch_sizes):
        raise UsageError("nothing to measure: --sizes, --seg-sizes and --batch-sizes are all empty")
    for flag, values in (
        ("--sizes", sizes),
        ("--seg-sizes", seg_sizes),
        ("--batch-px", [batch_px] if batch_sizes else []),
    ):
        for v in values:
            try:
                check_side(v, flag)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            if v % patch:
                raise UsageError(f"{flag}: {v} px is not a multiple of the {arch} patch size {patch}")
    try:
        check_batch_sizes(batch_sizes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for flag, v, lo in (("--threads", a.threads, 1), ("--min-iters", a.min_iters, 2)):
        if v < lo:
            raise UsageError(f"{flag} must be >= {lo}, got {v}")
    for flag, v in (("--min-time", a.min_time), ("--max-call-s", a.max_call_s)):
        if not v > 0:
            raise UsageError(f"{flag} must be > 0, got {v}")
    variants = variant_list(a.variants)
    return Settings(
        variants=variants,
        backends=backends,
        arch=arch,
        sizes=sorted(sizes),
        seg_sizes=sorted(seg_sizes),
        batch_sizes=sorted(batch_sizes),
        batch_px=batch_px,
        threads=a.threads,
        min_time=a.min_time,
        min_iters=a.min_iters,
        max_call_s=a.max_call_s,
        seed=a.seed,
        out=a.out,
        cache_dir=a.cache_dir or default_cache_dir() / "scaling",
        progress=not a.no_progress,
        command=shlex.join(["python", "-m", "attnzoo.benchmarks.scaling", *argv]),
        quick=a.quick,
    )


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnzoo.benchmarks.scaling``: the output folders are checked writable before any work."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if a.render is not None:
        if not a.render.is_file():
            raise UsageError(f"--render {a.render}: no such file")
        writable_dir(a.out, "--out folder")
        result = derive(json.loads(a.render.read_text()))
        files = write_outputs(result, a.out)
        print("wrote " + ", ".join(str(p) for p in files.values()))
        return 0
    s = parse_settings(argv)
    writable_dir(s.out, "--out folder")
    writable_dir(s.cache_dir, "--cache-dir folder")
    result = run_scaling(s, partial=s.out / "scaling.json")
    files = write_outputs(result, s.out)
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
