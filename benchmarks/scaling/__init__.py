"""Scaling: latency and peak memory against tokens and batch size, one variant per cost family, eager and ONNX.

Three sweeps on seeded random-init models (speed does not depend on the weights):

- ``tokens``: a ViT-S classifier at 224, 384 and 512 px (197, 577, 1025 tokens), batch 1;
- ``seg``: the Segmenter (ViT-S encoder, linear decoder, 150 classes) at 512 and 1024 px (1025, 4097 tokens);
- ``batch``: the ViT-S classifier at 224 px, batch 1 to 16.

:mod:`.sweep` runs them (every backend's output checked against eager fp32 before it is timed; a call too slow
or too large for this machine skipped with the reason), :mod:`.fits` derives the fitted exponents and the FLOP
cost model per family, :mod:`.tables` writes ``scaling.json``, ``scaling.md`` and ``scaling.png``, and
:mod:`.cli` is the command. ``report-variant`` runs the same sweep (:func:`run_scaling`) for its cost section.

Usage::

    python -m attnzoo.benchmarks.scaling --out results/studies/scaling-cpu
    python -m attnzoo.benchmarks.scaling --quick --out /tmp/scaling      # micro models, a minute or two
    python -m attnzoo.benchmarks.scaling --render DIR/scaling.json --out DIR   # tables and plot again
"""

from .cli import build_parser, main, parse_settings
from .fits import (
    DEFAULT_VARIANTS,
    FAMILIES,
    cost_model,
    crossover_tokens,
    derive,
    families,
    family_of,
    fit_exponent,
    fits,
)
from .sweep import Settings, plan, run_scaling
from .tables import markdown, plot, write_outputs

__all__ = [
    "FAMILIES",
    "DEFAULT_VARIANTS",
    "families",
    "family_of",
    "Settings",
    "plan",
    "run_scaling",
    "derive",
    "fits",
    "fit_exponent",
    "cost_model",
    "crossover_tokens",
    "markdown",
    "plot",
    "write_outputs",
    "build_parser",
    "parse_settings",
    "main",
]
