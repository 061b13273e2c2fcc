"""Packages found, not listed: pyproject.toml maps one top-level folder per layer to a subpackage (``models/`` is
``attnzoo.models``, ...), and every folder below them with an ``__init__.py`` is a package of the wheel and sdist.
Everything else about the build is in pyproject.toml.

``attnzoo/models`` and its siblings are committed links to those folders (``attnzoo/models -> ../models``): they let
type checkers, IDEs and ``python`` started in the checkout follow ``attnzoo.models`` as the install does. The build
maps each folder itself, so the links are not searched for packages."""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.config.pyprojecttoml import load_file

ROOT = Path(__file__).resolve().parent


def packages(root: Path = ROOT) -> list[str]:
    """Every package: each folder of ``[tool.setuptools.package-dir]``, the folders with an ``__init__.py``
    below it, and the data folders ``[tool.setuptools.package-data]`` names as packages (``attnzoo.zoo.onnx``)."""
    config = load_file(str(root / "pyproject.toml"))["tool"]["setuptools"]
    # attnzoo/models -> ../models and its siblings: packages of their own folders, not of attnzoo/ (a package of
    # another folder may share a layer's name: benchmarks/report/ is attnzoo.benchmarks.report)
    linked = [f"{name.split('.')[1]}{tail}" for name in config["package-dir"] if "." in name for tail in ("", ".*")]
    found = [
        name
        for package, folder in config["package-dir"].items()
        for name in [
            package,
            *(
                f"{package}.{sub}"
                for sub in find_packages(str(root / folder), exclude=linked if folder == "attnzoo" else ())
            ),
        ]
    ]
    return found + [name for name in config.get("package-data", {}) if name not in found]


setup(packages=packages())
