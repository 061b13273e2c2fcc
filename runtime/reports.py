"""The report files the package writes beside what it exports, as typed schemas: one dataclass per kind, written
and read through it, validated with pydantic (strict: a field of the wrong JSON type, a missing or an unknown one
is refused, naming it).

The kinds (what each field means is the class's docstring; ``python -m attnzoo.runtime.reports KIND`` prints a
kind's JSON Schema, generated from the class):

- ``quantization``: :class:`attnzoo.runtime.quantization_report.QuantizationReport`, ``<model>.report.json`` of an
  int8 / fp8 ONNX file.
- ``engine``: :class:`EngineReport`, ``<engine>.json`` of a TensorRT engine.
- ``triton``: :class:`TritonConfigCheck`, the Triton model folder's config check (the ``triton`` part of
  ``export-model``'s result and of ``report-variant``'s report).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError

__all__ = ["JsonReport", "EngineReport", "TritonConfigCheck", "TritonIO", "report_kinds", "main"]

R = TypeVar("R", bound="JsonReport")

#: pydantic's error type -> the JSON type a field wanted, for the one-line refusal.
_EXPECTED = {
    "string_type": "str",
    "bool_type": "bool",
    "int_type": "int",
    "float_type": "float",
    "dict_type": "dict",
    "list_type": "list",
    "dataclass_type": "object",
    "model_type": "object",
}


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(cls: type) -> TypeAdapter[Any]:
    """pydantic's validator of ``cls`` (built once: building one costs milliseconds)."""
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = TypeAdapter(cls)
    return _ADAPTERS[cls]


def _problem(error: ValidationError, what: str) -> str:
    """The first thing wrong, in one line: ``what: [parent: ]missing field(s) a, b`` / ``unknown field(s) x`` /
    ``name is str, expected bool``."""
    errors = error.errors()
    first = errors[0]
    *parent, name = [str(p) for p in first["loc"]] or ["?"]
    where = f"{what}: " + "".join(f"{p}: " for p in parent)
    same = [str(e["loc"][-1]) for e in errors if e["type"] == first["type"] and list(e["loc"][:-1]) == parent]
    if first["type"] == "missing":
        return f"{where}missing field(s) {', '.join(same)}"
    if first["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return f"{where}unknown field(s) {', '.join(same)}"
    expected = _EXPECTED.get(first["type"])
    if expected:
        return f"{where}{name} is {type(first['input']).__name__}, expected {expected}"
    return f"{where}{name}: {first['msg']}"


class JsonReport:
    """What every report dataclass shares: the JSON text in field order, reading it back through the schema."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid", strict=True)
    #: What the refusal lines call a report of this kind (``"report"``, ``"quantization"``).
    what: ClassVar[str] = "report"

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (fields in order, nested reports as objects)."""
        return asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass

    def to_json(self) -> str:
        """The report file's text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any]) -> R:
        """Read a report object; ``ValueError`` naming what is missing, unknown or mistyped."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{cls.what}: not a JSON object")
        return cls.from_json(json.dumps(dict(data)))

    @classmethod
    def from_json(cls: type[R], text: str | bytes) -> R:
        """Read a report file's text; ``ValueError`` for text that is not a JSON object of this schema."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{cls.what}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{cls.what}: not a JSON object")
        try:
            return _adapter(cls).validate_json(text)  # JSON mode: objects become the nested dataclasses, strictly
        except ValidationError as exc:
            raise ValueError(_problem(exc, cls.what)) from None

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON Schema of this kind, generated from the dataclass."""
        return _adapter(cls).json_schema()


@dataclass
class EngineReport(JsonReport):
    """``<engine>.json``: a TensorRT engine's build, check and (where a GPU ran it) parity and latency; also
    ``<engine>.failed.json`` of a build that was refused (then the build facts are ``None`` when it failed before
    them).

    Attributes:
        engine, onnx: The engine written (or refused) and the verified ONNX it was built from.
        variant, task, arch, dtype, input_size: The model (from the ONNX file's contract).
        status: ``built, not run`` or ``built and run`` (``not built`` when refused before the build).
        onnx_verification: The ONNX file's verification report, and whether it is still the file it verified.
        library, library_version: The TensorRT library that built it (TensorRT-RTX or TensorRT).
        ran_on_gpu, gpu: Whether it was run, and on which GPU.
        parity: Against ONNX Runtime on the CPU, per batch (``None`` when not run).
        latency: Its median and spread at the profile's ``opt`` batch (``None`` when not run).
        network_check: The extra math found in the parsed network, every op of it a fp32 layer (and in an int8 /
            fp8 network, what reads a DequantizeLinear).
        compute_capability, build_time_s, engine_size, profile, workspace_gb, tf32, require_user_allocation,
            timing_cache: The build's facts.
        not_run_reason: Why it was built but not run.
        metadata: The ONNX file's metadata (the model contract).
        passed, failures: Every check passed (the engine was written); why not, one line each.
    """

    what: ClassVar[str] = "engine report"

    engine: str
    onnx: str
    variant: str
    task: str
    arch: str
    dtype: str
    input_size: list[int]
    status: str
    onnx_verification: dict[str, Any]
    library: str
    library_version: str
    ran_on_gpu: bool = False
    gpu: str | None = None
    parity: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    network_check: dict[str, Any] | None = None
    compute_capability: str | None = None
    build_time_s: float | None = None
    engine_size: int | None = None
    profile: dict[str, int] | None = None
    workspace_gb: float | None = None
    tf32: bool | None = None
    require_user_allocation: bool | None = None
    timing_cache: str | None = None
    not_run_reason: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    passed: bool = False
    failures: list[str] = field(default_factory=list)


@dataclass
class TritonIO(JsonReport):
    """A Triton config's input or output: its name and its dims (``-1`` for a dynamic one; no batch dim)."""

    name: str
    dims: list[int]


@dataclass
class TritonConfigCheck(JsonReport):
    """The check of a Triton model folder's ``config.pbtxt`` (parsed with Triton's own schema) against the graph.

    Attributes:
        passed, failures: It parsed and matches the model (a folder is written only then).
        schema: The protobuf message it was parsed with.
        platform: ``onnxruntime_onnx`` or ``tensorrt_plan``.
        max_batch_size: The batch dynamic batching may form.
        input, output: The model's tensors as the config names them.
        dynamic_batching_max_queue_delay_us: How long Triton waits to fill a batch.
        labels: Lines of ``labels.txt`` (the model's class names).
    """

    what: ClassVar[str] = "triton config check"

    passed: bool
    failures: list[str]
    schema: str
    platform: str
    max_batch_size: int
    input: TritonIO
    output: TritonIO
    dynamic_batching_max_queue_delay_us: int
    labels: int


def report_kinds() -> dict[str, type[JsonReport]]:
    """Every report kind by name (module docstring)."""
    from .quantization_report import QuantizationReport

    return {"quantization": QuantizationReport, "engine": EngineReport, "triton": TritonConfigCheck}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnzoo.runtime.reports KIND``: print the kind's JSON Schema."""
    kinds = report_kinds()
    parser = argparse.ArgumentParser(prog="python -m attnzoo.runtime.reports", description=main.__doc__)
    parser.add_argument("kind", choices=sorted(kinds), help="the report kind")
    args = parser.parse_args(argv)
    sys.stdout.write(json.dumps(kinds[args.kind].json_schema(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
