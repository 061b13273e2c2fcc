"""python -m research.quantized: McNemar's test, the report's tables (who loses accuracy when its extra math is
quantized, which runtime is fastest at int8), and --accuracy-only keeping an earlier run's rows."""

from __future__ import annotations

import numpy as np
import pytest

from research.quantized import _kept_accuracy, markdown, mcnemar_p


def test_mcnemar_against_the_binomial_formula():
    a = np.array([True] * 8 + [True] * 50 + [False] * 10)
    b = np.array([False] * 8 + [True] * 50 + [False] * 10)
    assert mcnemar_p(a, b) == pytest.approx(2 * 0.5**8)  # 8 discordant pairs, all one way
    assert mcnemar_p(a, a) == 1.0


def _row(variant, metrics, xm_loses=None):
    d = {k: v - metrics["fp32"] for k, v in metrics.items() if k != "fp32"}
    row = {
        "variant": variant,
        "task": "cls",
        "metric_name": "top1",
        "n_images": 10000,
        "metrics": metrics,
        "delta": d,
        "extra_math_nodes": 0 if xm_loses is None else 32,
        "tolerance": 0.5,
        "int8_within_tolerance": -d["int8"] <= 0.5,
    }
    if xm_loses is not None:
        row["extra_math_cost"] = {
            "points": metrics["int8 xm"] - metrics["int8"],
            "mcnemar_p": 0.001 if xm_loses else 0.6,
            "loses": xm_loses,
        }
    return row


def test_report_tables_say_who_loses_accuracy():
    env = {"cpu": {"model": "Test CPU", "key_flags": ["avx2", "avx512_vnni"], "usable_cores": 2}}
    speed_row = {
        "backend": "openvino",
        "batch": 1,
        "speedup_median": 1.8,
        "speedup_q1": 1.7,
        "speedup_q3": 1.9,
        "load_1min": 0.3,
        "fp32": {"median_ms": 9.0, "ceiling_fraction": 0.5},
        "int8": {"median_ms": 5.0, "ceiling_fraction": 0.25},
    }
    result = {
        "command": "python -m research.quantized --out x",
        "environment": env,
        "accuracy": {
            "data": "fashion",
            "calibration_count": 512,
            "seed": 0,
            "load_start": [3.0],
            "load_end": [3.1],
            "rows": [
                _row("standard", {"fp32": 89.6, "int8": 89.3, "fp8": 89.5}),
                _row("belief2", {"fp32": 89.4, "int8": 89.38, "int8 xm": 88.1, "fp8": 89.3}, True),
                _row("belief", {"fp32": 89.0, "int8": 88.2, "int8 xm": 88.2, "fp8": 88.9}, False),
            ],
        },
        "speed": {
            "variant": "standard",
            "arch": "small",
            "img_size": 224,
            "threads": 1,
            "gflop_per_image": 9.2,
            "min_time": 3.0,
            "ceiling": {"fp32": {"gflops": 70.0}, "int8": {"gops": 250.0}},
            "load_start": [0.2],
            "load_end": [0.3],
            "contended": False,
            "rows": [speed_row],
            "fastest_int8": {"1": {"backend": "openvino", "speedup_median": 1.8}},
            "skipped": {},
        },
    }
    md = markdown(result)
    assert "Test CPU (avx2, avx512_vnni" in md and result["command"] in md
    assert (
        "| belief2 | cls | top1 | 89.40 | 89.38 (-0.02) | 88.10 (-1.30) | 89.30 (-0.10) "
        "| 32 | -1.28 | 0.001 | **loses** |" in md
    )
    assert "| standard | cls | top1 | 89.60 | 89.30 (-0.30) | - | 89.50 (-0.10) | 0 | - | - | - |" in md
    assert "Lose accuracy when their extra math is quantized: belief2." in md
    assert "all but belief" in md  # belief's int8 is 0.8 points below fp32
    assert "| openvino | 1 | 9.00 | 5.00 | 1.80 [1.70, 1.90] | 50% | 25% | 0.30 |" in md
    # ModelOpt's rows name their Q/DQ placement (rows written before placements were compared: the default)
    result["speed"]["rows"] = [
        {**speed_row, "backend": "ort-cpu", "placement": "cpu"},
        {**speed_row, "backend": "ort-cpu"},
    ]
    md = markdown(result)
    assert "| ort-cpu (Q/DQ cpu) | 1 | 9.00 |" in md and "| ort-cpu (Q/DQ tensorrt) | 1 | 9.00 |" in md
    assert "measured under load" not in md
    result["speed"]["contended"] = True
    assert "measured under load" in markdown(result)


def test_accuracy_only_keeps_earlier_rows_only_under_the_same_settings_and_names_their_cpu(capsys):
    """--accuracy-only merges the earlier run's rows of the models not measured now only when that run used the
    same data, limit and calibration, and each section names the CPU it was measured on."""
    cpu_a = {"model": "CPU A", "key_flags": ["avx2"], "usable_cores": 2}
    cpu_b = {"model": "CPU B", "key_flags": ["avx2", "avx512_vnni"], "usable_cores": 2}
    settings = {"data": "fashion", "limit": None, "calibration_count": 512, "seed": 0}
    old = {
        **settings,
        "environment": {"cpu": cpu_a},
        "rows": [
            _row("standard", {"fp32": 89.6, "int8": 89.3, "fp8": 89.5}),
            _row("belief", {"fp32": 89.0, "int8": 88.9, "int8 xm": 88.9, "fp8": 88.9}, False),
        ],
    }
    kept, cpus = _kept_accuracy(old, settings, {("standard", "cls")})
    assert [r["variant"] for r in kept] == ["belief"] and cpus == [cpu_a]
    assert _kept_accuracy(old, {**settings, "calibration_count": 64}, set()) == ([], [])
    assert "calibration_count 512 -> 64" in capsys.readouterr().err
    assert _kept_accuracy(old, settings, {("standard", "cls"), ("belief", "cls")}) == ([], [])

    speed = {
        "variant": "standard",
        "arch": "small",
        "img_size": 224,
        "threads": 1,
        "gflop_per_image": 9.2,
        "min_time": 3.0,
        "ceiling": {"fp32": {"gflops": 70.0}, "int8": {"gops": 250.0}},
        "load_start": [0.2],
        "load_end": [0.3],
        "contended": False,
        "rows": [],
        "fastest_int8": {},
        "skipped": {},
        "environment": {"cpu": cpu_a},
    }
    accuracy = {
        **settings,
        "load_start": [1.0],
        "load_end": [1.0],
        "rows": [_row("standard", {"fp32": 89.6, "int8": 89.3, "fp8": 89.5}), *kept],
        "environment": {"cpu": cpu_b},
        "cpus": [cpu_b, *cpus],
    }
    md = markdown({"command": "c", "environment": {"cpu": cpu_b}, "accuracy": accuracy, "speed": speed})
    acc_part, speed_part = md.split("## int8 speed")
    assert "CPU: CPU B (avx2, avx512_vnni" in acc_part and "; CPU A (avx2" in acc_part
    assert "CPU: CPU A (avx2" in speed_part and "CPU B" not in speed_part


# ------------------------------------------------------------------------------------------ serving int8
