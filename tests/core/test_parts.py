"""The package is made of parts: precisions are objects (:mod:`attnzoo.runtime.precision`), formats do not call
each other, and no function grows past :data:`MAX_LINES` lines of code (its docstring aside) in any folder of the
package, the studies (``research/``) or the evaluation scripts (``evaluation/``).

The precision scan looks for a comparison of something named ``dtype`` with a precision's name (``dtype == "fp16"``,
``req.dtype in ("int8", "fp8")``) in ``export/`` and the targets' format modules: such a fact belongs to the
:class:`Precision`. The sites that are a format's own rule, not a precision's fact, are listed in :data:`ALLOWED`;
the list may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import pytest
import tomllib
from onnx import TensorProto, helper, numpy_helper

from attnzoo.export.cli import build_parser
from attnzoo.runtime.fp8 import simulate_fp8
from attnzoo.runtime.precision import PRECISIONS, QUANTIZED, TRACED, get_precision

ROOT = Path(__file__).resolve().parents[2]
EXPORT = ROOT / "export"
#: Longest function in lines of code (its docstring aside).
MAX_LINES = 60
#: The folders the size rule reads: every package folder (``pyproject.toml``'s ``[tool.setuptools.package-dir]``,
#: the table the build uses), the studies and the evaluation scripts.
SIZED_FOLDERS: tuple[str, ...] = (
    *dict.fromkeys(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()),
    "research",
    "evaluation",
)
#: Format rules that name a precision: file -> count. Only ever lower an entry.
ALLOWED: dict[str, int] = {
    "export/quantize/options.py": 2,  # a dynamic-int8 format (ExecuTorch) quantizes int8 itself and nothing else
    "targets/executorch/format.py": 1,  # its report names its dynamic int8
    "targets/aoti/format.py": 1,  # AOTInductor compiles fp16 for CUDA only
}


def _code_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = fn.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1
    start = body[1].lineno if has_doc and isinstance(body[0].value.value, str) else body[0].lineno
    return fn.end_lineno - start + 1  # type: ignore[operator]


def long_functions(source: str) -> list[tuple[str, int]]:
    """Every function of ``source`` over :data:`MAX_LINES` lines of code: (name, lines)."""
    return [
        (n.name, _code_lines(n))
        for n in ast.walk(ast.parse(source))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(n) > MAX_LINES
    ]


def _names_dtype(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and "dtype" in node.id) or (
        isinstance(node, ast.Attribute) and "dtype" in node.attr
    )


def _precision_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in PRECISIONS else []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for elt in node.elts for n in _precision_names(elt)]
    return []


def precision_branches(source: str) -> list[int]:
    """Lines of ``source`` that compare a ``dtype`` with a precision's name."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_dtype(o) for o in operands) and any(_precision_names(o) for o in operands):
                hits.append(node.lineno)
    return sorted(hits)


def _sources() -> dict[str, str]:
    """Every module of ``export/``, and each target's format module (the formats written from the export layer)."""
    paths = sorted({*EXPORT.rglob("*.py"), *(ROOT / "targets").glob("*/format.py")})
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths}


def test_the_scans_find_what_they_look_for():
    body = "\n".join(f"    x = {i}" for i in range(MAX_LINES))
    assert long_functions(f'def f():\n    """Doc."""\n{body}\n') == []  # the docstring does not count
    assert long_functions(f"def f():\n{body}\n    return x\n") == [("f", MAX_LINES + 1)]
    planted = "if dtype == 'fp16':\n    pass\nif req.dtype in ('int8', 'fp8'):\n    pass\ny = x == 'fp16'\n"
    assert precision_branches(planted) == [1, 3]
    assert precision_branches("if get_precision(dtype).half:\n    pass\nif fmt == 'tensorrt':\n    pass\n") == []


def _sized_sources() -> dict[str, str]:
    """Every module of :data:`SIZED_FOLDERS`, by its path from the root."""
    paths = sorted({p for folder in SIZED_FOLDERS for p in (ROOT / folder).rglob("*.py")})
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths}


def test_the_size_rule_reads_every_folder():
    sources = _sized_sources()
    for folder in ("export", "models", "runtime", "targets", "benchmarks", "report", "serve", "training", "research"):
        assert any(rel.startswith(folder + "/") for rel in sources), f"the size rule reads no module of {folder}/"
    assert "evaluation/independent_check.py" in sources and len(sources) > 150


def test_no_function_is_over_the_limit():
    found = {f"{rel}:{name}": n for rel, src in _sized_sources().items() for name, n in long_functions(src)}
    long = [f"{where} ({n} lines)" for where, n in sorted(found.items())]
    assert not long, f"split these into parts of at most {MAX_LINES} lines:\n" + "\n".join(long)


def test_export_asks_the_precision_instead_of_naming_it():
    problems = []
    for rel, src in _sources().items():
        hits, allowed = precision_branches(src), ALLOWED.get(rel, 0)
        if len(hits) != allowed:
            problems.append(
                f"{rel}: {len(hits)} comparison(s) of a dtype with a precision's name at {hits}, {allowed} allowed"
            )
    assert not problems, "ask attnzoo.runtime.precision.get_precision(dtype) for the fact:\n" + "\n".join(problems)


def _format_modules() -> list[Path]:
    """Every format's module: those of ``export/formats/`` and each target's ``format.py``."""
    return sorted([*(EXPORT / "formats").glob("*_format.py"), *(ROOT / "targets").glob("*/format.py")])


def test_formats_compose_parts_and_do_not_import_each_other():
    formats = _format_modules()
    assert len(formats) >= 6
    for path in formats:
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        others = sorted(
            m for m in imported if m.split(".")[-1] == "format" or (m.endswith("_format") and not m.endswith(path.stem))
        )
        assert not others, f"{path.relative_to(ROOT)} imports {others}: share a step module instead"


def test_the_precisions_and_their_facts():
    assert TRACED == ("fp32", "fp16") and QUANTIZED == ("int8", "fp8")
    fp32, fp16, int8, fp8 = (get_precision(n) for n in ("fp32", "fp16", "int8", "fp8"))
    assert [p.file_tag for p in (fp32, fp16, int8, fp8)] == ["", "_fp16", "_int8", "_fp8"]
    assert fp16.half and not fp32.half and not int8.half
    assert fp16.fp32_ops == ("LayerNormalization", "Softmax") and fp32.fp32_ops == ()
    assert fp32.same_top1 and not fp16.same_top1
    # a quantized engine is compared with ONNX Runtime's Q/DQ graph under the int8 entry; FP8 runs on the CPU
    # runtimes only through its simulation, needs SM 8.9 to build, and is not SmoothQuant's default
    assert (int8.parity_key, fp8.parity_key) == ("int8", "int8")
    assert int8.cpu_runtimes and not fp8.cpu_runtimes and int8.smooth_quant and not fp8.smooth_quant
    assert fp8.min_compute_capability == (8, 9) and int8.min_compute_capability is None
    with pytest.raises(ValueError, match="unknown dtype 'bf16'; valid: fp32, fp16, int8, fp8"):
        get_precision("bf16")
    # export-model offers exactly these
    dtype = next(a for a in build_parser()._actions if a.dest == "dtype")
    assert tuple(dtype.choices) == tuple(PRECISIONS)


def test_only_a_simulated_precision_rewrites_the_graph_onnx_runtime_runs():
    """FP8's ONNX Runtime graph is :func:`simulate_fp8`'s (no float8 tensor left); every other precision's graph
    is the file's own."""
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    zp = helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, [], [0.0])
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
            helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [scale, zp],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    assert get_precision("int8").ort_graph(proto) is proto
    simulated = get_precision("fp8").ort_graph(proto)
    assert simulated.SerializeToString() == simulate_fp8(proto).SerializeToString()
    assert [n.op_type for n in simulated.graph.node] == ["Div", "Cast", "Cast", "Mul"]
    assert all(t.data_type != TensorProto.FLOAT8E4M3FN for t in simulated.graph.initializer)
    onnx.checker.check_model(simulated)


# ------------------------------------------------------------------ one job a room: module and class sizes
#: Longest package module, in physical lines (``wc -l``), and longest class (its ``class`` line to its last).
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
#: Modules over :data:`MAX_MODULE_LINES` today, each to be split by concern: path -> its lines when listed. The
#: list may only shrink: a module listed must still be over the limit (remove it once it is split), and a module
#: not listed must be within it.
PENDING_MODULES: dict[str, int] = {}
#: Classes over :data:`MAX_CLASS_LINES` today, as ``path:name`` -> lines when listed; the same rules.
PENDING_CLASSES: dict[str, int] = {}


def _package_modules() -> dict[str, str]:
    """Every tracked module of the package's folders (``pyproject.toml``'s package-dir) and of ``research/``."""
    import subprocess

    import tomllib

    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", *(f"{f}/*.py" for f in sorted(folders | {"research"}))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    paths = [ROOT / rel for rel in sorted(set(listed) - {""})]
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths if p.is_file() and not p.is_symlink()}


def oversized(sources: dict[str, str]) -> tuple[dict[str, int], dict[str, int]]:
    """The modules of ``sources`` over :data:`MAX_MODULE_LINES` (path -> physical lines, as ``wc -l`` counts
    them) and their classes over :data:`MAX_CLASS_LINES` (``path:name`` -> lines)."""
    modules, classes = {}, {}
    for rel, src in sources.items():
        if src.count("\n") > MAX_MODULE_LINES:
            modules[rel] = src.count("\n")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:  # type: ignore[operator]
                classes[f"{rel}:{node.name}"] = node.end_lineno - node.lineno + 1  # type: ignore[operator]
    return modules, classes


def _size_problems(found: dict[str, int], pending: dict[str, int], limit: int, what: str) -> list[str]:
    """A line for each of ``found`` (over ``limit``) not in ``pending``, and for each of ``pending`` no longer over."""
    new = [
        f"{name}: {n} lines, over the {limit}-line limit for a {what}: split it"
        for name, n in found.items()
        if name not in pending
    ]
    return new + [
        f"{name}: listed in PENDING, now within the limit: remove it from the list"
        for name in pending
        if name not in found
    ]


def test_the_size_scan_finds_long_modules_and_classes():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_CLASS_LINES))  # the class line and these: one too many
    modules, classes = oversized({"m.py": f"class C:\n{body}", "ok.py": "x = 1\n" * MAX_MODULE_LINES})
    assert classes == {"m.py:C": MAX_CLASS_LINES + 1} and modules == {}
    modules, _ = oversized(
        {"big.py": "x = 1\n" * (MAX_MODULE_LINES + 1), "last.py": "x = 1\n" * MAX_MODULE_LINES + "y"}
    )
    assert modules == {"big.py": MAX_MODULE_LINES + 1}  # a last line without a newline is not counted, as by wc -l
    assert _size_problems({"a.py": 700}, {"b.py": 650}, MAX_MODULE_LINES, "module") == [
        "a.py: 700 lines, over the 600-line limit for a module: split it",
        "b.py: listed in PENDING, now within the limit: remove it from the list",
    ]


def test_every_module_and_class_is_within_its_size_limit():
    """No package module over :data:`MAX_MODULE_LINES` lines and no class over :data:`MAX_CLASS_LINES`, but those
    listed in :data:`PENDING_MODULES` and :data:`PENDING_CLASSES`, which must still be over it."""
    sources = _package_modules()
    assert len(sources) > 150 and "serve/loading.py" in sources and any(p.startswith("research/") for p in sources)
    modules, classes = oversized(sources)
    problems = _size_problems(modules, PENDING_MODULES, MAX_MODULE_LINES, "module")
    problems += _size_problems(classes, PENDING_CLASSES, MAX_CLASS_LINES, "class")
    assert not problems, "one job a room:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------------ names that explain themselves
#: Types a one-letter name may hold: a value of the math (a number, a tensor, an array, an index slice, an ONNX
#: Script tensor type or an ONNX IR value, a sequence of numbers), where ``x``, ``q``, ``k``, ``v``, ``h``, ``i`` are
#: the paper's or the kernel's own names.
_VALUE_TYPES = frozenset(
    {"int", "float", "bool", "str", "bytes", "complex", "Any", "Tensor", "ndarray", "slice", "FLOAT", "Value"}
)


def _is_value_type(annotation: ast.expr) -> bool:
    """Whether ``annotation`` names a value of the math (:data:`_VALUE_TYPES`, ``Sequence[float]``, ``X | None``)."""
    if isinstance(annotation, ast.BinOp):  # X | None
        return all(_is_value_type(side) for side in (annotation.left, annotation.right))
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return True
    if isinstance(annotation, ast.Subscript):  # list[float], Sequence[float]: numbers
        return _is_value_type(annotation.slice)
    name = annotation.attr if isinstance(annotation, ast.Attribute) else getattr(annotation, "id", "")
    return name in _VALUE_TYPES


def one_letter_state(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each one-letter name in ``source`` that carries state: a parameter annotated with
    anything but a value of the math (``s: Settings``, ``a: argparse.Namespace``, ``e: Mapping[str, Any]``), and a
    name bound to a new object of a class or to parsed arguments (``p = ArgumentParser(...)``,
    ``a = parser.parse_args()``). Loop indices, comprehension and lambda variables, the math's ``x`` / ``q`` / ``k``
    / ``v`` on tensors and type variables (``T = TypeVar("T")``) are not state."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if len(arg.arg) == 1 and arg.annotation is not None and not _is_value_type(arg.annotation):
                    found.append((node.lineno, f"parameter {arg.arg}: {ast.unparse(arg.annotation)} of {node.name}"))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Call):
            func = node.value.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("TypeVar", *_VALUE_TYPES) or not (called[:1].isupper() or called.startswith("parse_")):
                continue
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name) and len(target.id) == 1:
                    found.append((node.lineno, f"{target.id} = {called}(...)"))
    return sorted(found)


def _package_sources() -> dict[str, str]:
    """Every module of the package and of the research folder: its path from the root -> its source."""
    from .test_layers import modules

    return {str(path.relative_to(ROOT)): path.read_text() for _, path in modules()}


def test_the_one_letter_scan_finds_state_and_leaves_the_math():
    source = (
        "import argparse\n"
        "def run(s: Settings, x: torch.Tensor, n: int, w: Sequence[float], m: float | None = None) -> None:\n"
        "    p = argparse.ArgumentParser()\n"
        "    a = p.parse_args()\n"
        "    T = TypeVar('T')\n"
        "    k = x.shape[-1]\n"
        "    for i in range(n):\n"
        "        pass\n"
        "    return [e for e in a.items]\n"
        "def _label(e: Mapping[str, Any]) -> str:\n"
        "    return e['name']\n"
    )
    assert one_letter_state(source) == [
        (2, "parameter s: Settings of run"),
        (3, "p = ArgumentParser(...)"),
        (4, "a = parse_args(...)"),
        (10, "parameter e: Mapping[str, Any] of _label"),
    ]


def test_no_one_letter_name_carries_state():
    """The package's and the research folder's names say what they hold (``settings``, ``args``, ``entry``)."""
    found = [
        f"{path}:{line}: {what}"
        for path, source in _package_sources().items()
        for line, what in one_letter_state(source)
    ]
    assert found == []
