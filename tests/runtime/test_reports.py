"""The report kinds' schemas (:mod:`attnzoo.runtime.reports`): each reads back what it writes, refuses what it does
not describe with one line naming the field, and prints its JSON Schema. Reports written by real exports are read
back in the tests of their writers (tests/export: test_tensorrt, test_triton, test_quantize)."""

from __future__ import annotations

import json

import pytest

from attnzoo.runtime.reports import EngineReport, TritonConfigCheck, TritonIO, main, report_kinds


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


@pytest.mark.parametrize("make", [_engine, _triton])
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


def test_every_kind_prints_its_json_schema(capsys):
    assert set(report_kinds()) == {"quantization", "engine", "triton"}
    for kind, cls in report_kinds().items():
        assert main([kind]) == 0
        schema = json.loads(capsys.readouterr().out)
        assert schema["additionalProperties"] is False and schema["title"] == cls.__name__
        assert set(schema["required"]) <= set(schema["properties"])
    assert "passed" in json.loads(json.dumps(EngineReport.json_schema()))["properties"]
    with pytest.raises(SystemExit):
        main(["nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err
