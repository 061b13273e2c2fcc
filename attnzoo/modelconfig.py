"""A model's config, as checkpoints and exported files carry it: its tasks, archs and variant names, its check and its
logits' check.

Plain Python (no torch): the runtime reads an exported file's contract, a serving replica checks a model's logits,
and every command checks a variant or arch name it is given, without importing PyTorch or timm (the registry,
:mod:`attnzoo.models`, imports both).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from attnzoo.limits import MAX_CLASSES, check_side

__all__ = [
    "TASKS",
    "ARCHS",
    "BUILTIN_VARIANT_NAMES",
    "BUILTIN_VARIANT_ALIASES",
    "VARIANT_ENTRY_POINTS",
    "variant_key",
    "plugins_installed",
    "known_variants",
    "variant_names",
    "check_variant",
    "validate_config",
    "check_logits",
]

#: What a model does: ``cls`` (one label per image) or ``seg`` (one label per pixel).
TASKS = ("cls", "seg")
#: Architectures: ViT-Ti/S/B at 224 px as in timm, ``micro`` for CPU training at 32 px (~0.2 M params), and
#: ``micro-conv``, micro with a convolutional stem (``stem="conv"``) for small real images.
ARCHS: dict[str, dict[str, Any]] = {
    "micro": dict(img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=4.0),
    # micro with a convolutional stem (models/stem.py), for 28-64 px images such as Fashion-MNIST
    "micro-conv": dict(img_size=28, patch_size=4, embed_dim=64, depth=4, num_heads=2, mlp_ratio=4.0, stem="conv"),
    "tiny": dict(img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0),
    "small": dict(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6, mlp_ratio=4.0),
    "base": dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0),
}
#: The built-in variants in their order, and their aliases: what a command checks a variant name against before
#: it imports PyTorch. Each is registered beside its class (``attnzoo.models``), and the registry refuses a
#: built-in registration that is not listed here as it is registered, so the two cannot drift apart.
BUILTIN_VARIANT_NAMES: tuple[str, ...] = (
    "standard",
    "belief",
    "belief-star",
    "exclusive",
    "belief2",
    "mabvit-glu",
    "mabvit-gelu",
    "anti-wafe-dot",
    "wafe-mse",
    "anti-wafe-mse",
    "wafe-mae",
    "anti-wafe-mae",
    "horizontal",
    "vertical",
    "horizontal-vertical",
)
BUILTIN_VARIANT_ALIASES: dict[str, str] = {"wafe-dot": "standard"}
#: Entry-point group of third-party variant packages (docs/your-own-variant.md).
VARIANT_ENTRY_POINTS = "attnzoo.variants"


def variant_key(name: Any) -> str:
    """A variant name as the registry looks it up: case and ``_`` / ``-`` spelling folded."""
    return str(name).strip().lower().replace("_", "-")


def plugins_installed() -> bool:
    """Whether an installed package declares a variant plugin (:data:`VARIANT_ENTRY_POINTS`): its variants are
    known only once the registry has run it, which imports PyTorch."""
    return bool(metadata.entry_points(group=VARIANT_ENTRY_POINTS))


#: The registry's module: once a process has imported it (and torch with it), it answers for every variant, those
#: registered in this process by ``register_variant`` included.
_REGISTRY_MODULE = "attnzoo.models.registry"


def known_variants() -> dict[str, str] | None:
    """Every accepted variant name (aliases included) -> its canonical name, where that is known without PyTorch:
    no variant plugin is installed and this process has not loaded the registry, so the built-ins are all. ``None``
    otherwise: the registry knows the names (a plugin's, or a variant this process registered)."""
    if _REGISTRY_MODULE in sys.modules or plugins_installed():
        return None
    return {**{name: name for name in BUILTIN_VARIANT_NAMES}, **BUILTIN_VARIANT_ALIASES}


def variant_names() -> tuple[str, ...] | None:
    """Every variant's canonical name, in the registry's order, where that is known without PyTorch (as for
    :func:`known_variants`: the built-ins); ``None`` otherwise (``attnzoo.models.VARIANT_NAMES``)."""
    return None if known_variants() is None else BUILTIN_VARIANT_NAMES


def check_variant(name: Any) -> str | None:
    """The canonical name of the variant ``name`` names, checked without PyTorch; ``None`` where the name is not a
    built-in's and only the registry can tell (:func:`known_variants`: ``attnzoo.models.canonical_name``).

    Raises:
        ValueError: an unknown name, none being installed that could register it: the registry's own line
            (``unknown variant 'x'; valid variants: ...``).
    """
    key = variant_key(name)
    key = BUILTIN_VARIANT_ALIASES.get(key, key)
    if key in BUILTIN_VARIANT_NAMES:
        return key
    known = known_variants()
    if known is None:
        return None
    raise ValueError(f"unknown variant {name!r}; valid variants: {', '.join(sorted(known))}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_config(config: Any, source: Any = "model") -> dict[str, Any]:
    """Check a model config (a checkpoint's, or an ONNX file's ``attnzoo.config``) before anything is built.

    Checks that it is a JSON object with variant, task, arch, ``num_classes`` (1..``MAX_CLASSES``) and
    ``img_size`` (1..``MAX_SIDE``); that ``class_names``, when given, has ``num_classes`` entries; and that
    ``mean``/``std``, when given, are 3 finite numbers (std non-zero). Returns ``config``.

    Raises:
        ValueError: one line naming ``source`` and the first problem found.
    """
    if not isinstance(config, dict):
        raise ValueError(f"{source}: the model config is a JSON {type(config).__name__}, not an object")
    missing = [k for k in ("variant", "task", "arch", "num_classes", "img_size") if k not in config]
    if missing:
        raise ValueError(f"{source}: not an attnzoo model config (missing {', '.join(missing)})")
    if config["task"] not in TASKS:
        raise ValueError(f"{source}: unknown task {config['task']!r}; valid: {', '.join(TASKS)}")
    k = config["num_classes"]
    if not _is_int(k) or not 1 <= k <= MAX_CLASSES:
        raise ValueError(f"{source}: num_classes must be an integer in 1..{MAX_CLASSES}, got {k!r}")
    check_side(config["img_size"], f"{source}: img_size")
    names = config.get("class_names")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, (str, int)) for n in names):
            raise ValueError(f"{source}: class_names must be a list of names")
        if len(names) != k:
            raise ValueError(f"{source}: {len(names)} class names for {k} classes")
    for key in ("mean", "std"):
        v = config.get(key)
        if v is not None and (
            not isinstance(v, list)
            or len(v) != 3
            or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)
            or (key == "std" and not all(v))
        ):
            raise ValueError(
                f"{source}: {key} must be 3 finite numbers{' (non-zero)' if key == 'std' else ''}, got {v!r}"
            )
    if not isinstance(config.get("options", {}), dict):
        raise ValueError(f"{source}: options must be a JSON object")
    return config


def check_logits(class_names: Sequence[str], logits_shape: Sequence[int], task: str, source: Any = "model") -> None:
    """The model's output must have one logit channel per class name (axis 1; rank 2 cls, rank 4 seg).

    Raises:
        ValueError: naming both counts.
    """
    rank = 2 if task == "cls" else 4
    if len(logits_shape) != rank:
        raise ValueError(f"{source}: a {task} model must output rank-{rank} logits, got shape {tuple(logits_shape)}")
    if logits_shape[1] != len(class_names):
        raise ValueError(
            f"{source}: {len(class_names)} class names but the model outputs {logits_shape[1]} "
            "logits per " + ("image" if task == "cls" else "pixel")
        )
