"""Modules renamed for what they hold keep their old names for one release, as timm keeps ``timm.models.layers``:
importing an old name warns (``DeprecationWarning``, naming the new module) and gives the new module's objects, the
same objects, and an old ``python -m`` command still runs, with the same output."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Old module -> the module that holds its names now.
RENAMED: dict[str, str] = {
    "attnzoo.runtime.reports": "attnzoo.runtime.schemas",
    "attnzoo.runtime.quantization_report": "attnzoo.runtime.schemas",
    "attnzoo.export.quantize.report": "attnzoo.export.quantize.record",
    "attnzoo.benchmarks.report": "attnzoo.benchmarks.tables",
}
#: Names each old module must still give (those its importers took from it).
NAMES: dict[str, tuple[str, ...]] = {
    "attnzoo.runtime.reports": ("JsonReport", "FormatReport", "VerificationReport", "report_kinds", "main"),
    "attnzoo.runtime.quantization_report": ("QuantizationReport", "QuantizeReport"),
    "attnzoo.export.quantize.report": ("QuantizationReport", "write_report", "read_quantization_report", "summary"),
    "attnzoo.benchmarks.report": ("markdown", "markdown_table", "write_outputs", "ROW_FIELDS", "plot_latency"),
}


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_module_name_warns_and_gives_the_new_modules_objects(old, monkeypatch):
    new = importlib.import_module(RENAMED[old])
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported afresh, so that its warning is issued again
    with pytest.warns(DeprecationWarning, match=RENAMED[old].replace(".", r"\.")):
        module = importlib.import_module(old)
    for name in NAMES[old]:
        assert getattr(module, name) is getattr(new, name), name


def test_every_renamed_module_is_listed_with_its_names():
    assert set(NAMES) == set(RENAMED)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_the_old_schema_command_prints_the_same_schema_and_says_it_is_deprecated():
    from attnzoo.runtime.schemas import report_kinds

    old, new = (
        _run("-m", "attnzoo.runtime.reports", "quantization"),
        _run("-m", "attnzoo.runtime.schemas", "quantization"),
    )
    assert old.returncode == new.returncode == 0, old.stderr + new.stderr
    assert old.stdout == new.stdout and json.loads(old.stdout) == report_kinds()["quantization"].json_schema()
    assert "DeprecationWarning" in old.stderr and "attnzoo.runtime.schemas" in old.stderr
    assert "DeprecationWarning" not in new.stderr
    bad = _run("-m", "attnzoo.runtime.reports", "nope")  # its usage line keeps the command's own name
    assert bad.returncode == 2 and "usage: python -m attnzoo.runtime.reports" in bad.stderr
