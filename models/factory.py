"""Model factory: ViT classifiers and Segmenter models for every variant; timm checkpoints; Prop. 1 conversion."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Union

import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import Block, VisionTransformer
from torch import nn

from .belief2 import belief2_extra_params
from .mabvit import PR_MLP_RATIO, ParallelBlock
from .registry import attention_class, split_options
from .segmenter import DECODERS, Segmenter
from .stem import ConvStemPatchEmbed

__all__ = ["ARCHS", "TASKS", "create_model", "model_config", "load_timm_state_dict", "convert_to_belief2",
           "count_params", "mlp_hidden"]

#: Architectures: ViT-Ti/S/B at 224 px as in timm, ``micro`` for CPU training at 32 px (~0.2 M params), and
#: ``micro-conv``, micro with a convolutional stem (``stem="conv"``) for small real images.
ARCHS: Dict[str, Dict[str, Any]] = {
    "micro": dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=4.0),
    # micro with a convolutional stem (models/stem.py), for 28-64 px images such as Fashion-MNIST
    "micro-conv": dict(img_size=28, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=4.0, stem="conv"),
    "tiny": dict(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0),
    "small": dict(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6, mlp_ratio=4.0),
    "base": dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0),
}
TASKS = ("cls", "seg")


def _check_choice(kind: str, value: str, valid) -> None:
    if value not in valid:
        raise ValueError(f"unknown {kind} {value!r}; valid: {', '.join(valid)}")


def mlp_hidden(variant: str, arch: str, **options: Any) -> int:
    """Hidden width of the block MLP for a variant: 4D, 3D with MABViT ``pr``, or shrunk so that a
    ``param_matched`` Belief2 model has the parameter count of ``standard`` (Belief2 paper, sec. 4)."""
    spec, attn, model = split_options(variant, **options)
    a = ARCHS[arch]
    dim = a["embed_dim"]
    if model.get("pr"):
        return int(dim * PR_MLP_RATIO)
    hidden = int(dim * a["mlp_ratio"])
    if model.get("param_matched"):
        extra = belief2_extra_params(dim, bool(attn["zz"]))
        hidden -= round(extra / (2 * dim + 1))  # each hidden unit costs 2D weights + 1 bias
    return hidden


def create_model(
        variant: str,
        task: str = "cls",
        arch: str = "micro",
        num_classes: Optional[int] = None,
        img_size: Optional[int] = None,
        decoder: str = "linear",
        drop_path_rate: float = 0.0,
        **variant_options: Any,
) -> nn.Module:
    """Build a classifier (timm ``VisionTransformer``) or a Segmenter with the variant's attention.

    Args:
        variant: Variant name (``attnzoo.models.VARIANTS``).
        task: ``cls`` (logits (B, K)) or ``seg`` (logits (B, K, H, W)).
        arch: ``micro``, ``tiny``, ``small`` or ``base`` (``ARCHS``).
        num_classes: K (default 1000 for cls, 150 for seg, as ImageNet / ADE20K).
        img_size: Training input size (default: the arch's).
        decoder: Segmentation decoder, ``linear`` or ``mask``.
        drop_path_rate: Stochastic depth.
        **variant_options: Options of the variant (see ``VARIANTS[name].valid_options``).

    Returns:
        The model; ``model.attnzoo_config`` holds everything needed to rebuild it.

    Raises:
        ValueError: unknown variant, option, task, arch or decoder.
    """
    _check_choice("task", task, TASKS)
    _check_choice("arch", arch, tuple(ARCHS))
    spec, attn, model_opts = split_options(variant, **variant_options)
    if task == "seg":
        _check_choice("decoder", decoder, DECODERS)
    num_classes = int(num_classes if num_classes is not None else (1000 if task == "cls" else 150))
    a = ARCHS[arch]
    img_size = int(img_size or a["img_size"])
    if img_size % a["patch_size"]:
        raise ValueError(f"img_size {img_size} must be a multiple of the patch size {a['patch_size']}")
    hidden = mlp_hidden(spec.name, arch, **variant_options)
    block_fn = ParallelBlock if model_opts.get("parallel") else Block
    encoder = VisionTransformer(
        img_size=img_size,
        patch_size=a["patch_size"],
        embed_dim=a["embed_dim"],
        depth=a["depth"],
        num_heads=a["num_heads"],
        mlp_ratio=(hidden + 0.5) / a["embed_dim"],  # timm takes int(dim * ratio) -> exactly `hidden`
        num_classes=num_classes if task == "cls" else 0,
        dynamic_img_size=(task == "seg"),
        drop_path_rate=drop_path_rate,
        block_fn=block_fn,
        embed_layer=ConvStemPatchEmbed if a.get("stem") == "conv" else PatchEmbed,
        attn_layer=attention_class(spec.name, **attn),
    )
    model: nn.Module = encoder if task == "cls" else Segmenter(encoder, num_classes, decoder=decoder)
    model.attnzoo_config = model_config(spec.name, task, arch, num_classes, img_size,
                                        {**attn, **model_opts}, decoder if task == "seg" else None)
    return model


def model_config(variant: str, task: str, arch: str, num_classes: int, img_size: int,
                 options: Mapping[str, Any], decoder: Optional[str] = None) -> Dict[str, Any]:
    """The JSON-able description from which :func:`create_model` rebuilds a model."""
    cfg = {"variant": variant, "task": task, "arch": arch, "num_classes": int(num_classes),
           "img_size": int(img_size), "options": dict(options)}
    if decoder is not None:
        cfg["decoder"] = decoder
    return cfg


def count_params(model: nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


def load_timm_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> List[str]:
    """Load a timm-named ViT state dict into any variant; return the variant's parameters it did not hold.

    For a Segmenter the keys are matched against its ``encoder``. Keys the model does not have, and keys
    whose shapes differ, raise ``ValueError`` naming them -- nothing is dropped silently.
    """
    target = model.encoder if isinstance(model, Segmenter) else model
    own = target.state_dict()
    unexpected = sorted(k for k in state_dict if k not in own)
    mismatched = sorted(f"{k}: {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}"
                        for k in state_dict if k in own and own[k].shape != state_dict[k].shape)
    if unexpected or mismatched:
        parts = []
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected[:20])}" + (" ..." if len(unexpected) > 20 else ""))
        if mismatched:
            parts.append(f"shape mismatches: {', '.join(mismatched[:20])}")
        raise ValueError("state dict does not fit the model; " + "; ".join(parts))
    result = target.load_state_dict(dict(state_dict), strict=False)
    return sorted(result.missing_keys)


def convert_to_belief2(source: Union[nn.Module, Mapping[str, torch.Tensor]], **create_kwargs: Any) -> nn.Module:
    """Turn a standard model (or a timm-named standard state dict) into Belief2 with the same function.

    Belief2 with ``phi = identity``, ``zz`` off and ``W^p = W`` equals standard attention (Belief2 paper,
    Prop. 1): ``(MH - aV) W + b + (aV) W = MH W + b``. So ``proj_p.weight = proj.weight`` and
    ``proj_p.bias = 0`` (the bias is added once, by ``proj``).

    Args:
        source: A model from ``create_model("standard", ...)`` or a standard ViT state dict.
        **create_kwargs: ``create_model`` arguments (task, arch, num_classes, img_size ...) when ``source`` is
            a state dict; ignored for a model, whose ``attnzoo_config`` is used.

    Returns:
        The Belief2 model in eval mode.
    """
    if isinstance(source, nn.Module):
        cfg = getattr(source, "attnzoo_config", None)
        if cfg is None or cfg["variant"] != "standard":
            raise ValueError("convert_to_belief2 needs a 'standard' model built by attnzoo.models.create_model")
        kwargs = {"task": cfg["task"], "arch": cfg["arch"], "num_classes": cfg["num_classes"],
                  "img_size": cfg["img_size"]}
        if cfg["task"] == "seg":
            kwargs["decoder"] = cfg["decoder"]
        state = source.state_dict()
    else:
        kwargs = dict(create_kwargs)
        state = dict(source)
        if "num_classes" not in kwargs and "head.weight" in state and kwargs.get("task", "cls") == "cls":
            kwargs["num_classes"] = state["head.weight"].shape[0]
    model = create_model("belief2", phi="identity", zz=False, param_matched=False, **kwargs)
    if isinstance(source, nn.Module):
        result = model.load_state_dict(state, strict=False)
        missing, unexpected = result.missing_keys, result.unexpected_keys
        if unexpected:
            raise ValueError(f"unexpected keys: {', '.join(unexpected)}")
    else:
        missing = load_timm_state_dict(model, state)
    not_proj_p = [k for k in missing if not k.endswith(("attn.proj_p.weight", "attn.proj_p.bias"))]
    if not_proj_p:
        raise ValueError(f"the standard weights lack: {', '.join(not_proj_p[:20])}")
    encoder = model.encoder if isinstance(model, Segmenter) else model
    with torch.no_grad():
        for blk in encoder.blocks:
            blk.attn.proj_p.weight.copy_(blk.attn.proj.weight)
            if blk.attn.proj_p.bias is not None:
                blk.attn.proj_p.bias.zero_()
    return model.eval()

