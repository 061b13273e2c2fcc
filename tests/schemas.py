"""Reading a report a test's export wrote through its schema (:mod:`attnzoo.runtime.reports`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnzoo.runtime.reports import exported_report_type, report_kinds


def read_back(path: str | Path, kind: str) -> dict[str, Any]:
    """The report at ``path`` as a dict, after checking that it is of ``kind`` and that its schema reads it back
    whole: the object read from the file writes the file's object again, field for field."""
    data = json.loads(Path(path).read_text())
    schema = report_kinds()[kind]
    assert exported_report_type(data) is schema, f"{path} is a {exported_report_type(data).__name__}, not {kind}"
    assert schema.from_dict(data).to_dict() == data
    return data
