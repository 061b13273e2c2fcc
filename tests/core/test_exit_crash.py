"""A native crash after pytest's summary (a library's teardown at exit) names its stack (tests/conftest.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CRASH_AT_EXIT = """
import atexit
import ctypes


def _teardown_that_crashes():
    ctypes.string_at(0)  # reads address 0: SIGSEGV while the interpreter exits


def test_passes():
    atexit.register(_teardown_that_crashes)
"""


def _run(tmp_path: Path, *plugins: str) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_crash_at_exit.py").write_text(CRASH_AT_EXIT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONFAULTHANDLER", None)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugins, "test_crash_at_exit.py"]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_crash_in_teardown_after_the_summary_prints_its_stack(tmp_path):
    with_hook = _run(tmp_path, "-p", "tests.conftest")
    assert with_hook.returncode == -11, with_hook.stdout + with_hook.stderr
    assert "1 passed" in with_hook.stdout
    assert "Fatal Python error: Segmentation fault" in with_hook.stderr
    assert "_teardown_that_crashes" in with_hook.stderr

    plain = _run(tmp_path)  # pytest alone: the same crash, and not a word about it
    assert plain.returncode == -11
    assert "Fatal Python error" not in plain.stderr
