"""Every gate of ``export_model`` at its boundary: just inside it the file is written, just outside it nothing is
written at the destination and the failed report names the reason.

- parity against eager at fp32 and fp16, an output moved by half and by twice the tolerance of its precision;
- the extra-math count of the ONNX graph, the real export holding exactly the ops a scope declares and one op
  fewer (its node renamed out of the scope: the numbers stay, the count drops); the projection's eps within and
  beyond the check's 1e-3;
- the int8 fidelity gate (worst output cosine to fp32) at half and twice the default gate's ``1 - cosine``, and
  exactly at the gate; the int8 accuracy gate at half, exactly at and twice the tolerance in points;
- the TensorRT network check, every extra-math op an fp32 layer, and one of them 16-bit or missing.

The model is belief2's micro classifier cut to one block, labelled as a ``digits`` classifier (so that int8
scores it, on the smallest built-in data set). Its torch export (and, for int8, ModelOpt's quantization) runs
once; each test's export is answered with a copy of that file, and every check after it runs as written.
OpenVINO, ExecuTorch and AOTInductor have theirs in their own test files; the parity comparison itself is pinned
in tests/runtime/test_parity.py.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from attnzoo.data.datasets import DIGITS_CLASSES
from attnzoo.export import export_model, verify
from attnzoo.export import quantize as qz
from attnzoo.export.errors import ExportError
from attnzoo.export.onnx_export import export_onnx
from attnzoo.export.quantize import fidelity, verified
from attnzoo.export.verify import VerificationError, failed_report_path, report_path
from attnzoo.models import PROJECTION_OPS, create_model
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.runtime.schemas import QuantizeReport
from attnzoo.targets.tensorrt.schema import EngineReport
from tests.export.boundary import made_once, shift_parity
from tests.schemas import read_back

# one torch export per precision and one ModelOpt run, shared (about 10 s on 2 cores); then a second or two a test
pytestmark = pytest.mark.slow

SCOPE = "blocks.0.attn.projection"
INT8 = dict(dtype="int8", qdq_placement="cpu", calibration_count=32, fidelity_count=16, eval_limit=32)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The model, its ONNX exports (fp32, fp16) and a store for ModelOpt's first answer."""
    torch.manual_seed(0)
    model = create_model("belief2", "cls", "micro", num_classes=len(DIGITS_CLASSES)).eval()
    model.blocks = model.blocks[:1]
    model.attnzoo_config = {**model.attnzoo_config, "data": "digits", "class_names": list(DIGITS_CLASSES)}
    folder = tmp_path_factory.mktemp("gates")
    files = {
        dtype: made_once(
            folder / f"gates_b2_{dtype}.onnx",
            lambda path, dtype=dtype: export_onnx(model, path, config=model.attnzoo_config, dtype=dtype),
        )
        for dtype in ("fp32", "fp16")
    }
    return model, files, {}


@pytest.fixture
def model(source, monkeypatch):
    """The model, whose torch export (and ModelOpt quantization) is answered from :func:`source`; ``model.edits``:
    changes made to the exported graph before the export's checks read it."""
    model, files, quantized = source
    edits: list = []

    def exported(model, path, *, dtype="fp32", **kwargs):
        proto = onnx.load(str(files[dtype]))
        for edit in edits:
            edit(proto)
        onnx.save(proto, str(path))
        return Path(path)

    real_quantize = verified.quantize_onnx

    def quantized_once(source, out, **kwargs):
        """ModelOpt's graph of the fixture's fp32 file (the only one the int8 tests quantize) and its report."""

        def make(path):
            Path(f"{path}.json").write_text(real_quantize(source, path, **kwargs).to_json())

        if "file" not in quantized:
            quantized["file"] = made_once(files["fp32"].with_name("gates_b2_int8.onnx"), make, siblings=(".json",))
        shutil.copyfile(quantized["file"], out)
        return QuantizeReport.from_json(Path(f"{quantized['file']}.json").read_text())

    monkeypatch.setattr(verify, "export_onnx", exported)
    monkeypatch.setattr(verified, "quantize_onnx", quantized_once)
    model.edits = edits
    yield model
    del model.edits


def _failed(out: Path, kind: str = "verification") -> dict:
    """The failed report of ``out``, which must not exist (nor its report)."""
    assert not out.exists() and not report_path(out).exists()
    return read_back(failed_report_path(out), kind)


# ---------------------------------------------------------------------------------------------------------- parity
def _errors(report: dict) -> list[float]:
    return [row[k]["error"] for row in report["parity"]["per_batch"] for k in ("real", "random")]


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_an_onnx_file_off_by_half_its_tolerance_is_written(model, monkeypatch, tmp_path, dtype):
    shift_parity(monkeypatch, verify, 0.5, dtype)
    out = tmp_path / "b2.onnx"
    report = export_model(model=model, out=out, dtype=dtype, batch_sizes=(1,)).report
    assert report["passed"] and out.is_file() and report["dtype"] == dtype
    assert 0.4 * TOLERANCES[dtype] < min(_errors(report)) <= max(_errors(report)) < TOLERANCES[dtype]
    assert report["parity"]["tolerance"] == {f"{dtype}_x_max(1,max|logit|)": TOLERANCES[dtype]}


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_an_onnx_file_off_by_twice_its_tolerance_is_refused(model, monkeypatch, tmp_path, dtype):
    shift_parity(monkeypatch, verify, 2.0, dtype)
    out = tmp_path / "b2.onnx"
    with pytest.raises(VerificationError, match=r"^b2.onnx failed verification \(batch 1 real: max abs err ") as info:
        export_model(model=model, out=out, dtype=dtype, batch_sizes=(1,))
    assert str(info.value).endswith("b2.onnx was not written") and "\n" not in str(info.value)
    report = _failed(out)
    assert report["passed"] is False and report["extra_math"]["ok"]
    rows = [f"batch {b} {kind}" for b in (1, 3) for kind in ("real", "random")]
    assert [f.split(":")[0] for f in report["failures"]] == rows
    assert all(" > " in f for f in report["failures"])
    assert all(1.9 * TOLERANCES[dtype] < e < 2.1 * TOLERANCES[dtype] for e in _errors(report))


# ---------------------------------------------------------------------------------------------------- extra math
def _move_one(op: str):
    """An edit: the first ``op`` node of the scope renamed into another scope (the graph computes the same)."""

    def edit(proto: onnx.ModelProto) -> None:
        node = next(n for n in proto.graph.node if n.name.startswith(SCOPE + "/") and n.op_type == op)
        node.name = node.name.replace(SCOPE, "blocks.0.attn.elsewhere")

    return edit


def test_a_graph_holding_exactly_the_declared_projection_ops_is_written(model, tmp_path):
    report = export_model(model=model, out=tmp_path / "b2.onnx", batch_sizes=(1,)).report
    assert report["passed"] and report["extra_math"]["ok"]
    assert report["extra_math"]["blocks"][SCOPE]["ops"] == dict(PROJECTION_OPS)  # at the boundary: not one to spare


@pytest.mark.parametrize("op", sorted(PROJECTION_OPS))
def test_a_graph_one_projection_op_short_is_refused(model, tmp_path, op):
    model.edits.append(_move_one(op))
    out = tmp_path / "b2.onnx"
    need = PROJECTION_OPS[op]
    line = f"{SCOPE}: {need - 1} {op} node(s), need {need}"
    with pytest.raises(VerificationError, match=rf"^b2.onnx failed verification \({re.escape(line)}\); see "):
        export_model(model=model, out=out, batch_sizes=(1,))
    report = _failed(out)
    assert report["failures"] == [line] and report["parity"]["passed"]  # the count alone refused it


def test_a_graph_whose_projection_scope_lost_its_name_is_refused(model, tmp_path):
    def rename(proto):
        for node in proto.graph.node:
            node.name = node.name.replace(SCOPE, "blocks.0.attn.anonymous")

    model.edits.append(rename)
    out = tmp_path / "b2.onnx"
    with pytest.raises(VerificationError, match=rf"\({SCOPE}: no nodes named {SCOPE}/\.\.\. \(variant 'belief2'"):
        export_model(model=model, out=out, batch_sizes=(1,))
    assert _failed(out)["extra_math"]["blocks"][SCOPE] == {"ops": {}, "nodes": []}


def _scaled_eps(factor: float):
    """An edit: the constant the projection's ``Add`` adds (its eps) multiplied by ``factor``."""

    def edit(proto: onnx.ModelProto) -> None:
        add = next(n for n in proto.graph.node if n.name.startswith(SCOPE + "/") and n.op_type == "Add")
        tensors = {t.name: t for t in proto.graph.initializer}
        tensors.update({n.output[0]: n.attribute[0].t for n in proto.graph.node if n.op_type == "Constant"})
        value = next(tensors[i] for i in add.input if i in tensors)
        value.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(value) * np.float32(factor), value.name))

    return edit


@pytest.mark.parametrize("factor,passes", [(1 + 0.5e-3, True), (1 - 0.5e-3, True), (1 + 2e-3, False)])
def test_the_projections_eps_is_checked_to_one_part_in_a_thousand(model, tmp_path, factor, passes):
    """The graph's eps against the metadata's ``eps`` (1e-6): 0.05 % off is the same eps rounded, 0.2 % is another
    model; the numbers barely move either way, so parity passes and the check alone decides."""
    model.edits.append(_scaled_eps(factor))
    out = tmp_path / "b2.onnx"
    if passes:
        assert export_model(model=model, out=out, batch_sizes=(1,)).report["passed"]
        return
    with pytest.raises(VerificationError, match=r"/Add adds 1\.002e-06, metadata eps 1e-06"):
        export_model(model=model, out=out, batch_sizes=(1,))
    assert _failed(out)["parity"]["passed"]


# ---------------------------------------------------------------------------------------------------------- int8
def _outputs_at_cosine(monkeypatch, cosine: float) -> None:
    """The quantized graph's outputs, where the fidelity gate reads them, replaced by outputs whose cosine to the
    fp32 graph's is ``cosine`` on every held-out input (the fp32 graph's are read as they are)."""
    real = fidelity.onnx_outputs
    references: dict[int, np.ndarray] = {}

    def outputs(model, x, threads):
        if isinstance(model, (str, Path)):  # the fp32 graph: the reference, read first
            references[id(x)] = real(model, x, threads)
            return references[id(x)]
        ref = references[id(x)].reshape(len(x), -1).astype(np.float64)
        other = np.random.default_rng(0).standard_normal(ref.shape)
        other -= (other * ref).sum(1, keepdims=True) / (ref * ref).sum(1, keepdims=True) * ref  # orthogonal to ref
        other *= np.linalg.norm(ref, axis=1, keepdims=True) / np.linalg.norm(other, axis=1, keepdims=True)
        return (cosine * ref + np.sqrt(1 - cosine**2) * other).reshape(references[id(x)].shape).astype(np.float32)

    monkeypatch.setattr(fidelity, "onnx_outputs", outputs)


def test_the_int8_fidelity_gate_writes_half_its_error_and_its_own_figure(model, monkeypatch, tmp_path):
    """``1 - cosine`` at half the default gate's (0.995 against 0.99) is written; the figure measured then, given as
    the gate itself, is written too (the gate is ``>=``)."""
    gate = qz.DEFAULT_MIN_COSINE
    _outputs_at_cosine(monkeypatch, 1 - 0.5 * (1 - gate))
    _scores(monkeypatch, 0.0)  # scored as fp32 is: the accuracy gate is not this test's
    report = export_model(model=model, out=tmp_path / "a.onnx", min_cosine=gate, **INT8).report
    worst = report["fidelity"]["cosine"]["min"]
    assert report["passed"] and report["fidelity"]["within_gate"] and worst == pytest.approx(0.995, abs=1e-6)
    at_gate = export_model(model=model, out=tmp_path / "b.onnx", min_cosine=worst, **INT8).report
    assert at_gate["passed"] and at_gate["fidelity"]["cosine"]["min"] == at_gate["fidelity"]["min_cosine"] == worst


def test_the_int8_fidelity_gate_refuses_twice_its_error(model, monkeypatch, tmp_path):
    gate = qz.DEFAULT_MIN_COSINE
    _outputs_at_cosine(monkeypatch, 1 - 2 * (1 - gate))
    out = tmp_path / "b2_int8.onnx"
    with pytest.raises(qz.FidelityError, match=r"worst output cosine to fp32 0\.9800 \(mean 0\.9800\) on 16 held-out"):
        export_model(model=model, out=out, min_cosine=gate, **INT8)
    report = _failed(out, "quantization")
    assert report["fidelity"]["within_gate"] is False and report["accuracy"]["measured"] is False
    assert (
        report["failures"][0].startswith("worst output cosine to fp32 0.9800")
        and "below --min-cosine 0.99" in (report["failures"][0])
    )


def _scores(monkeypatch, factor: float) -> None:
    """The int8 graph's test-split score set ``factor`` x the tolerance below fp32's (measured as it is)."""
    real = verified.evaluate_onnx

    def scored(models, config, **kwargs):
        ev = real(models, config, **kwargs)
        ev["metrics"]["int8"] = ev["metrics"]["fp32"] - factor * qz.ACCURACY_TOLERANCE[config["task"]]
        return ev

    monkeypatch.setattr(verified, "evaluate_onnx", scored)


@pytest.mark.parametrize("factor", [0.5, 1.0])
def test_an_int8_drop_within_the_accuracy_tolerance_is_written(model, monkeypatch, tmp_path, factor):
    _scores(monkeypatch, factor)
    report = export_model(model=model, out=tmp_path / "b2_int8.onnx", **INT8).report
    acc = report["accuracy"]
    assert report["passed"] and acc["drop"] == factor * acc["tolerance"] and acc["within_tolerance"]
    assert acc["tolerance"] == qz.ACCURACY_TOLERANCE["cls"] and not acc["accepted_drop"] and acc["n_images"] == 32


def test_an_int8_drop_twice_the_accuracy_tolerance_is_refused_unless_accepted(model, monkeypatch, tmp_path):
    _scores(monkeypatch, 2.0)
    out = tmp_path / "b2_int8.onnx"
    with pytest.raises(qz.AccuracyDropError, match=r"is 1\.00 points below fp32's .* \(tolerance 0\.5\); pass --acc"):
        export_model(model=model, out=out, **INT8)
    acc = _failed(out, "quantization")["accuracy"]
    assert acc["drop"] == 1.0 and acc["within_tolerance"] is False
    report = export_model(model=model, out=out, accept_accuracy_drop=True, **INT8).report
    assert report["passed"] and report["accuracy"]["accepted_drop"] and not failed_report_path(out).exists()


# ------------------------------------------------------------------------------------------- the int8 graph's own
def _quantizer_answers(monkeypatch, change) -> None:
    """ModelOpt's answer (the fixture's graph and report) changed by ``change(proto, report)`` before the int8
    graph's checks read them: a quantizer that left the graph, or its report, other than asked."""
    answered = verified.quantize_onnx

    def changed(source, out, **kwargs):
        report = answered(source, out, **kwargs)
        proto = onnx.load(str(out))
        change(proto, report)
        onnx.save(proto, str(out))
        return report

    monkeypatch.setattr(verified, "quantize_onnx", changed)


def _int8_refused(model, tmp_path, line: str) -> dict:
    """The int8 export of ``model``, refused by its graph's checks with exactly ``line`` (the gates after them not
    run): nothing at ``--out``, the failed report returned."""
    out = tmp_path / "b2_int8.onnx"
    with pytest.raises(qz.QuantizationCheckError, match=rf"^b2_int8.onnx not written: {re.escape(line)}; see "):
        export_model(model=model, out=out, **INT8)
    report = _failed(out, "quantization")
    assert report["failures"] == [line] and report["fidelity"] is None
    return report


def test_the_unchanged_quantizer_answer_passes_the_int8_graphs_checks(model, monkeypatch, tmp_path):
    _quantizer_answers(monkeypatch, lambda proto, report: None)  # the twin of the three refusals below
    _scores(monkeypatch, 0.0)
    report = export_model(model=model, out=tmp_path / "b2_int8.onnx", **INT8).report
    scope_check = report["extra_math_scope_check"]
    assert report["passed"] and scope_check["checker"] is True and scope_check["quantized"] == []
    assert sum(report["quantization"]["qdq"]["quantized_ops"].values()) > 0


def test_an_int8_graph_with_no_quantized_op_is_refused(model, monkeypatch, tmp_path):
    def none_quantized(proto, report):
        report.qdq["quantized_ops"] = dict.fromkeys(report.qdq["quantized_ops"], 0)

    _quantizer_answers(monkeypatch, none_quantized)
    _int8_refused(model, tmp_path, "no MatMul/Gemm/Conv was quantized")


def test_an_int8_graph_whose_extra_math_reads_quantized_values_is_refused(model, monkeypatch, tmp_path):
    def into_the_projection(proto, report):
        report.qdq["extra_math_quantized"] = [f"{SCOPE}/Div"]

    _quantizer_answers(monkeypatch, into_the_projection)
    _int8_refused(model, tmp_path, f"1 extra-math op(s) read quantized values, e.g. {SCOPE}/Div")


def test_an_int8_graph_whose_projection_scope_lost_its_name_is_refused(model, monkeypatch, tmp_path):
    def unnamed(proto, report):
        for node in proto.graph.node:
            node.name = node.name.replace(SCOPE, "blocks.0.attn.anonymous")

    _quantizer_answers(monkeypatch, unnamed)
    line = f"extra math: {SCOPE}: no nodes named {SCOPE}/... (variant 'belief2' declares extra scope 'projection'"
    report = _int8_refused(model, tmp_path, line + "; its ops are missing, folded away or renamed)")
    assert report["extra_math_scope_check"]["checker"] == [
        line[len("extra math: ") :] + "; its ops are missing, folded away or renamed)"
    ]


def test_an_int8_export_whose_fp32_graph_fails_names_a_failed_report_that_stays(model, monkeypatch, tmp_path):
    """The fp32 graph an int8 export quantizes is verified in a temporary folder; its refusal's line names the failed
    report beside ``--out``, which is there after the command, not one in that folder."""
    shift_parity(monkeypatch, verify, 2.0, "fp32")
    out = tmp_path / "b2_int8.onnx"
    with pytest.raises(VerificationError) as info:
        export_model(model=model, out=out, **INT8)
    line = str(info.value)
    assert line.startswith("b2_int8.onnx failed verification (batch 1 real: max abs err ") and "\n" not in line
    assert f"; see {failed_report_path(out)}; b2_int8.onnx was not written" in line and "attnzoo-fp32-" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [failed_report_path(out).name]
    report = read_back(failed_report_path(out), "verification")
    assert report["passed"] is False and report["failures"][0].startswith("batch 1 real: max abs err ")


# ------------------------------------------------------------------------------------------------------ TensorRT
def _layers(monkeypatch, change) -> None:
    """The TensorRT network's layers, as the network check reads them, changed by ``change(layers)``."""
    from attnzoo.targets.tensorrt import builder

    real = builder.network_layers
    monkeypatch.setattr(builder, "network_layers", lambda network: change(list(real(network))))


def _stop_before_the_build(monkeypatch) -> None:
    """The engine build replaced by a refusal: reached only once the network check passed."""
    from attnzoo.targets.tensorrt import builder, library

    def build(*args, **kwargs):
        raise library.TensorRTError("stopped before the build")

    monkeypatch.setattr(builder, "build", build)  # where the engine step looks it up


def _trt_failed(model, tmp_path, match: str) -> dict:
    """``export-model --format tensorrt`` of the model, which must fail with ``match``: no engine and no engine
    report written, its failed report returned (the verified ONNX beside it stays: it passed)."""
    from attnzoo.targets.tensorrt.verified import engine_report_path, failed_engine_report_path

    engine = tmp_path / "b2.engine"
    with pytest.raises(ExportError, match=match) as info:
        export_model(model=model, out=engine, format="tensorrt", batch_sizes=(1, 2), compute_capability="SM89")
    assert "\n" not in str(info.value) and not engine.exists() and not engine_report_path(engine).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2.engine.failed.json", "b2.onnx", "b2.report.json"]
    text = failed_engine_report_path(engine).read_text()
    assert EngineReport.from_json(text).to_json() == text  # written through its schema
    return json.loads(text)


def test_a_network_whose_extra_math_layers_are_all_fp32_passes_its_check(model, monkeypatch, tmp_path):
    _stop_before_the_build(monkeypatch)
    report = _trt_failed(model, tmp_path, "stopped before the build")
    net = report["network_check"]
    assert net["ok"] and net["failures"] == [] and net["blocks"][SCOPE] == {"layers": 8, "fp32": 8}


def test_a_network_with_one_16_bit_extra_math_layer_is_refused(model, monkeypatch, tmp_path):
    def half(layers):
        layer = next(x for x in layers if x["name"] == f"{SCOPE}/Div")
        layer["outputs"] = ["HALF"]
        return layers

    _layers(monkeypatch, half)
    _stop_before_the_build(monkeypatch)  # a check that let it through fails here, without an engine build
    report = _trt_failed(model, tmp_path, rf"network: {SCOPE}: {SCOPE}/Div computes in HALF, not FLOAT \(fp32\)")
    assert report["network_check"]["blocks"][SCOPE] == {"layers": 8, "fp32": 7} and report["passed"] is False


def test_a_network_missing_one_extra_math_layer_is_refused(model, monkeypatch, tmp_path):
    _layers(monkeypatch, lambda layers: [x for x in layers if x["name"] != f"{SCOPE}/Sub"])
    _stop_before_the_build(monkeypatch)
    report = _trt_failed(model, tmp_path, rf"network: {SCOPE}: {SCOPE}/Sub \(Sub\) is not a layer of the TensorRT")
    assert report["network_check"]["blocks"][SCOPE] == {"layers": 7, "fp32": 7}
