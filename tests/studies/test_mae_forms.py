"""python -m research.mae_forms: every form exported, verified, timed against eager; bad input."""

from __future__ import annotations

import json

import pytest

from attnzoo.models import ARCHS
from attnzoo.runtime.parity import TOLERANCES
from research.mae_forms import forms, main


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--variant", "standard"], "--variant: unknown 'standard'; valid: wafe-mae, anti-wafe-mae"),
        (["--arch", "huge"], "--arch: unknown 'huge'"),
        (["--blocks", "0"], "--blocks must be comma-separated positive integers, got '0'"),
        (["--batch-sizes", "0"], "--batch-sizes must be comma-separated positive integers, got '0'"),
        (["--rounds", "1"], "--rounds must be >= 2"),
    ],
)
def test_bad_input_one_line_exit_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not (tmp_path / "out" / "mae_forms.json").exists()


def test_forms_names():
    assert forms([8, 16]) == ["broadcast", "blocked8", "blocked16"]


@pytest.mark.slow
def test_run_times_every_form_after_parity(tmp_path):
    out = tmp_path / "out"
    assert (
        main(
            [
                "--arch",
                "micro",
                "--batch-sizes",
                "2",
                "--blocks",
                "4",
                "--rounds",
                "2",
                "--out",
                str(out),
                "--cache-dir",
                str(tmp_path / "cache"),
                "--no-progress",
            ]
        )
        == 0
    )
    result = json.loads((out / "mae_forms.json").read_text())
    runners = [r["runner"] for r in result["rows"]]
    assert runners[0] == "eager" and {"ort-cpu broadcast", "ort-cpu blocked4"} <= set(runners)
    for row in result["rows"][1:]:
        assert row["batch"] == 2 and row["iterations"] == 2 and row["speedup"] > 0
        assert 0 <= row["parity_error"] <= TOLERANCES["fp32"]
    assert set(result["exports"]) == {"broadcast", "blocked4"}
    arch = ARCHS["micro"]
    tokens = (32 // arch["patch_size"]) ** 2 + 1
    blocks = -(-tokens // 4)  # exactly 4 queries per block, whatever the default rule
    assert result["exports"]["blocked4"]["ops"]["Max"] == arch["depth"] * arch["num_heads"] * blocks
    md = (out / "mae_forms.md").read_text()
    assert "| 2 | ort-cpu blocked4 |" in md and "| blocked4 |" in md
