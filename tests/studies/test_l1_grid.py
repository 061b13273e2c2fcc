"""python -m research.l1_grid: pieces of the fused-cores grid gathered into one table and chart; pieces from two
CPUs, a setting measured twice and unfinished pieces refused in one line."""

from __future__ import annotations

import json

import pytest

from attnzoo.errors import CommandExit
from research.l1_grid import CHART, main

CPU = {"model": "Test CPU", "logical_cores": 2, "key_flags": ["avx2", "avx512f"]}


def _row(mode, tokens, batch, threads, variant, ratio, mem, core="current", ok=True):
    return {
        "mode": mode,
        "tokens": tokens,
        "batch": batch,
        "threads": threads,
        "variant": variant,
        "core": core,
        "x_standard": {"ratio_median": ratio},
        "bound": 1.31 if variant != "standard" else 1.0,
        "mem_x_standard": mem,
        "parity_ok": ok,
    }


def _piece(folder, rows, cpu=CPU, tokens=(1025,), threads=(1,)):
    folder.mkdir(parents=True)
    result = {
        "settings": {"tokens": list(tokens), "batch_sizes": [1], "threads": list(threads), "rounds": 5},
        "environment": {"cpu": cpu, "versions": {"torch": "2.x"}, "load_average": [1.0, 1.0, 1.0]},
        "rows": rows,
        "complete": True,
        "load_end": [0.9, 1.0, 1.0],
    }
    (folder / "fused-cores.json").write_text(json.dumps(result))
    return folder


def test_pieces_become_one_table_per_measure_and_a_chart(tmp_path, capsys):
    a = _piece(
        tmp_path / "a",
        [
            _row("eager", 1025, 1, 1, "standard", 1.0, 1.0),
            _row("eager", 1025, 1, 1, "wafe-mae", 1.74, 1.09),
            _row("eager", 1025, 1, 1, "wafe-mae", 4.4, 2.0, core="cdist"),  # an alternative: not in the grid
            _row("eager", 1025, 1, 1, "anti-wafe-mae", 1.84, 1.04, ok=False),
            _row("ort", 1025, 1, 1, "wafe-mae", 4.77, 1.17),
        ],
    )
    b = _piece(tmp_path / "b", [_row("eager", 1025, 1, 2, "wafe-mae", 1.62, 1.2)], threads=(2,))
    out = tmp_path / "grid"
    main([str(a), str(b), "--out", str(out)])
    md = (out / "README.md").read_text()
    assert md == capsys.readouterr().out.rstrip("\n") + "\n"
    assert "Test CPU (avx2, avx512f" in md
    assert "| 1025 | 1 | 1 | 1.31 | 1.74 / 1.84 FAIL | 4.77 / - |" in md  # time: bound, then per runtime
    assert "| 1025 | 1 | 1 | 1.09 / 1.04 FAIL | 1.17 / - |" in md  # memory: no bound column
    assert "| 1025 | 1 | 2 | 1.31 | 1.62 / - | - / - |" in md  # not measured in that piece
    assert "4.40" not in md and "2.00" not in md  # alternative cores stay in their piece's README
    assert "[a](../a/README.md)" in md and "[b](../b/README.md)" in md
    assert (out / CHART).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refuses_two_cpus_a_setting_twice_and_unfinished_pieces(tmp_path, capsys):
    row = [_row("eager", 1025, 1, 1, "wafe-mae", 1.7, 1.1)]
    a = _piece(tmp_path / "a", row)
    other = _piece(tmp_path / "other", [_row("eager", 577, 1, 1, "wafe-mae", 1.5, 1.0)], cpu={"model": "Other"})
    twice = _piece(tmp_path / "twice", row)
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "fused-cores.partial.json").write_text("{}")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "fused-cores.json").write_text("[1, 2]")
    for folders, words in [
        ([a, other], "other was measured on Other"),
        ([a, twice], "eager at 1025 tokens, batch 1, 1 thread(s) is in both"),
        ([partial], "a partial run only: finish it first"),
        ([tmp_path / "none"], "no fused-cores.json"),
        ([junk], "not a fused-cores result"),
        ([], "give at least one fused-cores study folder"),
    ]:
        with pytest.raises(CommandExit) as e:
            main([*map(str, folders), "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything is written
