"""The report files the package writes beside what it exports, as typed schemas: one dataclass per kind, written
and read through it, validated with pydantic (strict: a field of the wrong JSON type, a missing or an unknown one
is refused, naming it).

The kinds (what each field means is the class's docstring; ``python -m attnzoo.runtime.schemas KIND`` prints a
kind's JSON Schema, generated from the class):

- ``verification``: :class:`VerificationReport`, ``<model>.report.json`` of an fp32 / fp16 ONNX file.
- ``quantization``: :class:`QuantizationReport`, ``<model>.report.json`` of an int8 / fp8 ONNX file (what the
  quantizer did: :class:`QuantizeReport`), written by :func:`attnzoo.export.quantize.quantize_verified` and read by
  :func:`attnzoo.runtime.sessions.verification_problem`, the summary ``export-model`` prints, the benchmarks and the
  studies. The figures whose shape depends on the run (the fidelity, the accuracy, the ``auto`` placement's
  decision) stay JSON objects.
- each deployment target's own (:attr:`attnzoo.runtime.targets.Target.reports`): ``engine``, ``<engine>.json`` of a
  TensorRT engine (:mod:`attnzoo.targets.tensorrt.schema`); ``triton``, the Triton model folder's config check
  (the ``triton`` part of ``export-model``'s result and of ``report-variant``'s report,
  :mod:`attnzoo.targets.triton.schema`); ``openvino``, ``executorch`` and ``aoti``, ``<file>.json`` beside an
  OpenVINO IR ``.xml``, an ExecuTorch program ``.pte`` and an AOTInductor package ``.pt2``
  (:mod:`attnzoo.targets.openvino.schema`, :mod:`attnzoo.targets.executorch.schema`,
  :mod:`attnzoo.targets.aoti.schema`). A target's report kept under one of its formats' names is the report of a
  file in that format (:func:`exported_report_type`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from pydantic import ConfigDict, TypeAdapter, ValidationError

from .targets import target_reports, targets

__all__ = [
    "JsonReport",
    "ParityCheck",
    "ExtraMathCheck",
    "BlockDivergence",
    "VerificationReport",
    "FormatReport",
    "QuantizeReport",
    "QuantizationReport",
    "format_reports",
    "exported_report_type",
    "schema_checked",
    "report_kinds",
    "main",
]

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


def _plain(value: Any) -> Any:
    """A field's JSON value: a nested report as its object, containers element by element."""
    if isinstance(value, JsonReport):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class JsonReport:
    """What every report dataclass shares: the JSON text in field order, reading it back through the schema."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="forbid", strict=True)
    #: What the refusal lines call a report of this kind (``"report"``, ``"quantization"``).
    what: ClassVar[str] = "report"
    #: Fields left out of the JSON while they are ``None``: facts only some files (a format, a stage reached
    #: before a refusal) have, so that a report reads back as the very object it was written from. ``None`` (the
    #: default): every field whose default is ``None``, the facts a report may lack; ``()``: every field written.
    omit_none: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def omitted_while_none(cls) -> frozenset[str]:
        """The fields :meth:`to_dict` leaves out while they are ``None`` (:attr:`omit_none`)."""
        if cls.omit_none is not None:
            return frozenset(cls.omit_none)
        return frozenset(f.name for f in fields(cls) if f.default is None)  # type: ignore[arg-type]  # a dataclass

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (fields in order, nested reports as objects, :attr:`omit_none` fields left out while
        ``None``)."""
        omitted = self.omitted_while_none()
        return {
            f.name: _plain(value)
            for f in fields(self)  # type: ignore[arg-type]  # every subclass is a dataclass
            if not ((value := getattr(self, f.name)) is None and f.name in omitted)
        }

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
class ParityCheck(JsonReport):
    """A verified file's parity with eager fp32 PyTorch (its ``parity`` entry).

    Attributes:
        passed, failures: Every batch and input kind within the tolerance; why not, one line each.
        per_batch: Per batch size, the ``real`` and ``random`` inputs' errors against eager.
        max_abs_err: The largest absolute logit error over them.
        tolerance: ``{"<dtype>_x_max(1,max|logit|)": value}``: the tolerance, scaled by the logits' size.
        batch_sizes: The batch sizes run (some of them not the one traced).
        batch_dim, providers: An ONNX file's: its symbolic batch dimension and ONNX Runtime's providers.
        runtime: Another format's: what ran it (``OpenVINO 2026.0 CPU, f32``).
    """

    what: ClassVar[str] = "parity"

    passed: bool
    failures: list[str]
    per_batch: list[dict[str, Any]]
    max_abs_err: float
    tolerance: dict[str, float]
    batch_sizes: list[int]
    batch_dim: str | int | None = None
    providers: list[str] | None = None
    runtime: str | None = None


@dataclass
class ExtraMathCheck(JsonReport):
    """The variant's extra math found in the written graph, counted from the format's own graph (``extra_math``).

    Attributes:
        ok, failures: Every block holds its extra math as ops of full precision; why not, one line each.
        blocks: Per extra-math scope, the ops found in it (and their precision where the format has one).
        nodes_per_block: Extra-math nodes per block.
        depth: The blocks the model has.
        non_standard_ops: An ONNX file's ops outside the standard ONNX domain.
        half_ops: An OpenVINO IR's: ops of the scopes computing in f16 (an fp16 IR's compressed weights aside).
        delegated_nodes, portable_nodes: An ExecuTorch program's: extra-math nodes XNNPACK runs, and the rest.
    """

    what: ClassVar[str] = "extra math check"

    ok: bool
    failures: list[str]
    blocks: dict[str, dict[str, Any]]
    nodes_per_block: dict[str, int]
    depth: int
    non_standard_ops: list[str] | None = None
    half_ops: int | None = None
    delegated_nodes: int | None = None
    portable_nodes: int | None = None


@dataclass
class BlockDivergence(JsonReport):
    """The error at each attention block's output against its reference, and where a failed file first diverges
    (:mod:`attnzoo.export.divergence`; the ``divergence`` entry).

    Attributes:
        blocks: Per block: its errors (``max_abs_err``, ``rel_err``, ``rel_l2``, ``cosine``).
        first_diverging_block: The first block over the criterion (``None``: none is).
        worst_op: In that block, the op with the largest error of its own (``None``: no block is over).
        reference, inputs, criterion, measure, prefix: What it was compared with, on how many inputs, the
            criterion and the measure it reads, the blocks' scope prefix.
        worst_block: The block with the largest error.
        ops: The first diverging block's ops and their errors.
        not_exposed: Why a file's block outputs cannot be read (then no figures).
    """

    what: ClassVar[str] = "divergence"

    blocks: list[dict[str, Any]]
    first_diverging_block: int | None
    worst_op: dict[str, Any] | None
    reference: str | None = None
    inputs: int | None = None
    criterion: str | None = None
    measure: str | None = None
    prefix: str | None = None
    worst_block: int | None = None
    ops: list[dict[str, Any]] | None = None
    not_exposed: str | None = None


@dataclass
class VerificationReport(JsonReport):
    """``<model>.report.json`` of an fp32 / fp16 ONNX file (``<model>.failed.report.json`` of a refused one),
    written by :func:`attnzoo.export.export_verified` after its checks.

    Attributes:
        path: The file written (or refused).
        variant, task, arch, dtype, opset, input_size, batch_dim: The model and the graph's input.
        file_size, sha256: The file (what serving matches before it loads it).
        checkpoint_sha256: The weights it was exported from.
        num_nodes, op_histogram: The graph.
        extra_math, parity, divergence: :class:`ExtraMathCheck`, :class:`ParityCheck`, :class:`BlockDivergence`.
        onnxruntime, torch: The versions that exported and checked it.
        passed, failures: Every check passed (the file was written); why not, one line each.
        export_time_s, fingerprint: A fresh export's: its time, and the hash of all it depends on (reused while
            it matches).
        adopted_from: A file copied from an earlier export (the zoo's), verified again.
    """

    what: ClassVar[str] = "verification report"

    path: str
    variant: str
    task: str
    arch: str
    dtype: str
    opset: int | None
    input_size: list[int]
    batch_dim: str | int
    file_size: int
    sha256: str
    checkpoint_sha256: str
    num_nodes: int
    op_histogram: dict[str, int]
    extra_math: ExtraMathCheck
    parity: ParityCheck
    divergence: BlockDivergence
    onnxruntime: str
    torch: str
    passed: bool = False
    failures: list[str] = field(default_factory=list)
    export_time_s: float | None = None
    fingerprint: str | None = None
    adopted_from: str | None = None


@dataclass
class FormatReport(JsonReport):
    """What every file written from the model or the verified ONNX in another format reports, ``<file>.json``
    (``<file>.failed.json`` when refused; the facts of a stage not reached are left out).

    Attributes:
        path, format: The file written (or refused) and its format.
        variant, task, arch, dtype, input_size: The model.
        trace_batch: The batch it was traced or converted at (parity runs others).
        checkpoint_sha256: The weights it came from.
        extra_math, parity, divergence: As in :class:`VerificationReport`.
        file_size, sha256: The file (its parts' total size; the hash of the first).
        passed, failures: Every check passed (the file was written); why not, one line each.
    """

    path: str
    format: str
    variant: str
    task: str
    arch: str
    dtype: str
    input_size: list[int]
    trace_batch: int
    checkpoint_sha256: str


# ------------------------------------------------------------------- an int8 / fp8 export's record


@dataclass
class QuantizeReport(JsonReport):
    """What the quantizer did (the report's ``quantization`` entry; JSON-ready with :meth:`to_dict`).

    Attributes:
        quantizer: ``nvidia-modelopt (modelopt.onnx.quantization.quantize)``.
        quantizer_version: ModelOpt's version.
        mode: ``int8`` or ``fp8``.
        calibration: ``{"source", "count", "seed", "shape", "method", "providers"}``.
        excluded_nodes: Node names kept out of quantization (the extra math unless quantized on purpose).
        qdq: :func:`attnzoo.export.quantize.qdq_summary` of the written graph.
        time_s: Seconds the quantizer took.
        options: The other ModelOpt arguments that matter (``placement``; ``auto``: the measured decision).
        extra_math_inputs_unquantized: Excluded-op inputs re-pointed at the fp32 tensor ModelOpt had quantized
            for another reader (``node:input``).
    """

    quantizer: str
    quantizer_version: str
    mode: str
    calibration: dict[str, Any]
    excluded_nodes: list[str]
    qdq: dict[str, Any]
    time_s: float
    options: dict[str, Any] = field(default_factory=dict)
    extra_math_inputs_unquantized: list[str] = field(default_factory=list)

    what: ClassVar[str] = "quantization"


@dataclass
class QuantizationReport(JsonReport):
    """``<model>.report.json`` of an int8 / fp8 export (also ``<model>.failed.report.json`` of a refused one).

    Attributes:
        path: The quantized model written (or refused).
        variant, task, arch: The model.
        dtype: ``int8`` or ``fp8``.
        fp32_source: ``{"path" (None when not kept), "kept", "sha256", "report"}``: the verified fp32 graph
            quantized and its verification report.
        quantization: :class:`QuantizeReport`.
        quantize_extra_math: The extra math was quantized on purpose (``--quantize-extra-math``).
        extra_math_scope_check: ``{"nodes", "quantized", "checker"}``.
        fidelity: The output's agreement with fp32 on held-out inputs and the gate (``None`` when an earlier
            check failed).
        accuracy: Test-split scores next to fp32 (``{"measured": False, ...}`` when not scored).
        warnings: What the user should know.
        file_size, sha256, num_nodes, op_histogram, batch_dim: The written graph.
        onnxruntime: The ONNX Runtime version that checked it.
        verified: What was checked, in words.
        passed: Every check passed (the model was written).
        failures: Why not, one line each.
        divergence: The error at each block's output against the fp32 graph's, the first block below the
            fidelity gate and its worst op (:mod:`attnzoo.export.divergence`); ``None`` (left out of the JSON) in
            reports written before it was measured, or when an earlier check failed.
    """

    path: str
    variant: str
    task: str
    arch: str
    dtype: str
    fp32_source: dict[str, Any]
    quantization: QuantizeReport
    quantize_extra_math: bool
    extra_math_scope_check: dict[str, Any]
    fidelity: dict[str, Any] | None
    accuracy: dict[str, Any]
    warnings: list[str]
    file_size: int
    sha256: str
    num_nodes: int
    op_histogram: dict[str, int]
    batch_dim: str
    onnxruntime: str
    verified: str
    passed: bool = False
    failures: list[str] = field(default_factory=list)
    divergence: dict[str, Any] | None = None

    what: ClassVar[str] = "quantization report"


def format_reports() -> dict[str, type[FormatReport]]:
    """``format`` -> the report type of a file written in it: each target's :class:`FormatReport` kept under the
    name of one of its formats."""
    return {
        kind: schema
        for target in targets()
        for kind, schema in target.reports.items()
        if kind in target.formats and issubclass(schema, FormatReport)
    }


def exported_report_type(data: Mapping[str, Any]) -> type[JsonReport]:
    """The schema of an exported file's report object: a format's (its ``format``, :func:`format_reports`), a
    quantized ONNX file's (``dtype`` int8 / fp8) or an ONNX file's verification report."""
    known = format_reports()
    if data.get("format") in known:
        return known[data["format"]]
    if data.get("dtype") in ("int8", "fp8"):
        return QuantizationReport
    return VerificationReport


def schema_checked(data: Mapping[str, Any]) -> dict[str, Any]:
    """An exported file's report object as its schema (:func:`exported_report_type`) writes it: read through the
    type (``ValueError`` naming a missing, unknown or mistyped field) and back, in field order."""
    plain = json.loads(json.dumps(dict(data), default=str))
    return exported_report_type(plain).from_dict(plain).to_dict()


def report_kinds() -> dict[str, type[JsonReport]]:
    """Every report kind by name (module docstring)."""
    return {
        "verification": VerificationReport,
        "quantization": QuantizationReport,
        **target_reports(),
    }


def main(argv: Sequence[str] | None = None, prog: str = "python -m attnzoo.runtime.schemas") -> int:
    """``python -m attnzoo.runtime.schemas KIND``: print the kind's JSON Schema."""
    kinds = report_kinds()
    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    parser.add_argument("kind", choices=sorted(kinds), help="the report kind")
    args = parser.parse_args(argv)
    sys.stdout.write(json.dumps(kinds[args.kind].json_schema(), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
