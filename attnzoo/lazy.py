"""A module named at the top of the file that uses it and imported on first use.

The runtime layer and the commands' entry modules load without PyTorch, ONNX or ONNX Runtime, so that
``bench-latency --help``, ``python -m attnzoo.runtime`` and the Ray app's driver start in a fraction of a second.
Their modules still name these libraries at the top::

    from attnzoo.lazy import lazy_import

    torch = lazy_import("torch")  # imported by the first torch.<name>

Each attribute access goes through :func:`importlib.import_module`, so a library that is not installed raises
``ImportError`` at the first use, exactly where a function-level ``import torch`` would have.

A package whose names come from heavy modules (``attnzoo.export``, ``attnzoo.training``) exports them through
:func:`lazy_exports`, so that importing one of its light modules (a command's ``cli``) does not import them all::

    if TYPE_CHECKING:  # for type checkers; at run time each name is imported at its first use
        from .pipeline import export_model
    __getattr__, __dir__ = lazy_exports(__name__, {".pipeline": ("export_model",)})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

__all__ = ["lazy_import", "lazy_exports"]


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


def lazy_exports(
    package: str, modules: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) for the names ``modules`` lists (module, absolute or
    relative to ``package`` -> the names it defines), each imported from its module at its first read and then
    kept in the package. Any other name is ``AttributeError``, so ``from package import submodule`` still imports
    the submodule. A name that is also a submodule's (``attnzoo.training.train``, the function, beside the module
    of that name) stays the name listed, whichever is imported first: Python's import sets a package's attribute
    to each submodule it loads, and the package keeps the listed name instead."""
    where = {name: module for module, names in modules.items() for name in names}
    module = importlib.import_module(package)
    namespace = module.__dict__

    class _Exports(ModuleType):
        def __setattr__(self, attr: str, value: Any) -> None:
            if attr in where and isinstance(value, ModuleType) and value.__name__ == f"{package}.{attr}":
                value = getattr(value, attr)  # the import of the submodule that shares the name: keep the name
            super().__setattr__(attr, value)

    module.__class__ = _Exports

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
