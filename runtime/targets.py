"""Deployment targets: one technology each (ONNX Runtime, OpenVINO, TensorRT, ...), one folder each.

A target is everything of one technology in one place, as Polygraphy keeps ``backend/trt/``: its export format (if it
has one), its backends, the schemas of the reports its format writes, its own options and whether it is installed
here. The package's own targets are the folders of :mod:`attnzoo.targets`, each defining ``TARGET``; an installed
package adds one through the ``attnzoo.targets`` entry-point group (an entry point naming a module that defines
``TARGET``). Nothing else names them: the backend registry, the export formats and the report schemas are read from
:func:`targets`, so adding a technology is one folder.

The registries below the targets (this layer's backends and report schemas, the export layer's formats) load the
targets at their first lookup (:func:`load_targets`); a target imports those layers, never the reverse.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from attnzoo.errors import first_line, quoted

__all__ = [
    "ENTRY_POINT_GROUP",
    "BUILTIN_PACKAGE",
    "FormatOption",
    "Target",
    "TargetWarning",
    "load_targets",
    "targets",
    "get_target",
    "collect",
    "load_object",
    "target_reports",
]

#: The entry-point group an installed package adds a target through.
ENTRY_POINT_GROUP = "attnzoo.targets"
#: The package whose sub-packages are the built-in targets.
BUILTIN_PACKAGE = "attnzoo.targets"


@dataclass(frozen=True)
class FormatOption:
    """One option a format has of its own (TensorRT's target GPU, Triton's platform): a keyword of
    :func:`attnzoo.export.export_model` and a flag of ``export-model``, declared by its target (:attr:`Target.options`)
    and by the formats that read it (:attr:`~attnzoo.export.formats.ExportFormat.options`), refused with any other.

    Attributes:
        name: The keyword (``compute_capability``); the flag is ``--compute-capability``.
        owner: The format it belongs to (a refusal names it); another format whose output holds the owner's (Triton's
            model folder holding an engine) declares it too.
        help: The flag's help, without its default.
        default: Its value when not given.
        choices: The values it takes (the flag's choices), or ``None``.
        kind: What a value given on the command line is read as (``str``, ``int``).
        normalize: Applied to a given value before it is checked (``str.upper``: ``sm89`` is ``SM89``).
        metavar: The flag's placeholder.
        title: What a value is called in a refusal (``unknown compute capability 'SM90'``; default: the flag).
    """

    name: str
    owner: str
    help: str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    kind: Callable[[str], Any] = str
    normalize: Callable[[Any], Any] | None = None
    metavar: str | None = None
    title: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str) -> Any:
        """A value given on the command line, read as :attr:`kind` and normalized."""
        value = self.kind(text)
        return self.normalize(value) if self.normalize else value


class TargetWarning(UserWarning):
    """An installed target that could not be loaded (the rest load; the line names it and why)."""


@dataclass(frozen=True)
class Target:
    """One deployment technology.

    Attributes:
        name: Its one name (``tensorrt``); the folder of a built-in one.
        title: What it is called in messages and tables (``TensorRT``).
        summary: One line: what it runs or writes, and with what.
        requires: The Python modules it needs (any one of them: ``("tensorrt_rtx", "tensorrt")``); empty when it
            needs nothing beyond the package's own dependencies.
        install: How to install what it needs (``pip install 'attnzoo[tensorrt]'``), said when it is missing.
        backends: Its :class:`~attnzoo.runtime.backends.Backend` instances, in the order the command lines list them.
        formats: Its export formats by name, each where its :class:`~attnzoo.export.formats.ExportFormat` instance
            is (``"attnzoo.targets.tensorrt.format:FORMAT"``): the export layer imports it when it lists the
            formats, so that listing the backends loads neither PyTorch nor ONNX.
        reports: The :class:`~attnzoo.runtime.schemas.JsonReport` schemas of the reports it writes, by kind
            (``python -m attnzoo.runtime.schemas KIND``; a format's report under the format's name).
        options: The options its formats have of their own (:class:`FormatOption`): ``export-model`` adds them
            as flags without importing a format.
        order: Where it stands in listings (lower first): the PyTorch reference first, then the rest.
    """

    name: str
    title: str
    summary: str
    requires: tuple[str, ...] = ()
    install: str = ""
    backends: tuple[Any, ...] = ()
    formats: Mapping[str, str] = field(default_factory=dict)
    reports: Mapping[str, type] = field(default_factory=dict)
    options: tuple[FormatOption, ...] = ()
    order: int = 100

    def unavailable_reason(self) -> str | None:
        """Why this target's library is not installed here (one line), or ``None`` when it is."""
        if not self.requires or any(_installed(module) for module in self.requires):
            return None
        what = " or ".join(self.requires)
        return f"{self.title} needs {what}, not installed" + (f" ({self.install})" if self.install else "")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_TARGETS: dict[str, Target] = {}
_LOADED: list[bool] = [False]
#: Held while the targets load: a second thread's first lookup waits; the loading thread (whose targets' imports
#: ask a registry again) re-enters and sees the targets loaded so far.
_LOCK = threading.RLock()


def _add(target: Any, where: str) -> None:
    if not isinstance(target, Target):
        raise TypeError(f"{where}: TARGET is a {type(target).__name__}, not an attnzoo Target")
    if target.name in _TARGETS:
        raise ValueError(f"{where}: target name {target.name!r} is taken")
    _TARGETS[target.name] = target


def _builtin_names() -> list[str]:
    package = importlib.import_module(BUILTIN_PACKAGE)
    return sorted(info.name for info in pkgutil.iter_modules(package.__path__) if info.ispkg)


def load_targets() -> None:
    """Import every target once: the built-in folders of :mod:`attnzoo.targets`, then the installed ones
    (:data:`ENTRY_POINT_GROUP`; one that fails to load is skipped with a :class:`TargetWarning` naming it)."""
    with _LOCK:
        if _LOADED[0]:
            return
        _LOADED[0] = True
        for name in _builtin_names():
            module = f"{BUILTIN_PACKAGE}.{name}"
            _add(getattr(importlib.import_module(module), "TARGET", None), module)
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            try:
                _add(getattr(importlib.import_module(ep.value.split(":")[0]), "TARGET", None), ep.value)
            except Exception as exc:  # an installed package's fault must not stop every command: one line, go on
                warnings.warn(
                    f"target plugin {ep.name} ({ep.value}) not loaded: {type(exc).__name__}: {first_line(exc)}",
                    TargetWarning,
                    stacklevel=2,
                )


def targets() -> list[Target]:
    """Every target, in listing order (:attr:`Target.order`, then name)."""
    load_targets()
    return sorted(_TARGETS.values(), key=lambda t: (t.order, t.name))


def get_target(name: str) -> Target:
    """The target called ``name``; ``ValueError`` listing the valid ones otherwise."""
    known = {t.name: t for t in targets()}
    if name not in known:
        raise ValueError(f"unknown target {quoted(name)}; valid: {', '.join(known)}")
    return known[name]


def collect(attribute: str) -> Sequence[Any]:
    """Every target's ``attribute`` (``backends``; a mapping's values: ``formats``), concatenated in listing
    order."""
    found: list[Any] = []
    for target in targets():
        items = getattr(target, attribute)
        found.extend(items.values() if isinstance(items, Mapping) else items)
    return found


def load_object(reference: str) -> Any:
    """The object a ``"module:NAME"`` reference names (a target's format)."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def target_reports() -> dict[str, type]:
    """Every target's report schemas by kind."""
    return {kind: schema for target in targets() for kind, schema in target.reports.items()}
