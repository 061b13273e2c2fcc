"""attnzoo.models: attention variants as timm ``attn_layer`` classes, ViT classifiers and Segmenters.

One file per paper family: ``standard`` (the base), ``belief`` (BeliefFormer), ``belief2`` (Improved
Belief-Attention), ``mabvit`` (MABViT), ``wafe`` (WAFE / anti-WAFE), ``hv`` (horizontal / vertical).
Your own variant: :func:`register_variant` (see docs/your-own-variant.md); installed packages with an entry point
in the group ``attnzoo.variants`` are loaded at the end of this import.
"""

from .belief import DEFAULT_EPS, BeliefAttention, BeliefStarAttention, ExclusiveAttention, OrthogonalProjection
from .belief2 import PHI_CHOICES, Belief2Attention
from .factory import (ARCHS, TASKS, convert_to_belief2, count_params, create_model, load_timm_state_dict,
                      mlp_hidden, model_config)
from .hv import HVAttention
from .mabvit import MABViTAttention, ParallelBlock
from .registry import (ALIASES, BUILTIN_PACKAGE, BUILTIN_VARIANTS, ENTRY_POINT_GROUP, PROJECTION_OPS, VARIANT_NAMES,
                       VARIANTS, PluginWarning, VariantSpec, attention_class, canonical_name, create_attention,
                       load_plugins, register_variant, split_options)
from .segmenter import DECODERS, Segmenter
from .standard import StandardAttention
from .wafe import WAFEAttention

__all__ = [
    "VARIANTS", "VARIANT_NAMES", "BUILTIN_VARIANTS", "ALIASES", "VariantSpec", "ARCHS", "TASKS", "DECODERS",
    "register_variant", "load_plugins", "PluginWarning", "ENTRY_POINT_GROUP", "BUILTIN_PACKAGE", "PROJECTION_OPS",
    "create_attention", "attention_class", "canonical_name", "split_options", "create_model", "model_config",
    "convert_to_belief2", "load_timm_state_dict", "count_params", "mlp_hidden",
    "StandardAttention", "BeliefAttention", "BeliefStarAttention", "ExclusiveAttention", "Belief2Attention",
    "MABViTAttention", "ParallelBlock", "WAFEAttention", "HVAttention", "OrthogonalProjection", "Segmenter",
    "DEFAULT_EPS", "PHI_CHOICES",
]

load_plugins()  # last: a plugin imports register_variant (and anything else) from this package
