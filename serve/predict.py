"""Inference and its pictures for the demo: top-k classification, sliding-window segmentation, class colours,
mask overlays, per-class pixel shares and IoU, and top-k bar charts. No Gradio here -- plain arrays in and out.

Every image goes through :mod:`attnzoo.preprocess`; logits that are not finite raise ``ValueError`` so that no
NaN reaches an output.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import numpy as np
from PIL import Image

from attnzoo.preprocess import ImageLike, load_image, preprocess, to_input_style
from attnzoo.serve.served import SLIDING_BATCH, ServedModel

__all__ = [
    "classify",
    "segment",
    "model_view",
    "sliding_logits",
    "softmax",
    "palette",
    "overlay",
    "pixel_shares",
    "class_iou",
    "dominant_classes",
    "topk_chart",
    "background_classes",
]

_BACKGROUND_NAMES = {"background", "bg", "_background_", "void"}


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax."""
    z = np.exp(logits - logits.max(axis=axis, keepdims=True))
    return z / z.sum(axis=axis, keepdims=True)


def _checked(model: ServedModel, x: np.ndarray, run=None) -> tuple[np.ndarray, float]:
    """Run the model; return (logits, milliseconds); ``ValueError`` when an output is NaN or infinite."""
    start = time.perf_counter()
    logits = (run or model.run)(x)
    ms = (time.perf_counter() - start) * 1000.0
    if not np.isfinite(logits).all():
        raise ValueError(f"model {model.name!r} produced non-finite outputs (NaN or inf) for this image")
    return logits, ms


def model_view(model: ServedModel, image: ImageLike) -> Image.Image:
    """``image`` as ``model`` sees it: converted to its input style (:func:`attnzoo.preprocess.to_input_style`)
    and, for a classifier, resized to its input size (a segmenter's image keeps its size)."""
    img = to_input_style(load_image(image), model.input_style, model.task)
    h, w = model.input_size
    if model.task == "cls" and (img.height, img.width) != (h, w):
        img = img.resize((w, h), Image.Resampling.BILINEAR)
    return img


def classify(model: ServedModel, image: ImageLike, k: int = 5) -> tuple[dict[str, float], float]:
    """Top-``k`` classes of ``image`` as ``{class name: probability}`` (best first) and the model's latency
    in ms. The image is seen as :func:`model_view` shows it."""
    if model.task != "cls":
        raise ValueError(f"model {model.name!r} is a {model.task} model, not a classifier")
    x = preprocess(model_view(model, image), size=model.input_size, mean=model.mean, std=model.std)
    logits, ms = _checked(model, x)
    probs = softmax(logits[0].astype(np.float64))
    top = np.argsort(-probs, kind="stable")[:k]
    return {model.class_names[i]: float(probs[i]) for i in top}, ms


def _starts(length: int, window: int) -> list[int]:
    """Window offsets covering ``length`` with a stride of 2/3 of the window (the last one flush right)."""
    if length <= window:
        return [0]
    stride = max(1, window * 2 // 3)
    return sorted(set(list(range(0, length - window, stride)) + [length - window]))


def sliding_logits(model: ServedModel, x: np.ndarray, batch: int = SLIDING_BATCH) -> np.ndarray:
    """(1, 3, H, W) -> (1, K, H, W) logits, averaging windows of the model's input size.

    A model that takes any size sees images no larger than its window in one pass. A fixed-size model (an
    exported ONNX file) gets images smaller than its window padded with zeros (bottom/right), as the
    Segmenter pads to its patch grid. Windows run in batches of ``batch``.
    """
    H, W = x.shape[-2:]
    wh, ww = model.input_size
    if not model.fixed_size and H <= wh and W <= ww:
        return model.run(x)
    if model.fixed_size and (H < wh or W < ww):
        x = np.pad(x, ((0, 0), (0, 0), (0, max(0, wh - H)), (0, max(0, ww - W))))
    Hp, Wp = x.shape[-2:]
    ch, cw = min(Hp, wh), min(Wp, ww)
    boxes = [(y, x0) for y in _starts(Hp, ch) for x0 in _starts(Wp, cw)]
    total: np.ndarray | None = None
    count = np.zeros((Hp, Wp), np.float32)
    for i in range(0, len(boxes), batch):
        chunk = boxes[i : i + batch]
        out = model.run(np.concatenate([x[:, :, y : y + ch, x0 : x0 + cw] for y, x0 in chunk]))
        if total is None:
            total = np.zeros((out.shape[1], Hp, Wp), np.float32)
        for (y, x0), logits in zip(chunk, out, strict=False):
            total[:, y : y + ch, x0 : x0 + cw] += logits
            count[y : y + ch, x0 : x0 + cw] += 1
    assert total is not None  # the windows cover the image: at least one
    return (total / count)[None, :, :H, :W]


def segment(model: ServedModel, image: ImageLike, max_side: int | None = None) -> tuple[np.ndarray, float]:
    """Class-index mask of ``image`` at the image's own size, and the model's latency in ms.

    The image is downscaled so that its longer side is at most ``max_side`` (default: the model's input
    size, the scale the bundled models were trained at), segmented (sliding windows when larger than the
    model's window) and the mask is scaled back with nearest-neighbour sampling. The image is first converted
    to the model's input style (:func:`model_view`).
    """
    if model.task != "seg":
        raise ValueError(f"model {model.name!r} is a {model.task} model, not a segmenter")
    img = load_image(image)
    x = preprocess(
        model_view(model, img), size=None, mean=model.mean, std=model.std, max_side=max_side or max(model.input_size)
    )
    logits, ms = _checked(model, x, run=lambda t: sliding_logits(model, t))
    pred = logits[0].argmax(axis=0).astype(np.uint8 if logits.shape[1] <= 256 else np.int32)
    if pred.shape != (img.height, img.width):
        pred = np.asarray(Image.fromarray(pred).resize((img.width, img.height), Image.Resampling.NEAREST))
    return pred, ms


def background_classes(class_names: Sequence[str]) -> list[int]:
    """Indices of classes named like a background; they are left uncoloured in overlays."""
    return [i for i, n in enumerate(class_names) if n.strip().lower() in _BACKGROUND_NAMES]


def palette(n: int) -> np.ndarray:
    """(n, 3) uint8 class colours: matplotlib's tab10 then tab20b/tab20c without their greys (a grey class would
    vanish over the gray images of Fashion-MNIST), repeated if needed."""
    from matplotlib import colormaps  # heavy: matplotlib, for the demo's pictures (serve-models never draws)

    colours = [colormaps[name](i)[:3] for name, k in (("tab10", 10), ("tab20b", 20), ("tab20c", 20)) for i in range(k)]
    colours = [c for c in colours if max(c) - min(c) > 0.1]
    return (np.asarray([colours[i % len(colours)] for i in range(n)]) * 255 + 0.5).astype(np.uint8)


def overlay(
    image: np.ndarray, mask: np.ndarray, colours: np.ndarray, opacity: float, skip: Iterable[int] = ()
) -> np.ndarray:
    """Blend class colours over an (H, W, 3) uint8 image; classes in ``skip`` stay unblended."""
    opacity = float(np.clip(opacity if np.isfinite(opacity) else 0.5, 0.0, 1.0))
    alpha = np.full(mask.shape, opacity, np.float32)
    skip = list(skip)
    if skip:
        alpha[np.isin(mask, skip)] = 0.0
    colour = colours[np.minimum(mask, len(colours) - 1)].astype(np.float32)
    out = image.astype(np.float32) * (1 - alpha[..., None]) + colour * alpha[..., None]
    return (out + 0.5).astype(np.uint8)


def pixel_shares(mask: np.ndarray, num_classes: int) -> np.ndarray:
    """Fraction of pixels of each class (sums to 1)."""
    counts = np.bincount(mask.ravel().astype(np.int64), minlength=num_classes)[:num_classes]
    return counts / max(1, mask.size)


def class_iou(pred: np.ndarray, true: np.ndarray, num_classes: int) -> dict[int, float]:
    """IoU of each class present in the prediction or the ground truth."""
    if pred.shape != true.shape:
        raise ValueError(f"mask shapes differ: {pred.shape} vs {true.shape}")
    out = {}
    for c in range(num_classes):
        p, t = pred == c, true == c
        union = int(np.logical_or(p, t).sum())
        if union:
            out[c] = float(np.logical_and(p, t).sum()) / union
    return out


def dominant_classes(shares: np.ndarray, class_names: Sequence[str], k: int = 2) -> list[tuple[str, float]]:
    """The ``k`` largest non-background classes by pixel share (all classes if only background is left)."""
    skip = set(background_classes(class_names))
    order = [int(i) for i in np.argsort(-shares, kind="stable") if shares[i] > 0]
    chosen = [i for i in order if i not in skip][:k] or order[:1]
    return [(class_names[i], float(shares[i])) for i in chosen]


def topk_chart(probs: dict[str, float], title: str) -> np.ndarray:
    """A small horizontal bar chart of ``{class: probability}`` as an RGB uint8 array (matplotlib, Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # heavy: matplotlib, for the demo's pictures (serve-models never draws)

    fig = Figure(figsize=(3.2, 2.2), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    names, values = list(probs)[::-1], list(probs.values())[::-1]
    ax.barh(names, values, color="#4c72b0")
    for y, v in enumerate(values):
        ax.text(min(v + 0.02, 0.78), y, f"{v:.0%}", va="center", fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=8)
    fig.tight_layout()
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
