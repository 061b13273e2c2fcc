"""The GPU plan's committed README says what its files hold: every overhead, parity bound and error it quotes is
read here from ``vit-s-224/overheads.csv`` and ``results.json`` and must appear as written."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[2] / "results" / "gpu-h100"


@pytest.fixture(scope="module")
def files():
    if not (FOLDER / "vit-s-224" / "results.json").is_file():
        pytest.skip("no committed GPU-plan results")
    result = json.loads((FOLDER / "vit-s-224" / "results.json").read_text())
    with open(FOLDER / "vit-s-224" / "overheads.csv", newline="") as f:
        overheads = list(csv.DictReader(f))
    return result, overheads, " ".join((FOLDER / "README.md").read_text().split())


def test_the_overheads_quoted_are_the_median_pair_ratios_of_overheads_csv(files):
    _, overheads, readme = files
    at = {(o["variant"], o["dtype"]): float(o["ratio_median"]) for o in overheads if o["batch"] == "256"}
    for variant in ("belief2", "exclusive", "belief", "mabvit-glu"):
        assert f"`{variant}` {at[variant, 'fp32']:.2f}x / {at[variant, 'fp16']:.2f}x" in readme, variant
    assert (
        f"`belief-star` {at['belief-star', 'fp32']:.2f}x `standard`'s latency at fp32 and "
        f"{at['belief-star', 'fp16']:.2f}x at fp16" in readme
    )
    bound = float(re.search(r"`anti-wafe-dot` within (\d\.\d+)x at every precision and batch", readme).group(1))
    assert all(float(o["ratio_median"]) <= bound for o in overheads if o["variant"] in ("mabvit-gelu", "anti-wafe-dot"))


def test_the_parity_errors_quoted_are_the_largest_in_results_json(files):
    result, _, readme = files
    rows = result["results"]
    for dtype, bound in (("fp16", "1e-2"), ("bf16", "6e-2")):
        worst = max(r["parity_error"] for r in rows if r["dtype"] == dtype and r.get("parity_error") is not None)
        assert {r["parity_tol"] for r in rows if r["dtype"] == dtype} == {float(bound)}
        assert f"{bound} bound (errors up to {worst:.1e})".replace("e-03", "e-3").replace("e-02", "e-2") in readme
    failed = sorted(r["parity_error"] for r in rows if r["status"] == "failed")
    assert f"{failed[0]:.2e} to {failed[-1]:.2e}".replace("e-03", "e-3") in readme


def test_the_stopped_part_names_the_time_limit_it_ran_with(files):
    result, _, readme = files
    limit = re.search(r"--time-limit (\d+)", result["note"] + json.dumps(result.get("interrupted"))).group(1)
    assert f"--part eager-b --time-limit {limit}" in readme
