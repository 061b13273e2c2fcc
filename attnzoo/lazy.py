"""A module named at the top of the file that uses it and imported on first use.

The runtime layer and the commands' entry modules load without PyTorch, ONNX or ONNX Runtime, so that
``bench-latency --help``, ``python -m attnzoo.runtime`` and the Ray app's driver start in a fraction of a second.
Their modules still name these libraries at the top::

    from attnzoo.lazy import lazy_import

    torch = lazy_import("torch")  # imported by the first torch.<name>

Each attribute access goes through :func:`importlib.import_module`, so a library that is not installed raises
``ImportError`` at the first use, exactly where a function-level ``import torch`` would have.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["lazy_import"]


class _LazyModule:
    """Stands for the module ``name`` until an attribute is read; then reads it from the imported module."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_import(name: str) -> ModuleType:
    """The module ``name``, imported when one of its attributes is first read (an absolute, dotted name)."""
    return _LazyModule(name)  # type: ignore[return-value]
