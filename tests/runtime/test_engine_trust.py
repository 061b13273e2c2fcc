"""A TensorRT engine given to the ``tensorrt`` backend by path is trusted by content: loaded only when its report
``<engine>.json`` says it passed export-model's checks and records the SHA-256 of these very bytes; anything else is
refused in one line before TensorRT sees a byte of it. No GPU or TensorRT is needed: the check comes before the
engine is deserialized, which is replaced here by a recorder."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

import pytest

from attnzoo.runtime.backends import get_backend
from attnzoo.targets.tensorrt.schema import EngineReport, engine_report_path

BYTES = b"an engine's bytes: any file will do, the check reads them before TensorRT"


def _report(engine: Path, data: bytes = BYTES, **fields) -> None:
    """The report export-model writes beside ``engine`` (its SHA-256 and size those of ``data``), with ``fields``."""
    report = EngineReport(
        engine=str(engine),
        onnx=str(engine.with_suffix(".onnx")),
        variant="belief2",
        task="cls",
        arch="micro",
        dtype="fp32",
        input_size=[32, 32],
        status="built, not run",
        onnx_verification={"verified": True},
        library="tensorrt_rtx",
        library_version="1.7",
        engine_size=len(data),
        engine_sha256=hashlib.sha256(data).hexdigest(),
        passed=True,
    )
    for key, value in fields.items():
        setattr(report, key, value)
    engine_report_path(engine).write_text(report.to_json())


@pytest.fixture
def deserialized(monkeypatch):
    """What the backend hands the engine loader (``Engine``): recorded, never deserialized."""
    backend = importlib.import_module(type(get_backend("tensorrt")).__module__)
    seen: list = []

    def engine(data, *args, **kwargs):
        seen.append(data)
        raise RuntimeError("deserialized")

    monkeypatch.setattr(backend, "Engine", engine)
    return seen


def _refused(engine: Path, deserialized: list) -> str:
    with pytest.raises(ValueError) as info:
        get_backend("tensorrt").load(engine)
    line = str(info.value)
    assert line.startswith(f"tensorrt: {engine} is not loaded: ") and "\n" not in line
    assert deserialized == []  # refused before TensorRT saw the file
    return line[len(f"tensorrt: {engine} is not loaded: ") :]


def test_an_engine_whose_bytes_match_its_report_is_handed_to_tensorrt_as_read(tmp_path, deserialized):
    engine = tmp_path / "m.engine"
    engine.write_bytes(BYTES)
    _report(engine)
    with pytest.raises(RuntimeError, match="^deserialized$"):
        get_backend("tensorrt").load(engine)
    assert deserialized == [BYTES]  # the bytes checked, read once: not the path, read again


@pytest.mark.parametrize("planted", [BYTES[:-1] + b"!", BYTES + b" and a payload"], ids=["same-size", "other-size"])
def test_an_engine_whose_bytes_differ_from_its_report_is_refused(tmp_path, deserialized, planted):
    engine = tmp_path / "m.engine"
    engine.write_bytes(planted)
    _report(engine)
    assert _refused(engine, deserialized) == "m.engine differs from the engine its report m.engine.json verified " + (
        "(SHA-256 mismatch)"
    )


def test_an_engine_without_a_report_is_refused(tmp_path, deserialized):
    engine = tmp_path / "m.engine"
    engine.write_bytes(BYTES)
    expected = "no engine report m.engine.json beside it (build it with export-model --format tensorrt)"
    assert _refused(engine, deserialized) == expected


def test_a_report_written_before_engines_were_hashed_is_not_trusted(tmp_path, deserialized):
    engine = tmp_path / "m.engine"
    engine.write_bytes(BYTES)
    _report(engine, engine_sha256=None)
    assert _refused(engine, deserialized) == (
        "m.engine.json records no SHA-256 of the engine (written before engines were hashed), so it is not trusted; "
        "build it with export-model --format tensorrt again"
    )


def test_a_failed_or_unreadable_report_is_refused(tmp_path, deserialized):
    engine = tmp_path / "m.engine"
    engine.write_bytes(BYTES)
    _report(engine, passed=False, failures=["network: x"])
    assert _refused(engine, deserialized) == "m.engine.json does not say the engine passed its checks"
    engine_report_path(engine).write_text("{not json")
    assert _refused(engine, deserialized).startswith("m.engine.json is not an engine report export-model writes (")


def test_a_missing_engine_file_is_refused(tmp_path, deserialized):
    assert _refused(tmp_path / "absent.engine", deserialized) == "no such engine file"
