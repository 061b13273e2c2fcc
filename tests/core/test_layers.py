"""The layers hold: every module's imports (function-level ones too) point down the declared order, the demo
and the Ray app stay apart, and no package imports another package's private names.

The order is the one ``docs/architecture.md`` draws; a test below checks that the document lists it. The studies
(``research/``, beside the package and not in the wheel) sit above every layer: they import the package, and
nothing in the package imports them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
#: Bottom to top: a module may import from its own layer and the layers below it, never above.
LAYERS: list[tuple[str, str]] = [
    ("core", "attnzoo"),
    ("data", "attnzoo.data"),
    ("models", "attnzoo.models"),
    ("zoo", "attnzoo.zoo"),
    ("runtime", "attnzoo.runtime"),
    ("export", "attnzoo.export"),
    ("targets", "attnzoo.targets"),
    ("training", "attnzoo.training"),
    ("benchmarks", "attnzoo.benchmarks"),
    ("report", "attnzoo.report"),
    ("serve", "attnzoo.serve"),
    ("research", "research"),
]
#: The one import of a layer above made on purpose, as ``(importer, imported)``: ``attnzoo.models`` ends by importing
#: ``attnzoo.zoo.hub``, which registers the zoo's trained models as timm models, so that ``import attnzoo.models`` is
#: all a timm user does before ``timm.create_model(name, pretrained=True)`` (docs/architecture.md).
UPWARD: frozenset[tuple[str, str]] = frozenset({("attnzoo.models", "attnzoo.zoo.hub")})
#: The studies' folder (``python -m research.<name>``): above the package, checked by the same rules, never built.
RESEARCH = "research"
#: Side by side on the top layer: each may use ``attnzoo.serve``'s shared modules, never the other.
APART = ("attnzoo.serve.demo", "attnzoo.serve.rayserve")
#: Package name -> folder: ``pyproject.toml``'s ``[tool.setuptools.package-dir]``, the table the build uses.
FOLDERS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def layer_of(module: str) -> int | None:
    """Index in :data:`LAYERS` of an ``attnzoo`` module (the longest matching prefix), else ``None``."""
    best = None
    for i, (_, prefix) in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(LAYERS[best][1]):
                best = i
    return best


def modules() -> Iterator[tuple[str, Path]]:
    """Every module of the package, then of the research folder, with its file."""
    linked = {f.split(".")[1] for f in FOLDERS if "." in f}  # attnzoo/'s links to the layer folders
    for package, folder in [*FOLDERS.items(), (RESEARCH, RESEARCH)]:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if package == "attnzoo" and parts and parts[0] in linked:
                continue  # a layer folder seen through attnzoo/'s link: checked under its own name
            yield ".".join([package, *parts]), path


@cache
def module_names() -> frozenset[str]:
    """The dotted name of every module and package of the package and of the research folder."""
    return frozenset(name for name, _ in modules())


def imports(
    name: str, source: str, *, is_package: bool = False, known: frozenset[str] | None = None
) -> Iterator[tuple[str, list[str], int, bool]]:
    """``(imported module, names taken from it, line, lazy)`` for every import in ``source``, the source of module
    ``name``: nested ones, and the modules named by ``lazy_import("...")`` (``lazy`` true), included.

    ``from P import X`` imports the module ``P.X`` where that is a module of the package (``known``, by default
    every module found by :func:`modules`), so ``from attnzoo import zoo`` is an import of ``attnzoo.zoo``.
    A ``lazy_import`` whose argument is not a string literal yields ``("", [], line, True)``: the check
    cannot see what it names.
    """
    known = module_names() if known is None else known
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno, False
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    yield f"{target}.{alias.name}", [], node.lineno, False
                else:
                    yield target, [alias.name], node.lineno, False
        elif isinstance(node, ast.Call) and _is_lazy_import(node.func):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield arg.value, [], node.lineno, True
            else:
                yield "", [], node.lineno, True


def _is_lazy_import(func: ast.expr) -> bool:
    """Whether a call's function is ``lazy_import`` (``attnzoo.lazy.lazy_import``), by name or attribute."""
    return (isinstance(func, ast.Name) and func.id == "lazy_import") or (
        isinstance(func, ast.Attribute) and func.attr == "lazy_import"
    )


def check_module(
    name: str, source: str, *, is_package: bool = False, where: str | None = None, known: frozenset[str] | None = None
) -> list[str]:
    """The layer rules ``source``, the source of module ``name``, breaks: one line each, ``where:line: ...``."""
    known = module_names() if known is None else known
    packages = {n for n in known if n in FOLDERS or any(m.startswith(n + ".") for m in known)}
    if is_package:
        packages.add(name)

    def package_of(module: str) -> str:
        return module if module in packages else module.rpartition(".")[0]

    where = where or name
    own = layer_of(name)
    found = []
    for target, names, line, lazy in imports(name, source, is_package=is_package, known=known):
        if lazy and not target:
            found.append(
                f"{where}:{line}: lazy_import of a name that is not a string literal (the check cannot see it)"
            )
            continue
        if target.split(".")[0] in _FOLDER_PACKAGES:
            found.append(f"{where}:{line}: imports {target} by its folder, not as attnzoo.{target}")
            continue
        if layer_of(target) is None:  # the standard library, third-party packages
            continue
        if lazy and target not in known:
            found.append(f"{where}:{line}: lazy_import names {target}, no module of the package")
        other = layer_of(target)
        if other is not None and own is not None and other > own and (name, target) not in UPWARD:
            found.append(f"{where}:{line}: {LAYERS[own][0]} imports {target} ({LAYERS[other][0]}, a layer above)")
        for a, b in (APART, APART[::-1]):
            if (name == a or name.startswith(a + ".")) and (target == b or target.startswith(b + ".")):
                found.append(f"{where}:{line}: {a} imports {target} (the demo and the Ray app stay apart)")
        if package_of(target) != package_of(name):  # another package's private names are its own
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            private += [p for p in target.split(".") if p.startswith("_") and not p.startswith("__")]
            if private:
                found.append(f"{where}:{line}: imports {', '.join(private)} from {target}, private to another package")
    return found


#: The layer folders, importable by their bare names from the repository root (``import models``) where the one
#: name of each is ``attnzoo.<folder>``: a module taking one by its folder's name loads a second copy of it.
_FOLDER_PACKAGES = frozenset(folder for package, folder in FOLDERS.items() if "." in package)


def violations() -> list[str]:
    """What every module of the package and of the research folder breaks (:func:`check_module`)."""
    found = []
    for name, path in modules():
        found += check_module(
            name, path.read_text(), is_package=path.name == "__init__.py", where=str(path.relative_to(ROOT))
        )
    return found


def test_every_import_points_down_the_layers():
    assert violations() == []


def test_the_one_upward_import_is_the_zoo_registration_at_the_end_of_attnzoo_models():
    """The allowance is used, only by the package ``attnzoo.models`` itself (a module of it importing the hub is
    caught), and only as the last statement of ``models/__init__.py``, after every name the hub builds with."""
    tree = ast.parse((ROOT / "models" / "__init__.py").read_text())
    last = tree.body[-1]
    assert isinstance(last, ast.ImportFrom) and last.module == "attnzoo.zoo" and [a.name for a in last.names] == ["hub"]
    probe = check_module("attnzoo.models.probe", "from attnzoo.zoo import hub\n")
    assert probe == ["attnzoo.models.probe:1: models imports attnzoo.zoo.hub (zoo, a layer above)"]
    assert check_module("attnzoo.models", "from attnzoo.zoo import hub\n", is_package=True) == []
    assert check_module("attnzoo.models", "from attnzoo.zoo import load\n", is_package=True) == [
        "attnzoo.models:1: models imports attnzoo.zoo (zoo, a layer above)"
    ]


def test_the_checker_sees_function_level_and_relative_imports():
    """A runtime module that imports the demo inside a function, and a private name of another package, is caught;
    so the test above can fail."""
    found = check_module(
        "attnzoo.runtime.probe",
        "def f():\n    from attnzoo.serve.demo import app\n    from attnzoo.export.quantize import _x\n"
        "from .contract import INPUT_NAME\n",
    )
    assert any("probe:2: runtime imports attnzoo.serve.demo" in v for v in found), found
    assert any("probe:3: imports _x from attnzoo.export.quantize" in v for v in found), found
    assert not any("probe:4" in v for v in found), found


def test_the_checker_sees_lazy_imports():
    """``lazy_import("attnzoo....")`` is an import: one that points up fails, one that points down passes, and a
    name the check cannot read or that names no module fails too."""
    source = (
        "from attnzoo import lazy\n"
        "from attnzoo.lazy import lazy_import\n"
        'demo_app = lazy_import("attnzoo.serve.demo.app")\n'
        'models = lazy_import("attnzoo.models")\n'
        'export = lazy.lazy_import("attnzoo.export")\n'
        "other = lazy_import(NAME)\n"
        'typo = lazy_import("attnzoo.modles")\n'
        'torch = lazy_import("torch")\n'
    )
    found = check_module("attnzoo.runtime.probe", source)
    assert any(v.startswith("attnzoo.runtime.probe:3: runtime imports attnzoo.serve.demo.app (serve") for v in found)
    assert any(v.startswith("attnzoo.runtime.probe:5: runtime imports attnzoo.export (export") for v in found)
    assert any(v.startswith("attnzoo.runtime.probe:6: lazy_import of a name that is not a string") for v in found)
    assert any(v.startswith("attnzoo.runtime.probe:7: lazy_import names attnzoo.modles") for v in found)
    assert len(found) == 4, found  # lines 1, 2, 4 and 8 point down or out of the package
    # the Ray app naming the demo lazily is caught as an import of it would be
    found = check_module("attnzoo.serve.rayserve.probe", 'app = lazy_import("attnzoo.serve.demo.app")\n')
    assert found == [
        "attnzoo.serve.rayserve.probe:1: attnzoo.serve.rayserve imports attnzoo.serve.demo.app (the demo and the "
        "Ray app stay apart)"
    ]


def test_the_package_imports_no_study_and_the_studies_import_the_package_by_its_name():
    """A package module that imports a study (directly, inside a function or lazily) points above every layer; a
    study may import any layer of the package and other studies, but not a layer folder by its bare name."""
    found = check_module(
        "attnzoo.report.probe",
        "from research.fusable import export_pair\n"
        "def f():\n    import research.bf16\n"
        'study = lazy_import("research.quantized")\n',
    )
    assert [v.split(": ", 1)[1] for v in found] == [
        "report imports research.fusable (research, a layer above)",
        "report imports research.bf16 (research, a layer above)",
        "report imports research.quantized (research, a layer above)",
    ]
    study = "from attnzoo.serve import loading\nfrom attnzoo.benchmarks.timing import time_round_robin\n"
    assert check_module("research.probe", study + "from research.study import reprint\n") == []
    found = check_module("research.probe", "from benchmarks.timing import time_round_robin\n")
    assert found == ["research.probe:1: imports benchmarks.timing by its folder, not as attnzoo.benchmarks.timing"]
    assert check_module("research.probe", "from attnzoo.export.quantize import _x\n") != []  # private stays private


def test_the_research_folder_is_checked_and_never_built():
    """The studies are read by the check (so the test above holds for them), and the build maps no folder to them."""
    names = {n for n, _ in modules()}
    assert {"research", "research.study", "research.bf16"} <= names
    assert RESEARCH not in FOLDERS.values() and not [p for p in FOLDERS if p.split(".")[-1] in ("research", "studies")]
    assert not (ROOT / "attnzoo" / RESEARCH).exists() and not (ROOT / "attnzoo" / "studies").exists()


def test_the_checker_resolves_from_package_import_module():
    """``from attnzoo import zoo`` (and ``from . import x``) imports the module ``attnzoo.zoo``, in its own layer,
    not the core package; a plain name taken from a package stays the package's."""
    found = check_module(
        "attnzoo.models.probe",
        "from attnzoo import zoo\nfrom attnzoo import export as e, __version__, cli\n"
        "from attnzoo.runtime import backends\n",
    )
    assert any(v.startswith("attnzoo.models.probe:1: models imports attnzoo.zoo (zoo, a layer above)") for v in found)
    assert any(v.startswith("attnzoo.models.probe:2: models imports attnzoo.export (export") for v in found)
    assert any(v.startswith("attnzoo.models.probe:3: models imports attnzoo.runtime.backends (runtime") for v in found)
    assert len(found) == 3, found  # __version__ and cli are the core's
    found = check_module("attnzoo.serve.demo.probe", "from .. import rayserve, loading\n")
    assert found == [
        "attnzoo.serve.demo.probe:1: attnzoo.serve.demo imports attnzoo.serve.rayserve (the demo and the Ray app "
        "stay apart)"
    ]
    assert check_module("attnzoo.serve.probe", "from attnzoo import zoo, models\n") == []


def test_every_module_is_checked():
    """The modules the check reads are the package's: the shared ``serve/examples.py`` among them (a module whose
    name an earlier filter of example folders had dropped), none seen twice through ``attnzoo/``'s links."""
    names = [n for n, _ in modules()]
    assert len(names) == len(set(names))
    assert {"attnzoo.serve.examples", "attnzoo.data.fashion", "attnzoo.zoo", "attnzoo.lazy"} <= set(names)
    assert not [n for n in names if n.startswith("attnzoo.attnzoo")]


def test_every_module_belongs_to_a_layer():
    assert [n for n, _ in modules() if layer_of(n) is None] == []


def test_every_folder_the_build_maps_is_a_layer():
    """A folder added to ``pyproject.toml``'s package-dir is checked here only once it has its place in the order."""
    assert "attnzoo.models" in FOLDERS and FOLDERS["attnzoo.models"] == "models"
    assert sorted(set(FOLDERS) - {prefix for _, prefix in LAYERS}) == []


def test_the_architecture_document_lists_the_layers_in_order():
    text = (ROOT / "docs" / "architecture.md").read_text()
    positions = [text.find(f"`{prefix}`") for _, prefix in LAYERS]
    assert -1 not in positions, [p for (_, p), i in zip(LAYERS, positions, strict=False) if i == -1]
    assert positions == sorted(positions)


def launcher_targets() -> dict[str, str]:
    """``attnzoo/cli.py``'s :data:`COMMANDS`, read from its source: command name -> ``module:function``."""
    tree = ast.parse((ROOT / "attnzoo" / "cli.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "COMMANDS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("attnzoo/cli.py defines no COMMANDS literal")


def test_the_launcher_is_the_one_place_the_core_names_the_layers_above():
    """The console scripts' launcher (``attnzoo.cli``, the core) imports each command's module by name when the
    command starts: the one reference from the core to the layers above, which an import statement would make a
    violation. Each name must be a command module (``...cli``) of a layer that has commands (export and the
    applications above it), and exist."""
    known = module_names()
    applications = {name for name, _ in LAYERS[LAYERS.index(("export", "attnzoo.export")) : -1]}  # not research
    for command, target in launcher_targets().items():
        module, _, function = target.partition(":")
        assert module in known, f"{command}: {module} is no module of the package"
        assert module.rsplit(".", 1)[-1] == "cli" and function, f"{command}: {target} is not a command's main"
        assert LAYERS[layer_of(module)][0] in applications, f"{command}: {module} is not an application's module"
