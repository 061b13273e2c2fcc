"""Modules that moved when the package was laid out by layers: their old names still import and still run
with ``python -m``, with a ``FutureWarning`` naming the new place.

:data:`MOVED` is the one table of old -> new names (a package's entry covers its submodules). A finder on
``sys.meta_path`` (installed by ``attnzoo/__init__.py``) answers an old name with the new module itself, so
both names are the same module object, and gives ``runpy`` the new module's code for ``python -m OLD``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from typing import Dict, Optional

__all__ = ["MOVED", "new_name", "install"]

MOVED: Dict[str, str] = {
    "attnzoo.checkpoint": "attnzoo.models.checkpoint",
    "attnzoo.training.fashion": "attnzoo.data.fashion",
    "attnzoo.training.data": "attnzoo.data.datasets",
    "attnzoo.benchmarks.env": "attnzoo.machine",
    "attnzoo.benchmarks.scaling": "attnzoo.studies.scaling",
    "attnzoo.benchmarks.mae_forms": "attnzoo.studies.mae_forms",
    "attnzoo.benchmarks.quantized": "attnzoo.studies.quantized",
    "attnzoo.benchmarks.int8_accuracy": "attnzoo.studies.int8_accuracy",
    "attnzoo.serve.app": "attnzoo.serve.demo.app",
    "attnzoo.serve.cli": "attnzoo.serve.demo.cli",
    "attnzoo.serve.coldstart": "attnzoo.serve.demo.coldstart",
    "attnzoo.serve.screenshot": "attnzoo.serve.demo.screenshot",
    "attnzoo.serving": "attnzoo.serve.rayserve",
}


def new_name(old: str) -> Optional[str]:
    """The current name of a moved module (or of a submodule of a moved package), else ``None``."""
    for before, after in MOVED.items():
        if old == before or old.startswith(before + "."):
            return after + old[len(before):]
    return None


class _MovedLoader(importlib.abc.InspectLoader):
    """Loads an old name as the new module (already imported by the finder) and hands runpy its code."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)  # the module object keeps its own name and spec

    def exec_module(self, module) -> None:  # executed when it was imported under its new name
        pass

    def get_code(self, fullname):
        spec = importlib.util.find_spec(self.new)
        return spec.loader.get_code(self.new)

    def get_source(self, fullname):
        spec = importlib.util.find_spec(self.new)
        return spec.loader.get_source(self.new)

    def is_package(self, fullname) -> bool:
        return importlib.util.find_spec(self.new).submodule_search_locations is not None


class _MovedSpec(importlib.machinery.ModuleSpec):
    """A spec whose package is the new module's, so ``python -m OLD`` resolves relative imports there."""

    @property
    def parent(self) -> str:
        return self._new_parent


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        warnings.warn(f"{fullname} is now {new}", FutureWarning, stacklevel=2)
        spec = _MovedSpec(fullname, _MovedLoader(new), origin=real.origin,
                          is_package=real.submodule_search_locations is not None)
        spec._new_parent = real.parent
        spec.has_location = real.has_location
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
