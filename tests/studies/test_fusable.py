"""python -m research.fusable: both opsets exported and verified, audited, timed on each CPU runtime."""

from __future__ import annotations

import json

import pytest

from attnzoo.errors import CommandExit
from research.fusable import main


@pytest.mark.parametrize(
    "args, words",
    [
        (["--variants", "nope"], "unknown variant 'nope'; valid: standard"),
        (["--img-sizes", "33"], "multiples of 16"),
        (["--rounds", "1"], "--rounds must be >= 2"),
        (["--arch", "huge"], "--arch: unknown 'huge'"),
    ],
)
def test_bad_flags_are_one_line_before_any_work(tmp_path, capsys, args, words):
    with pytest.raises(CommandExit) as e:
        main([*args, "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")])
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "out" / "fusable.json").exists()


@pytest.mark.slow  # two exports and three runtimes' fusion audits (about 13 s)
def test_the_opset_23_export_fuses_on_both_runtimes_and_an_l1_variant_says_why_not(tmp_path):
    out = tmp_path / "out"
    main(
        [
            "--variants",
            "standard,wafe-mae",
            "--arch",
            "micro",
            "--img-sizes",
            "32",
            "--rounds",
            "2",
            "--threads",
            "1",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "c"),
            "--no-progress",
        ]
    )
    result = json.loads((out / "fusable.json").read_text())
    (e,) = result["exports"]
    assert e["variant"] == "standard" and e["tokens"] == 65
    assert e["opsets"]["20"]["fused"]["onnxruntime"] == [0, 4]  # MatMul/Softmax/MatMul: ORT's CPU fuses none
    assert e["opsets"]["23"]["fused"]["onnxruntime"] == [4, 4] and e["opsets"]["23"]["ops"]["Attention"] == 4
    assert all(x["extra_math"]["ok"] for x in e["opsets"].values())
    assert {r["runtime"] for r in result["rows"]} == {"ort-cpu", "openvino"}
    assert all(r["speedup"] > 0 and r["opset20_ms"] > 0 for r in result["rows"])
    assert "wafe-mae" in result["no_dot_product"] and "pairwise L1" in (out / "fusable.md").read_text()


def test_the_committed_table_says_what_fused_means_and_which_runtimes_were_read(capsys):
    """fusable.md is --table of the committed fusable.json: it defines fused once, names the runtimes inspected and
    the one not (TensorRT, with why), and labels the transformer optimizer's opset-23 count as the export's."""
    from pathlib import Path

    from attnzoo.runtime.fusion import FUSED

    folder = Path(__file__).resolve().parents[2] / "results" / "studies" / "fusable-amx"
    assert main(["--table", str(folder / "fusable.json")]) == 0
    text = capsys.readouterr().out
    assert text == (folder / "fusable.md").read_text()
    assert FUSED[1:] in text and "not inspected: TensorRT (" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and " | 23 | " in line]
    assert rows and all(line.endswith("(as exported) |") for line in rows)
