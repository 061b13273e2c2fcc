"""The OpenVINO target's report: ``<model>.xml.json``, an OpenVINO IR's conversion, graph checks and parity (or an
int8 IR's gates) (``python -m attnzoo.runtime.schemas openvino`` prints its JSON Schema)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from attnzoo.runtime.schemas import BlockDivergence, ExtraMathCheck, FormatReport, JsonReport, ParityCheck

__all__ = ["OpenVINOReport", "SourceOnnx"]


@dataclass
class SourceOnnx(JsonReport):
    """The verified ONNX file an OpenVINO IR was converted from: its hash, export and parity."""

    sha256: str
    export_time_s: float | None
    opset: int | None
    num_nodes: int
    parity_max_abs_err: float
    passed: bool


@dataclass
class OpenVINOReport(FormatReport):
    """``<model>.xml.json``: an OpenVINO IR (``export-model --format openvino``).

    Attributes:
        source_onnx: :class:`SourceOnnx`.
        openvino: OpenVINO's version.
        convert_time_s, num_ops, op_histogram, weight_types: The conversion and the IR's graph.
        batch_dim: The IR's batch dimension (the symbolic name when dynamic).
        bin_sha256: The weights file ``<model>.bin`` (matched before the IR is served).
        quantized_onnx: An int8 IR's: the verified Q/DQ graph it was converted from (its hash, quantizer,
            placement, calibration, and the gates it passed).
        fake_quantize_ops: An int8 IR's FakeQuantize ops (OpenVINO's form of the Q/DQ pairs).
        fidelity: An int8 IR's own worst output cosine to the fp32 graph on the held-out inputs, and the gate.
        accuracy: An int8 IR's own score on the test split next to fp32's (``{"measured": False, ...}`` when the
            model has no labelled split).
    """

    what: ClassVar[str] = "OpenVINO IR report"

    source_onnx: SourceOnnx = field(kw_only=True)
    openvino: str = field(kw_only=True)
    quantized_onnx: dict[str, Any] | None = None
    convert_time_s: float | None = None
    num_ops: int | None = None
    op_histogram: dict[str, int] | None = None
    weight_types: dict[str, int] | None = None
    extra_math: ExtraMathCheck | None = None
    fake_quantize_ops: int | None = None
    batch_dim: str | int | None = None
    bin_sha256: str | None = None
    parity: ParityCheck | None = None
    fidelity: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    divergence: BlockDivergence | None = None
    file_size: int | None = None
    sha256: str | None = None
    passed: bool = False
    failures: list[str] = field(default_factory=list)
