"""Every deployment target, as the registries list it: each one's backends, formats, options and report schemas are
declared consistently, resolve through the registries, and are listed by ``python -m attnzoo.runtime``. The tests
iterate :func:`attnzoo.runtime.targets.targets`, so a new target (a folder of ``targets/`` or an installed one) is
checked with no edit here; :func:`target_problems` is shown failing on a target declared wrong."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import runpy
import sys
from typing import Any
from unittest import mock

import pytest

from attnzoo.export.formats import ExportFormat, formats
from attnzoo.runtime import backends as backends_mod
from attnzoo.runtime.backends import DTYPES, Backend, LoadOptions, backends, canonical_backend, get_backend
from attnzoo.runtime.targets import FormatOption, Target, load_object, target_reports, targets
from tests.schemas import minimal_report

LOAD_SETTINGS = {f.name for f in dataclasses.fields(LoadOptions)} - {"dtype"}


def _one_line(text: Any) -> bool:
    return isinstance(text, str) and bool(text.strip()) and "\n" not in text


def _backend_problems(backend: Any) -> list[str]:
    """What is wrong with one of a target's backends: not in the registry as itself, an alias that resolves
    elsewhere, facts outside their ranges, a reason that is not one line."""
    if not isinstance(backend, Backend):
        return [f"{backend!r} is not a Backend"]
    name, problems = backend.name, []
    try:
        if get_backend(name) is not backend:
            problems.append(f"backend {name}: the registry holds another backend under its name")
        problems += [
            f"backend {name}: alias {a} resolves to {canonical_backend(a)}"
            for a in backend.aliases
            if canonical_backend(a) != name
        ]
    except ValueError as exc:
        problems.append(f"backend {name}: not in the registry ({str(exc).split(';')[0]})")
    if backend.takes not in ("module", "onnx") or backend.device not in ("cpu", "cuda", "torch"):
        problems.append(f"backend {name}: takes {backend.takes!r} on {backend.device!r}")
    if not backend.dtypes or not set(backend.dtypes) <= set(DTYPES):
        problems.append(f"backend {name}: precisions {backend.dtypes} not among {DTYPES}")
    if not set(backend.reads) <= LOAD_SETTINGS:
        problems.append(f"backend {name}: reads {sorted(set(backend.reads) - LOAD_SETTINGS)}, no load setting")
    if not _one_line(backend.summary):
        problems.append(f"backend {name}: its summary is not one line")
    for dtype in DTYPES:
        reason = backend.unavailable_reason(dtype, "cpu")
        if reason is not None and not _one_line(reason):
            problems.append(f"backend {name}: its reason for {dtype} is not one line: {reason!r}")
    return problems


def _format_problems(target: Target) -> list[str]:
    """Each format reference names an :class:`ExportFormat` of that name, which the export layer lists, whose own
    options a target declares."""
    problems, known = [], formats()
    declared = {option.name for t in targets() for option in t.options} | {option.name for option in target.options}
    for name, reference in target.formats.items():
        try:
            part = load_object(reference)
        except (ImportError, AttributeError) as exc:
            problems.append(f"format {name}: {reference} does not load ({type(exc).__name__}: {exc})")
            continue
        if not isinstance(part, ExportFormat) or part.name != name:
            problems.append(f"format {name}: {reference} is {getattr(part, 'name', part)!r}, not that format")
        elif known.get(name) is not part:
            problems.append(f"format {name}: not the one export-model lists as {name!r}")
        else:
            problems += [
                f"format {name}: option {o.name} is no target's" for o in part.options if o.name not in declared
            ]
    return problems


def _option_problems(target: Target) -> list[str]:
    """Each option a target declares is a :class:`FormatOption` owned by a format export-model lists."""
    problems, known = [], set(formats()) | set(target.formats)
    for option in target.options:
        if not isinstance(option, FormatOption):
            problems.append(f"option {option!r} is not a FormatOption")
        elif option.owner not in known:
            problems.append(f"option {option.name}: its owner {option.owner!r} is no format")
        elif not _one_line(option.help):
            problems.append(f"option {option.name}: its help is not one line")
    return problems


def _report_problems(target: Target) -> list[str]:
    """Each report kind is this target's schema in the registry of kinds, and a report of it round-trips: the file
    written from a report (its required fields only, the rest their defaults) reads back as the same file."""
    problems, kinds = [], target_reports()
    for kind, schema in target.reports.items():
        if kinds.get(kind) is not schema:
            problems.append(f"report {kind}: the registry of report kinds holds {kinds.get(kind)!r}")
            continue
        try:
            text = schema.from_dict(minimal_report(schema)).to_json()
            if schema.from_json(text).to_json() != text:
                problems.append(f"report {kind}: {schema.__name__} does not write back what it read")
        except (ValueError, TypeError, KeyError) as exc:
            problems.append(f"report {kind}: {schema.__name__} does not round-trip ({exc})")
    return problems


def target_problems(target: Target) -> list[str]:
    """Everything declared wrong in ``target``, one line each (empty: consistent)."""
    problems = [] if _one_line(target.title) and _one_line(target.summary) else [f"{target.name}: title or summary"]
    reason = target.unavailable_reason()
    if reason is not None and not (_one_line(reason) and target.title in reason):
        problems.append(f"{target.name}: its unavailable reason does not name it in one line: {reason!r}")
    for backend in target.backends:
        problems += _backend_problems(backend)
    return problems + _format_problems(target) + _option_problems(target) + _report_problems(target)


@pytest.mark.parametrize("target", targets(), ids=lambda t: t.name)
def test_every_target_declares_its_backends_formats_options_and_reports_consistently(target):
    assert target_problems(target) == []


def test_the_registries_hold_every_targets_parts_and_no_stray_one():
    """Each backend, format and report kind of the built-in registries is one target's, held once."""
    names = [b.name for t in targets() for b in t.backends]
    assert len(names) == len(set(names)) and set(names) <= {b.name for b in backends()}
    assert [b.name for b in backends()][: len(names)] == names  # the targets' backends first, in listing order
    kinds = [kind for t in targets() for kind in t.reports]
    assert len(kinds) == len(set(kinds)) and set(kinds) == set(target_reports())
    own = [name for t in targets() for name in t.formats]
    assert len(own) == len(set(own)) and set(own) <= set(formats())


@pytest.fixture(scope="module")
def listing() -> str:
    """What ``python -m attnzoo.runtime --device cpu`` prints (run in this process)."""
    out = io.StringIO()
    argv = ["python -m attnzoo.runtime", "--device", "cpu"]
    with mock.patch.object(sys, "argv", argv), contextlib.redirect_stdout(out), pytest.raises(SystemExit) as info:
        runpy.run_module("attnzoo.runtime", run_name="__main__", alter_sys=False)
    assert info.value.code in (0, None)
    return out.getvalue()


@pytest.mark.parametrize("target", targets(), ids=lambda t: t.name)
def test_python_m_attnzoo_runtime_lists_every_target_and_its_backends(target, listing):
    rows = {line.split("|")[1].strip(" `"): line for line in listing.splitlines() if line.startswith("| `")}
    targets_part, backends_part = listing.split("\n\n")
    row = next((ln for ln in targets_part.splitlines() if ln.startswith(f"| `{target.name}` |")), None)
    assert row is not None, f"{target.name} is not in the targets table"
    assert target.summary in row and all(f"`{b.name}`" in row for b in target.backends)
    assert all(f"`{f}`" in row for f in target.formats)
    for backend in target.backends:
        assert any(ln.startswith(f"| `{backend.name}` |") for ln in backends_part.splitlines()), backend.name
    assert rows  # the two tables' rows were read


# ----------------------------------------------------------------------------- the check fails where it should
def test_a_target_declared_wrong_is_named_line_by_line(monkeypatch):
    """A target whose backend is not the registry's and reads no real setting, whose alias is another backend's,
    whose format reference names another format, whose option belongs to no format and whose report kind no
    registry holds: each is one line of :func:`target_problems`."""
    monkeypatch.setattr(backends_mod, "_REGISTRY", dict(backends_mod._REGISTRY))
    monkeypatch.setattr(backends_mod, "_ALIASES", dict(backends_mod._ALIASES))
    stray = Backend("tt-echo", "returns its input", aliases=("onnxruntime",), reads=("thread",))
    level = FormatOption("tt_level", owner="nowhere", help="how bad")
    parts = {"formats": {"tt-bad": "attnzoo.targets.tensorrt.format:FORMAT"}, "reports": {"tt-bad": dict}}
    bad = Target("tt-bad", "Bad", "declared wrong", backends=(stray,), options=(level,), **parts)
    problems = target_problems(bad)
    assert problems == [
        "backend tt-echo: not in the registry (unknown backend 'tt-echo')",
        "backend tt-echo: reads ['thread'], no load setting",
        "format tt-bad: attnzoo.targets.tensorrt.format:FORMAT is 'tensorrt', not that format",
        "option tt_level: its owner 'nowhere' is no format",
        "report tt-bad: the registry of report kinds holds None",
    ]
    backends_mod.register_backend(dataclasses.replace(stray, aliases=(), reads=()))
    good = Target("tt-echo", "Echo", "returns its input", backends=(get_backend("tt-echo"),))
    assert target_problems(good) == []  # registered and declared right, the same check passes it
