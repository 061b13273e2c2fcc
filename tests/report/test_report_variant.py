"""``report-variant``: one quick run writes the folder (report.md with its plots, report.json in the documented
schema) and prints a one-line verdict; an unknown variant is refused with the valid ones, before any work."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnzoo.errors import CommandExit
from attnzoo.models import VARIANT_NAMES
from attnzoo.report import SCHEMA
from attnzoo.report.cli import main

ROOT = Path(__file__).resolve().parents[2]
STATUSES = {"ok", "failed", "unavailable", "skipped"}
#: What the int8 step must say here: ``ok`` where its quantizer (the ``quantize`` extra) is installed.
INT8_STATUS = "ok" if importlib.util.find_spec("modelopt") else "unavailable"


def _documented_keys() -> set:
    """The ``report.json`` keys docs/report-variant.md documents (``key`` in its schema tables' first column)."""
    text = (ROOT / "docs" / "report-variant.md").read_text()
    return set(re.findall(r"^\| `([a-z0-9_.<>]+)`", text, flags=re.M))


@pytest.mark.slow  # a whole quick report: about 2 minutes on 2 cores (tests/report/conftest.py, shared)
def test_quick_report_writes_the_folder_schema_verdict_and_figures(belief2_quick):
    out, stdout = belief2_quick
    lines = stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("belief2: ") and str(out / "report.md") in lines[0]
    text = (out / "report.json").read_text()
    report = json.loads(text)
    assert report["schema"] == SCHEMA and report["variant"] == "belief2" and report["quick"] is True
    # no path into the report's temporary folder, removed when it ended: its caches are named from <temporary>
    assert "attnzoo-report-" not in text and "<temporary>/bench-cache/" in text
    # every top-level and section key is documented, and the documented ones are there
    documented = _documented_keys()
    present = (
        set(report)
        | {f"{k}.{s}" for k in ("cost", "verdict") for s in report[k]}
        | {f"export.<side>.{s}" for s in report["export"]["belief2"]}
    )
    assert present <= documented, sorted(present - documented)
    assert {"schema", "variant", "identity", "export", "fusion", "cost", "verdict"} <= set(report)
    # identity: the registry's facts and counted FLOPs beside standard's
    ident = report["identity"]
    assert ident["status"] == "ok" and ident["extra_scopes"] == ["projection"] and ident["paper"]
    assert all(r > 1 for r in ident["flops_ratio"].values())  # belief2's projection costs FLOPs
    # export: every step has a status; the variant's fp32 / fp16 parity and extra math from export_model's reports
    side = report["export"]["belief2"]
    for step in ("fp32", "fp16", "int8", "fp8", "tensorrt", "triton", "accuracy"):
        assert side[step]["status"] in STATUSES | {"absent"}, (step, side[step])
    assert side["fp32"]["status"] == "ok" and side["fp32"]["passed"] and side["fp32"]["max_abs_err"] < 1e-4
    assert side["fp32"]["extra_math"]["ok"] and side["fp32"]["extra_math"]["scopes"] == 4  # micro: 4 blocks
    assert side["fp8"]["status"] == "skipped"  # --quick builds no FP8 graph, and says so
    # int8 runs wherever its quantizer (the `quantize` extra) is installed: a failed int8 step fails here
    assert side["int8"]["status"] == INT8_STATUS, side["int8"]
    if INT8_STATUS == "ok":
        assert side["int8"]["passed"] and 0 < side["int8"]["cosine_min"] <= 1 and side["int8"]["placement"] == "cpu"
    if side["tensorrt"]["status"] == "ok":
        assert side["tensorrt"]["network_check"]["ok"]
        if not side["tensorrt"]["ran_on_gpu"]:
            assert "no GPU" in report["verdict"]["line"]
    assert report["export"]["standard"]["fp32"]["status"] == "ok"
    # the OpenVINO IR, verified as export-model writes it, its block errors read from the IR itself; no ExecuTorch
    # program in --quick (its lowering takes minutes), and neither format for standard, each said so
    ir = side["openvino"]
    assert ir["status"] == "ok" and ir["passed"] and ir["max_abs_err"] < 1e-4 and ir["runtime"].startswith("OpenVINO")
    assert (
        ir["extra_math"]["ok"]
        and side["extra_math_kept"]["openvino"] is True
        and ir["file"] == "exports/belief2/belief2.xml"
    )
    assert [b["block"] for b in ir["blocks"]] == [0, 1, 2, 3] and ir["first_diverging_block"] is None
    assert side["executorch"]["status"] == "skipped" and side["executorch"]["reason"].endswith("(--quick)")
    std_ir = report["export"]["standard"]["openvino"]
    assert std_ir["status"] == "skipped" and "for the variant only" in std_ir["reason"]
    assert "OpenVINO IR ok" in report["verdict"]["line"]
    # fusion: read from the runtimes; standard's cores run fused on OpenVINO (its snippets Subgraph)
    std = {r["runtime"]: r for r in report["fusion"]["standard"]["audit"]["runtimes"]}
    assert std["openvino"]["inspected"] and std["openvino"]["fused"] == std["openvino"]["cores"] == 4
    assert "fused: OpenVINO" in report["verdict"]["line"]
    # the fusable export: belief2 at opset 23 is one Attention op per block, kept whole by every runtime, timed
    fz = report["fusable"]
    assert fz["status"] == "ok" and fz["extra_math_kept"] and fz["attention_ops"] == 4
    inspected = {k: e for k, e in fz["fused"].items() if e["inspected"]}
    assert {"openvino", "onnxruntime"} <= set(inspected) and all(
        e["fused"] == e["cores"] == 4 for e in inspected.values()
    )
    assert fz["fused"]["onnxruntime-transformers"]["as_exported"] == 4  # opt_level 0: the export's count, labelled
    trt = fz["fused"]["tensorrt"]  # shown where its graph cannot be read, never dropped
    line = report["verdict"]["line"]
    assert "opset 23: OpenVINO 4/4, ONNX Runtime 4/4" in line and "as exported (opt_level 0)" in line
    assert ("TensorRT 4/4" if trt["inspected"] else "TensorRT not inspected") in line
    assert report["verdict"]["failed"] == [], report["verdict"]["failed"]  # every check of the run passed
    assert {"ort-cpu", "openvino"} <= set(fz["speed"]) and all(s["speedup"] > 0 for s in fz["speed"].values())
    # cost: latency rows of both variants at batch 1 and 8, overheads, scaling rows
    lat = report["cost"]["latency"]
    assert lat["status"] == "ok"
    ok = {(r["variant"], r["batch"]) for r in lat["rows"] if r["status"] == "ok" and r["backend"] == "eager"}
    assert ok == {(v, b) for v in ("standard", "belief2") for b in (1, 8)}
    assert any(o["variant"] == "belief2" and o["ratio_median"] > 0 for o in lat["overheads"])
    assert all(r["reason"] for r in lat["rows"] if r["status"] == "skipped")  # said plainly, never silent
    sc = report["cost"]["scaling"]
    assert sc["status"] == "ok" and {r["variant"] for r in sc["rows"] if r["status"] == "ok"} == {"standard", "belief2"}
    assert report["cost"]["gpu"]["status"] in ("ok", "absent") and (
        report["cost"]["gpu"].get("reason") or report["cost"]["gpu"].get("note")
    )
    # the page: verdict, sections, and every plot it names exists as a PNG
    md = (out / "report.md").read_text()
    for heading in (
        "## Identity",
        "## Export",
        "## Fusion audit",
        "### A fusable export (opset 23)",
        "## Cost",
        "### Scaling in tokens",
        "### GPU",
    ):
        assert heading in md
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {"latency.png", "overhead.png", "scaling.png", "block-errors.png"} <= set(images)
    assert [b["block"] for b in side["fp32"]["blocks"]] == [0, 1, 2, 3] and side["fp32"][
        "first_diverging_block"
    ] is None
    assert "| where it diverges (block outputs) | fp32 worst block " in md and "; OpenVINO IR worst block " in md
    assert "| OpenVINO IR: parity with eager fp32 | " in md and "| ExecuTorch program: parity with eager fp32 | " in md
    for name in images:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_block_errors_are_plotted_per_precision_and_a_failed_parity_names_its_first_diverging_block(tmp_path):
    from attnzoo.report import markdown, render

    def entry(errs, first=None, op=None):
        blocks = [{"block": i, "rel_err": e, "cosine": 1.0} for i, e in enumerate(errs)]
        return {"status": "ok", "blocks": blocks, "first_diverging_block": first, "worst_op": op}

    report = {
        "export": {
            "belief2": {
                "fp32": entry([1e-7, 3e-2, 4e-2], 1, "blocks.1.attn.proj/Add"),
                "int8": entry([1e-2, 2e-2]),
                "openvino": entry([2e-7, 1e-7, 2e-7]),
            },
            "standard": {"fp32": entry([2e-7, 3e-7, 1e-7]), "fp16": {"status": "skipped"}},
        }
    }
    series = render.block_series(report)
    assert list(series) == ["fp32", "int8", "openvino"] and series["fp32"]["standard"] == [2e-7, 3e-7, 1e-7]
    assert render.entry_title("openvino") == "OpenVINO IR" and render.entry_title("fp16") == "fp16"
    assert render.plots(report, tmp_path) == {"blocks": tmp_path / "block-errors.png"}
    assert (tmp_path / "block-errors.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert markdown._where(report["export"]["belief2"]["fp32"]) == (
        "first diverging block 1 (worst op `blocks.1.attn.proj/Add`)"
    )
    assert markdown._where(report["export"]["standard"]["fp32"]) == "worst block 1 (3.0e-07)"


def test_an_unknown_variant_is_refused_listing_the_valid_ones(tmp_path, capsys):
    with pytest.raises(CommandExit) as exc:
        main(["--variant", "no-such-attention", "--quick", "--out", str(tmp_path / "r")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-attention" in err[0]
    assert all(name in err[0] for name in VARIANT_NAMES)
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_gpu_rows_come_from_the_committed_gpu_plan_results_failed_rows_included():
    from attnzoo.report.variant import gpu_rows

    path = Path(__file__).resolve().parents[2] / "results" / "gpu-h100" / "vit-s-224" / "results.json"
    if not path.is_file():
        pytest.skip("no committed GPU-plan results")
    rows = json.loads(path.read_text())["results"]
    failed = [r for r in rows if r["status"] == "failed" and r["variant"] != "standard"]
    assert failed, "the committed run has failed rows to check against"
    variant = failed[0]["variant"]
    got = gpu_rows(variant)
    assert got["status"] == "ok" and got["rows"]
    mine = {(r["backend"], r["dtype"], r["batch"], r["status"]) for r in got["rows"] if r["variant"] == variant}
    want = {
        (r["backend"], r["dtype"], r["batch"], r["status"])
        for r in rows
        if r["variant"] == variant and r["status"] in ("ok", "failed")
    }
    assert mine == want
    assert all(r["reason"] for r in got["rows"] if r["status"] == "failed")
    assert all(r["median_ms"] is None for r in got["rows"] if r["status"] == "failed")
    # a variant with no row of its own is absent, not reported through standard's rows alone
    absent = sorted(set(VARIANT_NAMES) - {r["variant"] for r in rows})
    if absent:
        assert gpu_rows(absent[0])["status"] == "absent"


def test_latency_measures_batch_by_batch_so_a_time_limit_keeps_the_variants_first_batch(monkeypatch, tmp_path):
    """The benchmark runs standard before the variant; over both batch sizes at once a time limit would keep
    standard's batch-8 rows and drop the variant's. Batch by batch, a stop after batch 1 keeps both sides of it."""
    import attnzoo.benchmarks.run as run
    from attnzoo.report import variant as rv

    calls = []

    def fake(s):
        calls.append(list(s.batch_sizes))
        rows = [{"variant": v, "batch": s.batch_sizes[0], "status": "ok"} for v in ("standard", "belief2")]
        stop = {"signal": None, "during": "x", "rows_kept": 2, "note": "stopped"} if len(calls) == 1 else None
        return {
            "settings": {},
            "results": rows,
            "overheads": [],
            "fastest_cpu": None,
            "interrupted": stop,
            "note": "",
            "wall_time_s": 0.0,
        }

    monkeypatch.setattr(run, "run_benchmark", fake)
    got = rv.latency("belief2", rv.QUICK, tmp_path, "cmd")
    assert calls == [[rv.BATCH_SIZES[0]]]
    assert got["interrupted"]["note"] == "stopped"
    assert {(r["variant"], r["batch"]) for r in got["rows"]} == {("standard", 1), ("belief2", 1)}


@pytest.mark.parametrize("signal_name, raised", [("SIGTERM", "Terminated"), ("SIGINT", "Interrupted")])
def test_a_signal_during_the_latency_rows_stops_the_report(monkeypatch, tmp_path, signal_name, raised):
    """The benchmark keeps the rows measured before a signal and returns them; the report must stop there (the
    command's one line and exit status), not carry on to write a report.json."""
    import attnzoo.benchmarks.run as run
    from attnzoo import signals
    from attnzoo.report import variant as rv

    def fake(s):
        return {
            "settings": {},
            "results": [],
            "overheads": [],
            "fastest_cpu": None,
            "note": "",
            "interrupted": {"signal": signal_name, "during": "x", "rows_kept": 0, "note": "stopped"},
        }

    monkeypatch.setattr(run, "run_benchmark", fake)
    with pytest.raises(getattr(signals, raised)):
        rv._attempt(lambda: rv.latency("belief2", rv.QUICK, tmp_path, "cmd"))


def _terminated_when(tmp_path, ready, what: str, delay: float = 0.0) -> str:
    """Run ``report-variant --quick``, send SIGTERM ``delay`` s after ``ready(out, stderr so far)`` holds; expect
    the one line, exit 143 and no report.json. Returns the stderr."""
    out, log = tmp_path / "belief2", tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from attnzoo.cli import report_variant; report_variant()",
                "--variant",
                "belief2",
                "--quick",
                "--out",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
        )  # a crash shows where it was
        deadline = time.monotonic() + 300
        try:
            while not ready(out, log.read_text()) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert proc.poll() is None, f"ended before {what}: {log.read_text()[-2000:]}"
            assert ready(out, log.read_text()), f"never reached {what}"
            time.sleep(delay)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert proc.returncode == 143, text[-2000:]
    assert text.strip().splitlines()[-1] == "terminated (SIGTERM)", text[-2000:]
    assert not (out / "report.json").exists()
    return text


@pytest.mark.slow
def test_sigterm_inside_the_export_step_ends_with_the_line_and_143(tmp_path):
    # the fp16 file is written: the int8 export (calibration, ModelOpt, its fidelity and accuracy) is under way
    text = _terminated_when(
        tmp_path, lambda out, err: (out / "exports" / "belief2" / "belief2_fp16.onnx").is_file(), "the int8 export"
    )
    assert "export ..." in text and "fusion ..." not in text


def test_the_fusion_audit_names_heads_and_width_and_keeps_the_optimizers_warnings_off_the_terminal(caplog):
    """The transformer optimizer gets the export's heads and width (its arch) and logs no warnings between the
    report's progress lines; an error logged meanwhile still goes through."""
    import logging

    from attnzoo.models import ARCHS
    from attnzoo.runtime import fusion

    path = ROOT / "zoo" / "onnx" / "mabvit-glu_cls_fashion.onnx"  # a shipped export
    arch = ARCHS[json.loads(fusion.metadata_props(path)["attnzoo.config"])["arch"]]
    assert fusion._heads_and_width(path) == (arch["num_heads"], arch["embed_dim"])
    caplog.set_level(logging.DEBUG)
    result = fusion.onnxruntime_fusion(path, transformer_optimizer=True)
    assert result["inspected"] and result["cores"] == arch["depth"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    with fusion._warnings_silenced():
        logging.getLogger("fusion_attention").error("a real error")
        logging.getLogger("fusion_attention").warning("a warning")
    assert [r.getMessage() for r in caplog.records] == ["a real error"]
    assert logging.root.manager.disable == logging.NOTSET
