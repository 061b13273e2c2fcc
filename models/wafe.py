"""WAFE and anti-WAFE: dot-product, MSE and MAE scores, converging or diverging.

Paper: "Divergence vs. Convergence: substitutes for attention" (``shared/papers/003_*``), eq. 1-6:

- eq. 1 ``WAFE_dot``      ``softmax( Q K^T / sqrt(d)) V`` -- standard attention (alias ``wafe-dot``)
- eq. 2 ``anti-WAFE_dot`` ``softmax(-Q K^T / sqrt(d)) V``
- eq. 3 ``WAFE_MSE``      ``softmax(-||q_i - k_j||^2 / d) V``
- eq. 4 ``anti-WAFE_MSE`` ``softmax(+||q_i - k_j||^2 / d) V``
- eq. 5 ``WAFE_MAE``      ``softmax(-||q_i - k_j||_1 / d) V``
- eq. 6 ``anti-WAFE_MAE`` ``softmax(+||q_i - k_j||_1 / d) V``

MSE through the fused kernel (SPEC decision 4): ``-||q - k||^2 / d = (2 q.k - ||k||^2)/d - ||q||^2/d``;
the last term is constant along a softmax row and cancels, so the scores are dot products with scale
``2/d`` plus the per-key additive bias ``-||k||^2/d`` -- ``F.scaled_dot_product_attention`` with a float mask.
The sign flips for anti-WAFE.

MAE has no such form: it needs the pairwise L1 distances. Eager PyTorch uses ``torch.cdist(p=1)``; the ONNX
export materialises the broadcast ``|q_i - k_j|`` tensor of B*M*N^2*d elements (``Sub``, ``Abs``,
``ReduceSum``), e.g. 30 MB in fp32 per layer for a ViT-Ti at 224 px and batch 1 (N = 197, M = 3, d = 64),
growing linearly with batch. The ``mae_impl`` option chooses ``cdist`` or ``broadcast`` explicitly.
"""

from __future__ import annotations

from typing import Optional

import torch

from .standard import StandardAttention

__all__ = ["WAFEAttention", "SCORE_CHOICES"]

SCORE_CHOICES = ("dot", "mse", "mae")


class WAFEAttention(StandardAttention):
    """Attention with WAFE scores.

    Args:
        score: ``dot``, ``mse`` or ``mae``.
        anti: Flip the sign of the scores (anti-WAFE: attend to the *least* similar keys).
        mae_impl: ``auto`` (``cdist`` in eager, ``broadcast`` while exporting to ONNX), ``cdist`` or
            ``broadcast``.
        **kwargs: ``timm.layers.Attention`` keywords (see :class:`StandardAttention`).
    """

    def __init__(self, dim: int, num_heads: int = 8, score: str = "dot", anti: bool = False,
                 mae_impl: str = "auto", **kwargs) -> None:
        if score not in SCORE_CHOICES:
            raise ValueError(f"unknown score {score!r}; valid: {', '.join(SCORE_CHOICES)}")
        if mae_impl not in ("auto", "cdist", "broadcast"):
            raise ValueError(f"unknown mae_impl {mae_impl!r}; valid: auto, cdist, broadcast")
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.score = score
        self.anti = bool(anti)
        self.mae_impl = mae_impl

    def _scores_attention(self, x, q, k, v, attn_mask: Optional[torch.Tensor], is_causal: bool):
        sign = 1.0 if self.anti else -1.0  # WAFE: -distance; anti-WAFE: +distance
        d = self.head_dim
        if self.score == "dot":
            return self._sdpa(-q if self.anti else q, k, v, attn_mask, is_causal)
        if self.score == "mse":
            # sign * ||q - k||^2 / d  ==  (-2 sign) q.k / d + sign ||k||^2 / d  (+ a per-row constant)
            key_bias = (sign / d) * (k * k).sum(dim=-1).unsqueeze(-2)  # (B, M, 1, N)
            if attn_mask is not None:
                key_bias = key_bias + (torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(
                    ~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else attn_mask)
            # Keep the kernel's scale positive (torch's ONNX decomposition takes sqrt(scale)): flip q instead.
            return self._sdpa(-q if self.anti else q, k, v, key_bias, is_causal, scale=2.0 / d)
        # mae
        impl = self.mae_impl
        if impl == "auto":
            impl = "broadcast" if torch.onnx.is_in_onnx_export() else "cdist"
        if impl == "cdist":
            dist = torch.cdist(q, k, p=1.0)
        else:
            dist = (q.unsqueeze(-2) - k.unsqueeze(-3)).abs().sum(dim=-1)
        return self._softmax_attend((sign / d) * dist, v, attn_mask, is_causal)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", score={self.score}, anti={self.anti}"
