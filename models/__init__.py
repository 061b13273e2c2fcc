"""attnzoo.models: attention variants as timm ``attn_layer`` classes, ViT classifiers and Segmenters.

One file per paper family, each registering its variants beside its classes: ``standard`` (the base),
``belief`` (BeliefFormer), ``belief2`` (Improved Belief-Attention), ``mabvit`` (MABViT), ``wafe`` (WAFE /
anti-WAFE), ``hv`` (horizontal / vertical). They are imported below in that order, which is the built-in order
of the variants. Your own variant: :func:`register_variant` (see docs/your-own-variant.md); installed packages
with an entry point in the group ``attnzoo.variants`` are loaded at the end of this import.
"""

# isort: off
from .registry import (
    ALIASES,
    BUILTIN_PACKAGE,
    BUILTIN_VARIANTS,
    ENTRY_POINT_GROUP,
    VARIANT_NAMES,
    VARIANTS,
    ModelBuild,
    ModelOption,
    Paper,
    PluginWarning,
    VariantSpec,
    attention_class,
    canonical_name,
    create_attention,
    load_plugins,
    register_variant,
    split_options,
)
from .standard import StandardAttention
from .belief import DEFAULT_EPS, PROJECTION_OPS, BeliefAttention, BeliefStarAttention, OrthogonalProjection
from .belief2 import PHI_CHOICES, Belief2Attention, ExclusiveAttention
from .mabvit import MABViTAttention, ParallelBlock
from .wafe import KEY_NORM_OPS, WAFEAttention
from .hv import HVAttention

# isort: on
from .factory import (
    ARCHS,
    TASKS,
    block_fn,
    convert_to_belief2,
    count_params,
    create_model,
    load_timm_state_dict,
    mlp_hidden,
    model_config,
)
from .segmenter import DECODERS, Segmenter

__all__ = [
    "VARIANTS",
    "VARIANT_NAMES",
    "BUILTIN_VARIANTS",
    "ALIASES",
    "VariantSpec",
    "ModelOption",
    "ModelBuild",
    "Paper",
    "ARCHS",
    "TASKS",
    "DECODERS",
    "register_variant",
    "load_plugins",
    "PluginWarning",
    "ENTRY_POINT_GROUP",
    "BUILTIN_PACKAGE",
    "PROJECTION_OPS",
    "KEY_NORM_OPS",
    "create_attention",
    "attention_class",
    "canonical_name",
    "split_options",
    "create_model",
    "model_config",
    "convert_to_belief2",
    "load_timm_state_dict",
    "count_params",
    "mlp_hidden",
    "block_fn",
    "StandardAttention",
    "BeliefAttention",
    "BeliefStarAttention",
    "ExclusiveAttention",
    "Belief2Attention",
    "MABViTAttention",
    "ParallelBlock",
    "WAFEAttention",
    "HVAttention",
    "OrthogonalProjection",
    "Segmenter",
    "DEFAULT_EPS",
    "PHI_CHOICES",
]

# Plugins (entry-point group attnzoo.variants) load at the first lookup of a variant name, not here: importing the
# package, and every command's --help, runs no third-party code (registry.load_plugins).

# The zoo's trained models as timm models (timm.create_model("vit_micro_conv_belief2.fashion_mnist", pretrained=True)),
# registered here so that importing attnzoo.models is all a timm user does: the one import of the layer above
# (attnzoo.zoo.hub reads the zoo's listing and builds with the factory above; docs/architecture.md).
from attnzoo.zoo import hub as _zoo_hub  # noqa: F401  # isort: skip
