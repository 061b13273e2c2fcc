"""python -m attnzoo.studies.fused_cores: rows per group against standard, the previous cores, resume, bad flags."""

from __future__ import annotations

import json

import pytest

from attnzoo.errors import CommandExit
from research.fused_cores import main

# eager only (a compile per block is minutes on a loaded 2-core machine); tiny token counts, ViT-S width
FAST = ["--variants", "belief2,wafe-mae", "--compiled-variants", "none", "--batch-sizes", "1", "--rounds", "2"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--variants", "nope"], "unknown variant 'nope'"),
        (["--rounds", "1"], "--rounds must be >= 2"),
        (["--tokens", "1"], "--tokens must list token counts >= 2"),
        (["--batch-sizes", "0"], "--batch-sizes must be comma-separated positive integers"),
    ],
)
def test_bad_flags_are_one_line_before_any_work(tmp_path, capsys, args, words):
    with pytest.raises(CommandExit) as e:
        main([*args, "--out", str(tmp_path / "out")])
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # ViT-S blocks built and timed three times: ~10 s on a quiet 2-core machine
def test_rows_ratios_previous_cores_and_resume(tmp_path, capsys):
    out = tmp_path / "out"
    main([*FAST, "--tokens", "5,7", "--out", str(out), "--no-progress"])
    result = json.loads((out / "fused-cores.json").read_text())
    assert result["complete"] and not (out / "fused-cores.partial.json").exists()
    rows = result["rows"]
    assert {(r["tokens"], r["variant"], r["core"]) for r in rows} == {
        (t, v, c)
        for t in (5, 7)
        for v, c in [("standard", "current"), ("belief2", "current"), ("belief2", "before"), ("wafe-mae", "current")]
    }  # eager MAE runs cdist before and after: no before row
    for r in rows:
        assert r["parity_ok"] and r["median_ms"] > 0
        if r["variant"] == "standard":
            assert r["x_standard"]["ratio_median"] == 1.0
        assert ("speedup" in r) == (r["core"] == "before")
    readme = (out / "README.md").read_text()
    assert result["command"] in readme and "| 7 | 1 | `belief2` | before |" in readme

    # a stopped run: the 5-token group done (marked), the 7-token group not; the rerun keeps the first
    kept = [dict(r, median_ms=-1.0) for r in rows if r["tokens"] == 5]
    partial = dict(result, rows=kept, complete=False)
    (out / "fused-cores.partial.json").write_text(json.dumps(partial))
    main([*FAST, "--tokens", "5,7", "--out", str(out), "--no-progress"])
    assert "resuming: 4 rows kept" in capsys.readouterr().err
    again = json.loads((out / "fused-cores.json").read_text())["rows"]
    assert [r["median_ms"] for r in again if r["tokens"] == 5] == [-1.0] * 4
    assert all(r["median_ms"] > 0 for r in again if r["tokens"] == 7)
