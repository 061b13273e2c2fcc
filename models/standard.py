"""Standard multi-head self-attention, the base every variant in attnzoo extends.

Paper: Vaswani et al., "Attention Is All You Need", 2017, https://arxiv.org/abs/1706.03762, eq. 1 and the
multi-head attention of its sec. 3.2.2: scores ``S_m = Q_m K_m^T / sqrt(d)``, ``H_m = softmax(S_m) V_m``,
output ``Concat(H_1..H_M) W^o``. The WAFE paper calls this ``WAFE_dot`` (its eq. 1), so ``wafe-dot`` is an
alias of ``standard``; the Horizontal and Vertical Attention paper writes it as its eq. 1-3.

The class is a drop-in replacement for ``timm.layers.Attention`` (timm >= 1.0.23): the same constructor
keywords, the same parameter names (``qkv``, ``proj``) and ``forward(x, attn_mask=None, is_causal=False)``.
Variants, built-in or third-party, subclass it and override its hooks (``scores_attention``, ``combine``,
``transform_value``) rather than ``forward``; see :class:`StandardAttention` and ``docs/your-own-variant.md``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import Paper, register_variant

__all__ = ["StandardAttention", "apply_attn_mask", "additive_mask", "merge_heads", "PAPER"]

PAPER = Paper("Attention Is All You Need", "Vaswani et al.", 2017, "https://arxiv.org/abs/1706.03762")


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, M, N, d) -> (B, N, M*d)."""
    B, M, N, d = x.shape
    return x.transpose(1, 2).reshape(B, N, M * d)


def apply_attn_mask(
    scores: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
) -> torch.Tensor:
    """Add a boolean (True = keep) or additive float mask, and/or a causal mask, to attention scores."""
    if is_causal:
        n_q, n_k = scores.shape[-2:]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    return scores


def additive_mask(
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    n_q: int,
    n_k: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor | None:
    """One additive float mask (0 = keep, ``-inf`` = drop) from a boolean (True = keep) or additive float mask
    and/or the causal mask (query ``i`` sees keys ``j <= i``, as :func:`apply_attn_mask`); ``None`` for neither.

    ``F.scaled_dot_product_attention`` refuses ``attn_mask`` together with ``is_causal``, and a variant that adds
    its own per-key bias (WAFE-MSE) passes a mask always: both hand the kernel this one mask instead.
    """
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = torch.zeros(attn_mask.shape, dtype=dtype, device=device).masked_fill(~attn_mask, float("-inf"))
        else:
            mask = attn_mask.to(dtype)
    if is_causal:
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()
        causal = torch.zeros(n_q, n_k, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))
        mask = causal if mask is None else mask + causal
    return mask


class StandardAttention(nn.Module):
    """Multi-head self-attention with timm's constructor keywords and parameter names.

    Args:
        dim: Token width D.
        num_heads: Number of heads M.
        attn_head_dim: Head width d (default D / M).
        dim_out: Output width (default D).
        qkv_bias: Bias in the fused ``qkv`` projection.
        qk_norm: Normalise q and k per head with ``norm_layer``.
        scale_norm: Normalise the attention output before ``proj`` with ``norm_layer``.
        proj_bias: Bias in ``proj``.
        gated: Sigmoid gate on the attention output (timm's ``gated`` option).
        attn_drop: Dropout on attention weights.
        proj_drop: Dropout after the output projection.
        norm_layer: Normalisation constructor for ``qk_norm`` / ``scale_norm``.

    ``forward`` checks the input, then runs four hooks; a variant overrides the ones its paper changes and
    keeps ``forward``, the input check, timm's options (``qk_norm``, ``scale_norm``, ``gated``, dropouts) and
    the masks::

        q, k, v = self.project_qkv(x)                               # (B, M, N, d) each
        v = self.transform_value(x, v)                              # MABViT: GLU / GELU on V
        h = self.scores_attention(x, q, k, v, attn_mask, is_causal) # WAFE, Belief2: other scores
        out = self.proj_drop(self.combine(x, h, v))                 # belief, HV: other updates

    Inside a hook, :meth:`sdpa` (fused scaled dot product), :meth:`softmax_attend` (softmax of any scores,
    masks and dropout applied) and :meth:`norm_and_gate` (timm's ``scale_norm`` and ``gated`` before
    ``proj``) do the steps every variant shares. Extra math belongs in a sub-module called from a hook, so
    that export can name its ops (``extra_scopes`` of :func:`attnzoo.models.register_variant`).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        attn_head_dim: int | None = None,
        dim_out: int | None = None,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        gated: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        dim_out = dim_out or dim
        if attn_head_dim is None:
            if dim % num_heads != 0:
                raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
            attn_head_dim = dim // num_heads
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("norm_layer must be given when qk_norm or scale_norm is True")
        self.dim = dim
        self.dim_out = dim_out
        self.num_heads = num_heads
        self.head_dim = attn_head_dim
        self.attn_dim = num_heads * attn_head_dim
        self.scale = attn_head_dim**-0.5

        self.qkv = nn.Linear(dim, self.attn_dim * 3, bias=qkv_bias, **dd)
        self.q_norm = norm_layer(attn_head_dim, **dd) if qk_norm and norm_layer is not None else nn.Identity()
        self.k_norm = norm_layer(attn_head_dim, **dd) if qk_norm and norm_layer is not None else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(self.attn_dim, **dd) if scale_norm and norm_layer is not None else nn.Identity()
        self.gate = nn.Linear(dim, self.attn_dim, bias=qkv_bias, **dd) if gated else None
        self.proj = nn.Linear(self.attn_dim, dim_out, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    # ------------------------------------------------------- hooks a variant overrides
    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """X -> Q, K, V, each (B, M, N, d), with timm's optional q/k norm. One MatMul and one Split in the
        exported graph."""
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return self.q_norm(q), self.k_norm(k), v

    def transform_value(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """V before attention, (B, M, N, d). Standard: unchanged; MABViT: a GLU or GELU on it."""
        return v

    def scores_attention(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """Per-head outputs ``H_m``, (B, M, N, d). Standard: ``softmax(Q K^T / sqrt(d) + mask) V`` (fused).

        A variant with another score function overrides this, computing its scores and handing them to
        :meth:`softmax_attend` (or calling :meth:`sdpa` when they are a scaled dot product).
        """
        return self.sdpa(q, k, v, attn_mask, is_causal)

    def combine(self, x: torch.Tensor, h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Per-head outputs -> the block update (before ``proj_drop``), (B, N, dim_out).
        Standard: ``Concat(H) W^o``, with :meth:`norm_and_gate` before ``proj``."""
        return self.proj(self.norm_and_gate(x, merge_heads(h)))

    # ------------------------------------------------------- helpers the hooks call
    def new_linear(self, in_features: int, out_features: int, bias: bool) -> nn.Linear:
        """A variant's extra projection: an ``nn.Linear`` on the layer's device and dtype (those of ``qkv``)."""
        weight = self.qkv.weight
        return nn.Linear(in_features, out_features, bias=bias, device=weight.device, dtype=weight.dtype)

    def sdpa(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
        scale: float | None = None,
    ) -> torch.Tensor:
        """Fused ``softmax(q k^T * scale + mask) v`` through ``F.scaled_dot_product_attention``, with the
        layer's attention dropout; ``scale`` defaults to ``1 / sqrt(head_dim)``. A mask together with
        ``is_causal`` goes to the kernel as one additive mask (:func:`additive_mask`)."""
        if attn_mask is not None and is_causal:
            attn_mask = additive_mask(attn_mask, True, q.shape[-2], k.shape[-2], q.dtype, q.device)
            is_causal = False
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=self.attn_drop.p if self.training else 0.0,
            is_causal=is_causal,
            scale=self.scale if scale is None else scale,
        )

    def softmax_attend(
        self, scores: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool
    ) -> torch.Tensor:
        """Explicit ``softmax(scores + mask) v`` (with attention dropout) for scores no fused kernel takes."""
        scores = apply_attn_mask(scores, attn_mask, is_causal)
        attn = self.attn_drop(scores.softmax(dim=-1))
        return attn @ v

    def norm_and_gate(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """timm's optional ``scale_norm`` and ``gated`` steps, applied to the signal ``y`` fed to ``proj``."""
        y = self.norm(y)
        if self.gate is not None:
            y = y * self.gate(x).sigmoid()
        return y

    # --------------------------------------------------------------- forward
    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Apply attention to tokens ``x`` of shape (B, N, D); returns (B, N, dim_out)."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__} expects tokens of shape (batch, tokens, {self.dim}), got {tuple(x.shape)}"
            )
        q, k, v = self.project_qkv(x)
        v = self.transform_value(x, v)
        h = self.scores_attention(x, q, k, v, attn_mask, is_causal)
        return self.proj_drop(self.combine(x, h, v))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, head_dim={self.head_dim}"


register_variant("standard", StandardAttention, paper=PAPER, equations="eq. 1", aliases=("wafe-dot",))
