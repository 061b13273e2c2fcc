"""``export-model``'s output formats: each an :class:`ExportFormat`, most of them a deployment target's.

Every format starts from the verified ONNX; its part says what it checks, what it writes and its summary lines
(:class:`ExportFormat`). :func:`formats` finds them: the ``formats`` of every deployment target
(:mod:`attnzoo.runtime.targets`: a technology's folder of :mod:`attnzoo.targets`, or an installed target), and the
``FORMAT`` of each module of this package still holding one; :func:`register_format` adds one for this process
(``tests/export/test_export.py`` adds a made-up one).
"""

from __future__ import annotations

import importlib
import pkgutil

from attnzoo.errors import UsageError, quoted
from attnzoo.runtime.targets import collect, load_object

from . import base
from .base import *  # noqa: F403 -- the base's public names (its __all__) are the package's face
from .base import ExportFormat

__all__ = ["formats", "get_format", "register_format"]
__all__ += base.__all__

_REGISTRY: dict[str, ExportFormat] = {}


def _discover() -> None:
    """Register the ``FORMAT`` of every module of this package and the targets' formats, in name order."""
    modules = pkgutil.iter_modules(__path__)  # noqa: F405 -- the package's own path, not a star-imported name
    found = [getattr(importlib.import_module(f"{__name__}.{m.name}"), "FORMAT", None) for m in modules]
    found += [load_object(reference) for reference in collect("formats")]
    for part in sorted((p for p in found if isinstance(p, ExportFormat)), key=lambda p: p.name):
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
