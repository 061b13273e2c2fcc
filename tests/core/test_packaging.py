"""The distribution carries the whole package: every folder with an ``__init__.py`` under the folders setup.py maps
to ``attnzoo.*`` is a package of it, with all its modules, and every committed data file there is package data. The
studies (``research/``, run from the checkout) are not in it.

The default test reads what setuptools itself would package (setup.py and pyproject.toml, no build); the slow
test builds the sdist and, from it, the wheel (``python -m build``) and reads the archives. ``.ci/wheel-smoke``
installs such a wheel and runs the main jobs from it."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _setuptools_dist(monkeypatch):
    """The Distribution setuptools configures from setup.py and pyproject.toml (nothing built)."""
    import setuptools  # noqa: F401 -- installs setuptools' distutils first  # isort: skip
    from distutils.core import run_setup

    monkeypatch.chdir(ROOT)
    return run_setup(str(ROOT / "setup.py"), stop_after="config")


def _source_files(folder: Path) -> set[Path]:
    """The files under ``folder`` that git tracks or would (not ignored); every file but caches where this is no
    git checkout. Links are not files of the package: ``attnzoo/models -> ../models`` and its siblings point to the
    folders the build maps by themselves."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", str(folder)],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return {ROOT / f for f in out.split("\0") if f and not (ROOT / f).is_symlink()}
    except (OSError, subprocess.CalledProcessError):
        return {p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and "__pycache__" not in p.parts}


def _expected(package_dir: dict[str, str]) -> dict[str, set[str]]:
    """From the source tree: ``packages`` (names), ``modules`` and ``data`` (paths as they lie in the wheel)."""
    want: dict[str, set[str]] = {"packages": set(), "modules": set(), "data": set()}
    for package, folder in package_dir.items():
        base = ROOT / folder
        for path in sorted(_source_files(base)):
            rel = path.relative_to(base)
            in_wheel = "/".join([*package.split("."), *rel.parts])
            if path.suffix == ".py":
                want["modules"].add(in_wheel)
                if path.name == "__init__.py":
                    want["packages"].add(".".join([package, *rel.parent.parts]))
            else:
                want["data"].add(in_wheel)
    return want


def test_setuptools_packages_every_package_module_and_data_file(monkeypatch):
    dist = _setuptools_dist(monkeypatch)
    want = _expected(dist.package_dir)
    assert "attnzoo.runtime.backends" in want["packages"] and "attnzoo/data/fashion-mnist/LICENSE" in want["data"]
    assert want["packages"] <= set(dist.packages), f"not packaged: {sorted(want['packages'] - set(dist.packages))}"
    build_py = dist.get_command_obj("build_py")
    build_py.ensure_finalized()
    modules = {"/".join([*package.split("."), Path(file).name]) for package, _, file in build_py.find_all_modules()}
    assert want["modules"] <= modules, f"modules not packaged: {sorted(want['modules'] - modules)}"
    data = {
        "/".join([*package.split("."), *Path(name).parts])
        for package, _, _, names in build_py.data_files
        for name in names
    }
    assert want["data"] <= data, (
        f"data files not packaged (pyproject.toml's package-data): {sorted(want['data'] - data)}"
    )
    # a data folder whose name could be imported is a package of its own, or setuptools warns at every build
    # ("Package 'attnzoo.zoo.onnx' is absent from the `packages` configuration")
    importable = {
        ".".join(Path(name).parent.parts)
        for name in want["data"]
        if all(part.isidentifier() for part in Path(name).parent.parts)
    }
    assert importable <= set(dist.packages), f"data folders not in packages: {sorted(importable - set(dist.packages))}"
    studies = [p for p in dist.packages if p.split(".")[0] == "research" or p.startswith("attnzoo.studies")]
    assert not studies and not [m for m in modules if m.startswith(("research/", "attnzoo/studies/"))], studies
    assert "attnzoo.benchmarks.scaling" in dist.packages  # the scaling benchmark the product runs is the product's
    for shipped in (
        "attnzoo/zoo/manifest.json",
        "attnzoo/zoo/standard_cls_fashion.safetensors",
        "attnzoo/serve/examples/index.json",
        "attnzoo/data/fashion-mnist/t10k-images-idx3-ubyte.gz",
    ):
        assert shipped in data


@pytest.mark.slow
def test_the_built_sdist_and_wheel_hold_every_module_and_data_file(monkeypatch, tmp_path):
    """``python -m build`` (sdist, then the wheel from the unpacked sdist, as pip does from an index)."""
    want = _expected(_setuptools_dist(monkeypatch).package_dir)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        env=env,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("attnzoo-*.whl")
    (sdist,) = tmp_path.glob("attnzoo-*.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = (want["modules"] | want["data"]) - names
    assert not missing, f"not in {wheel.name}: {sorted(missing)}"
    with tarfile.open(sdist) as tar:  # the wheel was built from it: what the wheel holds, it held
        in_sdist = {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}
    assert {"setup.py", "pyproject.toml", "README.md", "runtime/backends/__init__.py"} <= in_sdist
    studies = sorted(n for n in names | in_sdist if n.startswith(("research/", "studies/", "attnzoo/studies/")))
    assert not studies, f"a study is in the distribution: {studies[:5]}"


def test_every_attnzoo_name_the_ci_scripts_import_exists():
    """``.ci/wheel-smoke`` imports package names in ``python -c`` one-liners that no linter reads; a renamed or
    moved name would fail CI only after the wheel is built. Every ``from attnzoo... import a, b`` there resolves."""
    import importlib.util
    import re

    found = []
    for script in sorted((ROOT / ".ci").iterdir()):
        for module, names in re.findall(r"from (attnzoo[\w.]*) import ([\w, ]+)", script.read_text()):
            for name in (n.strip() for n in names.split(",")):
                found.append((script.name, module, name))
                owner = importlib.import_module(module)
                submodule = hasattr(owner, "__path__") and importlib.util.find_spec(f"{module}.{name}")
                assert hasattr(owner, name) or submodule, f"{script.name}: {module}.{name} is gone"
    assert any(name == "free_port" for _, _, name in found), found  # the scan sees the one-liners
