"""Deprecated name of the int8 / fp8 export's record schemas, :class:`~attnzoo.runtime.schemas.QuantizationReport`
and :class:`~attnzoo.runtime.schemas.QuantizeReport`, now in :mod:`attnzoo.runtime.schemas` (removed in the next
release): read from there, with a ``DeprecationWarning`` at import."""

from __future__ import annotations

import warnings

from .schemas import QuantizationReport, QuantizeReport

__all__ = ["QuantizeReport", "QuantizationReport"]

warnings.warn(
    "attnzoo.runtime.quantization_report is deprecated: import QuantizationReport and QuantizeReport from "
    "attnzoo.runtime.schemas",
    DeprecationWarning,
    stacklevel=2,
)
