"""The tree passes its static checks: ruff's lint and format, and mypy's type check (the versions ``[dev]`` pins,
configured in ``pyproject.toml``; ``.ci/run`` runs the same commands). And the links that let those tools, IDEs and
``python`` started in the checkout follow ``attnzoo.models`` to ``models/`` are there, one per mapped folder."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def _tool(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]' installs it)")
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_ruff_lint_passes():
    done = _tool("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]


def test_a_noqa_for_a_rule_ruff_does_not_select_is_an_error(tmp_path):
    """A marker that silences nothing (here BLE001, a rule the configuration leaves off) fails the lint, so no
    marker claims a check that never runs."""
    (tmp_path / "m.py").write_text("try:\n    pass\nexcept Exception:  # noqa: BLE001\n    pass\n")
    config = str(ROOT / "pyproject.toml")
    done = _tool("ruff", "check", "--no-cache", "--config", config, "--output-format", "concise", str(tmp_path))
    assert done.returncode == 1 and "RUF100" in done.stdout and "BLE001" in done.stdout, done.stdout + done.stderr


def test_ruff_format_is_applied():
    done = _tool("ruff", "format", "--check", "--no-cache", ".")
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout[-5000:] + done.stderr[-2000:]


def test_mypy_passes():
    """Every module of the package, reached through the links (an unresolved ``attnzoo.*`` import is an error).

    Incremental, with mypy's cache in ``.mypy_cache/``: seconds once ``python -m mypy`` has run in the checkout (as
    ``.ci/run`` does before the tests), about 3 minutes on 2 cores the first time."""
    done = _tool("mypy", timeout=1200)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def test_each_mapped_folder_has_its_link_under_attnzoo():
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapped = {name.split(".", 1)[1]: folder for name, folder in folders.items() if "." in name}
    assert "models" in mapped
    for name, folder in mapped.items():
        link = ROOT / "attnzoo" / name
        assert link.is_symlink() and os.readlink(link) == f"../{folder}", f"attnzoo/{name} -> ../{folder} is missing"
    links = {p.name for p in (ROOT / "attnzoo").iterdir() if p.is_symlink()}
    assert links == set(mapped), f"links to no mapped folder: {sorted(links - set(mapped))}"
