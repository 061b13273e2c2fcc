"""MABViT: an activation on the value tensor inside attention, and the shared-LN parallel block.

Paper: Mahesh Ramesh and Aswinkumar Ramkumar, "MABViT -- Modified Attention Block Enhances Vision
Transformers", 2023, https://arxiv.org/abs/2312.01324, section "Modified Attention Block" (GLU and GELU
variants; its numbered eq. 1-4 are the Pre-LN and Post-LN blocks, and the parallel block follows them).

- ``mabvit-glu``: ``V = (X W^a) * SiLU(X W^b)`` -- a SwiGLU on the value path. ``W^a`` is the value slice of
  the timm-named ``qkv`` and ``W^b`` is the extra ``v_gate`` (D x D + bias), so the doubled value projection
  keeps ``qkv``'s shape and a standard timm checkpoint loads with only ``v_gate`` missing.
- ``mabvit-gelu``: ``V = GELU(X W^V)``; no extra parameters.
- ``parallel`` (docs/variants.md, "MABViT"): ``X <- X + attn(LN(X)) + MLP(LN(X))`` with one shared LN
  (PaLM / GPT-J style), :class:`ParallelBlock`.
- ``pr``: the paper's parameter-reduced MLP, hidden width 3D instead of 4D.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import DropPath, LayerScale, Mlp
from torch import nn

from .registry import ModelBuild, ModelOption, Paper, register_variant
from .standard import StandardAttention

__all__ = ["MABViTAttention", "ParallelBlock", "VALUE_ACTS", "PR_MLP_RATIO", "PAPER", "PARALLEL", "PR"]

PAPER = Paper(
    "MABViT -- Modified Attention Block Enhances Vision Transformers",
    "Mahesh Ramesh and Aswinkumar Ramkumar",
    2023,
    "https://arxiv.org/abs/2312.01324",
)

VALUE_ACTS = ("glu", "gelu")
#: MLP ratio of the parameter-reduced (``pr``) MABViT blocks.
PR_MLP_RATIO = 3.0


class MABViTAttention(StandardAttention):
    """Attention with a non-linearity on the value tensor.

    Args:
        value_act: ``glu`` (``V = (X W^a) * SiLU(X W^b)``, adds ``v_gate``) or ``gelu`` (``V = GELU(X W^V)``).
        **kwargs: ``timm.layers.Attention`` keywords (see :class:`StandardAttention`).
    """

    def __init__(self, dim: int, num_heads: int = 8, value_act: str = "glu", qkv_bias: bool = False, **kwargs) -> None:
        if value_act not in VALUE_ACTS:
            raise ValueError(f"unknown value_act {value_act!r}; valid: {', '.join(VALUE_ACTS)}")
        super().__init__(dim, num_heads=num_heads, qkv_bias=qkv_bias, **kwargs)
        self.value_act = value_act
        self.v_gate = self.new_linear(dim, self.attn_dim, bias=qkv_bias) if value_act == "glu" else None

    def transform_value(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.v_gate is None:
            return F.gelu(v)
        B, N, _ = x.shape
        gate = self.v_gate(x).reshape(B, N, self.num_heads, self.head_dim).transpose(1, 2)
        return v * F.silu(gate)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", value_act={self.value_act}"


def _pr_hidden(pr: bool, hidden: int, build: ModelBuild) -> int:
    return int(build.embed_dim * PR_MLP_RATIO) if pr else hidden


#: Model option ``parallel``: :class:`ParallelBlock` in place of timm's ``Block``.
PARALLEL = ModelOption(False, block_fn=lambda parallel: ParallelBlock if parallel else None)
#: Model option ``pr``: the paper's parameter-reduced MLP, hidden width 3D.
PR = ModelOption(False, mlp_hidden=_pr_hidden)
_BLOCK_OPTIONS = {"parallel": PARALLEL, "pr": PR}
#: Each value activation's extra parameters per block, in words.
_VALUE_ACT_PARAMS = {"glu": "W^b (D x D + bias)", "gelu": "none"}
for _act in VALUE_ACTS:  # mabvit-glu, mabvit-gelu
    register_variant(
        f"mabvit-{_act}",
        MABViTAttention,
        paper=PAPER,
        equations=f"Modified Attention Block ({_act.upper()})",
        options={"value_act": _act},
        model_options=_BLOCK_OPTIONS,
        extra_params=f"{_VALUE_ACT_PARAMS[_act]}; pr: MLP 3D",
        cost_family="mabvit",
    )


class ParallelBlock(nn.Module):
    """Pre-LN parallel block with one shared LayerNorm: ``x + attn(LN(x)) + mlp(LN(x))``.

    Accepts the keywords timm's ``VisionTransformer`` passes to ``block_fn``; parameter names follow timm's
    ``Block`` (``norm1``, ``attn``, ``mlp``; there is no ``norm2``).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        scale_mlp_norm: bool = False,
        proj_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        init_values: float | None = None,
        drop_path: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        mlp_layer: type[nn.Module] = Mlp,
        attn_layer: type[nn.Module] = StandardAttention,
        depth: int = 0,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        dd = {"device": device, "dtype": dtype}
        self.norm1 = norm_layer(dim, **dd)
        self.attn = attn_layer(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            scale_norm=scale_attn_norm,
            proj_bias=proj_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
            **dd,
        )
        self.ls1 = LayerScale(dim, init_values=init_values, **dd) if init_values else nn.Identity()
        self.mlp = mlp_layer(
            in_features=dim,
            hidden_features=int(dim * mlp_ratio),
            act_layer=act_layer,
            norm_layer=norm_layer if scale_mlp_norm else None,
            bias=proj_bias,
            drop=proj_drop,
            **dd,
        )
        self.ls2 = LayerScale(dim, init_values=init_values, **dd) if init_values else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        y = self.norm1(x)
        attn = self.ls1(self.attn(y, attn_mask=attn_mask, is_causal=is_causal))
        return x + self.drop_path(attn) + self.drop_path(self.ls2(self.mlp(y)))
