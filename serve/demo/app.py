"""The Gradio ``Blocks`` demo: Classify, Segment and Compare tabs over a list of :class:`ServedModel`.

Handlers take raw upload payloads (``preprocess=False``) and decode them with :mod:`attnzoo.preprocess`, so
any image mode is accepted and an unreadable file becomes a ``gr.Error`` message. Requests are admitted by the
size of their image, read from its header before a pixel is decoded (:class:`attnzoo.serve.admission.SizeGate`:
smallest first, at most :data:`WORKERS` at once and one large one, their decode memory within a budget), so a
small request never waits behind a queue of large ones; model calls run one at a time so concurrent users do not
oversubscribe the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import gradio as gr  # offline: attnzoo.serve (the parent package, imported first) set Gradio's environment
import numpy as np
from gradio.utils import get_upload_folder
from huggingface_hub import ModelCard
from PIL import Image
from starlette.middleware import Middleware

from attnzoo.errors import quoted
from attnzoo.limits import MAX_UPLOAD_BYTES
from attnzoo.preprocess import INPUT_STYLES, UnreadableImageError, busy_background, fit_size, image_size, load_image
from attnzoo.serve import examples as ex
from attnzoo.serve.admission import SizeGate, default_budget
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
from attnzoo.zoo.names import packaged_card

__all__ = [
    "build_demo",
    "launch",
    "private_upload_folder",
    "upload_roots",
    "MAX_FILE_SIZE",
    "MAX_API_BODY",
    "BodyLimit",
    "UploadQuota",
    "DISPLAY_MAX_SIDE",
]

MAX_FILE_SIZE = MAX_UPLOAD_BYTES  # bytes; the one upload cap (attnzoo.limits), serve-models too
#: Largest body of any other request (an event's JSON: file references, a variant name, a number): refused with
#: 413 before it is read, by its Content-Length or as it streams in (:class:`BodyLimit`).
MAX_API_BODY = 2**20
#: Room for the multipart envelope on top of an uploaded file.
_MULTIPART_SLACK = 64 * 1024
#: Overlays are shown at the image's size, downscaled past this side.
DISPLAY_MAX_SIDE = 2048
QUEUE = "models"
#: Requests the demo takes at once (the rest wait in Gradio's queue, up to its 64): each is then admitted by its
#: image's size (:class:`~attnzoo.serve.admission.SizeGate`), not in arrival order.
ADMITTED = 32
#: Requests that work at once (decode, resize, pictures; one large image among them); model calls run one at a time.
WORKERS = 2
#: Uploads are kept this long (seconds) for a user to re-run them, then deleted by a sweep this often.
UPLOAD_MAX_AGE_S = 600
UPLOAD_SWEEP_S = 60
#: What one client (IP address) may upload within :data:`UPLOAD_MAX_AGE_S`: files (one per upload request at
#: least, each file its answer lists) and bytes (each request's Content-Length); then 429 (:class:`UploadQuota`).
UPLOAD_FILES_PER_CLIENT = 100
UPLOAD_BYTES_PER_CLIENT = 128 * 2**20
#: What all clients together may upload within :data:`UPLOAD_MAX_AGE_S` (what the upload folder holds at most,
#: until the next sweep): then 503.
UPLOAD_BYTES_TOTAL = 2**30
LEGEND_HEADERS = ["colour", "class", "pixels %", "IoU"]
COMPARE_HEADERS = [
    "variant",
    "prediction",
    "probability / pixel share",
    "latency (ms)",
    "example: top-1 correct / mean IoU",
]
#: Small images (the shapes scenes are 128 px) are shown enlarged with crisp pixels.
CSS = ".pixelated img { image-rendering: pixelated; min-height: 288px; object-fit: contain; }"


def _user_errors(fn):
    """Turn ``ValueError`` into a ``gr.Error`` with its message; anything else into a one-line ``gr.Error``
    (the traceback goes to the server's stderr, never to the user)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except ValueError as exc:  # load_image names decompression bombs itself
            raise gr.Error(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            raise gr.Error(f"internal error ({type(exc).__name__}); see the server log") from None

    return wrapper


def upload_roots() -> tuple[Path, ...]:
    """The only folders the demo reads images from: Gradio's upload cache (where every file a client sends
    lands, ``GRADIO_TEMP_DIR``) and the shipped examples."""
    return tuple(Path(os.path.realpath(p)) for p in (get_upload_folder(), ex.EXAMPLES_DIR))


def _upload_bytes(payload: Any, roots: Sequence[Path] | None = None) -> tuple[bytes, str]:
    """Raw ``gr.Image`` payload (dict with ``path``, or a path) -> the file's bytes and its name as messages show
    it; ``ValueError`` if none.

    The handlers take payloads unprocessed, so a client can put any path in one: only a regular file inside
    :func:`upload_roots` is read (the path resolved first, so a link cannot lead out), opened without blocking
    (a FIFO or device never holds the model slot) and at most ``MAX_FILE_SIZE`` bytes of it.
    """
    name = None
    if isinstance(payload, dict):
        name = payload.get("orig_name")
        payload = payload.get("path")
    if not payload:
        raise ValueError("no image: upload one (or pick an example) first")
    if not isinstance(payload, (str, os.PathLike)):
        raise ValueError("no image: the request's image is not a file uploaded to this demo")
    shown = quoted(str(name or Path(payload).name))
    real = Path(os.path.realpath(payload))
    if not any(real.is_relative_to(root) for root in (roots or upload_roots())):
        raise ValueError(f"cannot read image {shown}: the demo reads only files uploaded to it and its examples")
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        raise ValueError(f"cannot read image {shown}: no such upload (upload it again)") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):  # a folder, FIFO or device: refused before Python's file object opens it
        os.close(fd)
        raise ValueError(f"cannot read image {shown}: not a regular file")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > MAX_FILE_SIZE:
            raise ValueError(
                f"cannot read image {shown}: {info.st_size / 2**20:.1f} MiB, over the "
                f"{MAX_FILE_SIZE / 2**20:.0f} MiB upload limit"
            )
        return f.read(MAX_FILE_SIZE + 1), shown


def _unreadable(shown: str) -> ValueError:
    return ValueError(
        f"cannot read image {shown}: not an image file, or a damaged one (PNG, JPEG, WebP, BMP, GIF, TIFF ... are read)"
    )


def _decoded(data: bytes, shown: str) -> Image.Image:
    try:
        img = load_image(data)  # over the pixel cap or a decompression bomb: its own message passes through
    except UnreadableImageError:
        raise _unreadable(shown) from None
    if img.width * img.height == 0:
        raise ValueError("cannot read image: it has no pixels")
    return img


def _read_upload(payload: Any, roots: Sequence[Path] | None = None) -> Image.Image:
    """Raw ``gr.Image`` payload -> RGB PIL image (:func:`_upload_bytes`, then decoded); ``ValueError`` if none."""
    return _decoded(*_upload_bytes(payload, roots))


@contextlib.contextmanager
def _admitted_upload(payload: Any, roots: Sequence[Path], gate: SizeGate) -> Iterator[Image.Image]:
    """The upload decoded once ``gate`` admits it by the size its header gives (nothing decoded before), held
    until the block ends."""
    data, shown = _upload_bytes(payload, roots)
    try:
        w, h = image_size(data)  # over the pixel cap: its own message passes through
    except UnreadableImageError:
        raise _unreadable(shown) from None
    with gate.admitted(w * h, f"image {shown} ({w}x{h})"):
        yield _decoded(data, shown)


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


# ------------------------------------------------------------------------------------------------- layout
def _choice_label(m: ServedModel) -> str:
    metric = {"top1": "top-1", "miou": "mIoU"}.get(m.score_name, m.score_name)
    return f"{m.name} ({metric} {m.score:.1f} %)" if m.score is not None else m.name


def _variant_dropdown(models: DemoModels, task: str) -> gr.Dropdown:
    """The variants of ``task``, labelled with their zoo test metric; the best one first selected."""
    choices = [(_choice_label(m), name) for name, m in models.by_task.get(task, {}).items()]
    return gr.Dropdown(
        choices, value=models.default(task), label="variant (zoo test metric)", interactive=bool(choices)
    )


def model_card(model: ServedModel) -> str:
    """The card of a served zoo model, as its Markdown body (the YAML metadata is for the Hub's tools), or one line
    saying that none ships with it."""
    card = packaged_card(model.timm_name) if model.timm_name else None
    if card is None:
        return f"No model card ships with {model.name}: the zoo's Fashion-MNIST models carry one."
    return ModelCard(card).text.strip()


def _card_panel(models: DemoModels, task: str, variant: gr.Dropdown) -> None:
    """The picked model's card (``zoo/cards/<timm name>/README.md``, packaged), under its dropdown and following it."""

    @_user_errors
    def card_of(name: str | None) -> str:
        return model_card(models.get(task, name)) if models.names(task) else ""

    with gr.Accordion("model card: what was measured, how it deploys", open=False):
        shown = gr.Markdown(card_of(models.default(task)), elem_id=f"{task}-card")
    variant.change(card_of, variant, shown, api_name=f"{task}_card", show_progress="hidden")


def _no_models_note(models: DemoModels, task: str) -> None:
    if not models.names(task):
        kind = "classifier" if task == "cls" else "segmenter"
        gr.Markdown(f"**No {kind} is served** here: none of the served models is a {kind}.")


def _classify_tab(models: DemoModels, roots: Sequence[Path], gate: SizeGate) -> None:
    _no_models_note(models, "cls")
    with gr.Row():
        with gr.Column():
            with gr.Tabs():
                with gr.Tab("Upload"):
                    image = gr.Image(
                        type="filepath",
                        sources=["upload", "clipboard"],
                        label="image",
                        elem_id="cls-image",
                        elem_classes="pixelated",
                    )
                    button = gr.Button(
                        "Classify", variant="primary", elem_id="cls-button", interactive=bool(models.names("cls"))
                    )
                with gr.Tab("Draw"):
                    sketch = gr.Sketchpad(type="numpy", image_mode="RGBA", canvas_size=(320, 320), label="draw")
                    sketch_button = gr.Button(
                        "Classify drawing", variant="primary", interactive=bool(models.names("cls"))
                    )
            variant = _variant_dropdown(models, "cls")
            _card_panel(models, "cls", variant)
            if ex.example_paths("cls"):
                gr.Examples(ex.example_paths("cls"), inputs=image, label=ex.title())
        with gr.Column():
            label = gr.Label(num_top_classes=5, label="top-5", elem_id="cls-label")
            latency = gr.Number(None, label="model latency (ms)", precision=3, elem_id="cls-latency")
            note = gr.Markdown()
            seen = gr.Image(
                label="as the model sees it",
                format="png",
                interactive=False,
                elem_id="cls-seen",
                elem_classes="pixelated",
                height=160,
            )

    @_user_errors
    def run(payload, name):
        with _admitted_upload(payload, roots, gate) as img:
            return _classify(models, img, name)

    @_user_errors
    def run_sketch(value, name):
        layer = (value or {}).get("composite")
        pixels = np.asarray(layer) if layer is not None else np.zeros((0, 0, 4), np.uint8)
        if pixels.size == 0 or (pixels.ndim == 3 and pixels.shape[-1] == 4 and not pixels[..., 3].any()):
            raise ValueError("nothing drawn yet: draw on the canvas first")
        with gate.admitted(pixels.shape[0] * pixels.shape[1], "the drawing"):
            return _classify(models, load_image(pixels), name)

    button.click(
        run,
        [image, variant],
        [label, latency, note, seen],
        api_name="classify",
        preprocess=False,
        concurrency_id=QUEUE,
        concurrency_limit=ADMITTED,
    )
    sketch_button.click(
        run_sketch,
        [sketch, variant],
        [label, latency, note, seen],
        api_name="classify_drawing",
        concurrency_id=QUEUE,
        concurrency_limit=ADMITTED,
    )


def _segment_tab(models: DemoModels, max_side: int | None, roots: Sequence[Path], gate: SizeGate) -> None:
    _no_models_note(models, "seg")
    state = gr.State(None)
    with gr.Row():
        with gr.Column():
            image = gr.Image(
                type="filepath",
                sources=["upload", "clipboard"],
                label="image",
                elem_id="seg-image",
                elem_classes="pixelated",
            )
            variant = _variant_dropdown(models, "seg")
            _card_panel(models, "seg", variant)
            button = gr.Button(
                "Segment", variant="primary", elem_id="seg-button", interactive=bool(models.names("seg"))
            )
            if ex.example_paths("seg"):
                gr.Examples(ex.example_paths("seg"), inputs=image, label=f"{ex.title()} (with true masks)")
        with gr.Column():
            shown = gr.Image(
                label="mask overlay", format="png", interactive=False, elem_id="seg-overlay", elem_classes="pixelated"
            )
            opacity = gr.Slider(0.0, 1.0, value=0.6, step=0.05, label="mask opacity (redraws without the model)")
            latency = gr.Number(None, label="model latency (ms)", precision=3, elem_id="seg-latency")
            legend = gr.Dataframe(
                headers=LEGEND_HEADERS,
                datatype=["html", "str", "number", "number"],
                label="legend: class colour, share of pixels, IoU (example images)",
                interactive=False,
                elem_id="seg-legend",
            )
            note = gr.Markdown()

    @_user_errors
    def run(payload, name, alpha):
        with _admitted_upload(payload, roots, gate) as img:
            st = _segment_state(models, img, name, max_side)
            pic = overlay(st["image"], st["mask"], st["colours"], alpha, st["skip"])
            note = _iou_note(st) or upload_note(models.get("seg", name), img)
            return pic, _legend(st), round(st["ms"], 3), note, st

    def redraw(st, alpha):
        if not st:
            return gr.skip()
        return overlay(st["image"], st["mask"], st["colours"], alpha, st["skip"])

    button.click(
        run,
        [image, variant, opacity],
        [shown, legend, latency, note, state],
        api_name="segment",
        preprocess=False,
        concurrency_id=QUEUE,
        concurrency_limit=ADMITTED,
    )
    opacity.change(
        redraw, [state, opacity], shown, api_name="overlay", trigger_mode="always_last", show_progress="hidden"
    )


def _compare_tab(models: DemoModels, max_side: int | None, roots: Sequence[Path], gate: SizeGate) -> None:
    tasks = [t for t in ("cls", "seg") if models.names(t)]
    choices = [("Classify", "cls"), ("Segment", "seg")]
    with gr.Row():
        with gr.Column(scale=1):
            image = gr.Image(
                type="filepath",
                sources=["upload", "clipboard"],
                label="image",
                elem_id="cmp-image",
                elem_classes="pixelated",
            )
            task = gr.Radio([c for c in choices if c[1] in tasks], value=tasks[0] if tasks else None, label="task")
            button = gr.Button("Run every variant", variant="primary", elem_id="cmp-button", interactive=bool(tasks))
            if ex.example_paths():
                gr.Examples(ex.example_paths(), inputs=image, label=ex.title())
        with gr.Column(scale=2):
            gallery = gr.Gallery(
                label="one result per variant",
                columns=4,
                format="png",
                object_fit="contain",
                elem_id="cmp-gallery",
                height="auto",
            )
            table = gr.Dataframe(headers=COMPARE_HEADERS, label="results", interactive=False, elem_id="cmp-table")

    @_user_errors
    def run(payload, which):
        if which not in ("cls", "seg"):
            raise ValueError(f"unknown task {quoted(which)}; valid: cls, seg")
        names = models.names(which)
        if not names:
            raise ValueError(f"no {which} models are served")
        with _admitted_upload(payload, roots, gate) as img:
            results = [_compare_one(models, which, n, img, max_side) for n in names]
        return [(pic, caption) for pic, caption, _ in results], [row for _, _, row in results]

    button.click(
        run,
        [image, task],
        [gallery, table],
        api_name="compare",
        preprocess=False,
        concurrency_id=QUEUE,
        concurrency_limit=ADMITTED,
    )


def _header(models: DemoModels, backend: str, source: str) -> str:
    n_cls, n_seg = len(models.names("cls")), len(models.names("seg"))
    served = [m for table in models.by_task.values() for m in table.values()]
    known = sorted({n for m in served for n in _object_classes(m)})
    dtypes = sorted({getattr(m, "dtype", "fp32") for m in served})
    precision = f" in {'/'.join(dtypes)}" if dtypes and dtypes != ["fp32"] else ""
    return (
        f"# attnzoo demo\nAttention variants side by side: {n_cls} classifiers, {n_seg} segmenters, "
        f"served by **{backend}**{precision} from {source}. Everything runs on this machine; nothing leaves it.\n\n"
        f"**What the models know:** {len(known)} classes ({', '.join(known)}). Every image is put into one of "
        "them, whatever it shows; the examples below are the kind of image they were trained on. An upload is "
        "first converted to look like them (the classify tab shows it as the model sees it)."
        + (
            "\n\nEach variant is listed with its test metric on the official test set; the best one is selected first."
            if any(m.score is not None for m in served)
            else ""
        )
        + "".join(f"\n\n*Backend chosen automatically:* {n}." for n in {m.backend_note for m in served} if n)
    )


def _one_model_call_at_a_time(models: Sequence[ServedModel]) -> list[ServedModel]:
    """Copies of ``models`` whose calls share one lock: the requests the gate admits work beside each other, their
    model calls one after another."""
    lock = threading.Lock()

    def locked(run):
        def call(x):
            with lock:
                return run(x)

        return call

    return [dataclasses.replace(m, run=locked(m.run)) for m in models]


def build_demo(
    models: Sequence[ServedModel],
    *,
    source: str = "the zoo",
    seg_max_side: int | None = None,
    gate: SizeGate | None = None,
) -> gr.Blocks:
    """The demo's ``gr.Blocks`` (queued; launch it with :func:`launch`).

    Args:
        models: The served models (:func:`attnzoo.serve.load_models`).
        source: Where they came from, for the header.
        seg_max_side: Longest image side segmenters see (default: each model's input size).
        gate: Admission of the requests by image size (default: :data:`WORKERS` at once within
            :func:`attnzoo.serve.admission.default_budget`).
    """
    gate = gate or SizeGate(default_budget(), slots=WORKERS)
    table = DemoModels(_one_model_call_at_a_time(models))
    backend = models[0].backend if models else "none"
    roots = upload_roots()  # the Blocks below take their upload cache from the same GRADIO_TEMP_DIR
    # Uploads older than UPLOAD_MAX_AGE_S are deleted every UPLOAD_SWEEP_S seconds while the server runs.
    with gr.Blocks(
        title="attnzoo demo", analytics_enabled=False, delete_cache=(UPLOAD_SWEEP_S, UPLOAD_MAX_AGE_S)
    ) as demo:
        gr.Markdown(_header(table, backend, source))
        with gr.Tab("Classify"):
            _classify_tab(table, roots, gate)
        with gr.Tab("Segment"):
            _segment_tab(table, seg_max_side, roots, gate)
        with gr.Tab("Compare"):
            _compare_tab(table, seg_max_side, roots, gate)
    demo.queue(max_size=64, default_concurrency_limit=1)
    return demo


@contextlib.contextmanager
def private_upload_folder() -> Iterator[Path]:
    """Uploads of this server go to a folder of its own (``GRADIO_TEMP_DIR``), removed with everything in it
    when the block ends; a ``GRADIO_TEMP_DIR`` the user set is used as it is and left in place."""
    given = os.environ.get("GRADIO_TEMP_DIR")
    if given:
        yield Path(given)
        return
    folder = Path(tempfile.mkdtemp(prefix="attnzoo-demo-uploads-"))
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    try:
        yield folder
    finally:
        os.environ.pop("GRADIO_TEMP_DIR", None)
        shutil.rmtree(folder, ignore_errors=True)


class BodyLimit:
    """ASGI middleware: a request body over its route's limit gets 413 (one JSON line) before the app reads it. An
    upload (``.../upload``) may carry :data:`MAX_FILE_SIZE` plus its multipart envelope (Gradio streams it to disk
    and checks the file's size itself); any other request :data:`MAX_API_BODY`, read here in full (so it never
    reaches Gradio larger) and handed on."""

    def __init__(self, app, upload_limit: int = MAX_FILE_SIZE + _MULTIPART_SLACK, limit: int = MAX_API_BODY) -> None:
        self.app, self.upload_limit, self.limit = app, upload_limit, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        upload = scope.get("path", "").rstrip("/").endswith("/upload")
        limit = self.upload_limit if upload else self.limit
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await self._refuse(send, int(declared), limit)
        if upload:
            return await self.app(scope, receive, send)
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                return await self._refuse(send, None, limit)
        refused = _payload_problem(bytes(body))
        if refused:
            return await _answer(send, 400, refused)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()  # the app waits for a disconnect: pass it on
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send, size: int | None, limit: int) -> None:
        said = f"{size:,} bytes, " if size is not None else ""
        await _answer(send, 413, f"the request body is {said}over the {limit:,}-byte limit")


async def _answer(send, status: int, error: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """One JSON line ``{"error": ...}`` with ``status``; the connection is closed after it."""
    text = json.dumps({"error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(text)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": text})


def _paths(value: Any, depth: int = 0) -> Iterator[str]:
    """Every ``path`` / ``url`` string of a request's JSON (file payloads), a few levels deep."""
    if depth > 4:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if key in ("path", "url") and isinstance(item, str):
                yield item
            else:
                yield from _paths(item, depth + 1)
    elif isinstance(value, list):
        for item in value[:16]:
            yield from _paths(item, depth + 1)


def _payload_problem(body: bytes) -> str | None:
    """Why an API request's JSON names a file the demo must not touch, before Gradio sees it (Gradio itself would
    download a ``path`` that is a URL, and log a traceback for a path outside its cache): a URL, or a path outside
    :func:`upload_roots`. None for anything else (other requests, other JSON)."""
    try:
        data = json.loads(body) if body[:1] == b"{" else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    roots = upload_roots()
    for path in _paths(data.get("data")):
        shown = quoted(path)
        if "://" in path[:16]:
            if path.startswith(("http://", "https://")) and "/gradio_api/file=" in path:
                continue  # the demo's own file URL (a url field beside the path): Gradio does not fetch it
            return f"cannot read image {shown}: the demo works offline and reads only files uploaded to it"
        real = Path(os.path.realpath(path))
        if not any(real.is_relative_to(root) for root in roots):
            return f"cannot read image {shown}: the demo reads only files uploaded to it and its examples"
    return None


class UploadQuota:
    """ASGI middleware on the upload route: each client (IP address) may upload :data:`UPLOAD_FILES_PER_CLIENT`
    files and :data:`UPLOAD_BYTES_PER_CLIENT` bytes within :data:`UPLOAD_MAX_AGE_S` (then 429 with
    ``Retry-After``), all of them together :data:`UPLOAD_BYTES_TOTAL` (then 503); an upload without a
    Content-Length gets 411. Bytes are charged from the Content-Length before anything is written; files from the
    answer (the paths Gradio wrote), at least one per upload."""

    def __init__(
        self,
        app,
        files: int = UPLOAD_FILES_PER_CLIENT,
        per_client: int = UPLOAD_BYTES_PER_CLIENT,
        total: int = UPLOAD_BYTES_TOTAL,
        keep_s: float = UPLOAD_MAX_AGE_S,
    ) -> None:
        self.app, self.files, self.per_client, self.total, self.keep_s = app, files, per_client, total, keep_s
        self.log: list[list] = []  # [time, client, bytes, files], oldest first

    async def __call__(self, scope, receive, send) -> None:
        upload = scope.get("path", "").rstrip("/").endswith("/upload")
        if scope["type"] != "http" or scope.get("method") != "POST" or not upload:
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if not declared.isdigit():
            return await _answer(send, 411, "an upload must state its size (Content-Length)")
        now, size = time.monotonic(), int(declared)
        self.log = [e for e in self.log if now - e[0] < self.keep_s]
        client = (scope.get("client") or ("unknown",))[0]
        mine = [e for e in self.log if e[1] == client]
        files, used = sum(e[3] for e in mine), sum(e[2] for e in mine)
        if files + 1 > self.files or used + size > self.per_client:
            wait = int(self.keep_s - (now - mine[0][0])) + 1 if mine else int(self.keep_s)
            return await _answer(
                send,
                429,
                f"upload quota reached: {files} files, {used / 2**20:.1f} MiB of this client's {self.files} files "
                f"and {self.per_client / 2**20:.0f} MiB per {self.keep_s / 60:g} minutes; retry in {wait} s",
                [(b"retry-after", str(wait).encode())],
            )
        if sum(e[2] for e in self.log) + size > self.total:
            return await _answer(
                send,
                503,
                f"the demo holds its {self.total / 2**20:.0f} MiB of uploads; retry in a few minutes",
                [(b"retry-after", b"60")],
            )
        entry = [now, client, size, 1]
        self.log.append(entry)
        body = bytearray()

        async def counting(message) -> None:
            if message["type"] == "http.response.body" and len(body) < 2**20:
                body.extend(message.get("body", b""))
                if not message.get("more_body"):
                    with contextlib.suppress(ValueError):
                        answer = json.loads(bytes(body))
                        entry[3] = max(1, len(answer)) if isinstance(answer, list) else 1
            await send(message)

        await self.app(scope, receive, counting)


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int = 7860, *, block: bool = True, **kwargs):
    """Launch offline and quiet (no share link, no Gradio banner: the caller says where it serves), uploads capped
    at ``MAX_FILE_SIZE`` and every other request body at :data:`MAX_API_BODY` (:class:`BodyLimit`), local fonts only,
    no SSR."""
    theme = gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
    )
    return demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        max_file_size=MAX_FILE_SIZE,
        prevent_thread_lock=not block,
        ssr_mode=False,
        show_error=False,
        theme=theme,
        css=CSS,
        footer_links=["api"],
        max_threads=ADMITTED + 16,  # the admitted requests wait for the gate in threads of their own
        quiet=True,  # the command prints its own line with the URL; Gradio's would add a share-link hint
        app_kwargs={"middleware": [Middleware(BodyLimit), Middleware(UploadQuota)]},
        **kwargs,
    )
