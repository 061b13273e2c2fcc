"""The report folder: ``report.json`` (the measurements, schema in docs/report-variant.md), ``report.md`` (one
GitHub-renderable page with PNG plots) and the one-line verdict (:func:`write_report`).

The verdict is :mod:`attnzoo.report.verdict`'s, the page :mod:`attnzoo.report.markdown`'s, the plots
:mod:`attnzoo.report.plots`' and the formats a report holds :mod:`attnzoo.report.formats`'; their public names are
importable from here too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnzoo.fileio import atomic_write_text
from attnzoo.runtime.fusion import RUNTIMES

from .formats import BLOCK_PRECISIONS, block_entries, entry_title, report_formats
from .markdown import markdown
from .plots import block_series, plot_block_errors, plots
from .verdict import *  # noqa: F403 -- the verdict's public names are this module's too
from .verdict import __all__ as _VERDICT_NAMES
from .verdict import verdict

__all__ = [
    *_VERDICT_NAMES,
    "markdown",
    "plots",
    "block_series",
    "plot_block_errors",
    "BLOCK_PRECISIONS",
    "report_formats",
    "block_entries",
    "entry_title",
    "write_report",
    "RUNTIMES",
]


def write_report(report: dict[str, Any], out: Path, replot: bool = True) -> tuple[list[Path], str]:
    """Add the verdict to ``report``, write ``report.json``, the plots and ``report.md`` into ``out``; returns the
    files and the verdict line. ``replot=False``: the plots ``report["plots"]`` names are kept as they are (a report
    rendered again from its ``report.json``, nothing measured)."""
    report["verdict"] = verdict(report, out)
    if replot:
        pngs = plots(report, out)
    else:
        pngs = {k: out / Path(str(name)).name for k, name in (report.get("plots") or {}).items()}
        pngs = {k: p for k, p in pngs.items() if p.is_file()}
    report["plots"] = {k: p.name for k, p in pngs.items()}
    atomic_write_text(out / "report.json", json.dumps(report, indent=1, default=str) + "\n")
    atomic_write_text(out / "report.md", markdown(report, pngs))
    return [out / "report.md", out / "report.json", *pngs.values()], report["verdict"]["line"]


def __getattr__(name: str) -> tuple[str, ...]:
    """``REPORT_FORMATS`` and ``BLOCK_ENTRIES``, read from the export formats when asked for
    (:mod:`attnzoo.report.formats`)."""
    if name == "REPORT_FORMATS":
        return report_formats()
    if name == "BLOCK_ENTRIES":
        return block_entries()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
