"""How commands start and end: the console scripts run each command through its launcher in ``attnzoo.cli``, so
that a Ctrl-C or SIGTERM while the command's modules still import (torch, ONNX Runtime, Ray: 1-2.5 s) ends it
with one line and 130 / 143 instead of a traceback."""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

from attnzoo import cli

ROOT = Path(__file__).resolve().parents[2]


def test_every_console_script_runs_its_command_through_a_launcher(monkeypatch):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {name: f"attnzoo.cli:{name.replace('-', '_')}" for name in cli.COMMANDS}
    imported = []

    def fake_import(module):
        imported.append(module)
        return SimpleNamespace(main=lambda: 7, evaluate_main=lambda: 8)

    monkeypatch.setattr(cli.importlib, "import_module", fake_import)
    for name, target in cli.COMMANDS.items():
        module, _, function = target.partition(":")
        assert getattr(cli, name.replace("-", "_"))() == (8 if function == "evaluate_main" else 7)
        assert imported[-1] == module
    monkeypatch.undo()
    for target in cli.COMMANDS.values():  # each target is a real command
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function))


def _handles(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (Linux: the ``SigCgt`` mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the signal mask from /proc (Linux)")
@pytest.mark.parametrize("command", ["serve-models", "export-model"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_imports_ends_it_with_one_line(command, sig):
    """The signal is sent as soon as the launcher's handler is in place (Python itself leaves SIGTERM alone), i.e.
    while torch and the rest import: had the import finished, the command would refuse the missing folder."""
    launcher = command.replace("-", "_")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; from attnzoo.cli import {launcher}; sys.exit({launcher}())",
            "--models",
            "/nonexistent/folder",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _handles(proc.pid, signal.SIGTERM):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.002)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    code, line = cli.SIGNAL_EXITS[sig]
    assert (proc.returncode, err.strip().splitlines()) == (code, [line])


_ABANDON = """
import sys, threading
from attnzoo import cli
from attnzoo.signals import abandon

@cli.entry_point
def refuse(argv=None):
    if argv:  # this command gives up on native work (a cancelled build) before its error
        abandon(threading.Thread(target=lambda: None))
    raise cli.UsageError("bad flag")

if sys.argv[1] == "earlier":  # a thread given up on by a library call or an earlier command of this process
    abandon(threading.Thread(target=lambda: None))
try:
    refuse(["abandon"] if sys.argv[1] == "own" else [])
except cli.CommandExit as exc:
    print("returned", exc.code)
"""


@pytest.mark.parametrize("case,returned", [("earlier", True), ("own", False)])
def test_only_a_commands_own_abandoned_work_ends_the_process(case, returned):
    """A command ends with ``os._exit`` only when it gave up on native work itself: a thread abandoned before it
    ran (another command or a library call in the same process, as in a test run) must not make a later
    command's ordinary error end the whole process (a full test run stopped at once with status 2)."""
    done = subprocess.run([sys.executable, "-c", _ABANDON, case], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "error: bad flag", done.stderr
    if returned:
        assert done.returncode == 0 and done.stdout.strip() == "returned 2", (done.stdout, done.stderr)
    else:
        assert done.returncode == 2 and "returned" not in done.stdout, (done.stdout, done.stderr)


def test_a_ray_task_error_says_its_cause_in_the_one_line(capsys):
    """Ray's ``RayTaskError`` starts with a line that only names the failed task and its process; the command's
    one line must also say what went wrong there (an HAProxy that did not start said nothing else)."""
    exceptions = pytest.importorskip("ray.exceptions")
    cause = RuntimeError("HAProxy crashed during startup: [ALERT] cannot bind socket [127.0.0.1:8404]\nmore")
    failed = exceptions.RayTaskError(
        "HAProxyManager.ready", "ray::HAProxyManager.ready() (pid=5999)\nTraceback ...", cause
    ).as_instanceof_cause()

    @cli.entry_point
    def serve(argv=None):
        raise failed

    with pytest.raises(cli.CommandExit) as info:
        serve([])
    assert info.value.code == 1
    assert str(info.value) == (
        "error: RayTaskError(RuntimeError): ray::HAProxyManager.ready() (pid=5999): RuntimeError: "
        "HAProxy crashed during startup: [ALERT] cannot bind socket [127.0.0.1:8404] "
        "(run with --debug for the traceback)"
    )
    assert capsys.readouterr().err.strip() == str(info.value)


def test_quoted_cuts_a_name_to_the_limit_whatever_it_holds():
    from attnzoo.errors import MAX_NAME_SHOWN, quoted

    assert quoted("standard") == "'standard'" and quoted(3) == "3" and quoted("x" * 80) == repr("x" * 80)
    assert quoted("m" * 60_000) == repr("m" * 77 + "...")
    for hostile in ("\x00" * 60_000, "\U0001f600" * 60_000, "'\"\n" * 20_000, ["m" * 60_000]):
        shown = quoted(hostile)
        assert len(shown) <= MAX_NAME_SHOWN + 2 and shown.rstrip("'\"]").endswith("..."), shown


LONG = "v" * 60_000


@pytest.mark.parametrize(
    "module, argv",
    [
        ("attnzoo.export.cli", ["--variant", LONG]),
        ("attnzoo.export.cli", ["--dtype", LONG]),
        ("attnzoo.export.cli", ["--format", LONG]),
        ("attnzoo.benchmarks.cli", ["--variants", LONG]),
        ("attnzoo.benchmarks.cli", ["--batch-sizes", LONG]),
        ("attnzoo.report.cli", ["--variant", LONG]),
        ("attnzoo.serve.demo.cli", ["--backend", LONG]),
    ],
)
def test_a_long_name_on_a_command_line_comes_back_cut(module, argv, capsys):
    """Every error line that echoes a name it was given quotes 80 characters of it at most (attnzoo.errors.quoted),
    argparse's own (``invalid choice: ...``) too."""
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # the command's error line, or argparse's after its usage
    assert info.value.code == 2 and "error: " in line and len(err) < 3000, err[-300:]
    assert "v" * 77 + "..." in line and "v" * 78 not in line, line[:300]


#: Runs one command through its launcher, as its console script does, and prints its exit status and which heavy
#: libraries it had imported by then.
_REFUSAL = """
import json, sys
from attnzoo import cli
command, sys.argv = sys.argv[1], sys.argv[1:]
try:
    code = getattr(cli, command.replace("-", "_"))()
except SystemExit as exc:
    code = exc.code
heavy = ("torch", "timm", "onnx", "onnxruntime", "openvino", "tensorrt", "modelopt", "ray", "gradio")
print(json.dumps({"code": code, "heavy": [m for m in heavy if m in sys.modules]}))
"""


@pytest.mark.parametrize(
    "argv, code, line",
    [
        (["bench-latency", "--batch-sizes", "0"], 2, "error: --batch-sizes must be comma-separated positive integers"),
        (["bench-latency", "--variants", "all", "--batch-sizes", "0"], 2, "error: --batch-sizes must be comma-sep"),
        (["bench-latency", "--variants", "nope"], 2, "error: unknown variant 'nope'; valid: all, anti-wafe-dot, "),
        (["export-model", "--variant", "nope"], 2, "error: unknown variant 'nope'; valid variants: anti-wafe-dot, "),
        (["export-model", "--variant", "belief", "--batch-sizes", "2000"], 2, "error: --batch-sizes: 2000 out of"),
        (["train-model", "--variant", "no_pe", "--epochs", "1"], 2, "error: unknown variant 'no_pe'; valid variants"),
        (["train-model", "--variant", "belief", "--img-size", "9999"], 2, "error: --img-size must be an integer in"),
        (["report-variant", "--variant", "nope"], 2, "error: unknown variant 'nope'; valid: standard, belief, "),
        (["serve-models", "--variants", "standard,nope"], 2, "error: unknown variant 'nope'; valid variants: "),
        (["serve-models", "--arch", "huge"], 2, "error: unknown arch 'huge'; valid: micro, micro-conv, tiny"),
        (["evaluate-model", "."], 1, "error: .: is a directory, not a checkpoint"),
    ],
)
def test_a_bad_command_line_is_refused_before_anything_heavy_is_imported(argv, code, line):
    """docs/errors.md: a bad command line is refused before anything is loaded. Each command checks its names
    (variants against ``attnzoo.modelconfig``'s list, not the registry) and bounds before it imports torch, onnx,
    ONNX Runtime, Ray or Gradio, so the refusal costs the interpreter's start and a few light modules on any
    machine, whatever its load: one line, the exit status, and none of them imported. (With a variant plugin
    installed an unknown variant name waits for the registry, which runs the plugin: that needs torch.)"""
    from attnzoo.modelconfig import plugins_installed

    done = subprocess.run(
        [sys.executable, "-c", _REFUSAL, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == code and done.stderr.strip().splitlines()[:1] == done.stderr.strip().splitlines()
    assert done.stderr.startswith(line), done.stderr
    if not (plugins_installed() and "variant" in line):
        assert result["heavy"] == [], result
