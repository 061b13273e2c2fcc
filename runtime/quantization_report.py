"""The report of an int8 / fp8 export, ``<model>.report.json``: one typed schema for its writer
(:func:`attnzoo.export.quantize.quantize_verified`) and its readers
(:func:`attnzoo.runtime.sessions.verification_problem`, the summary ``export-model`` prints, the benchmarks and the
studies).

The JSON is the dataclasses' fields in their order (:meth:`QuantizationReport.to_json`); the figures whose shape
depends on the run (the fidelity, the accuracy, the ``auto`` placement's decision) stay JSON objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

__all__ = ["QuantizeReport", "QuantizationReport"]


@dataclass
class QuantizeReport:
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantizeReport:
        """Read the ``quantization`` entry; ``ValueError`` naming what is missing, unknown or mistyped."""
        return cls(**_checked(cls, data, "quantization"))


@dataclass
class QuantizationReport:
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

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (fields in order, :class:`QuantizeReport` as an object); ``divergence`` is left out
        while it is ``None``, so a report written before it was measured reads back byte for byte."""
        data = asdict(self)
        if data.get("divergence") is None:
            data.pop("divergence", None)
        return data

    def to_json(self) -> str:
        """The report file's text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QuantizationReport:
        """Read a report object; ``ValueError`` naming what is missing, unknown or mistyped."""
        values = _checked(cls, data, "report")
        values["quantization"] = QuantizeReport.from_dict(values["quantization"])
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> QuantizationReport:
        """Read a report file's text (:meth:`from_dict`); ``ValueError`` for text that is not a JSON object."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a quantization report (not a JSON object)")
        return cls.from_dict(data)


#: JSON types a field's annotation accepts (``None`` too where it is ``Optional``).
_JSON_TYPES = {"str": (str,), "bool": (bool,), "int": (int,), "float": (int, float), "QuantizeReport": (dict,)}


def _checked(cls: type, data: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``data``'s values for ``cls``'s fields, each present (unless it has a default) and of its JSON type."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{what}: not a JSON object")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{what}: unknown field(s) {', '.join(unknown)}")
    missing = [n for n, f in known.items() if n not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ValueError(f"{what}: missing field(s) {', '.join(missing)}")
    for name, value in data.items():
        kind = str(known[name].type)
        base = kind.removeprefix("Optional[").removesuffix("]")
        if value is None and kind.startswith("Optional["):
            continue
        want = _JSON_TYPES.get(base) or (
            (dict,) if base.startswith("Dict") else (list,) if base.startswith("List") else (object,)
        )
        if not isinstance(value, want) or (isinstance(value, bool) and bool not in want):
            raise ValueError(f"{what}: {name} is {type(value).__name__}, expected {base}")
    return dict(data)
