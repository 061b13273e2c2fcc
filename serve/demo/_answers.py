"""The demo's answers, apart from their layout: the served models by task, what a classifier or segmenter says
of an image (with the truth of a shipped example), the segmentation legend and one Compare row.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from attnzoo.errors import quoted
from attnzoo.preprocess import INPUT_STYLES, busy_background, fit_size
from attnzoo.serve import examples as ex
from attnzoo.serve.predict import (
    background_classes,
    class_iou,
    classify,
    dominant_classes,
    model_view,
    overlay,
    palette,
    pixel_shares,
    segment,
    topk_chart,
)
from attnzoo.serve.served import ServedModel

#: Overlays are shown at the image's size, downscaled past this side.
DISPLAY_MAX_SIDE = 2048


def _display_image(img: Image.Image) -> np.ndarray:
    """The image as shown under its overlay: its own size, downscaled past ``DISPLAY_MAX_SIDE``."""
    h, w = fit_size((img.height, img.width), DISPLAY_MAX_SIDE)
    return np.asarray(img if (h, w) == (img.height, img.width) else img.resize((w, h), Image.Resampling.BILINEAR))


def _swatch(colour: Sequence[int], uncoloured: bool) -> str:
    hexcode = "#{:02x}{:02x}{:02x}".format(*tuple(int(c) for c in colour))
    if uncoloured:
        return "<span title='not coloured'>&mdash;</span>"
    return (
        f"<span style='display:inline-block;width:1.2em;height:1.2em;border-radius:3px;"
        f"background:{hexcode}' title='{hexcode}'></span>"
    )


class DemoModels:
    """The served models by task and name, with the class colours of each segmenter."""

    def __init__(self, models: Sequence[ServedModel]) -> None:
        self.by_task: dict[str, dict[str, ServedModel]] = {"cls": {}, "seg": {}}
        for m in models:
            self.by_task.setdefault(m.task, {})[m.name] = m

    def names(self, task: str) -> list[str]:
        return list(self.by_task.get(task, {}))

    def default(self, task: str) -> str | None:
        """The model shown first: the one with the best zoo test metric, else the first listed."""
        table = self.by_task.get(task, {})
        scored = [(m.score, m.name) for m in table.values() if m.score is not None]
        return max(scored, key=lambda s: s[0])[1] if scored else next(iter(table), None)

    def get(self, task: str, name: str | None) -> ServedModel:
        table = self.by_task.get(task, {})
        if not table:
            raise ValueError(f"no {'classification' if task == 'cls' else 'segmentation'} models are served")
        if name not in table:
            raise ValueError(f"unknown variant {quoted(name)}; valid: {', '.join(table)}")
        return table[name]


# ----------------------------------------------------------------------------------------------- handlers
def _object_classes(model: ServedModel) -> list[str]:
    """The model's class names without background."""
    skip = set(background_classes(model.class_names))
    return [n for i, n in enumerate(model.class_names) if i not in skip]


def known_classes_note(model: ServedModel) -> str:
    """What a model can answer: its classes, and that anything else is still forced into one of them."""
    names = _object_classes(model)
    return (
        f"This model knows only {len(names)} classes ({', '.join(names)}) from "
        f"{model.input_size[0]}x{model.input_size[1]} px training images. Anything else -- a cat, a street, "
        "a garment photographed on a busy background -- is still put into one of them, so its probability "
        "says nothing about such an image."
    )


def upload_note(model: ServedModel, img: Image.Image) -> str:
    """What was done to an upload before the model saw it, and a warning when it cannot look like the training
    images (a busy background); empty for models that take images as they are."""
    if model.input_style == "rgb":
        return ""
    note = f"Converted as the training images look ({INPUT_STYLES[model.input_style]}). "
    if busy_background(img):
        note += (
            "**This image has a busy background**, unlike every training image (one object on a plain "
            "background): the answer below is unlikely to mean anything. "
        )
    return note + "\n\n"


def _classify(models: DemoModels, img: Image.Image, variant: str) -> tuple[dict[str, float], float, str, np.ndarray]:
    """Top classes, latency, the note, and the image as the model saw it."""
    model = models.get("cls", variant)
    probs, ms = classify(model, img)
    entry = ex.find_example(img)
    truth = f"Example image; true class: **{entry['label']}**.\n\n" if entry and entry.get("label") else ""
    note = truth or upload_note(model, img)
    return probs, round(ms, 3), note + known_classes_note(model), np.asarray(model_view(model, img))


def _segment_state(models: DemoModels, img: Image.Image, variant: str, max_side: int | None) -> dict:
    """Run a segmenter; the state keeps everything the opacity slider needs to redraw without the model."""
    model = models.get("seg", variant)
    mask, ms = segment(model, img, max_side=max_side)
    shown = _display_image(img)
    if shown.shape[:2] != mask.shape:
        mask = np.asarray(Image.fromarray(mask).resize((shown.shape[1], shown.shape[0]), Image.Resampling.NEAREST))
    k = len(model.class_names)
    entry = ex.find_example(img)
    truth = ex.true_mask(entry) if entry else None
    iou = class_iou(mask, truth, k) if truth is not None and truth.shape == mask.shape else None
    return {
        "image": shown,
        "mask": mask,
        "colours": palette(k),
        "skip": background_classes(model.class_names),
        "names": model.class_names,
        "iou": iou,
        "ms": ms,
    }


def _legend(state: dict) -> list[list[Any]]:
    """Legend rows (colour swatch, class, pixel share %, IoU or None), largest share first."""
    shares = pixel_shares(state["mask"], len(state["names"]))
    iou = state["iou"] or {}
    rows = []
    for c in np.argsort(-shares, kind="stable"):
        c = int(c)
        if shares[c] > 0 or c in iou:
            rows.append(
                [
                    _swatch(state["colours"][c], c in state["skip"]),
                    state["names"][c],
                    round(100 * float(shares[c]), 2),
                    round(iou[c], 3) if c in iou else None,
                ]
            )
    return rows


def _iou_note(state: dict) -> str:
    if not state["iou"]:
        return ""
    mean = float(np.mean(list(state["iou"].values())))
    return f"Example image with a true mask: mean IoU over its classes **{mean:.3f}** (per class in the legend)."


def _compare_one(
    models: DemoModels, task: str, name: str, img: Image.Image, max_side: int | None
) -> tuple[np.ndarray, str, list[Any]]:
    """One Compare gallery item (picture, caption) and table row; a failing model reports its error.

    For a shipped example the last column is 1/0 (top-1 correct) or the mean IoU over its true classes."""
    try:
        if task == "cls":
            probs, ms, _, _ = _classify(models, img, name)
            top, p = next(iter(probs.items()))
            entry = ex.find_example(img)
            truth = float(top == entry["label"]) if entry and entry.get("label") else None
            return (
                topk_chart(probs, name),
                f"{name}: {top} ({p:.0%}) · {ms:.1f} ms",
                [name, top, round(p, 4), ms, truth],
            )
        state = _segment_state(models, img, name, max_side)
        dom = dominant_classes(pixel_shares(state["mask"], len(state["names"])), state["names"])
        text = ", ".join(f"{c} {s:.0%}" for c, s in dom)
        pic = overlay(state["image"], state["mask"], state["colours"], 0.6, state["skip"])
        miou = round(float(np.mean(list(state["iou"].values()))), 4) if state["iou"] else None
        return (
            pic,
            f"{name}: {text} · {state['ms']:.1f} ms",
            [name, text, round(dom[0][1], 4), round(state["ms"], 3), miou],
        )
    except ValueError as exc:
        blank = np.full((64, 64, 3), 255, np.uint8)
        return blank, f"{name}: error: {exc}", [name, f"error: {exc}", None, None, None]
    except Exception as exc:  # one failing model must not fail the whole comparison
        traceback.print_exc(file=sys.stderr)
        blank = np.full((64, 64, 3), 255, np.uint8)
        msg = f"{type(exc).__name__}: {exc}"
        return blank, f"{name}: error: {msg}", [name, f"error: {msg}", None, None, None]
