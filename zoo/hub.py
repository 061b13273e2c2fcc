"""The zoo as timm models: one timm name per zoo model, registered with timm's own ``register_model`` and
``generate_default_cfgs`` when ``attnzoo.models`` is imported, its weights the packaged file.

A name is timm's ``architecture.tag`` (:mod:`attnzoo.zoo.names`). The architecture says what is built, the tag
which weights:

- a classifier: ``vit_<arch>_<variant>``, e.g. ``vit_micro_conv_belief2`` (a timm ``VisionTransformer`` of the
  ``micro-conv`` layout with belief2 attention);
- a segmenter: ``segmenter_vit_<arch>_<variant>`` (``attnzoo.models.Segmenter`` with its linear decoder; another
  decoder adds ``_<decoder>``);
- the tag: the data it was trained on, ``fashion_mnist`` (Fashion-MNIST, or for a segmenter the scenes composed
  from it), ``shapes`` or ``digits`` (the smoke sets).

``-`` in the package's names becomes ``_``: ``vit_micro_conv_anti_wafe_mae.fashion_mnist``.

>>> import attnzoo.models, timm                                      # doctest: +SKIP
>>> timm.list_models("*belief2*", pretrained=True)                   # doctest: +SKIP
>>> model = timm.create_model("vit_micro_conv_belief2.fashion_mnist", pretrained=True)   # doctest: +SKIP

Each tag's ``pretrained_cfg`` names the zoo file (``file=``), its classes (``num_classes``, ``label_names``), input
size, mean/std, and the paper. Loading needs no network. Registration reads each zoo model's config (the JSON
beside it, checked against the file's metadata), never its weights; a zoo file whose config cannot be read is left
out with a warning, and the other models stay registered.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from timm.models import build_model_with_cfg, generate_default_cfgs, register_model, resolve_pretrained_cfg
from torch import nn

from attnzoo import models, zoo
from attnzoo.models.checkpoint import read_config
from attnzoo.zoo import names as naming
from attnzoo.zoo.names import tag

__all__ = ["ZooArch", "timm_name", "arch_name", "names", "entry", "config", "default_cfgs"]


@dataclass(frozen=True)
class ZooArch:
    """What a timm architecture of the zoo builds (everything but the classes and input size, which its tags give).

    Attributes:
        variant: Attention variant.
        task: ``cls`` or ``seg``.
        arch: The package's architecture (``micro``, ``micro-conv`` ...).
        decoder: A segmenter's decoder (``None`` for a classifier).
        options: The variant's options, as the zoo's checkpoints record them.
    """

    variant: str
    task: str
    arch: str
    decoder: str | None
    options: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> ZooArch:
        """The architecture of a checkpoint config."""
        decoder = cfg.get("decoder") if cfg["task"] == "seg" else None
        return cls(cfg["variant"], cfg["task"], cfg["arch"], decoder, tuple(sorted(cfg.get("options", {}).items())))

    def build(
        self,
        num_classes: int,
        img_size: int | tuple[int, int] | list[int] | None = None,
        in_chans: int = 3,
        global_pool: str | None = None,
        **kwargs: Any,
    ) -> nn.Module:
        """The model, untrained (timm's ``build_model_with_cfg`` loads the weights); ``kwargs`` are
        :func:`attnzoo.models.create_model`'s (``drop_path_rate``) or the variant's options."""
        if in_chans != 3:
            raise ValueError(f"{arch_name(self)} takes 3-channel images (gray ones repeated), not in_chans={in_chans}")
        pool = "token" if self.task == "cls" else None
        if global_pool not in (None, pool):
            raise ValueError(f"{arch_name(self)} pools with {pool!r}; global_pool={global_pool!r} is not supported")
        if isinstance(img_size, (tuple, list)):
            if len(img_size) != 2 or img_size[0] != img_size[1]:
                raise ValueError(f"{arch_name(self)} takes a square img_size, got {tuple(img_size)}")
            img_size = int(img_size[0])
        # the variant's options as the zoo trained them, each one overridden by a keyword given here
        build: dict[str, Any] = {**({"decoder": self.decoder} if self.decoder else {}), **dict(self.options), **kwargs}
        return models.create_model(
            self.variant, self.task, self.arch, num_classes=num_classes, img_size=img_size, **build
        )


def arch_name(arch: ZooArch) -> str:
    """timm architecture name: ``vit_micro_conv_belief2``, ``segmenter_vit_micro_conv_belief2``."""
    return naming.arch_name(arch.variant, arch.task, arch.arch, arch.decoder)


def _first_conv(arch: ZooArch) -> str:
    """The input convolution timm adapts to other channel counts (the conv stem's first one)."""
    stem = "patch_embed.proj.0" if models.ARCHS[arch.arch].get("stem") == "conv" else "patch_embed.proj"
    return stem if arch.task == "cls" else f"encoder.{stem}"


def _paper_cfg(variant: str) -> dict[str, Any]:
    """The variant's paper as ``pretrained_cfg`` fields (a built-in variant's; nothing for another)."""
    spec = dict.get(models.VARIANTS, variant)  # the registered built-ins: no plugin runs at import
    paper = getattr(spec, "paper", None)
    if not isinstance(paper, models.Paper):
        return {}
    ids = paper.url.split("arxiv.org/abs/")[-1] if "arxiv.org/abs/" in paper.url else paper.url
    return {"paper_name": paper.title, "paper_ids": ids}


def _pretrained_cfg(entry: Mapping[str, Any], cfg: Mapping[str, Any], arch: ZooArch) -> dict[str, Any]:
    size = int(cfg["img_size"])
    return {
        "file": str(zoo.ZOO_DIR / entry["file"]),
        "num_classes": int(cfg["num_classes"]),
        "label_names": tuple(cfg["class_names"]),
        "input_size": (3, size, size),
        # a classifier's position embedding is fixed to its grid; a segmenter pads and resamples to any size
        "fixed_input_size": arch.task == "cls",
        "interpolation": "bilinear",  # attnzoo.preprocess resizes bilinearly, without a crop
        "crop_pct": 1.0,
        "mean": tuple(cfg["mean"]),
        "std": tuple(cfg["std"]),
        "first_conv": _first_conv(arch),
        "classifier": "head" if arch.task == "cls" else "decoder.head",
        "license": "apache-2.0",
        "description": f"attnzoo {entry['variant']} {'classifier' if arch.task == 'cls' else 'segmenter'} "
        f"trained on {entry['data']} ({cfg.get('input_style', 'rgb')} input)",
        **_paper_cfg(arch.variant),
    }


def timm_name(entry: Mapping[str, Any]) -> str:
    """The timm name (``architecture.tag``) of a manifest row."""
    cfg = _CONFIGS.get(entry["file"])
    if cfg is None:
        raise ValueError(f"{entry['file']}: not registered with timm (its config could not be read at import)")
    return f"{arch_name(ZooArch.of(cfg))}.{tag(entry['data'])}"


def _register() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, ZooArch], dict[str, Any]]:
    """Every zoo model's config (by file), manifest row (by timm name), architecture (by name) and the
    pretrained cfgs (by timm name)."""
    configs: dict[str, dict[str, Any]] = {}
    rows: dict[str, dict[str, Any]] = {}
    archs: dict[str, ZooArch] = {}
    cfgs: dict[str, Any] = {}
    for e in zoo.entries():
        try:
            cfg = read_config(zoo.ZOO_DIR / e["file"])
        except ValueError as exc:
            warnings.warn(f"zoo model {e['file']} is not registered with timm: {exc}", stacklevel=3)
            continue
        arch = ZooArch.of(cfg)
        name = arch_name(arch)
        if archs.setdefault(name, arch) != arch:
            raise RuntimeError(f"zoo models of two builds share the timm name {name}: {archs[name]} and {arch}")
        configs[e["file"]] = cfg
        full = f"{name}.{tag(e['data'])}"
        rows[full] = e
        cfgs[full] = _pretrained_cfg(e, cfg, arch)
    return configs, rows, archs, cfgs


_CONFIGS, _ROWS, _ARCHS, _CFGS = _register()
#: timm's pretrained configs of every zoo model (read by ``register_model`` from this module).
default_cfgs = generate_default_cfgs(_CFGS)


def _entrypoint(name: str, arch: ZooArch):
    """The timm entrypoint of one architecture, named ``name``."""

    def create(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        # a segmenter's size is not fixed, so timm passes no img_size: build at the size the tag's weights have
        cfg = resolve_pretrained_cfg(name, kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay"))
        kwargs.setdefault("img_size", tuple(cfg.input_size[-2:]))
        return build_model_with_cfg(arch.build, name, pretrained, **kwargs)

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f"attnzoo {arch.variant} {arch.task} model ({arch.arch}); tags: the zoo's weights."
    return create


for _name, _arch in _ARCHS.items():
    register_model(_entrypoint(_name, _arch))


def names(data: str | None = None, task: str | None = None) -> list[str]:
    """The zoo's timm names (``architecture.tag``), in the manifest's order; only ``data`` / ``task`` when given."""
    return [n for n, e in _ROWS.items() if (data is None or e["data"] == data) and (task is None or e["task"] == task)]


def entry(name: str) -> dict[str, Any]:
    """The manifest row of a timm name (``architecture.tag``; an architecture alone: its default tag).

    Raises:
        ValueError: not a zoo model's name; the message lists them.
    """
    if name in _ROWS:
        return _ROWS[name]
    if name in default_cfgs and f"{name}.{default_cfgs[name].tags[0]}" in _ROWS:
        return _ROWS[f"{name}.{default_cfgs[name].tags[0]}"]
    raise ValueError(f"no zoo model is named {name!r}; the zoo's timm names: {', '.join(_ROWS) or 'none'}")


def config(name: str) -> dict[str, Any]:
    """The checkpoint config (classes, mean/std, recipe, seed ...) of a zoo model's timm name."""
    return _CONFIGS[entry(name)["file"]]
