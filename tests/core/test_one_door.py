"""Deployment code goes through one door: the backend registry (``attnzoo.runtime.backends``).

Outside the backend registry (``runtime/backends/``) and the targets that make backends (``targets/``: each
technology's folder, its own room), no module compares a string against a registered backend name or alias (a caller
acts on a backend's fact, :class:`~attnzoo.runtime.backends.Backend`'s attributes, never on its name), and none
builds a runtime session itself (an ONNX Runtime ``InferenceSession``, an OpenVINO compiled model, a TensorRT
runtime): it asks ``get_backend(name).load(model, LoadOptions(...))``. The scan reads every module of the folders
``pyproject.toml``'s package-dir maps, and allows no site: a string that means something else (a Triton platform, an
export format, a training setting) is an object of its own domain asked for its facts, not a bare name.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import tomllib

from attnzoo.runtime.backends import backends

ROOT = Path(__file__).resolve().parents[2]
#: Folders of ``[tool.setuptools.package-dir]``, the table the build uses.
FOLDERS: tuple[str, ...] = tuple(
    sorted(set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()))
)
#: Where backends are made: the registry and the targets' folders, the places that may name them and build sessions.
INSIDE = ("runtime/backends/", "targets/")
#: Every registered backend's name and aliases.
NAMES: frozenset[str] = frozenset(n for b in backends() for n in (b.name, *b.aliases))
#: Calls that build a runtime session directly (the function's or method's own name).
SESSION_CALLS: frozenset[str] = frozenset(
    {
        "InferenceSession",  # onnxruntime
        "compile_model",  # OpenVINO's Core
        "compile_onnx",  # attnzoo.targets.openvino's compiled model
        "OpenVINOSession",
        "ort_session",
        "cpu_session",
        "tuned_cpu_session",
        "naive_cpu_session",
        "deserialize_cuda_engine",  # TensorRT
    }
)


def _literal_names(node: ast.AST) -> list[str]:
    """Backend names among the string literals of ``node`` (a constant, or a tuple / list / set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in NAMES else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for elt in node.elts for n in _literal_names(elt)]
    return []


def _is_name_prefix(node: ast.AST) -> bool:
    """A literal (or tuple of them) that a backend's name or alias starts with (``"ort"``, ``"onnx"``, ``"tensor"``)."""
    values = node.elts if isinstance(node, ast.Tuple) else [node]
    return any(
        isinstance(v, ast.Constant)
        and isinstance(v.value, str)
        and len(v.value) >= 3
        and any(n.startswith(v.value) for n in NAMES)
        for v in values
    )


def _call_name(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _is_trt_runtime(node: ast.Call) -> bool:
    """``trt.Runtime(...)`` / ``tensorrt.Runtime(...)`` / ``rt.Engine(...)``: a TensorRT runtime or engine made
    outside a backend."""
    f = node.func
    return (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Name)
        and (f.attr, f.value.id) in {("Runtime", "trt"), ("Runtime", "tensorrt"), ("Engine", "rt")}
    )


def scan(source: str) -> list[tuple[int, str]]:
    """Every site of ``source`` that goes around the registry: (line, what)."""
    hits: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                for name in _literal_names(operand):
                    hits.append((node.lineno, f"compares the backend name {name!r}"))
        elif isinstance(node, ast.Call):
            called = _call_name(node.func)
            if called in ("startswith", "endswith") and node.args and _is_name_prefix(node.args[0]):
                hits.append((node.lineno, f"tests a backend name with .{called}({ast.unparse(node.args[0])})"))
            elif called in SESSION_CALLS or _is_trt_runtime(node):
                hits.append((node.lineno, f"builds a session itself: {ast.unparse(node.func)}(...)"))
    return sorted(hits)


def modules() -> list[Path]:
    """Every module of the package folders outside :data:`INSIDE` (links not followed)."""
    found = []
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(ROOT / folder):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for f in sorted(filenames):
                path = Path(dirpath, f)
                rel = path.relative_to(ROOT).as_posix()
                if f.endswith(".py") and not rel.startswith(INSIDE):
                    found.append(path)
    return found


def test_scanner_finds_what_goes_around_the_registry():
    planted = (
        "import onnxruntime as ort\n"
        "def f(backend, b):\n"
        "    if backend == 'eager':\n"
        "        pass\n"
        "    if b.name in ('ort-cpu', 'x'):\n"
        "        pass\n"
        "    if b.name.startswith('ort'):\n"
        "        pass\n"
        "    s = ort.InferenceSession('m.onnx')\n"
        "    c = ov.Core().compile_model(m, 'CPU')\n"
        "    e = trt.Runtime(logger)\n"
        "    return cpu_session(p, 1), ort_session(p), OpenVINOSession(p)\n"
        "r, g = rt.Engine(blob, lib), ov.compile_onnx(p, threads=1)\n"
    )
    lines = [line for line, _ in scan(planted)]
    assert lines == [3, 5, 7, 9, 10, 11, 12, 12, 12, 13, 13]
    # what is not a backend name, or not a comparison of one, is not a site
    assert scan("x == 'fp32'\ny = {'eager': 1}\nget_backend(name).load(m)\nz = s.startswith('op')\n") == []


def test_no_module_goes_around_the_registry():
    scanned = modules()
    problems = [f"{p.relative_to(ROOT)}:{line} {what}" for p in scanned for line, what in scan(p.read_text())]
    assert scanned, "no module scanned: the package folders moved?"
    assert not problems, "act on a backend's fact or load through get_backend:\n" + "\n".join(problems)
