"""The seg-epochs study's README quotes the committed evaluation: its headline figures are ``evaluation.json``'s
(written by the ``evaluate-model ... --out`` command the README gives), not prose."""

from __future__ import annotations

import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[2] / "results" / "studies" / "seg-epochs"


def test_the_readme_figures_are_the_committed_evaluation():
    result = json.loads((FOLDER / "evaluation.json").read_text())
    readme = " ".join((FOLDER / "README.md").read_text().split())
    assert result["metric_name"] == "miou" and result["n_images"] == 2000
    assert result["command"] in readme.replace(" \\ ", " ")  # the command that wrote it, as the README gives it
    assert f"**{result['metric']:.2f} %**" in readme
    named = result["named"]
    share = 100 * named["scenes_right"] / named["scenes"]
    assert f"{named['scenes_right']} of {named['scenes']:,} ({share:.1f} %)" in readme
