"""The zoo's figures: the baselines its models are read against, the README table of the zoo, and the table of a
retrain under way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo import zoo
from attnzoo.data.datasets import DIGITS_CLASSES, SHAPES_CLASSES, load_data
from attnzoo.data.fashion import MASK_THRESHOLD
from attnzoo.fileio import atomic_write_text, sha256_file
from attnzoo.metrics import confusion_matrix, metrics_from_confusion
from attnzoo.models import TASKS, VARIANT_NAMES
from attnzoo.training._zoo_manifest import RECIPES, TEST_N, TRAIN_ORDER
from attnzoo.training.train import evaluate_checkpoint


def baselines(recipes: dict[str, dict[str, Any]] = RECIPES) -> dict[str, dict[str, float]]:
    """Reference points for the Fashion-MNIST zoo, on the same test images as the models (percent).

    cls: chance, and multinomial logistic regression on the raw pixels (scikit-learn, trained on the train
    split). seg: predicting background everywhere, and thresholding the pixels with the masks' own rule
    (:data:`~attnzoo.data.fashion.MASK_THRESHOLD`), every foreground pixel given the most frequent garment
    class of the training scenes.
    """
    from sklearn.linear_model import LogisticRegression  # heavy: scikit-learn loads scipy; only the baselines fit

    r = recipes["fashion/cls"]
    train_set = load_data("fashion", "train", "cls", r["img_size"], r["train_size"])
    test_set = load_data("fashion", "test", "cls", r["img_size"], TEST_N["fashion"])
    flat = lambda s: s.images[..., 0].reshape(len(s), -1) / 255.0  # noqa: E731
    clf = LogisticRegression(max_iter=200).fit(flat(train_set), train_set.labels)
    cls = {
        "chance": round(100.0 / len(test_set.class_names), 2),
        "logistic_regression_pixels": round(100.0 * clf.score(flat(test_set), test_set.labels), 2),
    }
    r = recipes["fashion/seg"]
    seg = load_data("fashion", "test", "seg", r["img_size"], TEST_N["fashion"], scene=r.get("scene"))
    k = len(seg.class_names)
    train_masks = load_data("fashion", "train", "seg", r["img_size"], r["train_size"], scene=r.get("scene")).masks
    assert train_masks is not None  # fashion seg scenes have masks
    majority = int(np.bincount(train_masks.ravel(), minlength=k)[1:].argmax()) + 1
    pred = np.where(seg.images[..., 0] > MASK_THRESHOLD, majority, 0)
    conf = confusion_matrix(seg.masks, pred, k)
    seg_ref = {
        "all_background": round(background_miou(seg.masks, k), 2),
        "threshold_majority_class": round(metrics_from_confusion(conf, "seg", seg.class_names)["metric"], 2),
    }
    return {"fashion/cls": cls, "fashion/seg": seg_ref}


def background_miou(masks, num_classes: int) -> float:
    """mIoU (%) of predicting background everywhere: the floor a segmenter must clearly beat."""
    conf = confusion_matrix(masks, np.zeros_like(masks), num_classes)
    return metrics_from_confusion(conf, "seg", list(range(num_classes)))["metric"]


def table(rows: list[dict[str, Any]] | None = None, refs: dict[str, dict[str, float]] | None = None) -> str:
    """Markdown tables: Fashion-MNIST top-1 and mIoU per variant with the baselines, then the smoke sets."""
    if rows is None:
        rows = zoo.entries()
    if refs is None:
        refs = zoo.manifest().get("baselines", {})
    by = {(e["variant"], e["task"], e["data"]): e for e in rows}

    def cell(v, task, data):
        e = by.get((v, task, data))
        return "-" if e is None else f"{e['test_metric']:.1f}"

    def train_time(v, data):
        times = [by[(v, t, data)]["train_time_s"] for t in TASKS if (v, t, data) in by]
        return f"{sum(times):.0f}" if times else "-"

    lines = [
        "| variant | Fashion-MNIST top-1 (%) | fashion scenes mIoU (%) | params (cls) | train time cls+seg (s)* |",
        "|---|---:|---:|---:|---:|",
    ]
    for v in VARIANT_NAMES:
        c = by.get((v, "cls", "fashion"))
        if c is None and (v, "seg", "fashion") not in by:
            continue
        lines.append(
            f"| {v} | {cell(v, 'cls', 'fashion')} | {cell(v, 'seg', 'fashion')} | "
            f"{c['params'] if c else 0:,} | {train_time(v, 'fashion')} |"
        )
    lines += _baseline_rows(refs)
    n_test = {(e["data"], e["task"]): e["test_n"] for e in rows}
    lines += [
        "",
        f"Test images: {n_test.get(('fashion', 'cls'), '-')} (the official Fashion-MNIST test set) and "
        f"{n_test.get(('fashion', 'seg'), '-')} scenes composed from it. Baselines: `zoo baselines` "
        "(attnzoo.training.zoo.baselines). *Train times were measured on a 2-core CPU shared with other jobs, "
        "one thread per model; they vary with the load and are not a speed comparison (see bench-latency).",
    ]
    smoke = [e for e in rows if e["data"] in ("shapes", "digits")]
    if smoke:
        lines += [
            "",
            "Smoke sets (procedural shapes, scikit-learn digits):",
            "",
            "| variant | shapes cls top-1 (%) | shapes seg mIoU (%) | digits top-1 (%) |",
            "|---|---:|---:|---:|",
        ]
        for v in VARIANT_NAMES:
            if any((v, t, d) in by for t in TASKS for d in ("shapes", "digits")):
                lines.append(
                    f"| {v} | {cell(v, 'cls', 'shapes')} | {cell(v, 'seg', 'shapes')} | {cell(v, 'cls', 'digits')} |"
                )
        lines += [
            "",
            f"Chance: {100 / len(SHAPES_CLASSES):.1f}% on shapes, {100 / len(DIGITS_CLASSES):.0f}% on digits.",
        ]
    notes = [e for e in rows if e.get("note")]
    if notes:
        lines += [""] + [f"- {e['variant']} ({e['task']}, {e['data']}): {e['note']}" for e in notes]
    return "\n".join(lines)


def _baseline_rows(refs: dict[str, dict[str, float]]) -> list[str]:
    """The Fashion-MNIST table's two baseline rows (none without baselines)."""
    c, g = refs.get("fashion/cls", {}), refs.get("fashion/seg", {})
    if not (c or g):
        return []
    return [
        f"| *chance / all background* | *{c.get('chance', '-')}* | *{g.get('all_background', '-')}* | | |",
        f"| *logistic regression on pixels / threshold + majority class* | "
        f"*{c.get('logistic_regression_pixels', '-')}* | *{g.get('threshold_majority_class', '-')}* | | |",
    ]


TABLE_BEGIN, TABLE_END = "<!-- progress table: python -m attnzoo.training.zoo progress -->", "<!-- /progress table -->"


def progress(staging: Path, task: str = "seg", data: str = "fashion") -> str:
    """The table of a retrain under way (``build --retrain --out staging``), written into ``staging/README.md``
    between :data:`TABLE_BEGIN` and :data:`TABLE_END`: each finished model's test metric, the scenes in which it
    names every garment right (:func:`attnzoo.metrics.named_right`; where its manifest row predates that figure,
    evaluated from the file once and written into the manifest), the machine it trained on, its validation curve;
    then the variants still to train in the build's order. Returns the table."""
    staging = Path(staging)
    manifest = json.loads((staging / "manifest.json").read_text())
    rows = [r for r in manifest["models"] if r["task"] == task and r["data"] == data]
    backfilled = False
    lines = [
        "| variant | test mIoU (%) | scenes with every garment named right | trained on | validation mIoU per epoch |",
        "|---|---:|---:|---|---|",
    ]
    for r in sorted(rows, key=lambda r: -r["test_metric"]):
        path = staging / r["file"]
        if sha256_file(path) != r["sha256"]:
            raise ValueError(f"{path}: its sha256 is not the manifest's; rebuild it")
        if not r.get("named"):  # a row from before the figure: evaluated once, kept in the manifest
            r["named"], backfilled = evaluate_checkpoint(path)["named"], True
        named = r["named"]
        history = json.loads(path.with_suffix(".json").read_text())["history"]
        curve = " ".join(f"{h['val']:.1f}" for h in history)
        lines.append(
            f"| {r['variant']} | {r['test_metric']:.2f} | {named['scenes_right']} of {named['scenes']} "
            f"({100.0 * named['scenes_right'] / named['scenes']:.1f} %) | "
            f"{r.get('machine', 'not recorded')} | {curve} |"
        )
    if backfilled:
        atomic_write_text(staging / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    done = {r["variant"] for r in rows}
    left = [v for v in TRAIN_ORDER if v not in done]
    lines += ["", f"Still to train (the build's order): {', '.join(left)}." if left else "All variants are in."]
    text = "\n".join(lines)
    readme = staging / "README.md"
    old = readme.read_text() if readme.is_file() else ""
    if TABLE_BEGIN in old and TABLE_END in old:
        new = (
            old[: old.index(TABLE_BEGIN)]
            + f"{TABLE_BEGIN}\n{text}\n{TABLE_END}"
            + old[old.index(TABLE_END) + len(TABLE_END) :]
        )
    else:
        new = old.rstrip("\n") + f"\n\n{TABLE_BEGIN}\n{text}\n{TABLE_END}\n"
    atomic_write_text(readme, new)
    return text
