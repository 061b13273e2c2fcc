"""How much memory one forward pass of a model needs, checked before an export or a benchmark starts.

The estimate lives with the models because it reads their shapes (:data:`ARCHS`) and, for the variants whose
spec has ``pairwise_scores`` (the MAE ones), the slab of pairwise maxima (:func:`attnzoo.models.wafe.mae_block`);
the bound itself is :mod:`attnzoo.limits`'.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attnzoo.limits import available_memory

from .factory import ARCHS
from .registry import VARIANTS
from .wafe import mae_block

__all__ = ["forward_bytes", "check_forward_memory"]


def _encoder_shape(config: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """(patch height, patch width, width, heads, prefix tokens) of ``config``'s encoder: an attnzoo arch, or the
    timm ViT a converted model records (``config["timm"]``, from :func:`attnzoo.models.convert_to_belief2`)."""
    if config["arch"] in ARCHS:
        a = ARCHS[config["arch"]]
        return a["patch_size"], a["patch_size"], a["embed_dim"], a["num_heads"], 1
    vit = config.get("timm")
    if not vit:
        raise ValueError(f"unknown arch {config['arch']!r}; valid: {', '.join(ARCHS)} (or a converted timm ViT)")
    ph, pw = vit["patch_size"]
    return (
        int(ph),
        int(pw),
        int(vit["embed_dim"]),
        int(vit["num_heads"]),
        int(vit["class_token"]) + int(vit["reg_tokens"]),
    )


def forward_bytes(config: Mapping[str, Any], hw: tuple[int, int], batch: int) -> int:
    """A rough upper estimate of the memory one inference pass of ``config``'s model takes at ``batch``.

    Per image: the attention scores and their softmax (heads x N x N; for the MAE variants also one slab
    of pairwise maxima, head width x block x N), the block's token tensors and MLP hidden layer, and
    (segmentation) the upsampled logits; fp32.
    """
    ph, pw, dim, heads, prefix = _encoder_shape(config)
    h, w = hw
    tokens = -(-h // ph) * -(-w // pw) + prefix
    spec = VARIANTS.get(config["variant"])
    # pairwise scores: one (head width x block x N) slab of maxima at a time (wafe.pairwise_l1, the exported form)
    slab = dim // heads * mae_block(tokens) * tokens if spec is not None and spec.pairwise_scores else 0
    per_image = (
        2 * heads * tokens * tokens
        + slab
        + 12 * tokens * dim
        + 8 * tokens * dim
        + 3 * h * w
        + (2 * int(config.get("num_classes", 1)) * h * w if config["task"] == "seg" else 0)
    )
    return 4 * per_image * batch


def check_forward_memory(
    config: Mapping[str, Any], hw: tuple[int, int], batch: int, flag: str = "--batch-sizes"
) -> None:
    """``ValueError`` when :func:`forward_bytes` at ``batch`` exceeds the memory available now."""
    need, have = forward_bytes(config, hw, batch), available_memory()
    if have is not None and need > have:
        raise ValueError(
            f"{flag}: batch {batch} of {config['variant']} ({config['arch']}, {hw[0]}x{hw[1]}) "
            f"needs about {need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB available; "
            "use smaller batch sizes"
        )
