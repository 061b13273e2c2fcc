"""The verdict counts only what ran: every step's state (passed, failed, built not run, unavailable, not run),
``deploys`` from the steps that ran and passed, a TensorRT engine built without a GPU never a passed check, and
the committed reports' verdicts the ones their ``report.json`` gives now."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from attnzoo.report import render

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "results" / "variant-reports"
COMMITTED = sorted(p.parent.name for p in REPORTS.glob("*/report.json"))


def _committed(name: str = "belief2") -> dict[str, Any]:
    return json.loads((REPORTS / name / "report.json").read_text())


def _verdict(report: dict[str, Any]) -> dict[str, Any]:
    return render.verdict(report, Path("results/variant-reports") / report["variant"])


def test_an_engine_built_without_a_gpu_is_built_not_a_passed_check_and_not_counted():
    r = _committed()
    trt = r["export"]["belief2"]["tensorrt"]
    assert trt["state"] == "built, not run" and trt["ran_on_gpu"] is False and trt["network_check"]["ok"]
    v = _verdict(r)
    assert v["states"]["tensorrt"] == "built, not run" and v["checks"]["tensorrt"] is False
    assert v["deploys"] is True and "tensorrt" not in v["problems"]  # from the steps that ran, which all passed
    assert v["line"].startswith("belief2: deploys (not counted: TensorRT built, not run) | ")
    assert "TensorRT built, not run - no GPU, network check ok" in v["line"]  # the network check did pass
    r["verdict"] = v
    md = render.markdown(r, {})
    assert "| tensorrt | built, not run: not counted toward deploys |" in md and "| parity | yes |" in md


def test_a_built_engine_never_stands_in_for_a_step_that_did_not_run():
    """fp16 not run with TensorRT built: the variant does not deploy, and the engine is still not counted."""
    r = _committed()
    r["export"]["belief2"]["fp16"] = {"status": "skipped", "reason": "not exported with this budget"}
    v = _verdict(r)
    assert v["deploys"] is False and v["problems"] == ["fp16"]
    assert v["states"]["fp16"] == "not run" and v["states"]["tensorrt"] == "built, not run"
    r["verdict"] = v
    assert "| fp16 | not run: required |" in render.markdown(r, {})


@pytest.mark.parametrize(
    "change, state, deploys",
    [
        ({"state": "built and run", "ran_on_gpu": True, "parity": {"passed": True}}, "passed", True),
        ({"state": "built and run", "ran_on_gpu": True, "parity": {"passed": False}}, "failed", False),
        ({"network_check": {"ok": False, "failures": ["blocks.0: projection missing"]}}, "failed", False),
        ({"ran_on_gpu": True, "parity": None}, "built, not run", True),  # ran, by its flag, but nothing compared
    ],
)
def test_the_engine_counts_only_where_it_ran_on_a_gpu(change, state, deploys):
    r = _committed()
    r["export"]["belief2"]["tensorrt"].update(change)
    v = _verdict(r)
    assert v["states"]["tensorrt"] == state and v["checks"]["tensorrt"] is (state == "passed")
    assert v["deploys"] is deploys and (("tensorrt" in v["problems"]) is (state == "failed"))
    assert ("not counted" in v["line"].split(" | ")[0]) is (state == "built, not run")
    if state != "built, not run":
        assert f"parity {'ok' if state == 'passed' else 'FAILED'}" in v["line"] or "network check FAILED" in v["line"]


@pytest.mark.parametrize(
    "entry, state",
    [
        ({"status": "unavailable", "reason": "no TensorRT library here"}, "unavailable"),
        ({"status": "skipped", "reason": "not built with this budget (--quick)"}, "not run"),
        ({"status": "failed", "reason": "TensorRTError: build failed"}, "failed"),
    ],
)
def test_an_engine_step_that_did_not_run_or_failed_says_so(entry, state):
    r = _committed()
    r["export"]["belief2"]["tensorrt"] = entry
    v = _verdict(r)
    assert v["states"]["tensorrt"] == state and v["checks"]["tensorrt"] is False
    assert v["deploys"] is (state != "failed")
    head = v["line"].split(" | ")[0]
    assert head == (
        "belief2: does not deploy (tensorrt)"
        if state == "failed"
        else f"belief2: deploys (not counted: TensorRT {state})"
    )


def test_a_format_that_did_not_run_is_named_and_one_that_failed_is_a_problem():
    r = _committed()
    side = r["export"]["belief2"]
    side["executorch"] = {"status": "unavailable", "reason": "executorch is not installed"}
    side["openvino"] = dict(side["openvino"], passed=False)
    v = _verdict(r)
    assert v["states"]["executorch"] == "unavailable" and "executorch" not in v["checks"]
    assert v["states"]["openvino"] == "failed" and v["checks"]["openvino"] is False
    assert v["deploys"] is False and v["problems"] == ["openvino"]


def test_the_schema_documents_every_step_and_state():
    doc = (ROOT / "docs" / "report-variant.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `verdict.states` |"))
    steps = render.step_states(_committed())
    assert set(steps) == {*render.REQUIRED_STEPS, "tensorrt", *render.REPORT_FORMATS}
    for word in (*render.STEP_STATES, *steps):
        assert f"`{word}`" in row, word


@pytest.mark.parametrize("name", COMMITTED)
def test_each_committed_verdict_is_the_one_its_report_json_gives(name):
    """No committed report says it deploys on a check that did not run: its verdict is the one rendered now from
    its measurements (``python -m attnzoo.report.index --out results/variant-reports --render`` rewrites them)."""
    r = _committed(name)
    v = _verdict(r)
    assert r["verdict"] == json.loads(json.dumps(v, default=str)), f"{name}: render the committed reports again"
    assert all(v["states"][k] == "passed" for k, ok in v["checks"].items() if ok)
    if not r["export"][name]["tensorrt"].get("ran_on_gpu"):
        assert v["checks"]["tensorrt"] is False and v["states"]["tensorrt"] != "passed"
