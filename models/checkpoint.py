"""Checkpoints: safetensors weights with the model's config in the file's metadata, and a JSON beside it.

No pickle from a user file is ever executed: ``.safetensors`` is read with safetensors, and ``.pt``/``.pth``/
``.bin`` state dicts only with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer
from torch import nn

import attnzoo.models
from attnzoo.fileio import atomic_path, atomic_write_text
from attnzoo.filekind import SAFETENSORS, checkpoint_kind
from attnzoo.modelconfig import validate_config
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, INPUT_STYLES

from .registry import VARIANTS, canonical_name

__all__ = [
    "save_checkpoint",
    "load_checkpoint",
    "read_config",
    "load_state_dict_file",
    "build_model",
    "load_weights",
    "init_encoder",
    "check_encoder_source",
    "CONFIG_KEY",
    "NoConfigError",
    "require_variant",
]

CONFIG_KEY = "attnzoo_config"
_MODEL_KEYS = ("variant", "task", "arch", "num_classes", "img_size", "decoder")


def save_checkpoint(
    model: nn.Module,
    path: str | Path,
    *,
    class_names,
    mean=DEFAULT_MEAN,
    std=DEFAULT_STD,
    input_style: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Save ``model`` (built by ``create_model``) as ``path`` (.safetensors) plus ``path.json``.

    The safetensors metadata holds the config needed to rebuild the model (variant, options, task, arch,
    classes, input size, mean/std, ``input_style`` when given: how an image is converted to look like the training
    data); the JSON beside it holds that and ``extra`` (data, seed, history...).
    Both are written atomically. Returns the full config.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"checkpoint path must end in .safetensors, got {path}")
    base = getattr(model, "attnzoo_config", None)
    if base is None:
        raise ValueError("model has no attnzoo_config; build it with attnzoo.models.create_model")
    class_names = [str(c) for c in class_names]
    if len(class_names) != base["num_classes"]:
        raise ValueError(f"{len(class_names)} class names for a model with {base['num_classes']} classes")
    config = {**base, "class_names": class_names, "mean": [float(m) for m in mean], "std": [float(s) for s in std]}
    if input_style is not None:
        if input_style not in INPUT_STYLES:
            raise ValueError(f"unknown input style {input_style!r}; valid: {', '.join(INPUT_STYLES)}")
        config["input_style"] = input_style
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={CONFIG_KEY: json.dumps(config)})
    full = {**config, **dict(extra or {})}
    atomic_write_text(path.with_suffix(".json"), json.dumps(full, indent=2) + "\n")
    return full


class NoConfigError(ValueError):
    """The file has no attnzoo config (a plain state dict): the caller must describe the model."""


def _metadata_config(path: Path) -> dict[str, Any] | None:
    """The config :func:`save_checkpoint` stores in the safetensors metadata (covered by the file's sha256), or
    ``None`` when there is none (a plain state dict, or not a safetensors file)."""
    if checkpoint_kind(path) != SAFETENSORS:
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types
        raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
    if CONFIG_KEY not in meta:
        return None
    try:
        return json.loads(meta[CONFIG_KEY])
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: cannot read the config in its metadata ({exc})") from None
    except RecursionError:
        raise ValueError(f"{path}: cannot read the config in its metadata (JSON nested too deep)") from None


def read_config(path: str | Path) -> dict[str, Any]:
    """The config of a checkpoint: the JSON beside it when present, else the safetensors metadata.

    The model-defining config (variant, options, classes and their names, input size, mean/std, input style) lives
    in the safetensors metadata, so the checkpoint's sha256 covers it; the JSON beside it repeats it and adds the
    training record. When both are there, every key of the metadata config must have the same value in the JSON:
    a JSON edited after the checkpoint was written (reversed ``class_names``) is refused, never exported or served
    under the checkpoint's sha256.

    Raises:
        NoConfigError: neither holds a config (a plain state dict).
        ValueError: ``path`` is not a checkpoint (:func:`attnzoo.filekind.checkpoint_kind`: missing, a directory,
            an ONNX model ...), a config is there but unreadable or not an attnzoo config, or the JSON disagrees
            with the checkpoint's own config (the keys named).
    """
    path = Path(path)
    side = path.with_suffix(".json")
    stored = _metadata_config(path)
    if side.is_file():
        try:
            config = json.loads(side.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{side}: cannot read the checkpoint config ({exc})") from None
        except RecursionError:  # json's decoder recurses once per nesting level
            raise ValueError(f"{side}: cannot read the checkpoint config (JSON nested too deep)") from None
        if isinstance(config, dict) and isinstance(stored, dict):
            differ = [k for k in stored if config.get(k) != stored[k]]
            if differ:
                raise ValueError(
                    f"{side}: its {', '.join(differ[:5])} differ from the config stored in {path.name} (which the "
                    "checkpoint's sha256 covers); the JSON was edited after the checkpoint was written: restore it "
                    "or delete it"
                )
        source = side
    else:
        if stored is None:
            raise NoConfigError(f"{path}: no attnzoo config in its metadata and no {side.name} beside it")
        config, source = stored, path
    return validate_config(config, source)


def load_state_dict_file(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict without executing any pickle.

    safetensors via safetensors; a PyTorch save via ``torch.load(weights_only=True)``, which refuses arbitrary
    objects (:func:`attnzoo.filekind.checkpoint_kind` tells them apart and refuses anything else by name). A
    ``{"state_dict": ...}`` or ``{"model": ...}`` wrapper is unwrapped.
    """
    path = Path(path)
    if checkpoint_kind(path) == SAFETENSORS:
        try:
            return load_file(str(path))
        except Exception as exc:
            raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{path}: refused to load (only plain tensor state dicts are read, with "
            f"torch.load(weights_only=True); no pickle is executed): {first}"
        ) from exc
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path}: not a state dict of tensors")
    return obj


def require_variant(config: Mapping[str, Any], source: Any = "model"):
    """The registered :class:`~attnzoo.models.VariantSpec` of a config's variant.

    Raises:
        ValueError: one line: the variant is not registered; when the config records the plugin package that
            registered it (``plugin: {package, version}``), which package to install.
    """
    plugin = config.get("plugin") if isinstance(config.get("plugin"), dict) else None
    try:
        return VARIANTS[canonical_name(config["variant"])]
    except ValueError as exc:
        if plugin and plugin.get("package"):
            pkg, ver = str(plugin["package"]), str(plugin.get("version") or "")
            pin = f"{pkg}=={ver}" if ver else pkg
            raise ValueError(
                f"{source}: variant {config['variant']!r} comes from the plugin package {pkg!r}"
                f"{f' {ver}' if ver else ''}, which is not installed here; install it "
                f"(pip install '{pin}') so that its entry point in 'attnzoo.variants' registers the "
                "variant"
            ) from None
        raise ValueError(f"{source}: {exc}") from None


def build_model(config: Mapping[str, Any], source: Any = "model") -> nn.Module:
    """Rebuild an (untrained) model from a checkpoint config (its variant must be registered: see
    :func:`require_variant`)."""
    require_variant(config, source)
    kwargs = {k: config[k] for k in _MODEL_KEYS if k in config}
    return attnzoo.models.create_model(**kwargs, **dict(config.get("options", {})))


def load_weights(model: nn.Module, state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Strict load with one clear error naming missing and unexpected keys (and shape mismatches)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or mismatched:

        def _fmt(keys):
            return ", ".join(keys[:8]) + (f" ... ({len(keys)} in all)" if len(keys) > 8 else "")

        parts = [
            f"missing keys: {_fmt(missing)}" if missing else "",
            f"unexpected keys: {_fmt(unexpected)}" if unexpected else "",
            f"shape mismatches: {_fmt(mismatched)}" if mismatched else "",
        ]
        variant = getattr(model, "attnzoo_config", {}).get("variant", "?")
        raise ValueError(f"{source} does not match variant {variant!r}: " + "; ".join(p for p in parts if p))
    model.load_state_dict(dict(state), strict=True)


def check_encoder_source(path: str | Path, variant: str, arch: str) -> dict[str, Any]:
    """The config of checkpoint ``path`` after checking it can start a ``variant``/``arch`` encoder.

    Raises:
        ValueError: unreadable, or another variant or arch (named in the message).
    """
    src = read_config(path)
    for key, want in (("variant", canonical_name(variant)), ("arch", arch)):
        if src.get(key) != want:
            raise ValueError(f"{path}: its {key} is {src.get(key)!r}; it cannot start a {want!r} encoder")
    return src


def init_encoder(model: nn.Module, path: str | Path) -> int:
    """Copy the ViT encoder of a checkpoint (e.g. the same variant's classifier) into ``model``'s encoder.

    The pretrained-encoder start of Segmenter (Strudel et al. 2021): every encoder tensor is copied and the
    classifier's ``head`` is dropped; ``pos_embed`` is resampled to ``model``'s token grid (timm's
    ``resample_abs_pos_embed``, bicubic) when the input sizes differ. ``model`` is a segmenter (its
    ``encoder``) or a classifier (whose own head stays as initialised).

    Returns:
        The number of tensors copied.

    Raises:
        ValueError: the checkpoint is another variant or arch, or an encoder tensor is missing, extra or
            mis-shaped (:func:`load_weights`' message).
    """
    own: Any = getattr(model, "attnzoo_config", {})  # its config dict; check_encoder_source compares the names
    check_encoder_source(path, own.get("variant"), own.get("arch"))
    encoder = cast(VisionTransformer, getattr(model, "encoder", model))  # a segmenter or a ViT classifier
    state = {k: v for k, v in load_state_dict_file(path).items() if not k.startswith("head.")}
    target = encoder.state_dict()
    if "pos_embed" in state and "pos_embed" in target and state["pos_embed"].shape != target["pos_embed"].shape:
        prefix = 0 if encoder.no_embed_class else encoder.num_prefix_tokens
        old = math.isqrt(state["pos_embed"].shape[1] - prefix)
        state["pos_embed"] = resample_abs_pos_embed(
            state["pos_embed"], list(encoder.patch_embed.grid_size), old_size=[old, old], num_prefix_tokens=prefix
        )
    own_head = {k: v for k, v in target.items() if k.startswith("head.")}  # stays as initialised
    load_weights(encoder, {**state, **own_head}, source=str(path))
    return len(state)


def load_checkpoint(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """Load a checkpoint saved by :func:`save_checkpoint`; returns ``(model in eval mode, config)``."""
    config = read_config(path)
    model = build_model(config, path)
    load_weights(model, load_state_dict_file(path), source=str(path))
    return model.eval(), config
