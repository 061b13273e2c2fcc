"""The README's sentence on skipped tests names every reason a test of the suite skips for. Each kind of
tests/skips.py is named in the sentence; every skip reason written out anywhere in tests/ (conftest files and
helper modules included) falls under a kind; and a skip that happens for a reason of no kind fails its test,
wherever it was made: tests/skips.py's plugin reads the reason pytest reports, in every run."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import skips

ROOT = Path(__file__).resolve().parents[2]


def _sentence() -> str:
    readme = " ".join((ROOT / "README.md").read_text().split())
    return readme[readme.index("A test skips only") :].split(". ")[0]


def _dotted(node: ast.expr) -> str:
    """``pytest.mark.skipif`` for that attribute chain ('' for anything else)."""
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _text(node: ast.expr | None) -> str | None:
    """A reason written out: a string, or an f-string with ``{...}`` for its values; ``None`` for one computed at
    run time (the plugin sees that one when it skips)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    return None


def _written_reasons() -> list[tuple[str, str]]:
    """``(file:line, reason)`` of every skip in tests/ whose reason is written out: ``pytest.skip(...)``,
    ``pytest.mark.skip(reason=...)``, ``pytest.mark.skipif(..., reason=...)`` and ``pytest.importorskip(module)``
    (whose reason names the module), in every Python file: tests, conftest files and helpers."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            name, kwargs = _dotted(node.func), {k.arg: k.value for k in node.keywords}
            if name.endswith("importorskip") and node.args and (module := _text(node.args[0])):
                reason: str | None = f"could not import {module!r}"
            elif name.endswith(("pytest.skip", "mark.skip")):
                reason = _text(kwargs.get("reason") or (node.args[0] if node.args else None))
            elif name.endswith("mark.skipif"):
                reason = _text(kwargs.get("reason"))
            else:
                continue
            if reason is not None:
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", reason))
    return found


def test_every_kind_is_named_in_the_readme_sentence():
    sentence = _sentence()
    for words in skips.KINDS.values():
        assert " ".join(words.split()) in sentence, words  # a kind of skip the README does not name


def test_every_reason_written_in_tests_falls_under_a_kind():
    """The skips that do not happen on this machine (a GPU's, a CPU with bf16 units') are held by their text."""
    written = _written_reasons()
    assert len(written) > 15
    unnamed = [(where, reason) for where, reason in written if skips.kind_of(reason) is None]
    assert not unnamed, unnamed  # a new kind of skip: name it in README.md's sentence and in tests/skips.py


def test_this_run_holds_its_skips_to_the_sentence(request):
    assert request.config.pluginmanager.get_plugin("attnzoo-readme-skips") is skips


def test_a_skip_made_in_a_conftest_or_a_helper_is_held_by_the_reason_it_gives(tmp_path):
    """A fixture of a conftest and a marker of a helper module skip for reasons no kind names: both tests fail
    (at their setup, where the skip is made), naming the reason; a conftest fixture's skip for a GPU stays a skip,
    and an xfail is not a skip."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "helper.py").write_text(
        'import pytest\n\nneeds_board = pytest.mark.skipif(True, reason="the frobnicator board is absent")\n'
    )
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.fixture
            def dongle():
                pytest.skip("needs a licence dongle")

            @pytest.fixture
            def gpu():
                pytest.skip("needs an NVIDIA GPU; none is visible")
            """
        )
    )
    (tmp_path / "test_held.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from helper import needs_board

            def test_dongle(dongle):
                pass

            @needs_board
            def test_board():
                pass

            def test_gpu(gpu):
                pass

            @pytest.mark.xfail(reason="known")
            def test_known():
                assert False
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.skips", "-p", "no:cacheprovider", "-rA", "-q", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "1 skipped, 1 xfailed, 2 errors" in out, out  # a skip at setup fails as an error of the setup
    for name, reason in (("test_dongle", "needs a licence dongle"), ("test_board", "the frobnicator board is absent")):
        assert f"ERROR test_held.py::{name}" in out, out
        assert f"does not name: {reason!r}" in out, out
    assert "SKIPPED [1] test_held.py:12: needs an NVIDIA GPU; none is visible" in out, out


@pytest.mark.parametrize(
    "reason",
    [
        "running a TensorRT engine needs an NVIDIA GPU and none is visible (tensorrt_rtx 1.7 can only build engines)",
        "could not import 'ray.exceptions': No module named 'ray'",
        "openvino is not installed (pip install openvino)",
        "ExecuTorch is not installed (pip install 'attnzoo[executorch]')",
        "ruff is not installed (pip install -e '.[dev]' installs it)",
        "needs a CPU without bf16 units (avx512_bf16, AMX), to check the refusal there; this CPU has them",
    ],
)
def test_the_reasons_computed_at_run_time_fall_under_a_kind(reason):
    """What the library's own checks say where a skip passes their reason on (tests/export, tests/core)."""
    assert skips.kind_of(reason) is not None
