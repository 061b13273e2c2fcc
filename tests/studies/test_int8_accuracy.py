"""int8 accuracy on the zoo: a real run against an eager reference, the README table, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from research.int8_accuracy import main, readme_table


@pytest.mark.slow  # an int8 export scored on real images (about 10 s)
def test_real_run_matches_eager_on_the_same_images(tmp_path):
    import torch

    from attnzoo import zoo
    from attnzoo.data.datasets import load_data
    from attnzoo.preprocess import normalize

    n = 200
    assert (
        main(
            [
                "--variants",
                "standard",
                "--limit",
                str(n),
                "--batch-sizes",
                "1,4",
                "--min-time",
                "0.05",
                "--out",
                str(tmp_path),
                "--cache-dir",
                str(tmp_path / "cache"),
                "--no-progress",
            ]
        )
        == 0
    )
    result = json.loads((tmp_path / "int8_accuracy.json").read_text())
    (row,) = result["rows"]
    model, cfg = zoo.load("standard", "cls", "fashion")
    data = load_data("fashion", "test", "cls", cfg["img_size"], n=n)
    with torch.inference_mode():
        pred = model(torch.from_numpy(normalize(data.images, cfg["mean"], cfg["std"]))).argmax(1).numpy()
    eager_top1 = 100.0 * float(np.mean(pred == data.labels))
    assert row["n_images"] == n
    assert row["ort_fp32_metric"] == pytest.approx(eager_top1, abs=100.0 / n)  # at most one image apart
    assert row["delta"] == pytest.approx(row["ort_int8_metric"] - row["ort_fp32_metric"])
    assert 0.9 <= row["agreement"] <= 1.0
    assert set(row["speed"]) == {"1", "4"} and all(s["speedup_median"] > 0 for s in row["speed"].values())
    assert result["environment"]["cpu"]["model"] in (tmp_path / "int8_accuracy.md").read_text()


def _result(model: str, flags, deltas, speeds, contended=False):
    rows = [
        {
            "variant": v,
            "task": "cls",
            "ort_fp32_metric": 85.0,
            "delta": d,
            "speed": {"1": {"speedup_median": s}, "8": {"speedup_median": s + 0.5}},
        }
        for v, d, s in zip(("standard", "belief"), deltas, speeds, strict=False)
    ]
    return {
        "command": "python -m research.int8_accuracy --out x",
        "threads": 1,
        "batch_sizes": [1, 8],
        "contended": contended,
        "environment": {"cpu": {"model": model, "key_flags": flags}},
        "rows": rows,
    }


def test_readme_table_puts_machines_side_by_side():
    md = readme_table(
        [
            _result("AMD EPYC", ["avx2", "fma"], [0.04, -0.1], [1.3, 1.4], contended=True),
            _result("Intel Xeon", ["avx2", "avx512_vnni"], [0.0, 0.2], [2.0, 2.1]),
        ]
    )
    lines = md.splitlines()
    assert lines[0].split(" | ")[3:] == [
        "int8 - fp32 (M1)",
        "int8 speed-up b1 (M1)",
        "int8 speed-up b8 (M1)",
        "int8 - fp32 (M2)",
        "int8 speed-up b1 (M2)",
        "int8 speed-up b8 (M2) |",
    ]
    assert lines[2] == "| standard | cls | 85.00 | +0.04 | 1.30 | 1.80 | +0.00 | 2.00 | 2.50 |"
    assert "- M1: AMD EPYC (avx2, fma), 1 thread(s), shared with other jobs (contended)" in md
    assert "- M2: Intel Xeon (avx2, avx512_vnni)" in md


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--variants", "nope", "--out", "OUT"], "unknown variant 'nope'; valid: all,"),
        (["--data", "imagenet", "--out", "OUT"], "the zoo has no cls models for data 'imagenet'"),
        (["--batch-sizes", "100000", "--out", "OUT"], "100000 out of range"),
        ([], "--out is required"),
        (["--table", "/nonexistent.json"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([a.replace("OUT", str(tmp_path)) for a in argv])
    assert exc.value.code == 2 and needle in str(exc.value) and "\n" not in str(exc.value)
