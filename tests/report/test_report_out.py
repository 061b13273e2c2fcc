"""report-variant --out: a folder of anything but report-variant's own reports of the variant is refused before
any work, and no user's file is ever overwritten."""

import json

import pytest

from attnzoo.errors import UsageError
from attnzoo.report.variant import SCHEMA, out_problem, report_variant


def test_a_folder_of_the_users_files_is_refused_untouched(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my notes")  # a name report-variant writes
    (out / "thesis.tex").write_text("chapter 1")
    with pytest.raises(UsageError) as info:
        report_variant("standard", out=out, quick=True)
    assert str(info.value) == (
        f"--out {out} is not empty and holds no report of 'standard' (report.md, thesis.tex); choose a new or "
        "empty folder (report-variant overwrites only its own reports)"
    )
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "thesis.tex"]
    assert (out / "report.md").read_text() == "my notes"


def test_another_variants_report_or_a_foreign_report_json_is_refused(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"schema": SCHEMA, "variant": "belief2"}))
    with pytest.raises(UsageError, match="holds the report of variant 'belief2', not 'standard'"):
        report_variant("standard", out=tmp_path, quick=True)
    (tmp_path / "report.json").write_text(json.dumps({"results": []}))
    assert "holds a report.json that report-variant did not write" in out_problem(tmp_path, "standard")


def test_new_empty_stopped_or_same_variant_folders_are_accepted(tmp_path):
    assert out_problem(tmp_path / "new", "standard") is None
    assert out_problem(tmp_path, "standard") is None
    (tmp_path / "exports").mkdir()  # a run stopped before its report.json
    assert out_problem(tmp_path, "standard") is None
    (tmp_path / "report.json").write_text(json.dumps({"schema": SCHEMA, "variant": "standard"}))
    (tmp_path / "notes.txt").write_text("kept: report-variant never writes this name")
    assert out_problem(tmp_path, "standard") is None
