"""Deprecated name of :mod:`attnzoo.export.quantize.record`, an int8 / fp8 export's record written, read and
summarised (removed in the next release): its names, with a ``DeprecationWarning`` at import."""

from __future__ import annotations

import warnings

from .record import QuantizationReport, QuantizeReport, read_quantization_report, summary, write_report

__all__ = ["QuantizeReport", "QuantizationReport", "write_report", "read_quantization_report", "summary"]

warnings.warn(
    "attnzoo.export.quantize.report is deprecated: import attnzoo.export.quantize.record",
    DeprecationWarning,
    stacklevel=2,
)
