"""Model factory: ViT classifiers and Segmenter models for every variant; timm checkpoints; whole models
converted to Belief2 (the layer conversion of Prop. 1 is ``belief2.belief2_from_standard``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, SupportsInt, cast

import torch
from timm.data import resolve_model_data_config
from timm.layers import LayerScale, PatchEmbed
from timm.models.vision_transformer import Block, ResPostBlock, VisionTransformer
from torch import nn

from attnzoo.errors import quoted
from attnzoo.modelconfig import ARCHS, TASKS

from .belief2 import belief2_from_standard, check_prop1_source, prop1_options, tie_proj_p
from .mabvit import ParallelBlock
from .registry import VARIANTS, ModelBuild, attention_class, split_options
from .segmenter import DECODERS, Segmenter
from .stem import ConvStemPatchEmbed

__all__ = [
    "ARCHS",
    "TASKS",
    "create_model",
    "model_config",
    "load_timm_state_dict",
    "convert_to_belief2",
    "count_params",
    "mlp_hidden",
    "block_fn",
]


def _check_choice(kind: str, value: str, valid) -> None:
    if value not in valid:
        raise ValueError(f"unknown {kind} {quoted(value)}; valid: {', '.join(valid)}")


def mlp_hidden(variant: str, arch: str, **options: Any) -> int:
    """Hidden width of the block MLP for a variant: the arch's ``mlp_ratio`` x D, then each of the variant's
    model options with an ``mlp_hidden`` hook in turn (MABViT's ``pr``: 3D; Belief2's ``param_matched``: shrunk
    by the attention's extra parameters, so that the model has ``standard``'s parameter count)."""
    spec, attn, model = split_options(variant, **options)
    a = ARCHS[arch]
    build = ModelBuild(spec.name, attn, a["embed_dim"], a["num_heads"])
    hidden = int(a["embed_dim"] * a["mlp_ratio"])
    for key, value in model.items():
        hook = spec.model_options[key].mlp_hidden
        if hook is not None:
            hidden = int(hook(value, hidden, build))
    return hidden


def block_fn(variant: str, **options: Any) -> type[nn.Module]:
    """timm ``block_fn`` for a variant: ``Block``, or what its model options' ``block_fn`` hooks choose, in
    turn (MABViT's ``parallel``: :class:`ParallelBlock`)."""
    spec, _, model = split_options(variant, **options)
    block: type[nn.Module] = Block
    for key, value in model.items():
        hook = spec.model_options[key].block_fn
        if hook is not None:
            block = hook(value) or block
    return block


def create_model(
    variant: str,
    task: str = "cls",
    arch: str = "micro",
    num_classes: int | None = None,
    img_size: int | None = None,
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
        block_fn=block_fn(spec.name, **variant_options),
        embed_layer=ConvStemPatchEmbed if a.get("stem") == "conv" else PatchEmbed,
        attn_layer=attention_class(spec.name, **attn),
    )
    model: nn.Module = encoder if task == "cls" else Segmenter(encoder, num_classes, decoder=decoder)
    # nn.Module.__setattr__ is typed for Tensor | Module values; any attribute is allowed at runtime.
    model.attnzoo_config = model_config(  # type: ignore[assignment]
        spec.name, task, arch, num_classes, img_size, {**attn, **model_opts}, decoder if task == "seg" else None
    )
    return model


def model_config(
    variant: str,
    task: str,
    arch: str,
    num_classes: int,
    img_size: int,
    options: Mapping[str, Any],
    decoder: str | None = None,
) -> dict[str, Any]:
    """The JSON-able description from which :func:`create_model` rebuilds a model.

    A variant registered by an installed package (a plugin) adds ``plugin: {"package", "version"}``, so that
    loading the checkpoint where the package is missing can say what to install.
    """
    cfg = {
        "variant": variant,
        "task": task,
        "arch": arch,
        "num_classes": int(num_classes),
        "img_size": int(img_size),
        "options": dict(options),
    }
    if decoder is not None:
        cfg["decoder"] = decoder
    spec = VARIANTS.get(variant)
    if spec is not None and not spec.builtin and spec.version:  # an installed distribution, not a script
        cfg["plugin"] = {"package": spec.package, "version": spec.version}
    return cfg


def count_params(model: nn.Module) -> int:
    """Number of parameters."""
    return sum(p.numel() for p in model.parameters())


def load_timm_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> list[str]:
    """Load a timm-named ViT state dict into any variant; return the variant's parameters it did not hold.

    For a Segmenter the keys are matched against its ``encoder``. Keys the model does not have, and keys
    whose shapes differ, raise ``ValueError`` naming them -- nothing is dropped silently.
    """
    target = model.encoder if isinstance(model, Segmenter) else model
    own = target.state_dict()
    unexpected = sorted(k for k in state_dict if k not in own)
    mismatched = sorted(
        f"{k}: {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)}"
        for k in state_dict
        if k in own and own[k].shape != state_dict[k].shape
    )
    if unexpected or mismatched:
        parts = []
        if unexpected:
            parts.append(f"unexpected keys: {', '.join(unexpected[:20])}" + (" ..." if len(unexpected) > 20 else ""))
        if mismatched:
            parts.append(f"shape mismatches: {', '.join(mismatched[:20])}")
        raise ValueError("state dict does not fit the model; " + "; ".join(parts))
    result = target.load_state_dict(dict(state_dict), strict=False)
    return sorted(result.missing_keys)


#: Block classes whose forward uses ``attn`` only as ``x -> attn(x)``, so swapping the attention is exact.
_CONVERTIBLE_BLOCKS = (Block, ResPostBlock, ParallelBlock)
#: ``arch`` of a converted timm ViT whose ``pretrained_cfg`` names no architecture.
TIMM_DEFAULT_ARCH = "timm-vit"


def _timm_config(model: VisionTransformer) -> dict[str, Any]:
    """attnzoo config of a converted timm ViT: input size from the model, mean/std from its data config.

    mean/std come from ``timm.data.resolve_model_data_config`` (the model's ``pretrained_cfg``; without one,
    timm's ImageNet default). The input size is the model's own ``patch_embed.img_size``.
    """
    data = resolve_model_data_config(model)
    h, w = getattr(model.patch_embed, "img_size", None) or tuple(data["input_size"][1:])
    pretrained = getattr(model, "pretrained_cfg", None) or {}
    config = model_config(
        "belief2", "cls", pretrained.get("architecture") or TIMM_DEFAULT_ARCH, model.num_classes, h, prop1_options()
    )
    if h != w:
        config["img_size"] = [int(h), int(w)]
    config["mean"] = [float(m) for m in data["mean"]]
    config["std"] = [float(s) for s in data["std"]]
    heads = int(cast(SupportsInt, cast(nn.Module, model.blocks[0].attn).num_heads)) if len(model.blocks) else 0
    config["timm"] = {
        "class": type(model).__name__,
        "patch_size": list(model.patch_embed.patch_size),
        "embed_dim": int(model.embed_dim),
        "depth": len(model.blocks),
        "num_heads": heads,
        "class_token": model.cls_token is not None,
        "reg_tokens": int(model.num_reg_tokens),
        "layer_scale": any(isinstance(m, LayerScale) for m in model.modules()),
        "global_pool": str(model.global_pool),
    }
    return config


def _convert_timm_vit(model: VisionTransformer) -> nn.Module:
    """A deep copy of a timm ViT with every block's attention swapped for Belief2 (Prop. 1 options)."""
    for i, blk in enumerate(model.blocks):
        if type(blk) not in _CONVERTIBLE_BLOCKS:
            raise ValueError(
                f"blocks.{i} is a {type(blk).__name__}; convert_to_belief2 handles "
                f"{', '.join(c.__name__ for c in _CONVERTIBLE_BLOCKS)} blocks"
            )
        check_prop1_source(cast(nn.Module, blk.attn), f"blocks.{i}.attn")
    out = copy.deepcopy(model)
    for blk in out.blocks:
        blk.attn = belief2_from_standard(cast(nn.Module, blk.attn))
    out.attnzoo_config = _timm_config(model)  # type: ignore[assignment]  # a plain attribute (see create_model)
    return out.eval()


def convert_to_belief2(source: nn.Module | Mapping[str, torch.Tensor], **create_kwargs: Any) -> nn.Module:
    """Turn a standard model (a timm ViT, an attnzoo ``standard`` model or a timm-named state dict) into
    Belief2 computing the same function.

    Each block's attention becomes Belief2 with ``phi = identity``, ``zz`` off and ``W^p = W``, ``b^p = 0``,
    which equals standard attention (Belief2 paper, Prop. 1; the layer conversion and its proof sketch are
    :func:`attnzoo.models.belief2.belief2_from_standard`).

    A timm ``VisionTransformer`` (any patch size, width, depth, heads, LayerScale, class/register tokens,
    pooling) is deep-copied and each block's ``attn`` is swapped; everything else stays as timm built it
    (an ``attn_pool`` head keeps its own attention). Its ``attnzoo_config`` holds the input size, and mean/std
    from timm's data config (``timm.data.resolve_model_data_config``: the ``pretrained_cfg``, else timm's
    ImageNet default), so ``export_onnx(model, path)`` needs no config; edit ``model.attnzoo_config`` to
    override them.

    Args:
        source: A timm ``VisionTransformer``, a model from ``create_model("standard", ...)``, or a standard
            ViT state dict.
        **create_kwargs: ``create_model`` arguments (task, arch, num_classes, img_size ...) when ``source`` is
            a state dict; not accepted for a model.

    Returns:
        The Belief2 model in eval mode, with ``attnzoo_config``.

    Raises:
        ValueError: the source is not standard attention (another variant, a non-standard attention or block
            class, ``scale_norm``, gating), or its weights do not fit.
    """
    if isinstance(source, nn.Module):
        if create_kwargs:
            raise ValueError(f"{', '.join(sorted(create_kwargs))}: only for a state dict; a model describes itself")
        cfg = getattr(source, "attnzoo_config", None)
        if cfg is None and isinstance(source, VisionTransformer):
            return _convert_timm_vit(source)
        if cfg is None or cfg["variant"] != "standard":
            raise ValueError(
                "convert_to_belief2 needs a timm VisionTransformer with standard attention or a "
                f"'standard' model built by attnzoo.models.create_model; got a "
                f"{cfg['variant'] if cfg else type(source).__name__!r} model"
            )
        kwargs = {
            "task": cfg["task"],
            "arch": cfg["arch"],
            "num_classes": cfg["num_classes"],
            "img_size": cfg["img_size"],
        }
        if cfg["task"] == "seg":
            kwargs["decoder"] = cfg["decoder"]
        state = source.state_dict()
    else:
        kwargs = dict(create_kwargs)
        state = dict(source)
        if "num_classes" not in kwargs and "head.weight" in state and kwargs.get("task", "cls") == "cls":
            kwargs["num_classes"] = state["head.weight"].shape[0]
    model = create_model("belief2", **prop1_options(), **kwargs)
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
    encoder = model.encoder if isinstance(model, Segmenter) else cast(VisionTransformer, model)
    for blk in encoder.blocks:
        tie_proj_p(cast(nn.Module, blk.attn))
    return model.eval()
