"""export-model --dtype int8|fp8: ModelOpt Q/DQ export, extra math kept fp32, accuracy gate, bad
calibration input, FP8 simulation against an explicit e4m3 reference, TensorRT Q/DQ builds, packaging."""

from __future__ import annotations

import json
import re
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from attnzoo.export import export_verified
from attnzoo.export import quantize as qz
from attnzoo.export.cli import main as export_main
from attnzoo.export.verify import failed_report_path, report_path
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.fp8 import simulate_fp8
from attnzoo.runtime.precision import get_precision
from tests.tiers import SLOW_SET
from tests.tiers import marks as tier_marks


def test_the_dev_install_has_modelopts_onnx_quantizer():
    """ModelOpt comes with ``[dev]``: without it this fails (and so does every test below), where the module used
    to skip itself."""
    assert qz.quantize_unavailable_reason() is None


def test_the_missing_quantizer_hint_fits_the_installation(tmp_path, monkeypatch):
    """Without ModelOpt the hint is the command for this installation: ``pip install -e`` in the source checkout,
    ``pip install "attnzoo[quantize]"`` where the package was installed from a wheel (no checkout around it)."""
    import importlib.util
    import shutil

    import attnzoo.errors
    from attnzoo.export.quantize import modelopt

    monkeypatch.setattr(modelopt, "modelopt_version", lambda: None)
    assert 'pip install -e ".[quantize]"' in modelopt.quantize_unavailable_reason()
    wheel = tmp_path / "site-packages" / "attnzoo"  # the module as a wheel installs it: no pyproject.toml above
    wheel.mkdir(parents=True)
    shutil.copy(attnzoo.errors.__file__, wheel / "errors.py")
    spec = importlib.util.spec_from_file_location("wheel_errors", wheel / "errors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(modelopt, "install_hint", module.install_hint)
    reason = modelopt.quantize_unavailable_reason()
    assert 'pip install "attnzoo[quantize]"' in reason and "-e" not in reason


def _installed(name: str) -> bool:
    try:
        distribution(name)
        return True
    except PackageNotFoundError:
        return False


# ------------------------------------------------------------------------------------------------ packaging
def test_one_onnxruntime_distribution_only():
    """onnxruntime and onnxruntime-gpu install the same `onnxruntime` module: whichever came last wins. The
    [quantize] extra must not bring the second one (nvidia-modelopt[onnx] does)."""
    both = _installed("onnxruntime") and _installed("onnxruntime-gpu")
    assert not both, "both onnxruntime and onnxruntime-gpu are installed (pip uninstall onnxruntime-gpu)"


def test_quantize_extra_is_in_dev_and_pins_modelopt():
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert any(d.startswith("nvidia-modelopt==0.47") for d in extras["quantize"])
    assert not any("[onnx" in d or "onnxruntime" in d for d in extras["quantize"])
    assert "quantize" in extras["dev"][0]


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    """A verified fp32 export of an untrained micro belief2 classifier (4 projection scopes) and its config."""
    from attnzoo.export import load_for_export

    model, config, _ = load_for_export("belief2", "cls", "micro", random_init=True)
    path = tmp_path_factory.mktemp("fp32") / "b2.onnx"
    export_verified(model, path, config, batch_sizes=(1, 8))
    return path, config


@pytest.fixture(scope="module")
def int8(fp32, tmp_path_factory):
    path, config = fp32
    out = tmp_path_factory.mktemp("int8") / "b2_int8.onnx"
    options = qz.QuantizeOptions(
        dtype="int8",
        calibration=qz.random_calibration((32, 32), 32, seed=0),
        calibration_source="random",
        calibration_seed=0,
        measure_accuracy=False,
        placement="tensorrt",
        min_cosine=0.0,
    )  # untrained: ModelOpt's placement, measured
    return out, qz.quantize_verified(path, out, config, options)


def _fed_by_dq(proto: onnx.ModelProto, names) -> list:
    """Nodes among ``names`` with an input computed by a DequantizeLinear (through layout ops): written
    independently of the export.quantize package's own check."""
    producer = {o: n for n in proto.graph.node for o in n.output}
    hits = []
    for node in proto.graph.node:
        if node.name not in names:
            continue
        for i in node.input:
            p = producer.get(i)
            while p is not None and p.op_type in ("Transpose", "Reshape", "Squeeze", "Unsqueeze"):
                p = producer.get(p.input[0])
            if p is not None and p.op_type == "DequantizeLinear":
                hits.append(node.name)
    return hits


# ------------------------------------------------------------------------------------------------ int8 export
def test_int8_export_writes_a_qdq_model_with_the_extra_math_unquantized(fp32, int8):
    out, report = int8
    proto = onnx.load(str(out))
    ops = {n.op_type for n in proto.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    extra = qz.extra_math_nodes(proto)
    assert len(extra) == 4 * 8  # 4 blocks x (3 Mul, 2 ReduceSum, Add, Div, Sub), all still there
    assert _fed_by_dq(proto, set(extra)) == []
    assert not any(
        n.op_type in ("QuantizeLinear", "DequantizeLinear")
        and n.name.startswith("blocks.")
        and ".attn.projection" in n.name
        for n in proto.graph.node
    )
    # MatMuls outside the projection are quantized
    matmuls = [n.name for n in proto.graph.node if n.op_type == "MatMul"]
    assert _fed_by_dq(proto, set(matmuls))
    props = {p.key: p.value for p in proto.metadata_props}
    assert props["dtype"] == "int8" and json.loads(props["quantization"])["mode"] == "int8"
    # it runs in ONNX Runtime CPU with a symbolic batch
    x = np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)
    assert np.isfinite(onnx_reference().session(out).session.run(None, {"image": x})[0]).all()


def test_int8_report_fields(int8, fp32):
    out, report = int8
    on_disk = json.loads(report_path(out).read_text())
    assert on_disk["sha256"] == report["sha256"] and on_disk["passed"] is True
    q = on_disk["quantization"]
    assert q["quantizer"].startswith("nvidia-modelopt") and q["quantizer_version"].startswith("0.47")
    assert q["mode"] == "int8"
    assert q["calibration"]["count"] == 24 and q["calibration"]["seed"] == 0  # 8 of the 32 held out
    assert q["calibration"]["method"] == "entropy" and q["calibration"]["providers"] == ["cpu"]
    assert len(q["excluded_nodes"]) == 32
    n_mm = q["qdq"]["quantized_ops"]["MatMul"]
    assert 0 < n_mm <= q["qdq"]["total_ops"]["MatMul"] and len(q["qdq"]["quantized_matmuls"]) == n_mm
    assert on_disk["accuracy"]["measured"] is False and "no labelled test split" in on_disk["accuracy"]["warning"]
    assert on_disk["fp32_source"]["report"]["passed"] is True
    assert on_disk["fp32_source"]["path"] == str(fp32[0]) == on_disk["fp32_source"]["report"]["path"]  # kept
    fid = on_disk["fidelity"]  # measured on the last 8 of the 32 random inputs, which were not calibrated on
    assert fid["n_inputs"] == 8 and q["calibration"]["count"] == 24 and "not calibrated on" in fid["source"]
    assert fid["within_gate"] and fid["min_cosine"] == 0.0 and 0.5 < fid["cosine"]["mean"] <= 1.0
    blocks = on_disk["divergence"]["blocks"]  # each block's output against the fp32 graph's, same tensors
    assert [b["block"] for b in blocks] == [0, 1, 2, 3] and on_disk["divergence"]["reference"].startswith("the verif")
    assert all(0 < b["max_abs_err"] < 1 and 0.9 < b["cosine"] < 1 for b in blocks)
    worst = min(blocks, key=lambda b: b["cosine"])  # gated on the cosine: the verdict gives the worst block's
    assert f"worst block {worst['block']} cosine {worst['cosine']:.4f}" in qz.summary(on_disk)
    # the file is the schema's JSON, and what quantize_verified returns is the same object
    typed = qz.read_quantization_report(report_path(out))
    assert typed.to_json() == report_path(out).read_text() and typed.to_dict() == report == on_disk
    assert (
        isinstance(typed.quantization, qz.QuantizeReport) and typed.quantization.excluded_nodes == q["excluded_nodes"]
    )


#: Committed reports of quantized models: the exporter's own in tests/data, and any under results/ or zoo/.
COMMITTED_REPORTS = sorted(
    p
    for root in ("tests/data", "results", "zoo")
    for p in (Path(__file__).resolve().parents[2] / root).rglob("*.report.json")
)


def test_committed_quantization_reports_read_through_the_schema():
    quantized = [p for p in COMMITTED_REPORTS if json.loads(p.read_text()).get("dtype") in ("int8", "fp8")]
    assert len(quantized) >= 2, quantized  # at least the passed and the refused one in tests/data
    for path in quantized:
        report = qz.read_quantization_report(path)
        assert report.to_json() == path.read_text(), path  # read and written back byte for byte
        assert report.dtype in ("int8", "fp8") and report.quantization.mode == report.dtype
        assert report.passed == (not report.failures) == (".failed." not in path.name)
        assert (report.fidelity or {}).get("within_gate", True) or not report.passed
    passed = qz.read_quantization_report(
        Path(__file__).parents[1] / "data" / "quantization-reports" / "vit_int8.report.json"
    )
    assert passed.quantization.options["placement"] == "auto" and passed.fidelity["min_cosine"] == 0.99
    assert qz.summary(passed.to_dict()).endswith("PASSED")


def test_the_schema_refuses_a_report_it_does_not_describe(tmp_path):
    text = (Path(__file__).parents[1] / "data" / "quantization-reports" / "vit_int8.report.json").read_text()
    good = json.loads(text)
    cases = {
        "missing field(s) sha256": lambda r: r.pop("sha256"),
        "unknown field(s) extra": lambda r: r.update(extra=1),
        "passed is str, expected bool": lambda r: r.update(passed="yes"),
        "file_size is bool, expected int": lambda r: r.update(file_size=True),
        "quantization: missing field(s) mode": lambda r: r["quantization"].pop("mode"),
        "quantization: time_s is str, expected float": lambda r: r["quantization"].update(time_s="1s"),
    }
    for message, edit in cases.items():
        bad = json.loads(text)
        edit(bad)
        with pytest.raises(ValueError, match=re.escape(message)):
            qz.QuantizationReport.from_dict(bad)
    with pytest.raises(ValueError, match="not a JSON object"):
        qz.QuantizationReport.from_json("[]")
    assert qz.QuantizationReport.from_dict(good).fidelity == good["fidelity"]
    # serving reads it through the schema too: a report it does not describe is one line naming the field
    from attnzoo.fileio import sha256_file
    from attnzoo.runtime.sessions import verification_problem

    model = tmp_path / "m_int8.onnx"
    model.write_bytes(b"a model")
    good.pop("onnxruntime")
    good.update(sha256=sha256_file(model))
    (tmp_path / "m_int8.report.json").write_text(json.dumps(good))
    problem = verification_problem(model, "int8")
    assert problem == (
        "m_int8.report.json is not a report export-model writes (quantization report: missing field(s) onnxruntime)"
    )


def _dq_readers(proto: onnx.ModelProto) -> set:
    """Op types that read a DequantizeLinear output directly."""
    dq = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.op_type for n in proto.graph.node if dq.intersection(n.input)}


def test_cpu_placement_quantizes_only_the_weight_matmuls(fp32, int8, tmp_path, random_int8):
    """--qdq-placement cpu: Q/DQ only in front of MatMul/Conv (none dequantized into an Add or LayerNorm) and
    not on attention's two matmuls; the default (tensorrt) placement has both; the report and metadata say which."""
    path, config = fp32
    out = tmp_path / "b2_cpu.onnx"
    report = random_int8(
        path,
        out,
        config,
        32,
        placement="cpu",
        fp32_kept=False,  # as export-model's temporary fp32 graph: its report names no path to it
        calibration_method="max",  # asked for by one export, the precision's default left as it is
    )
    assert report["quantization"]["calibration"]["method"] == "max" and qz.CALIBRATION_METHODS["int8"] == "entropy"
    assert int8[1]["quantization"]["calibration"]["method"] == "entropy"
    assert report["fp32_source"]["path"] is None and report["fp32_source"]["report"]["path"] is None
    assert str(path) not in json.dumps(report) and report["fp32_source"]["report"]["passed"]
    cpu, default = onnx.load(str(out)), onnx.load(str(int8[0]))
    assert _dq_readers(cpu) <= {"MatMul", "Conv", "Shape"}
    assert {"Add", "LayerNormalization"} <= _dq_readers(default)
    core = [f"blocks.{i}.attn/MatMul{s}" for i in range(4) for s in ("", "_1")]  # q k^T and attn v
    assert set(core) <= set(_fed_by_dq(default, set(core))) and _fed_by_dq(cpu, set(core)) == []
    weights = [n.name for n in cpu.graph.node if n.op_type == "MatMul" and n.name not in core]
    assert set(_fed_by_dq(cpu, set(weights))) == set(weights) and _fed_by_dq(cpu, set(qz.extra_math_nodes(cpu))) == []
    assert report["quantization"]["options"]["placement"] == "cpu"
    assert json.loads({p.key: p.value for p in cpu.metadata_props}["quantization"])["placement"] == "cpu"
    assert json.loads(report_path(int8[0]).read_text())["quantization"]["options"]["placement"] == "tensorrt"
    with pytest.raises(ValueError, match="cpu is for int8"):
        qz.quantize_onnx(
            path, tmp_path / "x.onnx", dtype="fp8", calibration=qz.random_calibration((32, 32), 2), placement="cpu"
        )
    assert not (tmp_path / "x.onnx").exists()


def test_quantize_extra_math_puts_qdq_in_front_of_it(fp32, tmp_path, random_int8):
    path, config = fp32
    out = tmp_path / "b2_int8_all.onnx"
    report = random_int8(
        path, out, config, 16, quantize_extra_math=True, min_cosine=0.0
    )  # where the Q/DQ go, not how close an untrained model stays
    proto = onnx.load(str(out))
    assert report["quantization"]["excluded_nodes"] == []
    assert _fed_by_dq(proto, set(qz.extra_math_nodes(proto)))
    assert json.loads({p.key: p.value for p in proto.metadata_props}["quantization"])["quantize_extra_math"] is True


# ------------------------------------------------------------------------------------------------ fidelity
def test_output_agreement_against_explicit_values():
    ref = np.array([[1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [3.0, 4.0, 0.0, 0.0, 0.0, 1.0]], np.float32)
    out = np.array([[1.0, 1.0, 0.0, 0.0, 0.0, 0.0], [3.0, 4.0, 0.0, 0.0, 0.0, 1.0]], np.float32)
    r = qz.output_agreement(ref, out, "cls")
    assert r["cosine"]["min"] == pytest.approx(1 / np.sqrt(2)) and r["cosine"]["mean"] == pytest.approx(
        (1 / np.sqrt(2) + 1) / 2
    )
    assert r["relative_error"]["max"] == pytest.approx(1.0) and r["relative_error"]["mean"] == pytest.approx(0.5)
    assert r["top1_agreement"] == 1.0 and r["n_inputs"] == 2 and r["finite"]
    top = qz.output_agreement(np.array([[6, 5, 4, 3, 2, 1.0]]), np.array([[6, 5, 4, 3, 1, 2.0]]), "cls")
    assert top["top5_overlap"] == pytest.approx(4 / 5) and top["top1_agreement"] == 1.0
    bad = out.copy()
    bad[1, 0] = np.nan
    r = qz.output_agreement(ref, bad, "cls")
    assert not r["finite"] and r["cosine"]["min"] == 0.0  # a NaN output counts as no agreement
    seg = qz.output_agreement(np.stack([ref.T, ref.T]), np.stack([ref.T, -ref.T]), "seg")  # (2, 6, 2) maps
    assert seg["cosine"]["min"] == pytest.approx(-1.0) and seg["top1_agreement"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "n,coverage,confidence,table",
    [(10, 0.99, 0.95, 3.981), (20, 0.99, 0.95, 3.295), (10, 0.90, 0.95, 2.355), (15, 0.95, 0.90, 2.329)],
)
def test_tolerance_factor_against_published_tables(n, coverage, confidence, table):
    """One-sided normal tolerance factors as tabulated (NIST/SEMATECH e-Handbook 7.2.6.3; Natrella, Experimental
    Statistics, Table A-7)."""
    assert qz.tolerance_factor(n, coverage, confidence) == pytest.approx(table, abs=1.5e-3)
    assert qz.tolerance_factor(2) == float("inf")


def test_promised_cosine_covers_what_it_promises():
    """On log-normal errors (1 - cosine), the promise made from 32 draws leaves at most 0.1 % of the population
    below it in at least 90 % of the draws (the confidence, less sampling slack), is never above the worst draw,
    falls further below it with fewer draws, and is 0 below 3 draws."""
    rng = np.random.default_rng(0)
    population = 1.0 - np.exp(rng.normal(np.log(2e-3), 0.6, 200_000))
    covered = []
    for _ in range(300):
        draw = rng.choice(population, 32, replace=False)
        promise = qz.promised_cosine(draw)
        assert promise <= draw.min()
        covered.append(np.mean(population < promise) <= 1e-3)
    assert np.mean(covered) >= 0.85
    few = population[:8]
    many = np.tile(few, 8)  # the same worst and spread, eight times the evidence: a smaller margin
    assert qz.promised_cosine(few) < qz.promised_cosine(many) <= few.min()
    assert qz.promised_cosine(population[:2]) == 0.0


def test_the_gate_is_on_the_worst_input_not_the_mean(fp32, int8, tmp_path, random_int8):
    """A gate between the worst and the mean held-out cosine of the same export refuses it (it would pass a gate
    on the mean): nothing written, one line naming worst and mean, the failed report beside."""
    path, config = fp32
    fid = int8[1]["fidelity"]
    assert fid["cosine"]["min"] < fid["cosine"]["mean"] and fid["gate_on"].startswith("not gated (--min-cosine 0")
    gate = (fid["cosine"]["min"] + fid["cosine"]["mean"]) / 2
    out = tmp_path / "b2_int8.onnx"
    with pytest.raises(
        qz.FidelityError,
        match=r"worst output cosine to fp32 0\.\d+ \(mean 0\.\d+\) on 8 held-out "
        r"input\(s\) is below --min-cosine",
    ) as exc:
        random_int8(path, out, config, 32, seed=0, placement="tensorrt", min_cosine=gate)
    assert "\n" not in str(exc.value) and not out.exists() and not report_path(out).exists()
    failed = json.loads(failed_report_path(out).read_text())
    assert failed["fidelity"]["cosine"]["min"] == pytest.approx(fid["cosine"]["min"])
    assert failed["fidelity"]["gate_on"] == "worst held-out input"
    assert failed["fidelity"]["split"] == {"calibration": 24, "choose": 0, "gate": 8}
    assert "only 8 gate input(s)" in failed["fidelity"]["weak"]


def test_auto_refuses_when_no_placement_promises_the_gate(fp32, tmp_path, random_int8):
    """auto measures every group (weight inputs included) on the choosing inputs; when no placement promises the
    gate the export is refused in one line and nothing is written; the failed report names each group, its
    measurement, and what each group it kept fp32 costs on ONNX Runtime here."""
    path, config = fp32
    out = tmp_path / "b2_int8.onnx"
    with pytest.raises(
        qz.FidelityError,
        match=r"no Q/DQ placement promises a cosine to fp32 >= 0\.99999 on inputs "
        r"like the 8 choosing one\(s\)",
    ) as exc:
        random_int8(path, out, config, 64, seed=0, placement="auto", min_cosine=0.99999)
    assert "\n" not in str(exc.value) and not out.exists() and not report_path(out).exists()
    failed = json.loads(failed_report_path(out).read_text())
    auto = failed["quantization"]["options"]["auto"]
    assert auto["promised"] is False and auto["selection_inputs"] == 8 and failed["fidelity"]["split"]["gate"] == 8
    assert auto["all_quantized"]["promised"] <= auto["all_quantized"]["worst"] <= auto["all_quantized"]["mean"]
    assert auto["tolerance_factor"] == pytest.approx(qz.tolerance_factor(8))
    kinds = {d["kind"] for d in auto["groups"].values()}
    assert kinds == {"weights", "attention", "residual"}
    assert "blocks.0.mlp.fc1 input" in auto["groups"]
    kept = [g for g, d in auto["groups"].items() if not d["quantized"]]
    assert kept and set(auto["speed"]["groups"]) == set(kept)
    assert all(v["fp32_ms"] > 0 and v["quantized_ms"] > 0 for v in auto["speed"]["groups"].values())
    summary = qz.summary(failed)
    assert "cosine worst" in summary and "relative error mean" in summary and "WEAK" in summary


@pytest.mark.slow  # a whole placement search (about 20 s)
def test_export_model_refuses_in_one_line_when_no_placement_promises_the_gate(tmp_path, capsys):
    """export-model with the default placement (auto) and a gate no placement can promise: exit 1, one line
    naming the promise and the choosing inputs, nothing at --out nor anywhere else but the failed report."""
    out = tmp_path / "b2_int8.onnx"
    with pytest.raises(SystemExit) as info:
        export_main(
            [
                "--variant",
                "belief2",
                "--arch",
                "micro",
                "--random-init",
                "--dtype",
                "int8",
                "--min-cosine",
                "0.99999",
                "--calibration-count",
                "32",
                "--fidelity-count",
                "16",
                "--out",
                str(out),
            ]
        )
    assert info.value.code == 1
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()  # progress bars and warnings before it
    errors = [x for x in err if x.startswith("error: ")]
    assert len(errors) == 1 and err[-1] == errors[0]
    line = errors[0]
    assert (
        "b2_int8.onnx not written: no Q/DQ placement promises a cosine to fp32 >= 0.99999 on inputs like the 8 "
        "choosing one(s)" in line
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [failed_report_path(out).name]
    failed = json.loads(failed_report_path(out).read_text())
    assert failed["passed"] is False and failed["quantization"]["options"]["auto"]["promised"] is False


def test_calibration_folder_is_preprocessed_from_the_models_metadata(tmp_path):
    """A folder of images of any size and mode: load_image -> input style -> resize -> the model's mean/std; the
    last quarter (at most --fidelity-count) held out; random calibration of a trained model is warned about."""
    from PIL import Image

    from attnzoo.preprocess import load_image, normalize

    rng = np.random.default_rng(0)
    sub = tmp_path / "photos" / "sub"
    sub.mkdir(parents=True)
    for i in range(8):
        Image.fromarray(rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)).save(sub / f"{i}.png")
    (tmp_path / "photos" / "notes.txt").write_text("not an image")
    config = {"task": "cls", "img_size": 16, "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.3, 0.4], "input_style": "rgb"}
    x = qz.load_calibration_folder(tmp_path / "photos", config, (16, 16), count=100)
    want = normalize(
        np.stack([np.asarray(load_image(sub / f"{i}.png").resize((16, 16), Image.BILINEAR)) for i in range(8)]),
        config["mean"],
        config["std"],
    )
    np.testing.assert_array_equal(x, want)
    cal = qz.calibration_for(config, (16, 16), calibration_data=tmp_path / "photos", fidelity_count=64)
    assert len(cal.inputs) == 6 and len(cal.held_out) == 2 and not cal.random
    assert "only 2 held-out" in cal.warnings[0]
    with pytest.raises(ValueError, match="no images"):
        qz.calibration_for(config, (16, 16), calibration_data=_empty_dir(tmp_path))
    rand = qz.calibration_for({**config, "variant": "belief2"}, (16, 16), calibration_count=4, fidelity_count=2)
    assert rand.random and rand.inputs.shape == (4, 3, 16, 16) and rand.held_out.shape == (2, 3, 16, 16)
    assert "trained model" in rand.warnings[0] and "--calibration-data" in rand.warnings[0]


def _empty_dir(root: Path) -> Path:
    folder = root / "empty"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def pretrained_like(tmp_path_factory):
    """A converted pretrained-like ViT (massive residual channels, query/key outlier channels: see
    research.int8_fidelity.standin), a folder of 128 smooth images to calibrate on, and 256 further ones."""
    from attnzoo.models import convert_to_belief2
    from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
    from research.int8_fidelity.standin import pretrained_like_vit, smooth_images, write_images

    model = convert_to_belief2(pretrained_like_vit())
    folder = write_images(tmp_path_factory.mktemp("photos"), smooth_images(128, 32))
    cfg = model.attnzoo_config
    further = normalize(smooth_images(256, 32, seed=1), cfg.get("mean", DEFAULT_MEAN), cfg.get("std", DEFAULT_STD))
    return model, folder, further


@pytest.mark.slow
def test_pretrained_like_vit_fails_the_gate_with_modelopts_placement_and_passes_with_auto(pretrained_like, tmp_path):
    """A pretrained ViT's drift, offline: ModelOpt's full (tensorrt) placement drifts below the fidelity gate and is
    refused (nothing written, the failed report beside, the weights-only figure named); export-model's default
    (auto) chooses with a margin on 16 inputs, passes the gate on the worst of 16 others, and holds on 256 further
    images that took no part; a gate no placement can promise is refused in one line."""
    from attnzoo.export import ExportWarning, export_model

    model, folder, further = pretrained_like
    out = tmp_path / "vit_int8.onnx"
    common = dict(model=model, out=out, dtype="int8", batch_sizes=(1,), calibration_data=folder)
    with pytest.raises(
        qz.FidelityError,
        match=r"worst output cosine to fp32 0\.\d+ \(mean 0\.\d+\) on 32 held-out "
        r"input\(s\) is below --min-cosine 0\.99 \(Q/DQ placement tensorrt\); "
        r"the weight MatMuls alone: worst 0\.\d+",
    ):
        export_model(qdq_placement="tensorrt", **common)
    assert not out.exists() and not report_path(out).exists()
    failed = json.loads(failed_report_path(out).read_text())
    assert failed["fidelity"]["cosine"]["min"] < 0.99 < failed["fidelity"]["weights_only_worst"]
    with pytest.warns(ExportWarning, match="only 32 held-out"):
        result = export_model(**common)  # the default placement: auto
    rep = result.report
    fid = rep["fidelity"]
    assert rep["passed"] and fid["cosine"]["min"] >= 0.99 and not failed_report_path(out).exists()
    assert fid["split"] == {"calibration": 96, "choose": 16, "gate": 16} and "only 16 gate input(s)" in fid["weak"]
    auto = rep["quantization"]["options"]["auto"]
    assert auto["promised"] and auto["chosen"]["promised"] >= 0.99 and auto["all_quantized"]["promised"] < 0.99
    assert auto["chosen"]["promised"] <= auto["chosen"]["worst"]  # the margin: chosen below its own worst
    kept = [g for g, d in auto["groups"].items() if not d["quantized"]]
    assert kept and all("kept fp32" in auto["groups"][g]["why"] for g in kept)
    assert set(auto["speed"]["groups"]) == set(kept)
    unseen = qz.output_agreement(
        qz.onnx_outputs(_fp32(model, tmp_path), further, None), qz.onnx_outputs(out, further, None), "cls"
    )
    assert unseen["cosine"]["min"] >= 0.99  # inputs that neither chose nor gated the placement
    assert (
        json.loads({p.key: p.value for p in onnx.load(str(out)).metadata_props}["quantization"])["placement"] == "auto"
    )
    line = next(x for x in result.summary().splitlines() if "fidelity to fp32" in x)
    assert "on 16 held-out inputs (96 calibrate, 16 others chose the placement): cosine worst" in line
    assert "relative error mean" in line and "WEAK" in line
    refused = tmp_path / "refused.onnx"
    with pytest.raises(
        qz.FidelityError,
        match=r"no Q/DQ placement promises a cosine to fp32 >= 0\.99999 on inputs "
        r"like the 16 choosing one\(s\)",
    ):
        export_model(**{**common, "out": refused}, min_cosine=0.99999)
    assert not refused.exists() and not report_path(refused).exists()


def _fp32(model, folder: Path) -> Path:
    """The fp32 export of ``model`` (the reference the further inputs are compared with)."""
    from attnzoo.export import export_model

    return export_model(model=model, out=folder / "fp32.onnx", batch_sizes=(1,)).path


# ------------------------------------------------------------------------------------------------ accuracy gate


@pytest.fixture(scope="module")
def zoo_fp32(tmp_path_factory):
    """The zoo's trained belief2 Fashion-MNIST classifier, exported and verified."""
    from attnzoo.export import load_for_export

    model, config, sha = load_for_export("belief2", "cls")
    path = tmp_path_factory.mktemp("zoo") / "b2.onnx"
    export_verified(model, path, config, batch_sizes=(1, 8), checkpoint_sha256=sha)
    return path, config


def test_calibration_images_are_training_images_preprocessed_like_the_model(zoo_fp32):
    from attnzoo.data.fashion import fashion_arrays
    from attnzoo.preprocess import normalize

    _, config = zoo_fp32
    x = qz.calibration_images(config, 16, seed=3)
    assert x.shape == (16, 3, 28, 28) and x.dtype == np.float32
    gray, _ = fashion_arrays("train")
    idx = np.sort(np.random.default_rng(3).choice(len(gray), 16, replace=False))
    ref = normalize(np.repeat(gray[idx][..., None], 3, -1), config["mean"], config["std"])  # 28 px: no resize
    np.testing.assert_array_equal(x, ref)
    assert not np.array_equal(x, qz.calibration_images(config, 16, seed=4))


@pytest.mark.slow
def test_an_accuracy_drop_beyond_the_tolerance_refuses_to_write(zoo_fp32, tmp_path, monkeypatch):
    path, config = zoo_fp32
    out = tmp_path / "b2_int8.onnx"
    out.write_bytes(b"a good model already there")
    report_path(out).write_text("its report")
    cal = qz.calibration_images(config, 64, seed=0)
    # test hook: an impossible tolerance (int8 would have to beat fp32 by 100 points)
    monkeypatch.setitem(qz.ACCURACY_TOLERANCE, "cls", -100.0)
    with pytest.raises(qz.AccuracyDropError, match="below fp32"):
        qz.quantize_verified(
            path, out, config, dtype="int8", calibration=cal, calibration_source="fashion", eval_limit=300
        )
    assert out.read_bytes() == b"a good model already there" and report_path(out).read_text() == "its report"
    failed = json.loads(failed_report_path(out).read_text())
    assert failed["passed"] is False and failed["accuracy"]["n_images"] == 300
    drop = failed["accuracy"]["drop"]
    assert drop == pytest.approx(failed["accuracy"]["metrics"]["fp32"] - failed["accuracy"]["metrics"]["int8"])
    assert f"is {drop:.2f} points below fp32" in failed["failures"][0] and failed["accuracy"]["limit"] == 300
    assert not list(tmp_path.glob(".*tmp"))
    # the explicit override writes it, and says so
    report = qz.quantize_verified(
        path,
        out,
        config,
        dtype="int8",
        calibration=cal,
        calibration_source="fashion",
        eval_limit=300,
        accept_accuracy_drop=True,
    )
    assert report["passed"] and report["accuracy"]["accepted_drop"] is True
    assert onnx.load(str(out)).graph.node and not failed_report_path(out).exists()


@pytest.mark.slow
def test_export_model_int8_scores_the_test_split_next_to_fp32(tmp_path, capsys):
    out = tmp_path / "b2_int8.onnx"
    assert (
        export_main(
            [
                "--variant",
                "belief2",
                "--dtype",
                "int8",
                "--calibration-count",
                "64",
                "--eval-limit",
                "500",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rep = json.loads(report_path(out).read_text())
    acc = rep["accuracy"]
    assert acc["n_images"] == 500 and acc["split"] == "test" and set(acc["metrics"]) == {"fp32", "int8"}
    assert acc["drop"] == pytest.approx(acc["metrics"]["fp32"] - acc["metrics"]["int8"])
    assert rep["quantization"]["calibration"]["source"] == "fashion training split"
    # the fp32 model it was quantized from was a temporary file: its hash and report, no dangling path
    src = rep["fp32_source"]
    assert src["path"] is None and src["kept"] is False and src["report"]["passed"] and len(src["sha256"]) == 64
    assert src["report"]["path"] is None and "attnzoo-fp32-" not in json.dumps(rep)  # nor in its own report
    assert "top1 on 500 fashion test images" in capsys.readouterr().out
    # code that is not the package's (evaluation/independent_check.py: gzip + numpy IDX reader, preprocessing
    # from the file's metadata, plain onnxruntime) scores the same int8 file on the same 500 images
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("independent_check", root / "evaluation" / "independent_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    from attnzoo.data.fashion import fashion_root

    folder = fashion_root()  # Debian's official files or the package's copy of them (.gz)
    gray = check.read_idx(folder / "t10k-images-idx3-ubyte.gz")[:500]
    labels = check.read_idx(folder / "t10k-labels-idx1-ubyte.gz")[:500]
    top1 = 100.0 * float(np.mean(check.run_onnx(out, gray).argmax(1) == labels))
    assert top1 == pytest.approx(acc["metrics"]["int8"], abs=0.21)  # at most one image apart


# ------------------------------------------------------------------------------------------------ bad input
def _refused(argv, capsys, code: int = 2) -> str:
    with pytest.raises(SystemExit) as info:
        export_main(argv)
    assert info.value.code == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def _never(*args, **kwargs):
    raise AssertionError("work started although the input should have been refused up front")


@pytest.mark.parametrize(
    "array, message, code",
    [
        # the spatial size is known once the model is: a bad input file then (exit 1); the rest with the arguments (2)
        (np.zeros((4, 3, 16, 16), np.float32), "shape (4, 3, 16, 16)", 1),
        (np.zeros((4, 32, 32, 3), np.float32), "shape (4, 32, 32, 3)", 2),
        (np.zeros((4, 3, 32, 32), np.uint8), "dtype uint8", 2),
        (np.zeros((0, 3, 32, 32), np.float32), "holds no images", 2),
        (np.array([{"a": 1}], dtype=object), "not a plain .npy array", 2),
        (np.full((2, 3, 32, 32), np.nan, np.float32), "NaN", 2),
    ],
)
def test_bad_calibration_files_are_refused_in_one_line_before_work(array, message, code, tmp_path, monkeypatch, capsys):
    from attnzoo.export import verify as verify_mod

    monkeypatch.setattr(verify_mod, "export_verified", _never)
    monkeypatch.setattr(qz, "quantize_verified", _never)
    bad = tmp_path / "cal.npy"
    np.save(bad, array, allow_pickle=True)
    out = tmp_path / "out" / "m.onnx"
    line = _refused(
        ["--variant", "belief2", "--random-init", "--dtype", "int8", "--calibration-data", str(bad), "--out", str(out)],
        capsys,
        code,
    )
    assert message in line
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_fp8_below_sm89_is_refused_before_work(tmp_path, monkeypatch, capsys):
    from attnzoo.export import pipeline

    monkeypatch.setattr(pipeline, "load_for_export", _never)
    out = tmp_path / "m.engine"
    fp8_engine = ["--variant", "belief2", "--random-init", "--dtype", "fp8", "--format", "tensorrt", "--out", str(out)]
    line = _refused([*fp8_engine, "--compute-capability", "SM86"], capsys)
    assert line == ("error: --dtype fp8 needs compute capability SM89 or newer (FP8 tensor cores); SM86 has none")
    assert not any(tmp_path.iterdir())
    from attnzoo.targets.tensorrt.options import compute_capability_error

    fp8 = get_precision("fp8")
    assert compute_capability_error(fp8, "SM89") is None and compute_capability_error(fp8, "SM120") is None
    assert compute_capability_error(fp8, "SM75") is not None
    assert compute_capability_error(get_precision("int8"), "SM75") is None  # int8 builds for every target
    # CURRENT without a GPU: the usage line, before torch is asked for a device's capability
    from attnzoo.targets.tensorrt import library

    monkeypatch.setattr(library, "gpu_available", lambda: False)  # where the option's check looks it up
    line = _refused([*fp8_engine, "--compute-capability", "CURRENT"], capsys)
    assert line == (
        "error: compute capability CURRENT needs a GPU and none is visible; name one of SM75, SM80, "
        "SM86, SM89, SM120, SM121"
    )
    assert not any(tmp_path.iterdir())


def test_quantization_flags_need_a_quantized_dtype(tmp_path, capsys):
    line = _refused(
        ["--variant", "belief2", "--random-init", "--quantize-extra-math", "--out", str(tmp_path / "m.onnx")], capsys
    )
    assert line == "error: --quantize-extra-math applies to --dtype int8 / fp8 only"
    for flag in ("--smooth-quant", "--no-smooth-quant"):
        line = _refused(["--variant", "belief2", "--random-init", flag, "--out", str(tmp_path / "m.onnx")], capsys)
        assert line == "error: --smooth-quant applies to --dtype int8 / fp8 only"


def test_smooth_quant_flag_reaches_the_quantizer_as_given(monkeypatch):
    """--smooth-quant / --no-smooth-quant force the outlier migration on or off; without either, None (auto's
    default decides)."""
    from attnzoo.export import cli, pipeline

    seen = []

    def stop(*args, **kwargs):
        seen.append(kwargs["smooth_quant"])
        raise pipeline.UsageError("stopped here")

    monkeypatch.setattr(pipeline, "export_model", stop)  # where it is defined: the command names it lazily
    for flags, want in (([], None), (["--smooth-quant"], True), (["--no-smooth-quant"], False)):
        with pytest.raises(SystemExit):
            cli.main(["--variant", "belief2", "--dtype", "int8", *flags])
        assert seen[-1] is want


def test_cpu_placement_is_refused_where_it_cannot_work(tmp_path, monkeypatch, capsys):
    """--qdq-placement cpu: int8 only, not for a TensorRT engine, not without a quantized dtype; before any work."""
    from attnzoo.export import pipeline

    monkeypatch.setattr(pipeline, "load_for_export", _never)
    base = ["--variant", "belief2", "--random-init", "--qdq-placement", "cpu"]
    assert (
        _refused([*base, "--out", str(tmp_path / "m.onnx")], capsys)
        == "error: --qdq-placement applies to --dtype int8 / fp8 only"
    )
    assert (
        _refused([*base, "--dtype", "fp8", "--out", str(tmp_path / "m.onnx")], capsys)
        == "error: --qdq-placement cpu is for int8 on the CPU runtimes; fp8 is TensorRT's (use tensorrt)"
    )
    assert _refused(
        [*base, "--dtype", "int8", "--format", "tensorrt", "--out", str(tmp_path / "m.engine")], capsys
    ).startswith("error: --qdq-placement cpu is for ONNX Runtime on the CPU")
    assert not any(tmp_path.iterdir())


def test_ctrl_c_during_calibration_leaves_nothing(fp32, tmp_path, monkeypatch, random_int8):
    import modelopt.onnx.quantization as mo

    def interrupted(*args, **kwargs):
        Path(kwargs["output_path"]).write_bytes(b"half")  # the quantizer was writing when Ctrl-C came
        raise KeyboardInterrupt

    monkeypatch.setattr(mo, "quantize", interrupted)
    path, config = fp32
    out = tmp_path / "m.onnx"
    with pytest.raises(KeyboardInterrupt):
        random_int8(path, out, config, 4)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ FP8
def _e4m3(x: np.ndarray) -> np.ndarray:
    """Reference: QuantizeLinear to float8e4m3fn (saturate) and back, with ml_dtypes' RNE cast."""
    return np.clip(x, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def test_simulate_fp8_matches_an_e4m3_round_trip():
    """Q(fp8) -> Transpose -> DQ with a per-tensor scale (activation) and a per-channel one (weight)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 4])
    w_out = helper.make_tensor_value_info("wq", TensorProto.FLOAT, [4, 6])
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 6)) * 50).astype(np.float32)
    wscale = np.array([0.5, 0.01, 1.0, 3.0], np.float32)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, [], [0.0]),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(wscale, "ws"),
        helper.make_tensor("wzp", TensorProto.FLOAT8E4M3FN, [4], [0.0] * 4),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
        helper.make_node("Transpose", ["q"], ["qt"], perm=[1, 0], name="t"),
        helper.make_node("DequantizeLinear", ["qt", "s", "zp"], ["y"], name="dq"),
        helper.make_node("QuantizeLinear", ["w", "ws", "wzp"], ["wq8"], axis=0, name="wq"),
        helper.make_node("DequantizeLinear", ["wq8", "ws", "wzp"], ["wq"], axis=0, name="wdq"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y, w_out], inits), opset_imports=[helper.make_opsetid("", 21)]
    )
    sim = simulate_fp8(model)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in sim.graph.node)
    xv = np.concatenate([rng.standard_normal((2, 6)), rng.standard_normal((2, 6)) * 100]).astype(np.float32)
    got_y, got_w = onnx_reference().session(sim.SerializeToString()).session.run(None, {"x": xv})
    np.testing.assert_array_equal(got_y, (_e4m3(xv / np.float32(0.05)) * np.float32(0.05)).T)
    np.testing.assert_array_equal(got_w, _e4m3(w / wscale[:, None]) * wscale[:, None])
    assert np.abs(xv).max() / 0.05 > 448  # saturation exercised


# ------------------------------------------------------------------------------------------------ TensorRT
#: Built in the default run: none (an engine build takes about 8 s on 2 cores).
TRT_FAST: tuple[str, ...] = ()
#: CI's slow run builds belief2's int8 and fp8 engines (the projection), the int8 engines of tests/tiers.py's set and
#: the fp8 ones of the distance variants (the rest: the matrix run, -m matrix).
TRT_SLOW = {"int8": ("belief2", *SLOW_SET), "fp8": ("belief2", "wafe-mae", "anti-wafe-mae")}


@pytest.fixture(scope="module")
def fp32_of(fp32, tmp_path_factory):
    """A verified fp32 export of an untrained micro classifier of any variant (belief2's is ``fp32``)."""
    from attnzoo.export import load_for_export

    root = tmp_path_factory.mktemp("fp32-variants")
    cache = {"belief2": fp32}

    def get(variant):
        if variant not in cache:
            model, config, _ = load_for_export(variant, "cls", "micro", random_init=True)
            path = root / f"{variant}.onnx"
            export_verified(model, path, config, batch_sizes=(1, 8))
            cache[variant] = (path, config)
        return cache[variant]

    return get


def _trt_matrix():
    from attnzoo.models import BUILTIN_VARIANTS

    return [
        pytest.param(v, d, marks=tier_marks(v, TRT_FAST, slow=TRT_SLOW.get(d, ())), id=f"{v}-{d}")
        for v in BUILTIN_VARIANTS
        for d in ("int8", "fp8")
    ]


@pytest.mark.tensorrt
@pytest.mark.parametrize("variant,dtype", _trt_matrix())
def test_tensorrt_builds_the_qdq_graph_with_the_extra_math_fp32(fp32_of, variant, dtype, tmp_path):
    """Every variant's int8 and fp8 Q/DQ graph builds for SM89 (no GPU needed) with its extra math fp32 and
    no extra-math layer reading a DequantizeLinear, while some MatMuls do."""
    from attnzoo.models import ARCHS, VARIANTS
    from attnzoo.targets.tensorrt import gpu_available
    from attnzoo.targets.tensorrt.verified import STATUS_BUILT, build_engine, tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason(run=False)
    assert reason is None, reason
    path, config = fp32_of(variant)
    onnx_q = tmp_path / f"{variant}_{dtype}.onnx"
    qz.quantize_verified(
        path,
        onnx_q,
        config,
        dtype=dtype,
        calibration=qz.random_calibration((32, 32), 16),
        calibration_source="random",
        measure_accuracy=False,
        min_cosine=0.0,
    )  # an untrained model on random inputs: its fidelity is measured, not gated
    engine = tmp_path / f"{variant}_{dtype}.engine"
    report = build_engine(onnx_q, engine, batch_sizes=(1, 8), compute_capability="SM89")
    assert engine.stat().st_size > 0 and report.passed and report.network_check, report.failures
    net = report.network_check
    scopes = VARIANTS[variant].extra_scopes
    assert net["extra_scopes"] == sorted(scopes)
    assert net["extra_math_scopes"] == ARCHS["micro"]["depth"] * len(scopes)
    assert all(b["fp32"] == b["layers"] > 0 for b in net["blocks"].values())
    quantized = net["quantized"]
    assert quantized["matmuls_fed_by_dequantize"] and quantized["extra_math_layers_fed_by_dequantize"] == []
    if not gpu_available():
        assert report.status == STATUS_BUILT
    if dtype == "fp8" and variant == "belief2":  # the API refuses it too, before parsing
        with pytest.raises(ValueError, match="SM89 or newer"):
            build_engine(onnx_q, tmp_path / "old.engine", batch_sizes=(1, 8), compute_capability="SM86")
        assert not (tmp_path / "old.engine").exists()
