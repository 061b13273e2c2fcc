"""attnzoo.report: ``report_variant()`` and ``report-variant``: does an attention variant deploy (export parity in
fp32 and fp16, its extra math kept, int8 fidelity, a TensorRT engine counted only where it ran, Triton), does each
runtime fuse its attention core, and what does it cost against standard attention -- one folder with ``report.md``,
``report.json`` and plots."""

from .render import verdict, write_report
from .variant import BATCH_SIZES, FULL, QUICK, SCHEMA, Budget, ReportResult, report_variant

__all__ = [
    "report_variant",
    "ReportResult",
    "Budget",
    "FULL",
    "QUICK",
    "SCHEMA",
    "BATCH_SIZES",
    "verdict",
    "write_report",
]
