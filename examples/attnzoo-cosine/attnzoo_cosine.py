"""Scaled cosine attention from Swin Transformer V2, as an attnzoo variant (``--variant cosine``).

Paper: Ze Liu, Han Hu, Yutong Lin, et al., "Swin Transformer V2: Scaling Up Capacity and Resolution", CVPR 2022,
https://arxiv.org/abs/2111.09883, section 3.2, eq. (2)::

    Sim(q_i, k_j) = cos(q_i, k_j) / tau + B_ij

``tau`` is a learnable scalar, not shared across heads and layers, kept larger than 0.01; the attention weights
are ``softmax_j Sim(q_i, k_j)``. ``B_ij`` is Swin's relative position bias over a window; a ViT carries absolute
position embeddings instead, so ``B = 0`` here. ``tau`` starts at 0.1 (Swin V2's code starts ``log(1 / tau)`` at
``log 10``).

The extra math -- both normalisations, the similarity and the division by ``tau`` -- is the sub-module
``cosine``, declared as the variant's extra scope: exported graphs hold it as ``blocks.N.attn.cosine/...`` nodes
in every block, fp32 also in fp16 graphs, unquantized in int8 ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnzoo.models import StandardAttention

__all__ = ["CosineSimilarity", "CosineAttention", "register", "TAU_MIN", "TAU_INIT"]

#: The paper's lower bound on tau.
TAU_MIN = 0.01
#: Initial tau (Swin V2's code: logit scale log(10), i.e. 1 / tau = 10).
TAU_INIT = 0.1


class CosineSimilarity(nn.Module):
    """``cos(q_i, k_j) / max(tau_h, 0.01)`` for every query i and key j of every head h (eq. 2, B = 0).

    Args:
        num_heads: Heads M (one tau each).
        tau_init: Initial tau.
    """

    def __init__(self, num_heads: int, tau_init: float = TAU_INIT) -> None:
        super().__init__()
        if not tau_init > TAU_MIN:
            raise ValueError(f"tau_init must be > {TAU_MIN}, got {tau_init}")
        self.tau = nn.Parameter(torch.full((num_heads, 1, 1), float(tau_init)))

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """q, k: (B, M, N, d) -> similarities (B, M, N, N)."""
        cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        return cos / self.tau.clamp(min=TAU_MIN)


class CosineAttention(StandardAttention):
    """Attention with eq. 2's scaled cosine similarity in place of ``q k^T / sqrt(d)``.

    A :class:`attnzoo.models.StandardAttention` (timm's constructor keywords and parameter names) that
    overrides one hook, ``scores_attention``; the projections, timm's options and the masks stay attnzoo's.
    Takes ``tau_init`` besides timm's keywords.
    """

    def __init__(self, dim: int, num_heads: int = 8, tau_init: float = TAU_INIT, **kwargs) -> None:
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.cosine = CosineSimilarity(num_heads, tau_init)

    def scores_attention(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """``softmax_j Sim(q_i, k_j) v_j`` per head, masks applied to Sim."""
        return self.softmax_attend(self.cosine(q, k), v, attn_mask, is_causal)


def register() -> None:
    """The ``attnzoo.variants`` entry point: register ``cosine``."""
    from attnzoo.models import Paper, register_variant

    register_variant(
        "cosine",
        CosineAttention,
        paper=Paper(
            "Swin Transformer V2: Scaling Up Capacity and Resolution",
            "Liu et al.",
            2022,
            "https://arxiv.org/abs/2111.09883",
        ),
        equations="eq. 2, Sim = cos(q, k) / tau, tau > 0.01, B = 0",
        options={"tau_init": TAU_INIT},
        # the scope's ops: two L2 norms, the similarity MatMul and the divisions (a bare ["cosine"] would
        # require at least one op)
        extra_scopes={"cosine": {"ReduceL2": 2, "MatMul": 1, "Div": 3}},
        extra_params="tau (M)",
    )
