"""The deployment targets: the built-in folders found by discovery, installed ones by entry point, and the backend
registry read from them."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import attnzoo.runtime.backends as backends_mod
import attnzoo.runtime.targets as targets_mod
from attnzoo.runtime.backends import backend_names, get_backend
from attnzoo.runtime.targets import Target, TargetWarning, get_target, targets

ROOT = Path(__file__).resolve().parents[2]


def test_every_folder_of_targets_is_a_target():
    folders = sorted(p.name for p in (ROOT / "targets").iterdir() if (p / "__init__.py").is_file())
    assert folders and sorted(t.name for t in targets() if t.name in folders) == folders
    assert targets()[0].name == "pytorch"  # the reference's target is listed first


def test_the_registry_holds_each_targets_backends_in_its_order():
    names = backend_names()
    for target in targets():
        for backend in target.backends:
            assert get_backend(backend.name) is backend
    pytorch = [b.name for b in get_target("pytorch").backends]
    assert list(names[: len(pytorch)]) == pytorch == ["eager", "compile"]


def test_an_unknown_target_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown target 'nope'; valid: pytorch\b"):
        get_target("nope")


def test_a_missing_library_is_named_with_how_to_install_it():
    target = Target("x", "X", "x", requires=("surely_not_installed_module",), install="pip install 'attnzoo[x]'")
    assert target.unavailable_reason() == (
        "X needs surely_not_installed_module, not installed (pip install 'attnzoo[x]')"
    )
    assert Target("y", "Y", "y", requires=("surely_not_installed_module", "json")).unavailable_reason() is None


@pytest.fixture
def fresh_registries(monkeypatch):
    """The target and backend registries as before any lookup, restored afterwards."""
    monkeypatch.setattr(targets_mod, "_TARGETS", {})
    monkeypatch.setattr(targets_mod, "_LOADED", [False])
    monkeypatch.setattr(backends_mod, "_REGISTRY", dict(backends_mod._REGISTRY))
    monkeypatch.setattr(backends_mod, "_ALIASES", dict(backends_mod._ALIASES))
    monkeypatch.setattr(backends_mod, "_TARGETS_ADDED", [False])


def _installed_target(root: Path, module: str, code: str) -> None:
    """An installed distribution with an ``attnzoo.targets`` entry point naming ``module``."""
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[attnzoo.targets]\n{module} = {module}\n")


def test_an_installed_target_is_found_and_a_broken_one_is_named(tmp_path, monkeypatch, fresh_registries):
    _installed_target(
        tmp_path,
        "tt_echo",
        """
        from attnzoo.runtime.backends import Backend, Session
        from attnzoo.runtime.targets import Target

        class EchoSession(Session):
            def run(self, x):
                return x

        class Echo(Backend):
            def open(self, model, options):
                return EchoSession()

        TARGET = Target("echo", "Echo", "returns its input", backends=(Echo("echo", "returns its input"),))
        """,
    )
    _installed_target(tmp_path, "tt_broken", "raise RuntimeError('no such library')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(TargetWarning, match=r"target plugin tt_broken \(tt_broken\) not loaded: RuntimeError: no such"):
        names = [t.name for t in targets()]
    assert "echo" in names and "pytorch" in names
    assert "echo" in backend_names() and get_backend("echo").load("m").run(3) == 3
    sys.modules.pop("tt_echo", None)
    sys.modules.pop("tt_broken", None)
