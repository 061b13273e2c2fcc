"""The Gradio ``Blocks`` demo: Classify, Segment and Compare tabs over a list of :class:`ServedModel`.

Handlers take raw upload payloads (``preprocess=False``) and decode them with :mod:`attnzoo.preprocess`, so
any image mode is accepted and an unreadable file becomes a ``gr.Error`` message. Requests are admitted by the
size of their image, read from its header before a pixel is decoded (:class:`attnzoo.serve.admission.SizeGate`:
smallest first, at most :data:`WORKERS` at once and one large one, their decode memory within a budget), so a
small request never waits behind a queue of large ones; model calls run one at a time so concurrent users do not
oversubscribe the CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gradio as gr  # offline: attnzoo.serve (the parent package, imported first) set Gradio's environment
import numpy as np
from huggingface_hub import ModelCard
from starlette.middleware import Middleware

from attnzoo.errors import quoted
from attnzoo.preprocess import load_image
from attnzoo.serve import examples as ex
from attnzoo.serve.admission import SizeGate, default_budget
from attnzoo.serve.demo._answers import (
    DISPLAY_MAX_SIDE,
    DemoModels,
    _classify,
    _compare_one,
    _iou_note,
    _legend,
    _object_classes,
    _segment_state,
    known_classes_note,
    upload_note,
)
from attnzoo.serve.demo._guards import (
    MAX_API_BODY,
    UPLOAD_BYTES_PER_CLIENT,
    UPLOAD_BYTES_TOTAL,
    UPLOAD_FILES_PER_CLIENT,
    BodyLimit,
    UploadQuota,
)
from attnzoo.serve.demo._uploads import (
    MAX_FILE_SIZE,
    UPLOAD_MAX_AGE_S,
    UPLOAD_SWEEP_S,
    _admitted_upload,
    _read_upload,
    private_upload_folder,
    upload_roots,
)
from attnzoo.serve.predict import (
    overlay,
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
    # kept importable here: the demo's parts
    "DemoModels",
    "known_classes_note",
    "upload_note",
    "UPLOAD_MAX_AGE_S",
    "UPLOAD_SWEEP_S",
    "UPLOAD_FILES_PER_CLIENT",
    "UPLOAD_BYTES_PER_CLIENT",
    "UPLOAD_BYTES_TOTAL",
    "_read_upload",
]

QUEUE = "models"
#: Requests the demo takes at once (the rest wait in Gradio's queue, up to its 64): each is then admitted by its
#: image's size (:class:`~attnzoo.serve.admission.SizeGate`), not in arrival order.
ADMITTED = 32
#: Requests that work at once (decode, resize, pictures; one large image among them); model calls run one at a time.
WORKERS = 2
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


# ------------------------------------------------------------------------------------------------- layout
def _admitted_click(
    button: gr.Button,
    fn: Callable[..., Any],
    inputs: list[Any],
    outputs: list[Any],
    api_name: str,
    preprocess: bool = True,
) -> None:
    """A click on ``button`` runs ``fn`` (API endpoint ``api_name``) in the one queue of model calls every tab
    shares (:data:`QUEUE`, at most :data:`ADMITTED` at once)."""
    button.click(
        fn,
        inputs,
        outputs,
        api_name=api_name,
        preprocess=preprocess,
        concurrency_id=QUEUE,
        concurrency_limit=ADMITTED,
    )


def _image_input(elem_id: str) -> gr.Image:
    """A tab's input image: uploaded or pasted, handed to the tab's function as a file path, shown unsmoothed."""
    return gr.Image(
        type="filepath", sources=["upload", "clipboard"], label="image", elem_id=elem_id, elem_classes="pixelated"
    )


def _choice_label(model: ServedModel) -> str:
    metric = {"top1": "top-1", "miou": "mIoU"}.get(model.score_name, model.score_name)
    return f"{model.name} ({metric} {model.score:.1f} %)" if model.score is not None else model.name


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
                    image = _image_input("cls-image")
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
            label, latency, note, seen = _classify_outputs()

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

    _admitted_click(button, run, [image, variant], [label, latency, note, seen], "classify", preprocess=False)
    _admitted_click(sketch_button, run_sketch, [sketch, variant], [label, latency, note, seen], "classify_drawing")


def _classify_outputs() -> tuple[gr.Label, gr.Number, gr.Markdown, gr.Image]:
    """The classify tab's outputs, in the column it is called in: the top-5, the model's latency, a note and the
    image as the model sees it."""
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
    return label, latency, note, seen


def _segment_tab(models: DemoModels, max_side: int | None, roots: Sequence[Path], gate: SizeGate) -> None:
    _no_models_note(models, "seg")
    state = gr.State(None)
    with gr.Row():
        with gr.Column():
            image = _image_input("seg-image")
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

    _admitted_click(
        button, run, [image, variant, opacity], [shown, legend, latency, note, state], "segment", preprocess=False
    )
    opacity.change(
        redraw, [state, opacity], shown, api_name="overlay", trigger_mode="always_last", show_progress="hidden"
    )


def _compare_tab(models: DemoModels, max_side: int | None, roots: Sequence[Path], gate: SizeGate) -> None:
    tasks = [t for t in ("cls", "seg") if models.names(t)]
    choices = [("Classify", "cls"), ("Segment", "seg")]
    with gr.Row():
        with gr.Column(scale=1):
            image = _image_input("cmp-image")
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

    _admitted_click(button, run, [image, task], [gallery, table], "compare", preprocess=False)


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
