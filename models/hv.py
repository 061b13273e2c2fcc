"""Horizontal and vertical attention.

Paper: Litao Yu and Jian Zhang, "Horizontal and Vertical Attention in Transformers", 2022,
https://arxiv.org/abs/2207.04399, eq. 5-8.

- Horizontal (eq. 5-6): re-weight the heads per token. ``A_m = ReLU(H_m W^{A1} + X W^{A2})``,
  ``b_m = A_m w^B + b^B``, ``alpha = softmax over heads of [b_1..b_M]``,
  ``Y = Concat(alpha_1 H_1 .. alpha_M H_M) W^o``. Following the authors' code (docs/variants.md) alpha is per
  token and ``W^{A1}`` (d x d, ``head_a1``), ``W^{A2}`` (D x d, ``head_a2``), ``w^B``/``b^B`` (``head_b``) are
  shared by all heads.
- Vertical (eq. 7-8): re-calibrate channels. ``Y = MH W^o``, ``U = ReLU(X W^{U1} + Y W^{U2})``,
  ``beta = sigmoid(U W^U + b^U)``, output ``beta * Y``; ``D_a = D / 4`` (``chan_u1``, ``chan_u2``, ``chan_u``).
- ``horizontal-vertical``: both.

``X`` is the attention's input (the pre-normed tokens).
"""

from __future__ import annotations

import torch

from .registry import Paper, register_variant
from .standard import StandardAttention, merge_heads

__all__ = ["HVAttention", "PAPER"]

PAPER = Paper(
    "Horizontal and Vertical Attention in Transformers",
    "Litao Yu and Jian Zhang",
    2022,
    "https://arxiv.org/abs/2207.04399",
)


class HVAttention(StandardAttention):
    """Attention with horizontal (per-head) and/or vertical (per-channel) re-weighting.

    Args:
        horizontal: Softmax-over-heads weights per token (eq. 5-6).
        vertical: Sigmoid channel gate on the output (eq. 7-8).
        reduction: ``D / D_a`` of the vertical gate's bottleneck (paper: 4).
        **kwargs: ``timm.layers.Attention`` keywords (see :class:`StandardAttention`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        horizontal: bool = True,
        vertical: bool = False,
        reduction: int = 4,
        **kwargs,
    ) -> None:
        if not (horizontal or vertical):
            raise ValueError("HVAttention needs horizontal=True or vertical=True (else use 'standard')")
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.horizontal = bool(horizontal)
        self.vertical = bool(vertical)
        d = self.head_dim
        if horizontal:
            self.head_a1 = self.new_linear(d, d, bias=False)  # W^{A1}
            self.head_a2 = self.new_linear(dim, d, bias=False)  # W^{A2}
            self.head_b = self.new_linear(d, 1, bias=True)  # w^B, b^B
        if vertical:
            d_a = max(1, self.dim_out // reduction)
            self.chan_u1 = self.new_linear(dim, d_a, bias=False)  # W^{U1}
            self.chan_u2 = self.new_linear(self.dim_out, d_a, bias=False)  # W^{U2}
            self.chan_u = self.new_linear(d_a, self.dim_out, bias=True)  # W^U, b^U

    def head_weights(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Horizontal weights alpha, (B, M, N, 1), summing to 1 over heads (dim 1)."""
        a = torch.relu(self.head_a1(h) + self.head_a2(x).unsqueeze(1))
        return self.head_b(a).softmax(dim=1)

    def channel_gate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Vertical gate beta in (0, 1), shaped like ``y``."""
        return torch.sigmoid(self.chan_u(torch.relu(self.chan_u1(x) + self.chan_u2(y))))

    def combine(self, x: torch.Tensor, h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.horizontal:
            h = h * self.head_weights(x, h)
        y = self.proj(self.norm_and_gate(x, merge_heads(h)))
        if self.vertical:
            y = self.channel_gate(x, y) * y
        return y

    def extra_repr(self) -> str:
        return super().extra_repr() + f", horizontal={self.horizontal}, vertical={self.vertical}"


def _register(name: str, horizontal: bool, vertical: bool, equations: str, extra_params: str) -> None:
    """Register the HV variant with the horizontal and/or vertical re-weighting (the vertical gate's bottleneck
    at the paper's ``D / 4``)."""
    register_variant(
        name,
        HVAttention,
        paper=PAPER,
        equations=equations,
        options={"horizontal": horizontal, "vertical": vertical, **({"reduction": 4} if vertical else {})},
        extra_params=extra_params,
        cost_family="horizontal-vertical",
    )


_register("horizontal", True, False, "eq. 5-6", "W^A1 (d x d), W^A2 (D x d), w^B, b^B")
_register("vertical", False, True, "eq. 7-8", "W^U1, W^U2 (D x D/4), W^U (D/4 x D), b^U")
_register("horizontal-vertical", True, True, "eq. 5-8", "both of the above")
