"""Belief-attention and belief-attention*: the orthogonal projection of the attention output onto V.

Paper: Guoqiang Zhang, "BeliefFormer: Belief Attention in Transformer", 2025 (submitted to ICLR 2026; no
arXiv version), https://openreview.net/forum?id=Ard2QzPAUK

- ``belief`` (eq. 10-12): global projection per token,
  ``alpha_i = <MH_i, V_i> / <V_i, V_i>``, ``Delta = MH - alpha * V``, ``X <- X + Delta W^o``.
- ``belief-star`` (eq. 10, 13-15): adds the per-head projection
  ``beta_{m,i} = <H_{m,i}, V_{m,i}> / <V_{m,i}, V_{m,i}>``, ``Delta^s_m = H_m - beta_m * V_m`` and
  ``X <- X + Delta W^o + Concat(Delta^s) W^s`` (``W^s`` is ``proj_s``).

The per-head projection alone (``exclusive``) is in :mod:`attnzoo.models.belief2`, with the paper that
names it.

Numerics (docs/variants.md, "Projection numerics"): the divisor is ``<V, V> + eps``, and the two inner
products and the division run in fp32 through explicit casts even when the model runs in fp16/bf16, so a
zero value row gives ``alpha = 0`` (finite) and squares of 16-bit activations cannot overflow. The
projection is its own sub-module (``attn.projection``, ``attn.head_projection``) so its exported ONNX nodes
carry that name; :data:`PROJECTION_OPS` are the ops every export must find there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from .registry import Paper, register_variant
from .standard import StandardAttention, merge_heads

__all__ = [
    "OrthogonalProjection",
    "BeliefAttention",
    "BeliefStarAttention",
    "DEFAULT_EPS",
    "PROJECTION_OPS",
    "PAPER",
    "register_projection_variant",
]

PAPER = Paper(
    "BeliefFormer: Belief Attention in Transformer",
    "Guoqiang Zhang",
    2025,
    "https://openreview.net/forum?id=Ard2QzPAUK",
)
#: Default epsilon added to <V, V>; small against any non-degenerate fp32 <V, V>.
DEFAULT_EPS = 1e-6
#: Minimum op counts of one orthogonal-projection scope (:class:`OrthogonalProjection`: two inner products
#: as ``Mul`` + ``ReduceSum``, ``Add`` eps, ``Div``, ``Mul`` coef * v, ``Sub``).
PROJECTION_OPS: Mapping[str, int] = {"Mul": 3, "ReduceSum": 2, "Add": 1, "Div": 1, "Sub": 1}


class OrthogonalProjection(nn.Module):
    """Split ``a`` into its parts perpendicular and parallel to ``v``, row by row (last dim).

    ``coef = <a, v> / (<v, v> + eps)``, ``parallel = coef * v``, ``perpendicular = a - parallel``
    (BeliefFormer eq. 10 and 13; Belief2 eq. 14). Computed in at least fp32 (16-bit inputs are cast up by
    explicit ``Cast`` nodes in an exported graph); results are cast back to ``a.dtype``.
    In ONNX this is ``Mul``/``ReduceSum`` (twice), ``Add`` (eps), ``Div``, ``Mul``, ``Sub``.

    Args:
        eps: Added to ``<v, v>`` so that a zero row of ``v`` gives ``coef = 0`` instead of NaN.
    """

    def __init__(self, eps: float = DEFAULT_EPS) -> None:
        super().__init__()
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.eps = float(eps)

    def forward(self, a: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(perpendicular, parallel)``, both shaped and typed like ``a``."""
        out_dtype = a.dtype
        compute = torch.promote_types(a.dtype, torch.float32)  # fp16/bf16 -> fp32; fp32/fp64 unchanged
        a32, v32 = a.to(compute), v.to(compute)
        dot_av = (a32 * v32).sum(dim=-1, keepdim=True)
        dot_vv = (v32 * v32).sum(dim=-1, keepdim=True)
        coef = dot_av / (dot_vv + self.eps)
        parallel = coef * v32
        perpendicular = a32 - parallel
        return perpendicular.to(out_dtype), parallel.to(out_dtype)

    def extra_repr(self) -> str:
        return f"eps={self.eps:g}"


class BeliefAttention(StandardAttention):
    """Belief-attention (BeliefFormer eq. 10-12): the global projection; no extra parameters.

    Args:
        eps: Epsilon of the projection's divisor ``<V, V> + eps``.
        **kwargs: ``timm.layers.Attention`` keywords (see :class:`StandardAttention`).
    """

    def __init__(self, dim: int, num_heads: int = 8, eps: float = DEFAULT_EPS, **kwargs) -> None:
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.projection = OrthogonalProjection(eps)

    def combine(self, x: torch.Tensor, h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        delta, _ = self.projection(merge_heads(h), merge_heads(v))
        return self.proj(self.norm_and_gate(x, delta))


class BeliefStarAttention(StandardAttention):
    """Belief-attention* (BeliefFormer eq. 13-15): global and per-head projections, extra ``proj_s``.

    Args:
        eps: Epsilon of both projections' divisors.
        **kwargs: ``timm.layers.Attention`` keywords (see :class:`StandardAttention`).
    """

    def __init__(
        self, dim: int, num_heads: int = 8, eps: float = DEFAULT_EPS, proj_bias: bool = True, **kwargs
    ) -> None:
        super().__init__(dim, num_heads=num_heads, proj_bias=proj_bias, **kwargs)
        self.projection = OrthogonalProjection(eps)
        self.head_projection = OrthogonalProjection(eps)
        self.proj_s = self.new_linear(self.attn_dim, self.dim_out, bias=proj_bias)

    def combine(self, x: torch.Tensor, h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        delta, _ = self.projection(merge_heads(h), merge_heads(v))
        delta_s, _ = self.head_projection(h, v)
        return self.proj(self.norm_and_gate(x, delta)) + self.proj_s(merge_heads(delta_s))


def register_projection_variant(
    name: str,
    attn_layer: type[nn.Module],
    paper: Paper,
    equations: str,
    projections: Sequence[str],
    options: Mapping[str, Any] | None = None,
    **facts: Any,
) -> None:
    """Register a variant built on :class:`OrthogonalProjection`: its option ``eps`` (after ``options``; default
    :data:`DEFAULT_EPS`), and its ``projections`` (the sub-modules) as extra scopes that must export
    :data:`PROJECTION_OPS`. ``facts``: the other keywords of :func:`register_variant`."""
    register_variant(
        name,
        attn_layer,
        paper=paper,
        equations=equations,
        options={**(options or {}), "eps": DEFAULT_EPS},
        extra_scopes=dict.fromkeys(projections, PROJECTION_OPS),
        **facts,
    )


register_projection_variant("belief", BeliefAttention, PAPER, "eq. 10-12", ["projection"])
register_projection_variant(
    "belief-star",
    BeliefStarAttention,
    PAPER,
    "eq. 10, 13-15",
    ["projection", "head_projection"],
    extra_params="W^s (D x D + bias)",
    cost_family="belief",
)
