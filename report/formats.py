"""The entries a report can hold for an export: its precisions, and the formats ``report-variant`` writes for every
variant, read from the export formats (:attr:`~attnzoo.export.formats.ExportFormat.in_variant_report`) in the
deployment targets' listing order, so that a target whose format asks for the report joins it with no edit here.

The formats are read at their first use, not at import (listing them imports every target's format: PyTorch and
ONNX): ``report-variant --help`` stays fast. :data:`REPORT_FORMATS` and :data:`BLOCK_ENTRIES` are read the same way.
"""

from __future__ import annotations

from attnzoo.lazy import lazy_import
from attnzoo.runtime.targets import targets

export_formats = lazy_import("attnzoo.export.formats")

__all__ = ["BLOCK_PRECISIONS", "report_formats", "block_entries", "entry_title"]

#: The precisions whose exports carry block figures, in the order the plot shows them.
BLOCK_PRECISIONS = ("fp32", "fp16", "int8", "fp8")


def report_formats(quick: bool = False) -> tuple[str, ...]:
    """The formats besides the ONNX family and TensorRT that a report writes for the variant (``export-model --format
    NAME``), in the order its tables show them: every format whose ``in_variant_report`` is set (``quick``: only
    those that also run in ``--quick``), the targets' formats in the targets' listing order, then any other
    registered one by name."""
    known = export_formats.formats()
    ordered = [name for target in targets() for name in target.formats if name in known]
    ordered += [name for name in known if name not in ordered]
    wanted = ("quick",) if quick else ("quick", "full")
    return tuple(name for name in ordered if known[name].in_variant_report in wanted)


def block_entries() -> tuple[str, ...]:
    """Every export entry that can carry block figures (the precisions, then the report's formats: a format's are
    read from its own file where it exposes them), in the order the plot and the table show them."""
    return (*BLOCK_PRECISIONS, *report_formats())


def entry_title(name: str) -> str:
    """A report entry as the tables name it: a precision as it is (``fp16``), a format by its title (from the export
    format's part)."""
    return export_formats.get_format(name).title if name in report_formats() else name


def __getattr__(name: str) -> tuple[str, ...]:
    """:data:`REPORT_FORMATS` (:func:`report_formats`) and :data:`BLOCK_ENTRIES` (:func:`block_entries`), read when
    asked for."""
    if name == "REPORT_FORMATS":
        return report_formats()
    if name == "BLOCK_ENTRIES":
        return block_entries()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
