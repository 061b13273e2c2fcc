"""Checkpoints: safetensors weights with the model's config in the file's metadata, and a JSON beside it.

No pickle from a user file is ever executed: ``.safetensors`` is read with safetensors, and ``.pt``/``.pth``/
``.bin`` state dicts only with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from attnzoo.fileio import atomic_path, atomic_write_text
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD

__all__ = ["save_checkpoint", "load_checkpoint", "read_config", "load_state_dict_file", "build_model",
           "load_weights", "CONFIG_KEY", "NoConfigError"]

CONFIG_KEY = "attnzoo_config"
_MODEL_KEYS = ("variant", "task", "arch", "num_classes", "img_size", "decoder")


def save_checkpoint(model: nn.Module, path: Union[str, Path], *, class_names, mean=DEFAULT_MEAN,
                    std=DEFAULT_STD, extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Save ``model`` (built by ``create_model``) as ``path`` (.safetensors) plus ``path.json``.

    The safetensors metadata holds the config needed to rebuild the model (variant, options, task, arch,
    classes, input size, mean/std); the JSON beside it holds that and ``extra`` (data, seed, history...).
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
    config = {**base, "class_names": class_names, "mean": [float(m) for m in mean],
              "std": [float(s) for s in std]}
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata={CONFIG_KEY: json.dumps(config)})
    full = {**config, **dict(extra or {})}
    atomic_write_text(path.with_suffix(".json"), json.dumps(full, indent=2) + "\n")
    return full


class NoConfigError(ValueError):
    """The file has no attnzoo config (a plain state dict): the caller must describe the model."""


def read_config(path: Union[str, Path]) -> Dict[str, Any]:
    """The config of a checkpoint: the JSON beside it when present, else the safetensors metadata.

    Raises:
        NoConfigError: neither holds a config (a plain state dict).
        ValueError: a config is there but unreadable or not an attnzoo config.
    """
    path = Path(path)
    side = path.with_suffix(".json")
    if side.is_file():
        try:
            config = json.loads(side.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{side}: cannot read the checkpoint config ({exc})") from None
        source = side
    else:
        meta = {}
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    meta = f.metadata() or {}
            except Exception as exc:  # safetensors raises its own error types
                raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
        if CONFIG_KEY not in meta:
            raise NoConfigError(f"{path}: no attnzoo config in its metadata and no {side.name} beside it")
        try:
            config = json.loads(meta[CONFIG_KEY])
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: cannot read the config in its metadata ({exc})") from None
        source = path
    missing = [k for k in ("variant", "task", "arch", "num_classes", "img_size") if k not in config]
    if not isinstance(config, dict) or missing:
        raise ValueError(f"{source}: not an attnzoo checkpoint config (missing {', '.join(missing) or 'keys'})")
    return config


def load_state_dict_file(path: Union[str, Path]) -> Dict[str, torch.Tensor]:
    """Read a state dict without executing any pickle.

    ``.safetensors`` via safetensors; anything else via ``torch.load(weights_only=True)``, which refuses
    arbitrary objects. A ``{"state_dict": ...}`` or ``{"model": ...}`` wrapper is unwrapped.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as exc:
            raise ValueError(f"{path}: not a readable safetensors file ({exc})") from exc
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: refused to load (only plain tensor state dicts are read, with "
                         f"torch.load(weights_only=True); no pickle is executed): {first}") from exc
    for key in ("state_dict", "model", "model_state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"{path}: not a state dict of tensors")
    return obj


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """Rebuild an (untrained) model from a checkpoint config."""
    from attnzoo.models import create_model

    kwargs = {k: config[k] for k in _MODEL_KEYS if k in config}
    return create_model(**kwargs, **dict(config.get("options", {})))


def load_weights(model: nn.Module, state: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
    """Strict load with one clear error naming missing and unexpected keys (and shape mismatches)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    mismatched = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or mismatched:
        def _fmt(keys):
            return ", ".join(keys[:8]) + (f" ... ({len(keys)} in all)" if len(keys) > 8 else "")
        parts = [f"missing keys: {_fmt(missing)}" if missing else "",
                 f"unexpected keys: {_fmt(unexpected)}" if unexpected else "",
                 f"shape mismatches: {_fmt(mismatched)}" if mismatched else ""]
        variant = getattr(model, "attnzoo_config", {}).get("variant", "?")
        raise ValueError(f"{source} does not match variant {variant!r}: " + "; ".join(p for p in parts if p))
    model.load_state_dict(dict(state), strict=True)


def load_checkpoint(path: Union[str, Path]) -> Tuple[nn.Module, Dict[str, Any]]:
    """Load a checkpoint saved by :func:`save_checkpoint`; returns ``(model in eval mode, config)``."""
    config = read_config(path)
    model = build_model(config)
    load_weights(model, load_state_dict_file(path), source=str(path))
    return model.eval(), config
