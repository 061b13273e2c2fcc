"""How cost grows: the variants' cost families, the FLOP cost model of one encoder block, and the fitted exponents
of latency and memory against tokens or batch size."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from attnzoo.benchmarks.flops import count_forward, meta_model
from attnzoo.models import ARCHS, BUILTIN_VARIANTS, VARIANT_NAMES, VARIANTS, canonical_name

__all__ = [
    "FAMILIES",
    "DEFAULT_VARIANTS",
    "families",
    "family_of",
    "fit_exponent",
    "fits",
    "cost_model",
    "crossover_tokens",
    "derive",
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


def family_of(variant: str) -> str:
    """The cost family of a registered variant (built-in or plugin; aliases accepted)."""
    return VARIANTS[canonical_name(variant)].cost_family


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
    keys = dict.fromkeys((sweep, row["variant"], row["backend"]) for row in rows for sweep in row["sweeps"])
    for sweep, variant, backend in keys:
        pts = sorted(
            (
                row
                for row in rows
                if sweep in row["sweeps"]
                and row["variant"] == variant
                and row["backend"] == backend
                and row["status"] == "ok"
            ),
            key=lambda row: (row["tokens"], row["batch"]),
        )
        var = "batch" if sweep == "batch" else "tokens"
        xs = [row[var] for row in pts]
        out.append(
            {
                "sweep": sweep,
                "variant": variant,
                "family": family_of(variant),
                "backend": backend,
                "variable": var,
                "points": len(pts),
                "range": [min(xs), max(xs)] if xs else None,
                "latency_exponent": fit_exponent(xs, [row["median_ms"] for row in pts]),
                "memory_exponent": fit_exponent(xs, [row["peak_mb"] for row in pts]),
                "work_exponent": fit_exponent(xs, [row["matrix_gflop"] + row["vector_gop"] for row in pts]),
                "per_image_ms": {str(row[var]): row["per_image_ms"] for row in pts},
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


def crossover_tokens(cost: dict[str, Any]) -> float:
    """Tokens at which the per-pair (attention) work equals the per-token work: ``N = a D / (b + c)``."""
    return cost["matrix_linear_D2"] * cost["D"] / (cost["matrix_quadratic_D"] + cost["vector_quadratic_D"])


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
