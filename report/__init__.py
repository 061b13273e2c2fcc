"""attnzoo.report: ``report_variant()`` and ``report-variant``: does an attention variant deploy (export parity in
fp32 and fp16, its extra math kept, int8 fidelity, a TensorRT engine counted only where it ran, Triton), does each
runtime fuse its attention core, and what does it cost against standard attention -- one folder with ``report.md``,
``report.json`` and plots.

The modules, by role: :mod:`.variant` (the call, its identity and fusion sections), :mod:`.settings` (the request
and its :class:`Budget`), :mod:`.exports` (the export side), :mod:`.cost` (latency, scaling and the GPU plan's rows),
:mod:`.formats` (the formats a report writes, read from the export formats), :mod:`.render` (the folder) with
:mod:`.verdict`, :mod:`.markdown` and :mod:`.plots`, :mod:`.index` (a set of reports) and :mod:`.cli`.
"""

from .render import verdict, write_report
from .settings import BATCH_SIZES, SCHEMA, Budget, ReportResult, named_budget
from .variant import report_variant

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


def __getattr__(name: str) -> Budget:
    """:data:`FULL` and :data:`QUICK` (:mod:`attnzoo.report.settings`), made when asked for."""
    return named_budget(__name__, name)
