"""The layers hold: every module's imports (function-level ones too) point down the declared order, the demo
and the Ray app stay apart, and no package imports another package's private names.

The order is the one ``docs/architecture.md`` draws; a test below checks that the document lists it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
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
    ("training", "attnzoo.training"),
    ("benchmarks", "attnzoo.benchmarks"),
    ("studies", "attnzoo.studies"),
    ("report", "attnzoo.report"),
    ("serve", "attnzoo.serve"),
]
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
    """Every module of the package with its file."""
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(p in ("tests", "examples") for p in parts) or "results" in path.parts:
                continue
            name = ".".join([package, *parts])
            if package == "attnzoo" and parts and parts[0] in {f.split(".")[1] for f in FOLDERS if "." in f}:
                continue  # not a folder of attnzoo/
            yield name, path


def imports(name: str, path: Path) -> Iterator[tuple[str, list[str], int]]:
    """``(imported module, names taken from it, line)`` for every import in the file, nested ones included."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target, [a.name for a in node.names], node.lineno


def violations() -> list[str]:
    found = []
    packages = {n for n, p in modules() if p.name == "__init__.py"}

    def package_of(module: str) -> str:
        return module if module in packages else module.rpartition(".")[0]

    for name, path in modules():
        own = layer_of(name)
        where = f"{path.relative_to(ROOT)}"
        for target, names, line in imports(name, path):
            if not target.startswith("attnzoo"):
                continue
            other = layer_of(target)
            if other is not None and own is not None and other > own:
                found.append(f"{where}:{line}: {LAYERS[own][0]} imports {target} ({LAYERS[other][0]}, a layer above)")
            for a, b in (APART, APART[::-1]):
                if (name == a or name.startswith(a + ".")) and (target == b or target.startswith(b + ".")):
                    found.append(f"{where}:{line}: {a} imports {target} (the demo and the Ray app stay apart)")
            if package_of(target) != package_of(name):  # another package's private names are its own
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                private += [p for p in target.split(".") if p.startswith("_") and not p.startswith("__")]
                if private:
                    found.append(
                        f"{where}:{line}: imports {', '.join(private)} from {target}, private to another package"
                    )
    return found


def test_every_import_points_down_the_layers():
    assert violations() == []


def test_the_checker_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    """A probe file in the runtime layer that imports the demo inside a function, and a private name of another
    package, is caught; so the test above can fail."""
    probe = ROOT / "runtime" / "_layer_probe.py"
    probe.write_text(
        "def f():\n    from attnzoo.serve.demo import app\n    from attnzoo.export.quantize import _x\n"
        "from .contract import INPUT_NAME\n"
    )
    try:
        found = violations()
    finally:
        probe.unlink()
    assert any("runtime/_layer_probe.py:2: runtime imports attnzoo.serve.demo" in v for v in found), found
    assert any("runtime/_layer_probe.py:3: imports _x from attnzoo.export.quantize" in v for v in found), found
    assert not any("_layer_probe.py:4" in v for v in found)


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
