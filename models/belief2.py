"""Belief2-attention, and the per-head projection alone (``exclusive``).

Paper: Guoqiang Zhang, "Improved Belief-Attention in Vision Tasks", 2026, https://arxiv.org/abs/2606.00077,
eq. 7, 11-15, Remark 1 and Proposition 1.

``exclusive`` (Remark 1): belief-attention's update, eq. 7, with ``W = 0``: only the per-head perpendicular
components remain, ``X <- X + Concat(Delta^s_1..Delta^s_M) W^o``. The paper notes that this is the exclusive
self-attention of S. Zhai (arXiv:2603.09078).

``belief2``:

- eq. 11: ``H_m = softmax((Q_m K_m^T + Z_m Z_m^T) / sqrt(d)) V_m`` with ``Z_m = X W^Z_m`` (optional, ``zz``).
  Since ``Q K^T + Z Z^T = [Q|Z] [K|Z]^T``, the scores go through one fused attention call with
  query/key width 2d and scale ``1/sqrt(d)`` (docs/variants.md, "Belief2"); V is zero-padded to width 2d there,
  since the fused kernels take one head width (the ONNX export keeps the unpadded call).
- eq. 12-14: ``MH = Concat(H)``, ``V = Concat(V_m)``, ``Delta = MH - alpha * V`` with
  ``alpha_i = <MH_i, V_i> / (<V_i, V_i> + eps)``.
- eq. 15: ``X <- X + Delta W + phi(alpha * V) W^p`` (``W`` is ``proj``, ``W^p`` is ``proj_p``).

Proposition 1: with ``phi = identity``, ``zz`` off and ``W^p = W`` (``proj_p.bias = 0``, so the bias is
counted once) the update equals standard attention; :func:`belief2_from_standard` turns one standard attention
layer into that, and :func:`attnzoo.models.convert_to_belief2` does it for every block of a model.
The zoo trains it from scratch with ``param_matched``: the block MLP shrinks so that the model has
``standard``'s parameter count, as the paper does when training from scratch.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn.functional as F
from timm.layers import Attention as TimmAttention
from torch import nn

from .belief import DEFAULT_EPS, OrthogonalProjection, register_projection_variant
from .registry import ModelBuild, ModelOption, Paper, attention_class, split_options
from .standard import StandardAttention, merge_heads

__all__ = [
    "ExclusiveAttention",
    "Belief2Attention",
    "PHI_CHOICES",
    "PAPER",
    "PARAM_MATCHED",
    "prop1_options",
    "check_prop1_source",
    "tie_proj_p",
    "belief2_from_standard",
]

PAPER = Paper("Improved Belief-Attention in Vision Tasks", "Guoqiang Zhang", 2026, "https://arxiv.org/abs/2606.00077")
PHI_CHOICES = {"identity": nn.Identity, "gelu": nn.GELU, "silu": nn.SiLU}


class ExclusiveAttention(StandardAttention):
    """Per-head projection only (Remark 1: belief-attention, eq. 7, with ``W = 0``).

    ``X <- X + Concat(Delta^s_1..Delta^s_M) W^o``; no extra parameters.

    Args:
        eps: Epsilon of the projection's divisor.
        **kwargs: ``timm.layers.Attention`` keywords (see :class:`StandardAttention`).
    """

    def __init__(self, dim: int, num_heads: int = 8, eps: float = DEFAULT_EPS, **kwargs) -> None:
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.head_projection = OrthogonalProjection(eps)

    def combine(self, x: torch.Tensor, h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        delta_s, _ = self.head_projection(h, v)
        return self.proj(self.norm_and_gate(x, merge_heads(delta_s)))


register_projection_variant(
    "exclusive", ExclusiveAttention, PAPER, "Remark 1 (eq. 7, W = 0)", ["head_projection"], cost_family="belief"
)


class Belief2Attention(StandardAttention):
    """Belief2-attention (eq. 11-15).

    Args:
        phi: Activation on the projected component: ``identity``, ``gelu`` or ``silu``.
        zz: Add ``Z Z^T`` to the scores (eq. 11); creates ``z`` (``W^Z``, D x D, no bias).
        eps: Epsilon of the projection's divisor.
        **kwargs: ``timm.layers.Attention`` keywords (see :class:`StandardAttention`).
    """

    #: With ``zz``, pad V to the width of ``[Q|Z]`` so that PyTorch's fused kernels take the attention call
    #: (``False``: the unpadded call, which PyTorch runs unfused; the ONNX export always writes that one).
    pad_value: bool = True

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        phi: str = "gelu",
        zz: bool = True,
        eps: float = DEFAULT_EPS,
        proj_bias: bool = True,
        **kwargs,
    ) -> None:
        if phi not in PHI_CHOICES:
            raise ValueError(f"unknown phi {phi!r}; valid: {', '.join(PHI_CHOICES)}")
        super().__init__(dim, num_heads=num_heads, proj_bias=proj_bias, **kwargs)
        self.phi_name = phi
        self.zz = bool(zz)
        self.z: nn.Linear | None = self.new_linear(dim, self.attn_dim, bias=False) if zz else None
        self.projection = OrthogonalProjection(eps)
        self.phi = PHI_CHOICES[phi]()
        self.proj_p = self.new_linear(self.attn_dim, self.dim_out, bias=proj_bias)

    def scores_attention(self, x, q, k, v, attn_mask, is_causal):
        if self.z is None:
            return self.sdpa(q, k, v, attn_mask, is_causal)
        B, N, _ = x.shape
        z = self.z(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        # [Q|Z][K|Z]^T = Q K^T + Z Z^T; the scale stays 1/sqrt(d) with d the original head width.
        qz, kz = torch.cat([q, z], dim=-1), torch.cat([k, z], dim=-1)
        if not self.pad_value or torch.onnx.is_in_onnx_export():  # the exported ONNX graph keeps this form
            return self.sdpa(qz, kz, v, attn_mask, is_causal, scale=self.scale)
        # The fused kernels (flash on CPU and CUDA) take one head width for q, k and v; with V (width d) beside
        # [Q|Z] (width 2d), PyTorch falls back to its unfused math path. V padded with zero channels to 2d gives
        # the same H_m in its first d channels (the zeros only add zero columns) through the fused kernel.
        h = self.sdpa(qz, kz, F.pad(v, (0, qz.shape[-1] - v.shape[-1])), attn_mask, is_causal, scale=self.scale)
        return h[..., : v.shape[-1]]

    def combine(self, x: torch.Tensor, h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        delta, parallel = self.projection(merge_heads(h), merge_heads(v))
        return self.proj(self.norm_and_gate(x, delta)) + self.proj_p(self.phi(parallel))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", phi={self.phi_name}, zz={self.zz}"


def _param_matched_hidden(matched: bool, hidden: int, build: ModelBuild) -> int:
    """Shrink the MLP by the attention's extra parameters; each hidden unit costs 2D weights + 1 bias."""
    return hidden - round(build.attention_extra_params() / (2 * build.embed_dim + 1)) if matched else hidden


#: Model option ``param_matched``: the block MLP shrinks so that the model has ``standard``'s parameter count.
PARAM_MATCHED = ModelOption(False, mlp_hidden=_param_matched_hidden)

register_projection_variant(
    "belief2",
    Belief2Attention,
    PAPER,
    "eq. 11-15, Prop. 1",
    ["projection"],
    options={"phi": "gelu", "zz": True},
    model_options={"param_matched": PARAM_MATCHED},
    extra_params="W^p (D x D + bias), W^Z (D x D) if zz",
    zoo_options={"param_matched": True},
)


# ------------------------------------------------------------------------------------------------ Proposition 1
def prop1_options() -> dict[str, Any]:
    """Belief2 options (attention and model) under which Prop. 1 holds: ``phi = identity``, ``zz`` off, the
    full MLP (``param_matched`` off)."""
    _, attn, model = split_options("belief2", phi="identity", zz=False, param_matched=False)
    return {**attn, **model}


def tie_proj_p(attn: nn.Module) -> None:
    """``W^p = W``, ``b^p = 0`` in a Belief2 layer: the bias is added once, by ``proj`` (Prop. 1)."""
    layer = cast(Belief2Attention, attn)
    with torch.no_grad():
        layer.proj_p.weight.copy_(layer.proj.weight)
        if layer.proj_p.bias is not None:
            layer.proj_p.bias.zero_()


def check_prop1_source(attn: nn.Module, where: str) -> None:
    """Refuse an attention layer that Prop. 1 does not cover.

    Args:
        attn: The layer to convert.
        where: Its name in the model, for the message (``blocks.3.attn``).

    Raises:
        ValueError: ``attn`` is not timm's ``Attention`` or attnzoo's ``standard`` class, or uses
            ``scale_norm`` / ``gated`` (Belief2 applies those to ``Delta`` only, eq. 15).
    """
    cls = type(attn)
    if not (cls in (TimmAttention, StandardAttention) or getattr(cls, "variant", None) == "standard"):
        raise ValueError(
            f"{where} is a {cls.__module__}.{cls.__name__}, not standard attention "
            "(timm.layers.Attention); Prop. 1 covers standard attention only"
        )
    if not isinstance(attn.norm, nn.Identity):
        raise ValueError(
            f"{where} uses scale_norm (a norm before proj); Belief2 would normalise Delta only, "
            "so the function would change"
        )
    if getattr(attn, "gate", None) is not None:
        raise ValueError(f"{where} is gated; Belief2 would gate Delta only, so the function would change")


def belief2_from_standard(attn: nn.Module) -> nn.Module:
    """A Belief2 layer computing the same function as the standard attention layer ``attn`` (Prop. 1).

    With ``phi = identity``, ``zz`` off and ``W^p = W``, ``b^p = 0``, eq. 15's update is
    ``(MH - aV) W + b + (aV) W = MH W + b``, standard attention's. The new layer holds ``attn``'s own ``qkv``,
    q/k norm and ``proj`` modules (shared, not copied) and ``proj_p`` tied to ``proj`` by :func:`tie_proj_p`.
    Call :func:`check_prop1_source` first.
    """
    options = prop1_options()
    cls = attention_class("belief2", **{k: options[k] for k in ("phi", "zz", "eps")})
    attn = cast("TimmAttention | StandardAttention", attn)  # check_prop1_source admits these two only
    weight = attn.qkv.weight
    new = cls(
        attn.qkv.in_features,
        num_heads=attn.num_heads,
        attn_head_dim=attn.head_dim,
        dim_out=attn.proj.out_features,
        qkv_bias=attn.qkv.bias is not None,
        proj_bias=attn.proj.bias is not None,
        attn_drop=attn.attn_drop.p,
        proj_drop=attn.proj_drop.p,
        device=weight.device,
        dtype=weight.dtype,
    )
    new.qkv, new.q_norm, new.k_norm, new.proj = attn.qkv, attn.q_norm, attn.k_norm, attn.proj
    tie_proj_p(new)
    return new.train(attn.training)
