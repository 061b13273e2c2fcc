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


def _sample(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """The smallest value a JSON Schema node allows: its required properties only, empty containers."""
    if "$ref" in schema:
        return _sample(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            options = [s for s in schema[key] if s.get("type") != "null"] or schema[key]
            return _sample(options[0], defs)
    kind = schema.get("type", "object")
    if kind == "object":
        return {name: _sample(schema["properties"][name], defs) for name in schema.get("required", ())}
    minimum = schema.get("minimum", schema.get("exclusiveMinimum", 0))
    return {"array": [], "string": "x", "boolean": True, "integer": int(minimum) + 1, "number": minimum + 0.5}.get(
        kind, None
    )


def minimal_report(schema: type) -> dict[str, Any]:
    """A report object of ``schema`` (a report dataclass) with only its required fields, each its type's smallest
    value, made from the schema's own JSON Schema: what a round trip through the schema is checked on."""
    tree = schema.json_schema()
    return _sample(tree, tree.get("$defs", {}))
