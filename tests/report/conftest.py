"""The one real ``--quick`` report of belief2 that the per-variant and the index tests both read (a quick report
takes about 2 minutes on 2 cores: written once per run)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def belief2_quick(tmp_path_factory) -> tuple[Path, str]:
    """``report-variant --variant belief2 --out <reports>/belief2 --quick`` (the command line the index runs for
    it): its folder and what it printed on stdout."""
    from attnzoo.report.cli import main

    out = tmp_path_factory.mktemp("reports") / "belief2"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["--variant", "belief2", "--out", str(out), "--quick"]) == 0
    return out, buf.getvalue()
