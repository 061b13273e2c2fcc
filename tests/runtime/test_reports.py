"""The report kinds' schemas (:mod:`attnzoo.runtime.schemas`): each reads back what it writes, refuses what it does
not describe with one line naming the field, and prints its JSON Schema. Reports written by real exports are read
back in the tests of their writers (tests/export: test_export, test_openvino_format, test_executorch, test_aoti,
test_tensorrt, test_triton, test_quantize)."""

from __future__ import annotations

import json

import pytest

from attnzoo.fileio import sha256_file
from attnzoo.runtime.schemas import (
    BlockDivergence,
    ExtraMathCheck,
    ParityCheck,
    VerificationReport,
    main,
    report_kinds,
)
from attnzoo.runtime.sessions import verification_problem
from attnzoo.runtime.targets import target_reports
from attnzoo.targets.tensorrt.schema import EngineReport
from attnzoo.targets.triton.schema import TritonConfigCheck, TritonIO


def _engine() -> EngineReport:
    return EngineReport(
        engine="m.engine",
        onnx="m.onnx",
        variant="belief2",
        task="cls",
        arch="micro",
        dtype="fp32",
        input_size=[28, 28],
        status="built, not run",
        onnx_verification={"verified": True, "error": None},
        library="tensorrt_rtx",
        library_version="1.7",
        network_check={"ok": True, "failures": []},
        compute_capability="SM89",
        build_time_s=1.5,
        engine_size=1234,
        profile={"min": 1, "opt": 4, "max": 8},
        not_run_reason="no GPU on this machine",
        metadata={"variant": "belief2"},
        passed=True,
    )


def _triton() -> TritonConfigCheck:
    return TritonConfigCheck(
        passed=True,
        failures=[],
        schema="tritonclient.grpc.model_config_pb2.ModelConfig",
        platform="onnxruntime_onnx",
        max_batch_size=16,
        input=TritonIO(name="image", dims=[3, 28, 28]),
        output=TritonIO(name="logits", dims=[10]),
        dynamic_batching_max_queue_delay_us=100,
        labels=10,
    )


def _verification() -> VerificationReport:
    return VerificationReport(
        path="m.onnx",
        variant="belief2",
        task="cls",
        arch="micro",
        dtype="fp32",
        opset=20,
        input_size=[28, 28],
        batch_dim="batch",
        file_size=1234,
        sha256="0" * 64,
        checkpoint_sha256="1" * 64,
        num_nodes=3,
        op_histogram={"MatMul": 2, "Softmax": 1},
        extra_math=ExtraMathCheck(
            ok=True, failures=[], blocks={"blocks.0.attn.projection": {"ops": {"Mul": 3}}}, nodes_per_block={}, depth=1
        ),
        parity=ParityCheck(
            passed=True,
            failures=[],
            per_batch=[{"batch": 1}],
            max_abs_err=1e-6,
            tolerance={"fp32_x_max(1,max|logit|)": 1e-4},
            batch_sizes=[1, 3],
            batch_dim="batch",
            providers=["CPUExecutionProvider"],
        ),
        divergence=BlockDivergence(blocks=[], first_diverging_block=None, worst_op=None, not_exposed="why"),
        onnxruntime="1.23",
        torch="2.9",
        passed=True,
    )


@pytest.mark.parametrize("make", [_engine, _triton, _verification])
def test_a_report_reads_back_what_it_wrote(make):
    report = make()
    text = report.to_json()
    back = type(report).from_json(text)
    assert back == report and back.to_json() == text
    assert type(report).from_dict(json.loads(text)) == report


@pytest.mark.parametrize(
    "make, edit, message",
    [
        (_engine, lambda r: r.pop("engine"), "engine report: missing field(s) engine"),
        (_engine, lambda r: r.update(speed=1), "engine report: unknown field(s) speed"),
        (_engine, lambda r: r.update(passed="yes"), "engine report: passed is str, expected bool"),
        (_engine, lambda r: r.update(engine_size=True), "engine report: engine_size is bool, expected int"),
        (_engine, lambda r: r.update(input_size=["28", 28]), "engine report: input_size: 0 is str, expected int"),
        (_engine, lambda r: r.update(parity=[1]), "engine report: parity is list, expected dict"),
        (_triton, lambda r: r["input"].pop("dims"), "triton config check: input: missing field(s) dims"),
        (_triton, lambda r: r.update(labels=1.5), "triton config check: labels is float, expected int"),
        (
            _verification,
            lambda r: r["parity"].pop("max_abs_err"),
            "verification report: parity: missing field(s) max_abs_err",
        ),
        (
            _verification,
            lambda r: r["extra_math"].update(f16=1),
            "verification report: extra_math: unknown field(s) f16",
        ),
        (_verification, lambda r: r.update(opset="20"), "verification report: opset is str, expected int"),
    ],
)
def test_a_report_it_does_not_describe_is_refused_naming_the_field(make, edit, message):
    data = make().to_dict()
    edit(data)
    with pytest.raises(ValueError) as info:
        type(make()).from_dict(data)
    assert str(info.value) == message


@pytest.mark.parametrize("text", ["[]", "not json", "3"])
def test_text_that_is_not_a_json_object_is_one_line(text):
    with pytest.raises(ValueError, match="^engine report: not (a JSON object|JSON)") as info:
        EngineReport.from_json(text)
    assert "\n" not in str(info.value)


def test_facts_some_files_lack_are_left_out_while_none_and_read_back_whole():
    """A fact only some files have (a fresh export's time, a format's runtime) is left out while None, so the
    object read back from the file is the one written, field for field."""
    data = _verification().to_dict()
    assert "export_time_s" not in data and "runtime" not in data["parity"] and data["divergence"]["worst_op"] is None
    assert "reference" not in data["divergence"] and VerificationReport.from_dict(data).to_dict() == data


def test_serving_refuses_a_report_its_schema_does_not_describe(tmp_path):
    """A report that says it passed and matches the file, but lacks its parity (or has a field of another
    schema), is not a verification report: the file is not served."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"graph")
    good = {**_verification().to_dict(), "sha256": sha256_file(model)}
    (tmp_path / "m.report.json").write_text(json.dumps(good))
    assert verification_problem(model, "fp32") is None
    for edit, why in [
        (lambda r: r.pop("parity"), "missing field(s) parity"),
        (lambda r: r.update(trusted=True), "unknown field(s) trusted"),
    ]:
        bad = json.loads(json.dumps(good))
        edit(bad)
        (tmp_path / "m.report.json").write_text(json.dumps(bad))
        assert verification_problem(model, "fp32") == (
            f"m.report.json is not a report export-model writes (verification report: {why})"
        )


def test_every_kind_prints_its_json_schema(capsys):
    assert set(report_kinds()) == {"verification", "quantization", *target_reports()}  # the runtime's, every target's
    for kind, cls in report_kinds().items():
        assert main([kind]) == 0
        schema = json.loads(capsys.readouterr().out)
        assert schema["additionalProperties"] is False and schema["title"] == cls.__name__
        assert set(schema["required"]) <= set(schema["properties"])
    assert "passed" in json.loads(json.dumps(EngineReport.json_schema()))["properties"]
    with pytest.raises(SystemExit):
        main(["nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_a_formats_report_is_read_through_its_targets_schema():
    """A file's report names its format: a target's format report (OpenVINO's, in its folder) is found by that name
    before the precision is looked at, and a target's report of another kind (an engine's, a Triton config check) is
    no format's."""
    from attnzoo.runtime.schemas import exported_report_type, format_reports
    from attnzoo.targets.openvino.schema import OpenVINOReport

    assert format_reports()["openvino"] is OpenVINOReport
    assert exported_report_type({"format": "openvino", "dtype": "int8"}) is OpenVINOReport
    assert not {"engine", "triton"} & set(format_reports())
