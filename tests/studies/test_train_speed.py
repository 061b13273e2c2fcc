"""The train-speed study's committed reports reprint from their JSON, and a row it does not know is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnzoo.errors import CommandExit
from research.train_speed import SETTINGS, TRAIN_SETTINGS, main, markdown

RESULTS = Path(__file__).resolve().parents[2] / "results" / "studies" / "train-speed"


def test_every_committed_report_reprints_one_line_per_row(capsys):
    reports = sorted(RESULTS.glob("*/train_speed.json"))
    assert reports
    for path in reports:
        result = json.loads(path.read_text())
        assert {r["setting"] for r in result["rows"]} <= set(SETTINGS)
        assert main(["--table", str(path)]) == 0
        out = capsys.readouterr().out
        assert out == markdown(result) + "\n"
        for row in result["rows"]:
            assert any(f"| {row['setting']} |" in line for line in out.splitlines()), (path, row["setting"])


def test_each_setting_states_what_it_changes():
    """The facts the timing and the table act on, as the module docstring describes them."""
    assert TRAIN_SETTINGS["eager-2t"].threads == 2 and TRAIN_SETTINGS["eager-2t"].models_at_once == 1
    assert TRAIN_SETTINGS["compile"].compiles and TRAIN_SETTINGS["channels-last"].channels_last
    assert TRAIN_SETTINGS["pair-1t"].pair and not TRAIN_SETTINGS["eager-1t"].pair
    assert {s.name for s in TRAIN_SETTINGS.values() if s.alone} == {"compile", "channels-last"}


def test_a_report_row_of_an_unknown_setting_is_one_line_naming_the_valid_ones(tmp_path, capsys):
    result = json.loads((RESULTS / "standard" / "train_speed.json").read_text())
    result["rows"][-1]["setting"] = "warp-9"
    report = tmp_path / "train_speed.json"
    report.write_text(json.dumps(result))
    with pytest.raises(CommandExit) as exc:
        main(["--table", str(report)])
    assert exc.value.code != 0
    err = capsys.readouterr().err.strip()
    assert "unknown train-speed setting 'warp-9'; valid: eager-1t" in err and "\n" not in err
