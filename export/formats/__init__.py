"""``export-model``'s output formats as parts: one module per format, each an :class:`ExportFormat`.

Every format starts from the verified ONNX; its part says what it checks, what it writes and its summary lines
(:class:`ExportFormat`). A module of this package that defines ``FORMAT`` is found by :func:`formats`, so adding
a format is one file here (``tests/export/test_export.py`` adds a made-up one); :func:`register_format` adds one from
elsewhere, for this process.
"""

from __future__ import annotations

import importlib
import pkgutil

from attnzoo.errors import UsageError, quoted

from .base import ExportFormat, ExportRequest, ModelSource, Step, run_step

__all__ = [
    "ExportFormat",
    "ExportRequest",
    "ModelSource",
    "Step",
    "run_step",
    "formats",
    "get_format",
    "register_format",
]

_REGISTRY: dict[str, ExportFormat] = {}


def _discover() -> None:
    """Register the ``FORMAT`` of every module of this package, in module-name order."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name != "base":
            part = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FORMAT", None)
            if isinstance(part, ExportFormat):
                _REGISTRY.setdefault(part.name, part)


def register_format(part: ExportFormat) -> ExportFormat:
    """Add ``part`` as a format (after those of this package); ``ValueError`` when its name is taken."""
    if part.name in formats():
        raise ValueError(f"export format {part.name!r} is already registered")
    _REGISTRY[part.name] = part
    return part


def formats() -> dict[str, ExportFormat]:
    """Every format by name: this package's modules' (found once), then those registered."""
    if not _REGISTRY:
        _discover()
    return dict(_REGISTRY)


def get_format(name: str) -> ExportFormat:
    """The format called ``name``; a :class:`UsageError` listing the valid ones otherwise."""
    known = formats()
    if name not in known:
        raise UsageError(f"unknown format {quoted(name)}; valid: {', '.join(known)}")
    return known[name]
