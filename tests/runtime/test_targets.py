"""The deployment targets: the built-in folders found by discovery, installed ones by entry point, and the backend
registry read from them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

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


def test_the_onnx_reference_is_asked_of_the_registry_and_is_onnx_runtimes_cpu_backend(monkeypatch):
    """The layers below the targets reach ONNX Runtime's CPU session through ``onnx_reference()``: the backend named
    ``ONNX_REFERENCE``, which the ``onnxruntime`` target holds; a backend without an untuned session is refused."""
    reference = backends_mod.onnx_reference()
    assert reference is get_backend(backends_mod.ONNX_REFERENCE)
    assert [b.name for b in get_target("onnxruntime").backends] == ["ort-cpu", "ort-cuda", "ort-trt"]
    assert any(b is reference for b in get_target("onnxruntime").backends)
    monkeypatch.setitem(backends_mod._REGISTRY, backends_mod.ONNX_REFERENCE, backends_mod.Backend("ort-cpu", "bare"))
    with pytest.raises(TypeError, match="ort-cpu offers no untuned session: it cannot be the ONNX reference"):
        backends_mod.onnx_reference()


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


# ------------------------------------------------------------------------------ a new target is one folder
#: A whole deployment target in one folder: a backend (ONNX Runtime underneath, as a new runtime would wrap its own
#: library), an export format with an option of its own, its report kind. Installed by an entry point only.
TOY = {
    "__init__.py": """
        from attnzoo.runtime.targets import Target

        from .backend import TOY_BACKEND
        from .options import LEVEL

        TARGET = Target(
            "toy",
            "Toy",
            "the verified ONNX copied to a .toy file, run by ONNX Runtime",
            backends=(TOY_BACKEND,),
            formats={"toy": "tt_toy.format:FORMAT"},
            options=(LEVEL,),
        )
        """,
    "options.py": """
        from attnzoo.runtime.targets import FormatOption

        LEVEL = FormatOption("toy_level", owner="toy", help="--format toy: how toy it is", default=1, kind=int)
        """,
    "backend.py": """
        from dataclasses import dataclass

        from attnzoo.runtime.backends import Backend, Session, get_backend


        class ToySession(Session):
            def __init__(self, inner):
                self.backend, self.inner = "toy", inner

            def run(self, x):
                return self.inner.run(x)

            def release(self):
                self.inner.close()


        @dataclass(frozen=True)
        class ToyBackend(Backend):
            def open(self, model, options):
                ort = get_backend("ort-cpu")
                return ToySession(ort.load(model, ort.options(threads=options.threads)))


        TOY_BACKEND = ToyBackend("toy", "a .toy file on ONNX Runtime", reads=("threads",), library="onnxruntime")
        """,
    "format.py": """
        import shutil

        from attnzoo.export.formats import ExportFormat
        from attnzoo.runtime.backends import check_against_reference

        from .backend import TOY_BACKEND
        from .options import LEVEL


        class ToyFormat(ExportFormat):
            name, title, suffixes, options = "toy", "toy file", (".toy",), (LEVEL,)
            in_variant_report = "quick"  # report-variant writes and verifies it for every variant, --quick too

            def steps(self, req):
                return [("toy", self.write)]

            def write(self, req, result):
                shutil.copyfile(result.onnx_path, result.path)
                with TOY_BACKEND.load(result.path) as session:
                    check_against_reference(session, result.path)  # its parity, or one ValueError line
                result.parts.append(("toy level", req.option(LEVEL)))

            def files(self, result):
                return [result.path]

            def summary(self, result):
                return [f"{result.path}: toy file, level {result.parts[-1][1]}, parity checked"]


        FORMAT = ToyFormat()
        """,
}


def _install_toy(root: Path) -> None:
    """:data:`TOY` as an installed package ``tt_toy`` with its ``attnzoo.targets`` entry point: its folder and the
    entry point are every file written for it, and no module of the package names it (``_assert_one_folder``)."""
    (root / "tt_toy").mkdir()
    for name, code in TOY.items():
        (root / "tt_toy" / name).write_text(textwrap.dedent(code))
    info = root / "tt_toy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tt_toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[attnzoo.targets]\ntoy = tt_toy\n")
    _assert_one_folder(root)


#: The package's folders (``pyproject.toml``'s package-dir), where an edit for the toy would be one outside its folder.
PACKAGE_FOLDERS = sorted(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
)


def _assert_one_folder(root: Path) -> None:
    """The toy is its folder and its entry point and nothing else: the only files written for it, and no module of the
    package names it (a list, a branch or an import added for it would be an edit outside its folder)."""
    written = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert written == sorted(
        [f"tt_toy/{name}" for name in TOY] + ["tt_toy-0.1.dist-info/METADATA", "tt_toy-0.1.dist-info/entry_points.txt"]
    ), written
    named = subprocess.run(
        ["git", "grep", "-I", "-l", "-w", "-e", "toy", "-e", "tt_toy", "--", *PACKAGE_FOLDERS],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert named.returncode == 1 and not named.stdout, f"package files name the toy target: {named.stdout}"


def _run(root: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(ROOT)]), "ATTNZOO_CACHE": str(root / "c")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)


def test_a_new_target_is_listed_and_its_options_are_flags(tmp_path, monkeypatch, fresh_registries):
    _install_toy(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = _run(tmp_path, sys.executable, "-m", "attnzoo.runtime", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert (
        "| `toy` | the verified ONNX copied to a .toy file, run by ONNX Runtime | `toy` | `toy` | yes |" in out.stdout
    )
    assert "| `toy` | - | verified ONNX | cpu | fp32 | yes |" in out.stdout
    import attnzoo.export.formats as formats_mod
    from attnzoo.errors import UsageError
    from attnzoo.export import export_model
    from attnzoo.export.cli import build_parser

    monkeypatch.setattr(formats_mod, "_REGISTRY", {})
    assert "toy" in formats_mod.formats()
    from attnzoo.report.formats import report_formats

    # marked for the variant report: after the built-in targets' formats, in --quick too
    assert report_formats() == ("openvino", "executorch", "toy") and report_formats(quick=True) == ("openvino", "toy")
    help_text = build_parser().format_help()
    assert "--toy-level" in help_text and "--format toy:" in help_text
    with pytest.raises(UsageError, match=r"^--toy-level applies to --format toy only$"):
        export_model("belief2", random_init=True, toy_level=2)
    for name in [m for m in sys.modules if m == "tt_toy" or m.startswith("tt_toy.")]:
        sys.modules.pop(name)


@pytest.mark.slow
def test_a_new_target_is_exported_with_its_parity_and_timed(tmp_path):
    """With no edit outside its folder: ``export-model --format toy`` writes and checks it, ``bench-latency
    --backends toy`` times it against eager."""
    _install_toy(tmp_path)
    out = _run(
        tmp_path,
        sys.executable,
        "-m",
        "attnzoo.export.cli",
        "--variant=belief2",
        "--random-init",
        "--format=toy",
        "--toy-level=3",
        "--batch-sizes=1",
        "--out=b2.toy",
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "b2.toy").read_bytes() == (tmp_path / "b2.onnx").read_bytes()
    assert "b2.toy: toy file, level 3, parity checked" in out.stdout
    bench = _run(
        tmp_path,
        sys.executable,
        "-m",
        "attnzoo.benchmarks.cli",
        "--variants=standard",
        "--backends=eager,toy",
        "--batch-sizes=1",
        "--min-time=0.05",
        "--threads=1",
        "--out=bench",
        "--no-progress",
    )
    assert bench.returncode == 0, bench.stderr
    rows = json.loads((tmp_path / "bench" / "results.json").read_text())["results"]
    toy = [r for r in rows if r["backend"] == "toy"]
    assert toy and all(r["median_ms"] > 0 for r in toy), toy


#: report-variant's export side of one variant with the toy marked for the report, rendered into a report page: the
#: export side through its library call (fp32 and the report's formats only, as ``--quick`` asks for the variant),
#: the page from a committed report with that side in place of its own (nothing else measured again).
REPORT_TOY = """
import json, shutil, sys
from pathlib import Path

from attnzoo.report.exports import export_side
from attnzoo.report.formats import report_formats
from attnzoo.report.render import write_report
from attnzoo.report.settings import quick_budget

budget = quick_budget()
assert report_formats()[-1] == "toy" and "toy" in budget.formats, (report_formats(), budget.formats)
out = Path("report")
out.mkdir()
source = {"kind": "random-init", "arch": "micro", "task": "cls"}
side = export_side("belief2", source, out / "exports" / "belief2", out, budget, ("fp32", "toy"))
report = json.loads(Path(sys.argv[1]).read_text())
report["export"]["belief2"] = {**side, "onnx_path": "exports/belief2/belief2.onnx"}
report["budget"] = {**report["budget"], "formats": list(budget.formats)}
write_report(report, out, replot=False)
print(json.dumps({"side": side["toy"], "kept": side["extra_math_kept"], "verdict": report["verdict"]}))
"""


@pytest.mark.slow
def test_a_new_target_marked_for_the_variant_report_is_written_and_shown_by_report_variant(tmp_path):
    """With no edit outside its folder: a format whose ``in_variant_report`` is set is exported and verified on
    report-variant's export side, its extra math counted, and it has its row in ``report.md``, its state in the
    verdict and the table of checks."""
    _install_toy(tmp_path)
    committed = ROOT / "results" / "variant-reports" / "belief2" / "report.json"
    done = _run(tmp_path, sys.executable, "-c", REPORT_TOY, str(committed), timeout=600)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    toy = got["side"]
    assert toy["status"] == "ok" and toy["passed"] is True and toy["file"] == "exports/belief2/belief2.toy", toy
    assert (tmp_path / "report" / toy["file"]).is_file()
    assert toy["max_abs_err"] < 1e-3 and toy["extra_math"]["ok"] is True and toy["extra_math"]["scopes"] > 0, toy
    assert got["kept"]["toy"] is True and got["verdict"]["states"]["toy"] == "passed", got
    assert got["verdict"]["checks"]["toy"] is True and "toy file ok" in got["verdict"]["line"], got["verdict"]
    page = (tmp_path / "report" / "report.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| toy file: parity with eager fp32 |"))
    assert "extra math kept" in row and "passed: max abs err" in row, row
    assert "| toy | yes |" in page
