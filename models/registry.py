"""The variant registry: CLI name -> attention class, default options, paper and equations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Tuple, Type

from torch import nn

from .belief import DEFAULT_EPS, BeliefAttention, BeliefStarAttention, ExclusiveAttention
from .belief2 import Belief2Attention
from .hv import HVAttention
from .mabvit import MABViTAttention
from .standard import StandardAttention
from .wafe import WAFEAttention

__all__ = ["VariantSpec", "VARIANTS", "VARIANT_NAMES", "ALIASES", "PROJECTION_VARIANTS", "canonical_name",
           "split_options", "attention_class", "create_attention"]

_BELIEF = "BeliefFormer (001)"
_BELIEF2 = "Improved Belief-Attention / Belief2 (000)"
_MAB = "MABViT (002)"
_WAFE = "Divergence vs. Convergence, WAFE (003)"
_HV = "Horizontal and Vertical Attention (004)"


@dataclass(frozen=True)
class VariantSpec:
    """One attention variant.

    Attributes:
        name: CLI name.
        cls: Attention class (a ``timm.layers.Attention`` drop-in).
        options: Default attention options passed to ``cls``.
        model_options: Default model-level options (block type, MLP width).
        paper: Source paper.
        equations: Equations the class implements.
        extra_params: Parameters over ``standard`` per block, in words.
    """

    name: str
    cls: Type[nn.Module]
    options: Mapping[str, Any] = field(default_factory=dict)
    model_options: Mapping[str, Any] = field(default_factory=dict)
    paper: str = ""
    equations: str = ""
    extra_params: str = "none"

    @property
    def valid_options(self) -> Tuple[str, ...]:
        return tuple(self.options) + tuple(self.model_options)


_MAB_MODEL = {"parallel": False, "pr": False}

_SPECS = [
    VariantSpec("standard", StandardAttention, {}, {}, "Vaswani et al. 2017", "WAFE eq. 1", "none"),
    VariantSpec("belief", BeliefAttention, {"eps": DEFAULT_EPS}, {}, _BELIEF, "eq. 10-12", "none"),
    VariantSpec("belief-star", BeliefStarAttention, {"eps": DEFAULT_EPS}, {}, _BELIEF, "eq. 10, 13-15",
                "W^s (D x D + bias)"),
    VariantSpec("exclusive", ExclusiveAttention, {"eps": DEFAULT_EPS}, {}, _BELIEF2, "Remark 1 (eq. 7, W = 0)",
                "none"),
    VariantSpec("belief2", Belief2Attention, {"phi": "gelu", "zz": True, "eps": DEFAULT_EPS},
                {"param_matched": False}, _BELIEF2, "eq. 11-15, Prop. 1",
                "W^p (D x D + bias), W^Z (D x D) if zz"),
    VariantSpec("mabvit-glu", MABViTAttention, {"value_act": "glu"}, _MAB_MODEL, _MAB,
                "Modified Attention Block (GLU)", "W^b (D x D + bias); pr: MLP 3D"),
    VariantSpec("mabvit-gelu", MABViTAttention, {"value_act": "gelu"}, _MAB_MODEL, _MAB,
                "Modified Attention Block (GELU)", "none; pr: MLP 3D"),
    VariantSpec("anti-wafe-dot", WAFEAttention, {"score": "dot", "anti": True}, {}, _WAFE, "eq. 2", "none"),
    VariantSpec("wafe-mse", WAFEAttention, {"score": "mse", "anti": False}, {}, _WAFE, "eq. 3", "none"),
    VariantSpec("anti-wafe-mse", WAFEAttention, {"score": "mse", "anti": True}, {}, _WAFE, "eq. 4", "none"),
    VariantSpec("wafe-mae", WAFEAttention, {"score": "mae", "anti": False, "mae_impl": "auto"}, {}, _WAFE,
                "eq. 5", "none"),
    VariantSpec("anti-wafe-mae", WAFEAttention, {"score": "mae", "anti": True, "mae_impl": "auto"}, {}, _WAFE,
                "eq. 6", "none"),
    VariantSpec("horizontal", HVAttention, {"horizontal": True, "vertical": False}, {}, _HV, "eq. 5-6",
                "W^A1 (d x d), W^A2 (D x d), w^B, b^B"),
    VariantSpec("vertical", HVAttention, {"horizontal": False, "vertical": True, "reduction": 4}, {}, _HV,
                "eq. 7-8", "W^U1, W^U2 (D x D/4), W^U (D/4 x D), b^U"),
    VariantSpec("horizontal-vertical", HVAttention, {"horizontal": True, "vertical": True, "reduction": 4}, {},
                _HV, "eq. 5-8", "both of the above"),
]

#: Canonical variant names, in the order of SPEC.md.
VARIANT_NAMES: Tuple[str, ...] = tuple(s.name for s in _SPECS)
#: Accepted aliases -> canonical name.
ALIASES: Dict[str, str] = {"wafe-dot": "standard"}
#: name (aliases included) -> spec.
VARIANTS: Dict[str, VariantSpec] = {s.name: s for s in _SPECS}
VARIANTS.update({alias: VARIANTS[target] for alias, target in ALIASES.items()})
#: Variants whose blocks hold an orthogonal projection (checked in every exported graph).
PROJECTION_VARIANTS: Tuple[str, ...] = ("belief", "belief-star", "exclusive", "belief2")


def canonical_name(name: str) -> str:
    """Resolve case, ``_``/``-`` spelling and aliases; raise ``ValueError`` listing valid names."""
    key = str(name).strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in VARIANT_NAMES:
        raise ValueError(f"unknown variant {name!r}; valid variants: {', '.join(sorted(VARIANTS))}")
    return key


def split_options(name: str, **options: Any) -> Tuple[VariantSpec, Dict[str, Any], Dict[str, Any]]:
    """Validate ``options`` for a variant; return (spec, attention options, model options) with defaults."""
    spec = VARIANTS[canonical_name(name)]
    unknown = sorted(set(options) - set(spec.valid_options))
    if unknown:
        valid = ", ".join(spec.valid_options) or "none"
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for variant {spec.name!r}; valid options: {valid}")
    attn = {k: options.get(k, v) for k, v in spec.options.items()}
    model = {k: options.get(k, v) for k, v in spec.model_options.items()}
    return spec, attn, model


def attention_class(name: str, **options: Any) -> Type[nn.Module]:
    """A class usable as timm's ``attn_layer`` with the variant's options bound as constructor defaults.

    timm checks ``issubclass(attn_layer, ...)``, so this returns a real subclass, not a ``functools.partial``.
    Model-level options (``parallel``, ``pr``, ``param_matched``) are not accepted here.
    """
    spec, attn, model = split_options(name, **options)
    given_model = sorted(k for k in options if k in spec.model_options)
    if given_model:
        raise ValueError(f"{', '.join(given_model)} are model options of {spec.name!r}; pass them to create_model")
    base = spec.cls

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **{**attn, **kwargs})

    cls_name = "".join(p.capitalize() for p in spec.name.split("-")) + "Attention"
    return type(cls_name, (base,), {"__init__": __init__, "__module__": base.__module__,
                                    "variant": spec.name, "variant_options": dict(attn)})


def create_attention(name: str, dim: int, num_heads: int = 8, **options: Any) -> nn.Module:
    """Build one attention layer of a variant.

    Args:
        name: Variant name (see ``VARIANTS``).
        dim: Token width D.
        num_heads: Heads M.
        **options: Variant options and any ``timm.layers.Attention`` keyword (``qkv_bias``, ``attn_drop`` ...).

    Raises:
        ValueError: unknown variant or option.
    """
    spec = VARIANTS[canonical_name(name)]
    timm_kwargs = {"attn_head_dim", "dim_out", "qkv_bias", "qk_norm", "scale_norm", "proj_bias", "gated",
                   "attn_drop", "proj_drop", "norm_layer", "device", "dtype"}
    variant_opts = {k: v for k, v in options.items() if k not in timm_kwargs}
    layer_kwargs = {k: v for k, v in options.items() if k in timm_kwargs}
    return attention_class(spec.name, **variant_opts)(dim, num_heads=num_heads, **layer_kwargs)
