"""Quantized CPU speed: bench-latency --dtypes fp32,int8 (ModelOpt on ONNX Runtime, NNCF on OpenVINO, each verified
before it is timed), NNCF's ignored scope keeping the extra math unquantized, and the int8 copies the demo and
serve-models serve. The quantized-zoo study's tables: tests/studies/test_quantized.py."""

from __future__ import annotations

import json

import nncf
import numpy as np
import pytest

from attnzoo.benchmarks.cli import main, parse_settings
from attnzoo.export.quantize import quantize_unavailable_reason


@pytest.fixture(autouse=True)
def _few_calibration_images(monkeypatch):
    import attnzoo.benchmarks.rows as rows

    monkeypatch.setattr(rows, "CALIBRATION_COUNT", 8)  # the test checks the path, not calibration quality


def _bench(bench_args, tmp_path, *extra):
    out = tmp_path / "bench"
    args = bench_args(
        out,
        "standard",
        "ort-cpu,openvino",
        "--ceiling-size",
        "128",
        "--dtypes",
        "fp32,int8",
        "--no-pair-eager",
        *extra,
        cache_dir=tmp_path / "cache",
    )
    assert main(args) == 0
    return json.loads((out / "results.json").read_text())


def test_the_dev_install_has_both_int8_quantizers():
    """ModelOpt (ONNX Runtime's int8) and NNCF (OpenVINO's) come with ``[dev]``: without them this fails (the
    module does not skip itself)."""
    assert quantize_unavailable_reason() is None
    assert nncf.__version__


def test_old_dtype_spelling_still_parses():
    assert list(parse_settings(["--dtype", "fp32,int8"]).dtypes) == ["fp32", "int8"]
    assert list(parse_settings(["--dtypes", "int8"]).dtypes) == ["int8"]


@pytest.mark.slow
def test_bench_times_fp32_and_verified_int8_per_cpu_runtime(tmp_path, bench_args):
    from attnzoo.export.verify import report_path
    from attnzoo.fileio import sha256_file

    result = _bench(bench_args, tmp_path)
    rows = {(r["backend"], r["dtype"]): r for r in result["results"]}
    for backend in ("ort-cpu", "openvino"):
        for dtype in ("fp32", "int8"):
            r = rows[(backend, dtype)]
            assert r["status"] == "ok", r["reason"]
            assert r["median_ms"] > 0 and 0 < r["ceiling_fraction"] and r["ceiling_gflops"] > 0
        assert rows[(backend, "int8")]["ceiling_gflops"] == result["ceiling"]["int8"]["gops"]
        assert rows[(backend, "fp32")]["ceiling_gflops"] == result["ceiling"]["fp32"]["gflops"]
        assert 0 < rows[(backend, "int8")]["parity_error"] <= rows[(backend, "int8")]["parity_tol"]  # quantized
    ort8 = rows[("ort-cpu", "int8")]["info"]["int8"]
    assert ort8["quantized_ops"]["MatMul"] > 0 and "Q/DQ placement" in ort8["verified"]
    model = tmp_path / "cache" / "int8" / ort8["model"]
    report = json.loads(report_path(model).read_text())
    assert report["passed"] and report["dtype"] == "int8" and report["sha256"] == sha256_file(model)
    assert ort8["placement"] == report["quantization"]["options"]["placement"] == "cpu"  # the CPU placement
    fp32 = tmp_path / "cache" / "standard_cls_micro_32px_fp32.onnx"
    assert report["fp32_source"]["sha256"] == sha256_file(fp32)
    ov8 = rows[("openvino", "int8")]["info"]["int8"]
    assert ov8["fake_quantize"] > 0 and ov8["ignored_fake_quantized"] == []


@pytest.mark.slow
def test_int8_model_failing_its_verification_is_not_timed(tmp_path, monkeypatch, bench_args):
    from attnzoo.benchmarks import rows as bench_rows
    from attnzoo.export import quantize as q

    def refuse(*args, **kwargs):
        raise q.QuantizationCheckError("x.onnx not written: 3 extra-math op(s) read quantized values")

    monkeypatch.setattr(bench_rows, "quantize_verified", refuse)  # where the benchmark looks it up
    result = _bench(bench_args, tmp_path, "--backends", "ort-cpu")
    rows = {(r["backend"], r["dtype"]): r for r in result["results"]}
    assert rows[("ort-cpu", "fp32")]["status"] == "ok"
    bad = rows[("ort-cpu", "int8")]
    assert bad["status"] == "failed" and "extra-math op(s) read quantized values" in bad["reason"]
    assert bad["median_ms"] is None and bad["iterations"] is None


def test_the_int8_cache_is_read_through_the_report_schema_and_remade_when_it_does_not_parse(tmp_path, monkeypatch):
    """bench-latency reuses a cached int8 model whose report (read as QuantizationReport) passed, quantizing
    nothing; a report of another schema is not trusted: the model is quantized again."""
    from pathlib import Path

    from attnzoo.benchmarks import rows as bench_rows
    from attnzoo.export.verify import report_path
    from attnzoo.fileio import sha256_file

    ref = json.loads((Path(__file__).parents[1] / "data" / "quantization-reports" / "vit_int8.report.json").read_text())
    fp32 = tmp_path / "m.onnx"
    fp32.write_bytes(b"an fp32 graph")
    out = tmp_path / "cache" / "int8" / f"m-{sha256_file(fp32)[:12]}.modelopt-int8-cpu.onnx"
    out.parent.mkdir(parents=True)
    out.write_bytes(b"its int8 graph")
    ref = {**ref, "sha256": sha256_file(out)}  # the cache trusts a report of this very file only
    report_path(out).write_text(json.dumps(ref))
    calls = []
    monkeypatch.setattr(bench_rows, "quantize_verified", lambda *a, **k: calls.append(k) or ref)
    _, facts = bench_rows.int8_onnx(fp32, {"img_size": 32}, tmp_path / "cache")
    q = ref["quantization"]
    assert calls == [] and facts == {
        "quantizer": f"{q['quantizer']} {q['quantizer_version']}",
        "verified": ref["verified"],
        "placement": q["options"]["placement"],
        "quantized_ops": q["qdq"]["quantized_ops"],
        "excluded_extra_math": len(q["excluded_nodes"]),
        "calibration": q["calibration"]["source"],
        "fidelity": ref["fidelity"],
        "model": out.name,
    }
    report_path(out).write_text(json.dumps({**ref, "a_field_of_another_schema": 1}))
    _, again = bench_rows.int8_onnx(fp32, {"img_size": 32}, tmp_path / "cache")
    assert len(calls) == 1 and calls[0]["placement"] == "cpu" and again == facts


@pytest.fixture(scope="module")
def belief2_fp32(tmp_path_factory):
    import torch

    from attnzoo.export import export_verified
    from attnzoo.models import create_model

    torch.manual_seed(0)
    model = create_model("belief2", task="cls", arch="micro").eval()
    cfg = model.attnzoo_config
    path = tmp_path_factory.mktemp("nncf") / "belief2.onnx"
    export_verified(model, path, cfg, dtype="fp32", input_hw=(cfg["img_size"],) * 2, batch_sizes=(1,), threads=1)
    return path, cfg


@pytest.mark.slow
def test_nncf_ignored_scope_keeps_the_extra_math_unquantized(belief2_fp32, tmp_path):
    import onnx
    import openvino as ov

    from attnzoo.export.quantize import extra_math_nodes, random_calibration
    from attnzoo.runtime.backends import onnx_reference
    from attnzoo.runtime.parity import TOLERANCES, parity_error
    from attnzoo.targets.openvino.backend import OpenVINOSession
    from attnzoo.targets.openvino.library import fake_quantized, nncf_int8

    path, cfg = belief2_fp32
    extra = extra_math_nodes(onnx.load(str(path)), cfg)
    assert len(extra) > 0
    cal = random_calibration((cfg["img_size"],) * 2, 16, seed=0)
    # control: NNCF's default scheme without the ignored scope does put FakeQuantize on the extra math
    bare = nncf_int8(path, tmp_path / "bare.xml", cal, ignored=(), model_type=None)
    assert bare["fake_quantize"] > 0
    assert fake_quantized(ov.Core().read_model(str(tmp_path / "bare.xml")), extra)
    # the same scheme with the extra math ignored: FakeQuantize elsewhere, none feeding the extra math
    kept = nncf_int8(path, tmp_path / "kept.xml", cal, ignored=extra, model_type=None)
    written = ov.Core().read_model(str(tmp_path / "kept.xml"))
    assert kept["ignored_found"] == len(extra) and kept["fake_quantize"] > 0
    assert sum(op.get_type_name() == "FakeQuantize" for op in written.get_ordered_ops()) == kept["fake_quantize"]
    assert fake_quantized(written, extra) == []
    # the scheme the benchmark uses (NNCF's transformer preset) with the same exclusions runs within int8 parity
    vit = nncf_int8(path, tmp_path / "vit.xml", cal, ignored=extra)
    assert vit["ignored_fake_quantized"] == [] and vit["fake_quantize"] > 0
    x = cal[:2]
    ref = onnx_reference().session(path, 1).session.run(["logits"], {"image": x})[0]
    out = OpenVINOSession(tmp_path / "vit.xml", threads=1).run(x)
    assert 0 < parity_error(out, ref) <= TOLERANCES["int8"]


@pytest.fixture(scope="module")
def int8_folder(tmp_path_factory):
    """A folder as export-model leaves it: the zoo's belief2 classifier in fp32 and its verified int8 copy
    (calibrated on Fashion-MNIST training images, scored on the whole test split), plus int8 files whose
    verification does not hold."""
    import shutil

    from attnzoo.export import export_verified, load_for_export
    from attnzoo.export import quantize as q

    folder = tmp_path_factory.mktemp("int8")
    model, config, sha = load_for_export("belief2", "cls")
    fp32 = folder / "belief2_fp32.onnx"
    export_verified(model, fp32, config, batch_sizes=(1,), checkpoint_sha256=sha)
    good = folder / "belief2_int8.onnx"
    q.quantize_verified(
        fp32,
        good,
        config,
        dtype="int8",
        calibration=q.calibration_images(config, 64, 0),
        calibration_source="64 fashion training images",
    )
    report = json.loads(good.with_suffix(".report.json").read_text())

    def variant(name, edit=None, model_bytes=None):
        path = folder / f"{name}.onnx"
        path.write_bytes(model_bytes or good.read_bytes())
        if edit is not None:
            rep = json.loads(json.dumps(report))
            edit(rep)
            path.with_suffix(".report.json").write_text(json.dumps(rep))
        return path

    shutil.copy(good, folder / "no_report.onnx")  # no report beside it
    import onnx

    changed = onnx.load(str(good))
    changed.doc_string = "changed after its verification"
    variant("tampered", lambda r: None, changed.SerializeToString())  # a valid model, not the one its report verified
    variant("accepted_drop", lambda r: r["accuracy"].update(within_tolerance=False, drop=2.5, accepted_drop=True))
    variant("unscored", lambda r: r.update(accuracy={"measured": False, "warning": "untrained model"}))
    variant("failed", lambda r: r.update(passed=False))
    variant("limited", lambda r: r["accuracy"].update(limit=300, n_images=300))  # export-model --eval-limit 300
    return folder


@pytest.mark.slow  # int8 and fp32 exports served both ways (about 13 s)
def test_demo_and_serve_models_mean_the_same_by_dtype_fp32(tmp_path):
    """--dtype fp32 serves the unquantized exports, fp16 included, in both commands (one rule:
    runtime.sessions.served_precision); --dtype int8 serves neither of them."""
    from attnzoo.export import export_verified, load_for_export
    from attnzoo.runtime.sessions import served_precision
    from attnzoo.serve.loading import load_onnx_dir
    from attnzoo.serve.rayserve.selection import _matching

    assert [served_precision(d) for d in ("fp32", "fp16", "int8", "fp8")] == ["fp32", "fp32", "int8", "fp8"]
    for dtype in ("fp32", "fp16"):
        model, config, _ = load_for_export("standard", "cls", "micro", random_init=True)
        export_verified(model, tmp_path / f"standard_{dtype}.onnx", config, dtype=dtype, batch_sizes=(1,))
    names = ["standard_fp16.onnx", "standard_fp32.onnx"]
    assert sorted(m.source.rsplit("/", 1)[-1] for m in load_onnx_dir(tmp_path, dtype="fp32")) == names
    assert sorted(_matching(tmp_path, names, None, None, "fp32").files) == names
    assert load_onnx_dir(tmp_path, dtype="int8") == []
    with pytest.raises(ValueError, match="no int8 model"):
        _matching(tmp_path, names, None, None, "int8")


@pytest.mark.slow  # the int8 exports of the zoo's models this group shares (about a minute on 2 cores)
def test_verification_problem_names_each_reason(int8_folder, tmp_path):
    import shutil

    from attnzoo.runtime.sessions import verification_problem

    assert verification_problem(int8_folder / "belief2_int8.onnx", "int8") is None
    assert verification_problem(int8_folder / "belief2_fp32.onnx", "fp32") is None
    reasons = {
        n: verification_problem(int8_folder / f"{n}.onnx", "int8")
        for n in ("no_report", "tampered", "accepted_drop", "unscored", "failed", "limited")
    }
    assert "no verification report no_report.report.json beside it" in reasons["no_report"]
    assert "SHA-256 mismatch" in reasons["tampered"]
    assert "2.50 points below fp32" in reasons["accepted_drop"]
    assert "not scored" in reasons["unscored"]
    assert "passed" in reasons["failed"]
    assert "only 300 test images" in reasons["limited"]
    assert all("\n" not in r for r in reasons.values())
    # fp32 files are held to their reports too: a copy without one, one changed after its verification, and a
    # report nested too deep to parse (named, not a RecursionError)
    bare = shutil.copy(int8_folder / "belief2_fp32.onnx", tmp_path / "bare.onnx")
    assert "no verification report bare.report.json" in verification_problem(bare, "fp32")
    changed = tmp_path / "changed.onnx"
    changed.write_bytes((int8_folder / "belief2_fp32.onnx").read_bytes() + b"\0")
    shutil.copy(int8_folder / "belief2_fp32.report.json", tmp_path / "changed.report.json")
    assert "SHA-256 mismatch" in verification_problem(changed, "fp32")
    deep = shutil.copy(int8_folder / "belief2_fp32.onnx", tmp_path / "deep.onnx")
    (tmp_path / "deep.report.json").write_text("[" * 100_000 + "]" * 100_000)
    assert verification_problem(deep, "fp32") == "deep.report.json is not a verification report (JSON nested too deep)"


@pytest.mark.slow  # the int8 exports of the zoo's models this group shares (about a minute on 2 cores)
def test_demo_serves_only_verified_int8_models(int8_folder, capsys):
    from attnzoo.serve.loading import load_models

    models = load_models(int8_folder, "onnxruntime", dtype="int8")
    assert [(m.source.rsplit("/", 1)[-1], m.dtype) for m in models] == [("belief2_int8.onnx", "int8")]
    err = capsys.readouterr().err
    for name in ("no_report", "tampered", "accepted_drop", "unscored", "failed", "limited"):
        assert f"skipping {name}.onnx: " in err
    assert "belief2_fp32" not in err  # another precision: left out, not an error
    fp32 = load_models(int8_folder, "onnxruntime", dtype="fp32")
    assert [m.dtype for m in fp32] == ["fp32"]
    # without --dtype every file is a candidate, and still no unverified quantized one is served
    both = load_models(int8_folder, "onnxruntime")
    assert sorted(m.dtype for m in both) == ["fp32", "int8"]
    # the verified int8 model answers like the fp32 one on most images (it was scored within 0.5 points)
    x = np.random.default_rng(0).standard_normal((16, 3, 28, 28)).astype(np.float32)
    by = {m.dtype: m.run(x) for m in both}
    assert np.mean(by["int8"].argmax(1) == by["fp32"].argmax(1)) >= 0.75


@pytest.mark.slow  # the int8 exports of the zoo's models this group shares (about a minute on 2 cores)
def test_demo_int8_refuses_a_folder_without_verified_int8(tmp_path, int8_folder):
    import shutil

    from attnzoo.serve.loading import load_models

    shutil.copy(int8_folder / "no_report.onnx", tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="no servable models"):
        load_models(tmp_path, "onnxruntime", dtype="int8")
    with pytest.raises(ValueError, match="not eager"):
        load_models(tmp_path, "pytorch", dtype="int8")


@pytest.mark.slow  # the int8 exports of the zoo's models this group shares (about a minute on 2 cores)
def test_backend_choice_is_timed_on_the_served_precision(int8_folder):
    from attnzoo.runtime.choice import fastest_cpu_runtime
    from attnzoo.serve.loading import choose_cpu_backend

    run = {"a": lambda p: lambda x: x, "b": lambda p: lambda x: x}
    with pytest.raises(ValueError, match="belief2_fp32.onnx is fp32, not the int8 to be served"):
        fastest_cpu_runtime(run, [(int8_folder / "belief2_fp32.onnx", (28, 28))], seconds=0.01, dtype="int8")
    choice = fastest_cpu_runtime(run, [(int8_folder / "belief2_int8.onnx", (28, 28))], seconds=0.01, dtype="int8")
    assert "for int8 models" in choice.reason and list(choice.median_ms) == ["belief2_int8.onnx"]
    backend, reason = choose_cpu_backend(int8_folder, threads=1, dtype="int8")
    assert backend in ("ort-cpu", "openvino") and "for int8 models" in reason and "belief2_int8.onnx" in reason


@pytest.mark.slow  # the int8 exports of the zoo's models this group shares (about a minute on 2 cores)
def test_serve_models_selects_only_verified_int8(int8_folder, capsys):
    from attnzoo.serve.rayserve.config import merged
    from attnzoo.serve.rayserve.selection import select_models

    sel = select_models(merged({}, {"models": int8_folder, "dtype": "int8"}))
    assert list(sel.files) == ["belief2_int8.onnx"]
    err = capsys.readouterr().err
    for name in ("no_report", "tampered", "accepted_drop", "unscored", "failed", "limited"):
        assert f"skipping {name}.onnx: not served: " in err
    assert list(select_models(merged({}, {"models": int8_folder})).files) == ["belief2_fp32.onnx"]
    with pytest.raises(ValueError, match="random-init models have no test set to verify int8 on"):
        merged({}, {"arch": "micro", "dtype": "int8"})
    with pytest.raises(ValueError, match="not tensorrt"):
        merged({}, {"models": int8_folder, "dtype": "int8", "backend": "tensorrt"})
    with pytest.raises(ValueError, match="dtype must be one of fp32, int8"):
        merged({"dtype": "int4"}, {})


@pytest.mark.slow
def test_serve_models_zoo_int8_serves_verified_copies_first_and_publishes_the_rest(tmp_path):
    """serve-models --dtype int8 without --models: the first model's int8 copy is made and verified before the
    server starts, the other's is exported in the child and listed in the ready file only once its verification
    report holds."""
    from attnzoo.runtime.sessions import verification_problem
    from attnzoo.serve.rayserve.config import merged
    from attnzoo.serve.rayserve.selection import export_pending, select_models

    cfg = merged(
        {}, {"dtype": "int8", "variants": ["belief2", "standard"], "task": "cls", "cache_dir": tmp_path / "cache"}
    )
    sel = select_models(cfg)
    names = {"belief2_cls_fashion_int8.onnx", "standard_cls_fashion_int8.onnx"}
    (first,), pending = list(sel.files), [p["file"] for p in sel.pending]
    assert {first, *pending} == names and len(pending) == 1 and sel.dtype == "int8"
    assert verification_problem(sel.folder / first, "int8") is None and not (sel.folder / pending[0]).exists()
    sel.ready_file = tmp_path / "ready.json"
    assert export_pending(sel, cfg.cache_dir) == 2
    assert set(json.loads(sel.ready_file.read_text())) == names
    assert verification_problem(sel.folder / pending[0], "int8") is None
