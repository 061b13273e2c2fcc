"""The report of an int8 / fp8 export, ``<model>.report.json``: one typed schema for its writer
(:func:`attnzoo.export.quantize.quantize_verified`) and its readers
(:func:`attnzoo.runtime.sessions.verification_problem`, the summary ``export-model`` prints, the benchmarks and the
studies).

The JSON is the dataclasses' fields in their order (:meth:`QuantizationReport.to_json`); the figures whose shape
depends on the run (the fidelity, the accuracy, the ``auto`` placement's decision) stay JSON objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from .reports import JsonReport

__all__ = ["QuantizeReport", "QuantizationReport"]


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
    #: ``divergence`` is left out while it is ``None``: a report written before it was measured reads back whole.
    omit_none: ClassVar[tuple[str, ...]] = ("divergence",)
