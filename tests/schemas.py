"""Reading a report a test's export wrote through its schema (:mod:`attnzoo.runtime.schemas`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from attnzoo.runtime.schemas import exported_report_type, report_kinds


def read_back(path: str | Path, kind: str) -> dict[str, Any]:
    """The report at ``path`` as a dict, after checking that it is of ``kind`` and that its schema reads it back
    whole: the object read from the file writes the file's object again, field for field."""
    data = json.loads(Path(path).read_text())
    schema = report_kinds()[kind]
    assert exported_report_type(data) is schema, f"{path} is a {exported_report_type(data).__name__}, not {kind}"
    assert schema.from_dict(data).to_dict() == data
    return data


def assert_only_verified_loads(backend: Any, verified: Path, foreign: Path) -> None:
    """``backend.load(path)`` (a backend of a format ``export-model --format <backend name>`` writes) refuses in one
    line each: ``foreign``, which has no report beside it, and then ``foreign`` copied over ``verified`` (whose
    report, left beside it, verified another file)."""
    with pytest.raises(ValueError) as refused:
        backend.load(foreign)
    assert str(refused.value) == (
        f"{backend.name}: {foreign} is not loaded: no verification report {foreign.name}.json beside it (export it "
        f"with export-model --format {backend.name})"
    )
    shutil.copyfile(foreign, verified)  # another file where the verified one was, its report left beside it
    with pytest.raises(ValueError) as refused:
        backend.load(verified)
    assert str(refused.value) == (
        f"{backend.name}: {verified} is not loaded: {verified.name} differs from the file its report "
        f"{verified.name}.json verified (SHA-256 mismatch)"
    )
