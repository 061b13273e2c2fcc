"""int8 fidelity of a pretrained-like ViT under each Q/DQ placement, through ``export_model`` (what
``export-model --dtype int8`` runs), on inputs that neither chose nor gated the placement.

Real pretrained ViTs carry a few residual-stream channels with huge activations (Darcet et al., "Vision Transformers
Need Registers", 2023, arXiv:2309.16588; Sun et al., "Massive Activations in Large Language Models", 2024,
arXiv:2402.17762) and outlier channels in the queries and keys. The study downloads no weights (it runs offline,
from the package alone), so :func:`.standin.pretrained_like_vit` builds a timm ViT in DINOv2 layout (patch
embedding, class token, LayerScale) whose weights reproduce both, without changing what the LayerNorms and attention
compute: a bias of ``residual_outlier`` in two residual channels that every LayerNorm gain damps, and two query
channels scaled by ``qk_outlier`` with the matching key channels divided by it (q.k unchanged). It is converted to
Belief2 (``convert_to_belief2``, the same function) and quantized with each placement from a folder of images (the
export's defaults: a quarter, at most 64, held out; ``auto``: half of those choose, half gate). The report
(:mod:`.placements`) holds, per placement, the export's own fidelity figures, the fidelity on a further set of images
the export never saw, how the worst-of-n moves with n, what ``auto`` kept and what each kept group costs, and the
int8 latency next to fp32 on ONNX Runtime and OpenVINO (:mod:`.speed`: one thread, batch 1, every model's runs
interleaved, with the load average: the machine may be shared).

``--zoo-accuracy`` instead exports the zoo's models to int8 as ``export-model --dtype int8`` does (its default
``auto`` placement, and the ``cpu`` placement of the copies ``serve-demo`` / ``serve-models --dtype int8`` serve)
and records whether each still passes its accuracy gate on the test split, with its fidelity figures (:mod:`.zoo`).

Usage::

    python -m research.int8_fidelity --out results/studies/int8-fidelity
    python -m research.int8_fidelity --out results/studies/int8-fidelity --zoo-accuracy cls
    python -m research.int8_fidelity --table results/studies/int8-fidelity/results.json
    python -m research.int8_fidelity --remedies --out results/studies/int8-remedies
    python -m research.int8_fidelity --zoo-outliers cls --out results/studies/int8-remedies

``--remedies``: the stand-in with LayerNorm outlier channels calibrated on augmented crops of three images,
each outlier remedy on the same footing (:mod:`.remedies`); ``--zoo-outliers``: whether ``auto``'s SmoothQuant
step moves anything in the zoo's models (:func:`.zoo.zoo_outliers`).
"""

from research.study import cpu_line

from .cli import build_parser, main
from .placements import markdown, measure, worst_of_n
from .remedies import remedies, remedies_markdown
from .speed import speeds
from .standin import augmented_crops, pretrained_like_vit, smooth_images, write_images
from .zoo import zoo_accuracy, zoo_accuracy_markdown, zoo_drift, zoo_outliers, zoo_outliers_markdown

__all__ = [
    "pretrained_like_vit",
    "smooth_images",
    "write_images",
    "augmented_crops",
    "speeds",
    "worst_of_n",
    "measure",
    "markdown",
    "remedies",
    "remedies_markdown",
    "zoo_drift",
    "zoo_accuracy",
    "zoo_accuracy_markdown",
    "zoo_outliers",
    "zoo_outliers_markdown",
    "cpu_line",
    "build_parser",
    "main",
]
