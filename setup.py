"""Packages found, not listed: pyproject.toml maps one top-level folder per layer to a subpackage (``models/`` is
``attnzoo.models``, ...), and every folder below them with an ``__init__.py`` is a package of the wheel and sdist.
Everything else about the build is in pyproject.toml."""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.config.pyprojecttoml import load_file

ROOT = Path(__file__).resolve().parent


def packages(root: Path = ROOT) -> list[str]:
    """Every package: each folder of ``[tool.setuptools.package-dir]`` and the folders with an ``__init__.py``
    below it."""
    folders = load_file(str(root / "pyproject.toml"))["tool"]["setuptools"]["package-dir"]
    return [
        name
        for package, folder in folders.items()
        for name in [package, *(f"{package}.{sub}" for sub in find_packages(str(root / folder)))]
    ]


setup(packages=packages())
