"""No import circles: following every import of the package and of the research folder (function-level,
``TYPE_CHECKING`` and ``lazy_import`` ones too), no module comes back to itself, so no circle is hidden by an import
placed inside a function. A module that imports ``a.b.c`` from outside ``a.b`` also runs the packages ``a.b`` on the
way (their ``__init__``), so a package face that imports its modules while one of them imports the face back is a
circle. The one allowed is the zoo's timm registration (:data:`test_layers.UPWARD`): ``attnzoo.models`` ends by
importing ``attnzoo.zoo.hub``, which builds on ``attnzoo.models``.

An import circle is fixed by moving code where it belongs (docs/architecture.md, "Imports"), not by hiding an import.
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache

from .test_layers import UPWARD, imports, module_names, modules


def runs(importer: str, target: str, known: frozenset[str]) -> set[str]:
    """The modules of the package that importing ``target`` from ``importer`` runs: ``target`` itself (a package
    named on purpose, its face, counts even from inside it) and each package above it that does not hold
    ``importer`` (one that holds it is already running)."""
    parts = target.split(".")
    above = {".".join(parts[:i]) for i in range(1, len(parts))}
    ran = {m for m in above if m in known and not importer.startswith(m + ".")}
    return (ran | {target}) - {importer} if target in known else ran


def edges(
    name: str, source: str, *, is_package: bool = False, known: frozenset[str] | None = None
) -> dict[str, list[int]]:
    """Module of the package -> the lines of ``source`` (module ``name``) whose import runs it; the allowed upward
    import (:data:`UPWARD`) left out, with what it runs."""
    known = module_names() if known is None else known
    found: dict[str, list[int]] = defaultdict(list)
    for target, _, line, _ in imports(name, source, is_package=is_package, known=known):
        if target in known and (name, target) not in UPWARD:
            for module in runs(name, target, known):
                found[module].append(line)
    return dict(found)


@cache
def import_graph(*, allowed: bool = False) -> dict[str, dict[str, list[int]]]:
    """Module -> the package's modules it runs by an import, each with the lines of those imports; ``allowed``: the
    upward import of :data:`UPWARD` included."""
    known = module_names()
    graph = {}
    for name, path in modules():
        graph[name] = edges(name, path.read_text(), is_package=path.name == "__init__.py", known=known)
        if allowed:
            for importer, imported in UPWARD:
                if importer == name:
                    graph[name].update({m: [0] for m in runs(name, imported, known)})
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_finder_sees_a_circle_and_a_chain_is_none():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert sorted(circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}})) == [["a", "b"], ["c", "d"]]


def test_an_import_runs_the_packages_above_it_and_every_kind_of_import_counts():
    """``from attnzoo.export.quantize.options import X`` outside ``attnzoo.export`` runs ``attnzoo.export`` and
    ``attnzoo.export.quantize`` too; inside ``attnzoo.export`` only the quantize package and the module; an import
    inside a function, under ``TYPE_CHECKING`` or by ``lazy_import`` counts as one at the top."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from attnzoo.export.quantize.options import QuantizeOptions\n"
        "if TYPE_CHECKING:\n    from attnzoo.export.formats import base\n"
        "def f():\n    from attnzoo.runtime import schemas\n"
        'pipeline = lazy_import("attnzoo.export.pipeline")\n'
    )
    found = edges("attnzoo.runtime.probe", source)
    assert found == {
        "attnzoo.export": [2, 4, 7],
        "attnzoo.export.quantize": [2],
        "attnzoo.export.quantize.options": [2],
        "attnzoo.export.formats": [4],
        "attnzoo.export.formats.base": [4],
        "attnzoo.runtime.schemas": [6],
        "attnzoo.export.pipeline": [7],
    }
    inside = edges("attnzoo.export.formats.probe", source)
    assert "attnzoo.export" not in inside and "attnzoo.export.formats" not in inside
    assert {"attnzoo.export.quantize", "attnzoo.export.formats.base"} <= set(inside)


def test_a_package_face_imported_back_by_its_module_is_a_circle():
    """The TensorRT target's face imports its backend; a backend importing the face (to reach the builder through
    it) closes a circle, as an import of the backend from outside would run it."""
    graph = {name: set(targets) for name, targets in import_graph().items()}
    assert circles(graph) == []
    graph["attnzoo.targets.tensorrt.backend"] |= set(
        edges("attnzoo.targets.tensorrt.backend", "from attnzoo.targets import tensorrt as rt\n")
    )
    assert ["attnzoo.targets.tensorrt", "attnzoo.targets.tensorrt.backend"] in circles(graph)


def test_the_one_allowed_circle_is_the_zoo_registration():
    """With the upward import of ``attnzoo.models`` counted, its circle is the only one (so the allowance is still
    needed, and the graph sees it)."""
    graph = {name: set(targets) for name, targets in import_graph(allowed=True).items()}
    found = circles(graph)
    assert len(found) == 1 and {"attnzoo.models", "attnzoo.zoo.hub"} <= set(found[0]), found


def test_no_module_imports_itself_back():
    graph = import_graph()
    found = circles({name: set(targets) for name, targets in graph.items()})
    lines = [
        f"{a} -> {b} (line {', '.join(map(str, graph[a][b]))})"
        for circle in found
        for a in circle
        for b in circle
        if b in graph.get(a, {})
    ]
    assert found == [], "\n".join(lines)
