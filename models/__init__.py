"""attnzoo.models: attention variants as timm ``attn_layer`` classes, ViT classifiers and Segmenters.

One file per paper family: ``standard`` (the base), ``belief`` (BeliefFormer), ``belief2`` (Improved
Belief-Attention), ``mabvit`` (MABViT), ``wafe`` (WAFE / anti-WAFE), ``hv`` (horizontal / vertical).
"""

from .belief import DEFAULT_EPS, BeliefAttention, BeliefStarAttention, ExclusiveAttention, OrthogonalProjection
from .belief2 import PHI_CHOICES, Belief2Attention
from .factory import (ARCHS, TASKS, convert_to_belief2, count_params, create_model, load_timm_state_dict,
                      mlp_hidden, model_config)
from .hv import HVAttention
from .mabvit import MABViTAttention, ParallelBlock
from .registry import (ALIASES, PROJECTION_VARIANTS, VARIANT_NAMES, VARIANTS, VariantSpec, attention_class,
                       canonical_name, create_attention, split_options)
from .segmenter import DECODERS, Segmenter
from .standard import StandardAttention
from .wafe import WAFEAttention

__all__ = [
    "VARIANTS", "VARIANT_NAMES", "ALIASES", "PROJECTION_VARIANTS", "VariantSpec", "ARCHS", "TASKS", "DECODERS",
    "create_attention", "attention_class", "canonical_name", "split_options", "create_model", "model_config",
    "convert_to_belief2", "load_timm_state_dict", "count_params", "mlp_hidden",
    "StandardAttention", "BeliefAttention", "BeliefStarAttention", "ExclusiveAttention", "Belief2Attention",
    "MABViTAttention", "ParallelBlock", "WAFEAttention", "HVAttention", "OrthogonalProjection", "Segmenter",
    "DEFAULT_EPS", "PHI_CHOICES",
]
