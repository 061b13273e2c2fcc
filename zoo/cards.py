"""A zoo model in the Hugging Face layout: a folder of ``config.json`` (timm's ``save_for_hf``), ``model.safetensors``
(the zoo file itself) and ``README.md``, a model card whose YAML metadata (``library_name: timm``, ``model-index``
with the zoo's measured test metric) huggingface_hub writes and reads, and whose body says what the model is, how it
was trained and measured, its limits, and whether its attention deploys, from the variant's committed
``report-variant`` report.

A card is made from the repository: the manifest and checkpoint configs (``zoo/``), the variants' registry, the
equations in ``docs/variants.md`` and the reports in ``results/variant-reports/``. The Fashion-MNIST models' cards
are committed in ``zoo/cards/<name>/README.md`` and ship with the package (the demo shows them);
``python -m attnzoo.zoo card --all --readme-only --out zoo/cards`` rewrites them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import timm
import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from timm.models import save_for_hf

from attnzoo import models, zoo
from attnzoo.fileio import atomic_write_text, sha256_file
from attnzoo.machine import cpu_summary
from attnzoo.mdtext import code, link, text
from attnzoo.preprocess import INPUT_STYLES, input_style_of

from . import hub
from .names import CARDS_DIR, packaged_card

__all__ = ["ROOT", "CARDS_DIR", "DATASETS", "card_markdown", "write_folder", "packaged_card", "names_table"]

#: The repository root in a checkout (``zoo/`` is one of its folders); a card's sources are read from it.
ROOT = zoo.ZOO_DIR.parent
REPORTS = Path("results") / "variant-reports"
VARIANTS_DOC = Path("docs") / "variants.md"

#: Per zoo data set: its Hugging Face dataset id (``None``: not on the Hub), its name, and each task's test split.
DATASETS: dict[str, dict[str, Any]] = {
    "fashion": {
        "hub": "zalando-datasets/fashion_mnist",
        "name": "Fashion-MNIST",
        "licence": "MIT",
        "cls": "the official Fashion-MNIST test split",
        "seg": "scenes composed from the official Fashion-MNIST test images",
    },
    "shapes": {
        "hub": None,
        "name": "attnzoo shapes",
        "licence": "generated",
        "cls": "generated test images",
        "seg": "generated test scenes",
    },
    "digits": {"hub": None, "name": "scikit-learn digits", "licence": "CC BY 4.0", "cls": "a held-out test split"},
}
_TASKS = {"cls": ("image-classification", "Image Classification"), "seg": ("image-segmentation", "Image Segmentation")}
_KINDS = {"cls": ("classifier", "images"), "seg": ("segmenter", "scenes")}
_BASELINES = {
    "chance": "chance",
    "logistic_regression_pixels": "logistic regression on the pixels",
    "all_background": "all background",
    "threshold_majority_class": "a threshold and the majority class",
}
_METRICS = {"top1": ("accuracy", "top-1 accuracy (%)", "top-1"), "miou": ("mean_iou", "mIoU (%)", "mIoU")}
#: The report's export steps, labelled (a step the report adds later is shown by its key).
_STEPS = {
    "fp32": "ONNX fp32",
    "fp16": "ONNX fp16",
    "int8": "ONNX int8 (Q/DQ)",
    "fp8": "ONNX FP8 (Q/DQ)",
    "tensorrt": "TensorRT engine",
    "triton": "Triton model repository",
    "openvino": "OpenVINO IR",
    "executorch": "ExecuTorch program",
    "aoti": "AOTInductor package",
}
_RUNTIMES = {
    "openvino": "OpenVINO",
    "onnxruntime": "ONNX Runtime",
    "onnxruntime-transformers": "ONNX Runtime transformer optimizer",
    "tensorrt": "TensorRT",
}


def _data(entry: Mapping[str, Any]) -> dict[str, Any]:
    return DATASETS.get(
        entry["data"], {"hub": None, "name": entry["data"], "licence": "unknown", entry["task"]: "its test split"}
    )


def _metadata(name: str, entry: Mapping[str, Any]) -> ModelCardData:
    """The card's YAML metadata: what the Hub and its tools read."""
    task, task_name = _TASKS[entry["task"]]
    metric, metric_label, _ = _METRICS[entry["metric_name"]]
    data = _data(entry)
    result = EvalResult(
        task_type=task,
        task_name=task_name,
        dataset_type=data["hub"] or f"attnzoo-{entry['data']}",
        dataset_name=data["name"],
        dataset_split="test",
        metric_type=metric,
        metric_name=metric_label,
        metric_value=entry["test_metric"],
    )
    tags = ["timm", task, "attnzoo", f"attnzoo-{entry['variant']}", "vision-transformer"]
    return ModelCardData(
        library_name="timm",
        license="apache-2.0",
        tags=tags + (["segmenter"] if entry["task"] == "seg" else []),
        datasets=[data["hub"]] if data["hub"] else None,
        pipeline_tag=task,
        model_name=name,
        eval_results=[result],
    )


def _spec(variant: str) -> models.VariantSpec:
    return models.VARIANTS[variant]


def _paper(variant: str) -> str:
    p = _spec(variant).paper
    return f"{link(p.title, p.url)}, {text(p.authors)}, {p.year}" if isinstance(p, models.Paper) else text(p)


def _equations(variant: str, root: Path) -> list[str]:
    """The notation and the variant's row of ``docs/variants.md``'s "What each variant computes"."""
    doc = (root / VARIANTS_DOC).read_text()
    section = doc.split("## What each variant computes", 1)[1].split("\n## ", 1)[0]
    notation = section.strip().split("\n\n", 1)[0].replace("\n", " ")
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().removeprefix("|").removesuffix("|").split("|", 1)]
        named = re.findall(r"`([a-z0-9-]+)`", cells[0])
        if len(cells) == 2 and variant in named:  # "`wafe-mse` / `anti-wafe-mse`": ∓ is - for the first, + after
            return [notation, "", f"`{variant}`: {cells[1].replace('∓', '−' if named.index(variant) == 0 else '+')}"]
    raise ValueError(f"{VARIANTS_DOC} has no row for {variant!r} under 'What each variant computes'")


def _architecture(entry: Mapping[str, Any], cfg: Mapping[str, Any]) -> str:
    a = models.ARCHS[cfg["arch"]]
    stem = (
        "a stem of two stride-2 3x3 convolutions (patch 4)"
        if a.get("stem") == "conv"
        else f"{a['patch_size']}x{a['patch_size']} patches"
    )
    hidden = models.mlp_hidden(cfg["variant"], cfg["arch"], **cfg.get("options", {}))
    options = ", ".join(f"{k}={v}" for k, v in cfg.get("options", {}).items()) or "no options"
    vit = (
        f"timm `VisionTransformer` (attnzoo's `{cfg['arch']}`): {a['depth']} blocks, width {a['embed_dim']}, "
        f"{a['num_heads']} heads, MLP {hidden}, {stem}; attention `{cfg['variant']}` ({options})"
    )
    if entry["task"] == "cls":
        return vit
    return f"`attnzoo.models.Segmenter` (Strudel et al. 2021, {cfg.get('decoder')} decoder) over a {vit}"


def _details(name: str, entry: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    size, k = cfg["img_size"], cfg["num_classes"]
    style = input_style_of(cfg)
    return [
        "## Model details",
        "",
        "|  |  |",
        "|---|---|",
        f"| timm name | `{name}` (registered by `import attnzoo.models`) |",
        f"| task | {_TASKS[entry['task']][1].lower()}, {k} classes |",
        f"| architecture | {_architecture(entry, cfg)} |",
        f"| parameters | {entry['params']:,} |",
        f"| input | {size} x {size} RGB{' or larger (padded to a multiple of 4)' if entry['task'] == 'seg' else ''}, "
        f"resized bilinearly without a crop, mean {tuple(cfg['mean'])}, std {tuple(cfg['std'])}; input style "
        f"`{style}`: attnzoo's demo makes an upload look like the training images so ({text(INPUT_STYLES[style])}) |",
        f"| classes | {text(', '.join(cfg['class_names']))} |",
        f"| weights | `zoo/{entry['file']}` in the attnzoo package, sha256 `{entry['sha256']}` |",
        f"| licence | Apache-2.0; training data: {_data(entry)['name']} ({_data(entry)['licence']}) |",
    ]


#: How a card's example prepares an image and reads the output: timm's transform for a classifier; a segmenter
#: takes the whole image at any size (timm's transform would crop it to the training size).
_USE = {
    "cls": [
        "transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))",
        'x = transform(Image.open("image.png").convert("RGB")).unsqueeze(0)',
        "probs = model(x).softmax(1)",
    ],
    "seg": [
        "cfg = timm.data.resolve_data_config({}, model=model)",
        'x = normalize(to_tensor(Image.open("image.png").convert("RGB")), cfg["mean"], cfg["std"]).unsqueeze(0)',
        "masks = model(x).argmax(1)  # (1, H, W) class indices, any H and W",
    ],
}


def _usage(name: str, entry: Mapping[str, Any]) -> list[str]:
    seg = ["from torchvision.transforms.functional import normalize, to_tensor"] if entry["task"] == "seg" else []
    return [
        "## How to use",
        "",
        "```python",
        "import attnzoo.models  # registers the zoo's timm names",
        "import timm",
        "from PIL import Image",
        *seg,
        "",
        f'model = timm.create_model("{name}", pretrained=True).eval()',
        *_USE[entry["task"]],
        "```",
        "",
        f"`python -m attnzoo.zoo card {name} --out DIR` writes this card with `config.json` and `model.safetensors` "
        f'to `DIR/{name}/`, which `timm.create_model("local-dir:DIR/{name}", pretrained=True)` loads after '
        "`import attnzoo.models`. The weights load with no network.",
    ]


def _attention(entry: Mapping[str, Any], root: Path) -> list[str]:
    spec = _spec(entry["variant"])
    return [
        "## Attention",
        "",
        f"Paper: {_paper(entry['variant'])}. Equations: {text(spec.equations or '-')} of the paper, "
        "as attnzoo computes them:",
        "",
        *_equations(entry["variant"], root),
    ]


def _training(entry: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    r, manifest = cfg["recipe"], zoo.manifest()["recipe"]
    start = f"from `{r['init_from']}`" if r.get("init_from") else "from scratch"
    scene = f"; scenes {code(json.dumps(r['scene']))}" if r.get("scene") else ""
    return [
        "## Training",
        "",
        f"The zoo's one recipe for {_data(entry)['name']} {_KINDS[entry['task']][0]}s "
        f"(the same for every variant), {start}: "
        f"{r['epochs']} epochs of {cfg['train_size']:,} training {_KINDS[entry['task']][1]} "
        f"({r['img_size']} px{scene}), batch {r['batch_size']}, lr {r['lr']}, weight decay {r['weight_decay']}, "
        f"{r['warmup_epochs']} warm-up epochs, cosine to {r['min_lr_ratio']} of the peak; "
        f"{text(manifest['optimizer'])}; seed {cfg['seed']} (data seed {cfg.get('data_seed', 0)}), "
        f"{r.get('threads', 1)} thread. `{manifest['command']}` trains the zoo with it "
        f"(`--data {entry['data']} --tasks {entry['task']}` for these models).",
    ]


def _spread(entry: Mapping[str, Any]) -> str:
    peers = [p["test_metric"] for p in zoo.entries() if (p["task"], p["data"]) == (entry["task"], entry["data"])]
    return f"{min(peers):.2f}-{max(peers):.2f}"


def _evaluation(entry: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    _, _, short = _METRICS[entry["metric_name"]]
    base = zoo.manifest().get("baselines", {}).get(f"{entry['data']}/{entry['task']}", {})
    lines = [
        "## Evaluation",
        "",
        f"| split | {_KINDS[entry['task']][1]} | {short} (%) |",
        "|---|---:|---:|",
        f"| test: {_data(entry)[entry['task']]} | {entry['test_n']:,} | {entry['test_metric']:.2f} |",
        f"| validation (held out of the training data) | {cfg['recipe'].get('val_size') or 0:,} | "
        f"{entry['val_metric']:.2f} |",
        *(f"| baseline on the test split: {text(_BASELINES.get(k, k))} | | {v:.2f} |" for k, v in base.items()),
        "",
        f"Measured in fp32 (eager PyTorch on the CPU) when the zoo was built: `test_metric` in `zoo/manifest.json`. "
        f"`evaluate-model zoo/{entry['file']}` measures it again.",
    ]
    if entry.get("per_class_iou"):
        ious = ", ".join(f"{text(c)} {v:.1f}" for c, v in entry["per_class_iou"].items())
        lines += ["", f"IoU per class (%): {ious}."]
    return lines


def _limits(entry: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    n = sum(1 for p in zoo.entries() if (p["task"], p["data"]) == (entry["task"], entry["data"]))
    notes = [
        f"- Trained and measured on {_data(entry)['name']} {_KINDS[entry['task']][1]} only: any "
        f"other image is still put into its {len(cfg['class_names'])} classes.",
        f"- One training run (seed {cfg['seed']}); the seed-to-seed spread was not measured, so its place among the "
        f"zoo's {n} {_KINDS[entry['task']][0]}s of this data ({_spread(entry)} %) is weak evidence.",
        f"- A small model ({entry['params']:,} parameters) with a short recipe: neither the paper's setting nor its "
        "results.",
    ]
    if entry.get("note"):
        notes.append(f"- {text(entry['note'])}")
    return ["## Limits", "", *notes]


def _step_result(entry: Mapping[str, Any]) -> str:
    """A step's result from its own facts: its status, how far it got (``state``), whether it passed."""
    if entry.get("status") != "ok":
        return text(f"{entry.get('status')}: {entry.get('reason', '')}".rstrip(": "))
    if entry.get("state"):
        return text(f"{entry['state']}: {entry['not_run_reason']}" if entry.get("not_run_reason") else entry["state"])
    figure = next((f"{k.replace('_', ' ')} {entry[k]:.3g}" for k in ("max_abs_err", "cosine_min") if k in entry), "")
    return ("passed" if entry.get("passed") else "FAILED") + (f" ({figure})" if figure else "")


def _fused(report: Mapping[str, Any], side: str) -> dict[str, str]:
    entry = report.get("fusion", {}).get(side) or {}
    runtimes = entry.get("audit", {}).get("runtimes", []) if entry.get("status") == "ok" else []
    return {
        r["runtime"]: f"{r['fused']} of {r['cores']}" if r.get("inspected") else f"not inspected: {r.get('reason')}"
        for r in runtimes
    }


def _deployability(model_entry: Mapping[str, Any], report: Mapping[str, Any], path: str) -> list[str]:
    variant, env = model_entry["variant"], report["environment"]
    steps = report["export"][variant]
    source = steps.get("source", {}).get("checkpoint")
    whose = (
        f"It exported this model (`{source}`)."
        if source == model_entry["file"]
        else f"It exported the variant's classifier (`{source}`), not this model: the rows say how `{variant}` "
        "attention fares on each path."
    )
    gpu = (env.get("gpu") or {}).get("name") if env.get("gpu") else None
    lines = [
        "## Deployability",
        "",
        f"From the variant's committed `report-variant` run, `{path}` in the attnzoo repository "
        f"({code(report.get('command'))}), on {text(cpu_summary(env['cpu']))}, {text(gpu) if gpu else 'no GPU'}; "
        f"torch {text(env['versions'].get('torch'))}, onnxruntime {text(env['versions'].get('onnxruntime'))}, "
        f"openvino {text(env['versions'].get('openvino'))}. {whose}",
        "",
        "| format | result | extra math kept |",
        "|---|---|---|",
    ]
    kept = steps.get("extra_math_kept", {})
    for key in [*(k for k in _STEPS if k in steps), *(k for k in steps if k not in _STEPS)]:
        entry = steps[key]
        if isinstance(entry, dict) and "status" in entry and key != "accuracy":
            mark = {True: "yes", False: "NO"}.get(kept.get(key), "-")
            lines.append(f"| {text(_STEPS.get(key, key))} | {_step_result(entry)} | {mark} |")
    mine, base = _fused(report, variant), _fused(report, "standard")
    lines += ["", "Attention cores each runtime runs as one fused kernel (the fusion audit, fp32 exports):", ""]
    lines += [f"| runtime | {variant} | standard |", "|---|---|---|"]
    lines += [f"| {_RUNTIMES.get(r, text(r))} | {text(f)} | {text(base.get(r, '-'))} |" for r, f in mine.items()]
    return lines + _latency(report)


def _latency(report: Mapping[str, Any]) -> list[str]:
    lat = report.get("cost", {}).get("latency", {})
    rows = [o for o in lat.get("overheads", []) if o.get("batch") == 1]
    if lat.get("status") != "ok" or not rows:
        return ["", f"Latency: not measured ({text(lat.get('status', 'absent'))})."]
    s = lat["settings"]
    lines = [
        "",
        f"Latency against standard, ViT-{text(s['arch'])} classifiers with seeded random weights (not this model; "
        f"latency does not depend on the weights), batch 1, {s['threads']} thread, median [Q1, Q3] of "
        f"{rows[0]['pairs']} A B pairs:",
        "",
        "| backend | standard ms | this variant ms | x standard |",
        "|---|---:|---:|---|",
    ]
    for o in rows:
        lines.append(
            f"| {text(o['backend'])} {text(o['dtype'])} | {o['standard_median_ms']:.2f} | {o['variant_median_ms']:.2f} "
            f"| {o['ratio_median']:.2f} [{o['ratio_q1']:.2f}, {o['ratio_q3']:.2f}] |"
        )
    return lines


def _report(variant: str, root: Path) -> tuple[dict[str, Any], str]:
    rel = (REPORTS / variant / "report.json").as_posix()
    path = root / rel
    if not path.is_file():
        raise ValueError(f"no report-variant report of {variant!r} at {path} (the card's deployability table)")
    return json.loads(path.read_text()), rel


def card_markdown(name: str, root: Path = ROOT) -> str:
    """The README.md model card of a zoo model's timm name, from the repository at ``root``.

    Raises:
        ValueError: not a zoo name (the valid ones listed), or a source missing (named).
    """
    e, cfg = hub.entry(name), hub.config(name)
    report, rel = _report(e["variant"], root)
    task, items = _KINDS[e["task"]]
    intro = (
        f"A {_data(e)['name']} {task} with `{e['variant']}` attention ({_paper(e['variant'])}), trained by the "
        f"attnzoo zoo's recipe: {_METRICS[e['metric_name']][2]} {e['test_metric']:.2f} % on "
        f"{_data(e)[e['task']]} ({e['test_n']:,} {items})."
    )
    sections = [
        [f"# {name}", "", intro],
        _details(name, e, cfg),
        _usage(name, e),
        _attention(e, root),
        _training(e, cfg),
        _evaluation(e, cfg),
        _limits(e, cfg),
        _deployability(e, report, rel),
    ]
    body = "\n\n".join("\n".join(s) for s in sections)
    return f"---\n{_metadata(name, e).to_yaml()}\n---\n\n{body}\n"


def _verify(folder: Path, name: str, entry: Mapping[str, Any], model: torch.nn.Module) -> None:
    """The folder loads with timm's ``local-dir:`` to the zoo model's logits, holds the zoo's bytes, and its card's
    metadata reads back with the manifest's metric.

    Raises:
        ValueError: what differs.
    """
    size = hub.config(name)["img_size"]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    with torch.no_grad():
        if not torch.equal(loaded(x), model(x)):
            raise ValueError(f"{folder}: timm's local-dir load does not give the zoo model's logits")
    if sha256_file(folder / "model.safetensors") != entry["sha256"]:
        raise ValueError(f"{folder}/model.safetensors is not the zoo file (sha256 differs from the manifest)")
    results = ModelCard.load(folder / "README.md").data.eval_results or []
    if [r.metric_value for r in results] != [entry["test_metric"]]:
        raise ValueError(f"{folder}/README.md: its model-index metrics do not read back as the manifest's")


def write_folder(name: str, out: Path, markdown: str | None = None, readme_only: bool = False) -> Path:
    """Write ``out/<name>/``: ``config.json`` (timm's ``save_for_hf``), ``model.safetensors`` (the zoo file's bytes)
    and ``README.md`` (``markdown``, default :func:`card_markdown`'s), built in a temporary folder beside it and
    verified (:func:`_verify`) before any file of ``out/<name>/`` is replaced; ``readme_only``: the card alone (the
    committed cards). Returns the folder."""
    markdown = card_markdown(name) if markdown is None else markdown
    folder = Path(out) / name
    folder.mkdir(parents=True, exist_ok=True)
    if readme_only:
        atomic_write_text(folder / "README.md", markdown)
        return folder
    e = hub.entry(name)
    model = timm.create_model(name, pretrained=True).eval()
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{name}.") as tmp:
        staged = Path(tmp)
        save_for_hf(
            model,
            str(staged),
            safe_serialization=True,
            model_config={"label_names": list(hub.config(name)["class_names"])},
        )
        shutil.copyfile(zoo.ZOO_DIR / e["file"], staged / "model.safetensors")  # the zoo's bytes, attnzoo metadata kept
        (staged / "README.md").write_text(markdown, encoding="utf-8")
        _verify(staged, name, e, model)
        for file in ("config.json", "model.safetensors", "README.md"):
            os.replace(staged / file, folder / file)
    return folder


def names_table(data: str = zoo.DEFAULT_DATA, cards: str = "../zoo/cards") -> str:
    """Markdown table of the zoo's timm names of ``data``, one row per variant, each name linked to its card under
    ``cards`` (a path relative to the page; docs/zoo.md's)."""
    by_variant: dict[str, dict[str, str]] = {}
    for n in hub.names(data=data):
        e = hub.entry(n)
        by_variant.setdefault(e["variant"], {})[e["task"]] = f"[`{n}`]({cards}/{n}/README.md)"  # names: [a-z0-9_.]
    rows = ["| variant | classifier | segmenter |", "|---|---|---|"]
    rows += [f"| `{v}` | {t.get('cls', '-')} | {t.get('seg', '-')} |" for v, t in by_variant.items()]
    return "\n".join(rows)
