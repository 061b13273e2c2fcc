"""What the rows say beside their own numbers, filled in once every row of the log is read back: the speed-ups
over eager, the efficiency against the machine's matmul ceiling, the fraction of the GPU's roofline, and the
fastest fp32 CPU runtime per variant and batch.
"""

from __future__ import annotations

from typing import Any

import torch

from attnzoo.benchmarks.ceiling import ceiling_for, fraction
from attnzoo.benchmarks.flops import count_variant, meta_model
from attnzoo.benchmarks.plan import on_cpu
from attnzoo.benchmarks.roofline import GPUS, WIDTH, bound, gpu_key
from attnzoo.runtime.backends import get_backend, reference_backend

__all__ = ["speedups", "efficiency", "roofline_fractions", "fastest_cpu"]


def speedups(rows: list[dict[str, Any]]) -> None:
    """Fill ``speedup_vs_eager`` = median of the row's baseline eager row (``baseline``) / row median and
    ``speedup_vs_eager_fp32`` = eager fp32 median / row median (same variant, batch)."""
    eager = {
        (r["variant"], r["batch"], r["dtype"]): r["median_ms"]
        for r in rows
        if r["status"] == "ok" and r["backend"] == reference_backend()
    }
    for r in rows:
        if r["status"] != "ok":
            continue
        fp32 = eager.get((r["variant"], r["batch"], "fp32"))
        base = eager.get((r["variant"], r["batch"], (r.get("baseline") or "eager fp32").split()[-1]))
        r["speedup_vs_eager"] = base / r["median_ms"] if base else None
        r["speedup_vs_eager_fp32"] = fp32 / r["median_ms"] if fp32 else None


def efficiency(
    rows: list[dict[str, Any]], flops: dict[str, dict[str, Any]], ceiling: dict[str, Any] | None, device: torch.device
) -> None:
    """Fill ``gflop`` (counted FLOPs of one call: per image x batch), ``achieved_gflops`` (= gflop / median s),
    ``ceiling_gflops`` (the ceiling of the row's precision on its device) and ``ceiling_fraction``."""
    for r in rows:
        count = flops.get(r["variant"])
        if count is None:
            continue
        r["gflop"] = count["flops_per_image"] * r["batch"] / 1e9
        if r["status"] == "ok":
            top = ceiling_for(ceiling, r["backend"], r["dtype"], get_backend(r["backend"]).row_device(device.type))
            r.update(fraction(r["gflop"] * 1e9, r["median_ms"], top))


def roofline_fractions(
    rows: list[dict[str, Any]], gpu_name: str | None, task: str, arch: str, img_size: int | None = None
) -> None:
    """Fill ``roofline_us`` (the lower bound of the row's forward pass on this GPU at the row's precision:
    :func:`attnzoo.benchmarks.roofline.bound`, the one table of GPU peaks) and ``roofline_fraction`` (bound /
    median: 1 = at the roof) of every GPU row that ran, where the GPU is in that table."""
    key = gpu_key(gpu_name) if gpu_name else None
    if key is None:
        return
    counts: dict[tuple[str, int], Any] = {}
    for r in rows:
        if r["status"] != "ok" or r.get("device") != "cuda" or r["dtype"] not in WIDTH:
            continue
        where = (r["variant"], r["batch"])
        if where not in counts:
            counts[where] = count_variant(
                r["variant"], batch=r["batch"], model=meta_model(r["variant"], task, arch, img_size)
            )
        c = counts[where]
        b = bound(c.matrix_flops, c.vector_ops, c.bytes(WIDTH[r["dtype"]]), GPUS[key], r["dtype"])
        if b["bound_s"] is not None:
            r.update(roofline_us=b["bound_s"] * 1e6, roofline_fraction=b["bound_s"] / (r["median_ms"] / 1e3))


def fastest_cpu(rows: list[dict[str, Any]], pairs: list[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    """The fastest fp32 CPU runtime per (variant, batch), with the runner-up and by how much.

    Candidates are ranked by speed-up over eager fp32 (the paired median where measured, else the ratio of
    medians; eager itself counts as 1). Where the two best were also timed head to head (A B A B), that
    direct comparison decides between them and gives ``x_runner_up`` (``how``: ``head-to-head pairs``).
    int8 is a change of precision, not of runtime, and is left out.
    """
    groups: dict[tuple[str, int], list[tuple[float, dict[str, Any]]]] = {}
    for r in rows:
        if r["status"] != "ok" or r["dtype"] != "fp32" or not on_cpu(r["backend"], device):
            continue
        score = (
            1.0
            if r["backend"] == reference_backend()
            else (r["speedup_pair_median"] if r.get("speedup_pair_median") is not None else r["speedup_vs_eager"])
        )
        if score:
            groups.setdefault((r["variant"], r["batch"]), []).append((score, r))
    direct = {(p["variant"], p["batch"], frozenset((p["a"], p["b"]))): p for p in pairs}
    out = []
    for (variant, batch), scored in groups.items():
        scored.sort(key=lambda t: -t[0])
        ranked = [r["backend"] for _, r in scored]
        x_next = scored[0][0] / scored[1][0] if len(scored) > 1 else None
        how = "speed-ups over eager" if len(scored) > 1 else None
        pair = direct.get((variant, batch, frozenset(ranked[:2]))) if len(ranked) > 1 else None
        if pair is not None:
            # ratio_median = b time / a time: above 1, a is faster
            faster, slower = (pair["a"], pair["b"]) if pair["ratio_median"] >= 1 else (pair["b"], pair["a"])
            ranked[:2] = [faster, slower]
            x_next = max(pair["ratio_median"], 1 / pair["ratio_median"])
            how = "head-to-head pairs"
        best = next(r for _, r in scored if r["backend"] == ranked[0])
        score = next(sc for sc, r in scored if r["backend"] == ranked[0])
        out.append(
            {
                "variant": variant,
                "batch": batch,
                "backend": ranked[0],
                "median_ms": best["median_ms"],
                "x_eager": score,
                "runner_up": ranked[1] if len(ranked) > 1 else None,
                "x_runner_up": x_next,
                "how": how,
            }
        )
    return out
