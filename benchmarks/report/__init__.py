"""Deprecated name of :mod:`attnzoo.benchmarks.tables`, the benchmark's Markdown tables, CSV, JSON and charts
(removed in the next release): every name is read from there, with a ``DeprecationWarning`` at import. (A package
rather than ``report.py`` so that the module's rename stays a rename in git.)"""

from __future__ import annotations

import warnings
from typing import Any

from attnzoo.benchmarks import tables

__all__ = tables.__all__

warnings.warn(
    "attnzoo.benchmarks.report is deprecated: import attnzoo.benchmarks.tables", DeprecationWarning, stacklevel=2
)


def __getattr__(name: str) -> Any:
    """A name of :mod:`attnzoo.benchmarks.tables`."""
    return getattr(tables, name)
