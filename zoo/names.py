"""The zoo's timm names and its packaged model cards, without PyTorch or timm (the demo and serve-models read
them while loading exported models only).

A name is timm's ``architecture.tag``: ``vit_<arch>_<variant>`` for a classifier, ``segmenter_vit_<arch>_<variant>``
for a segmenter with the linear decoder (another decoder adds ``_<decoder>``), ``-`` spelled ``_``; the tag is the
data the weights were trained on (:data:`TAGS`). :mod:`attnzoo.zoo.hub` registers these names with timm.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from attnzoo.zoo import ZOO_DIR

__all__ = ["TAGS", "DEFAULT_DECODER", "CARDS_DIR", "arch_name", "tag", "entry_name", "packaged_card"]

#: The timm tag of each zoo data set (its weights' source, as timm's ``in1k``).
TAGS = {"fashion": "fashion_mnist", "shapes": "shapes", "digits": "digits"}
#: The decoder a segmenter's name leaves unsaid (the zoo's).
DEFAULT_DECODER = "linear"
#: The committed cards, one folder per timm name (package data: they ship with the weights).
CARDS_DIR = ZOO_DIR / "cards"


def _part(name: str) -> str:
    return name.replace("-", "_")


def arch_name(variant: str, task: str, arch: str, decoder: str | None = None) -> str:
    """timm architecture name: ``vit_micro_conv_belief2``, ``segmenter_vit_micro_conv_belief2``."""
    base = f"vit_{_part(arch)}_{_part(variant)}"
    if task == "cls":
        return base
    return f"segmenter_{base}" + ("" if decoder in (None, DEFAULT_DECODER) else f"_{_part(str(decoder))}")


def tag(data: str) -> str:
    """timm tag of the weights trained on ``data``."""
    return TAGS.get(data, _part(data))


def entry_name(entry: Mapping[str, Any]) -> str:
    """The timm name of a manifest row: its decoder read from the JSON beside its file (the default when that
    cannot be read; :mod:`attnzoo.zoo.hub` registers from the checked config)."""
    decoder = None
    if entry["task"] == "seg":
        try:
            decoder = json.loads((ZOO_DIR / entry["file"]).with_suffix(".json").read_text()).get("decoder")
        except (OSError, ValueError, AttributeError):
            pass
    return f"{arch_name(entry['variant'], entry['task'], entry['arch'], decoder)}.{tag(entry['data'])}"


def packaged_card(name: str) -> str | None:
    """The committed (packaged) model card of a timm name, or ``None`` when there is none."""
    path = CARDS_DIR / name / "README.md"
    return path.read_text(encoding="utf-8") if path.is_file() else None
