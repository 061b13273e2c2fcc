"""attnzoo.lazy: a module named at the top of a file, imported on its first attribute read."""

from __future__ import annotations

import subprocess
import sys

import pytest

from attnzoo.lazy import lazy_import


def test_nothing_is_imported_until_an_attribute_is_read():
    code = (
        "import sys; from attnzoo.lazy import lazy_import; m = lazy_import('json.tool'); "
        "assert 'json.tool' not in sys.modules; m.main; assert 'json.tool' in sys.modules; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_attributes_are_the_modules_own_and_a_missing_library_fails_at_first_use():
    import json

    assert lazy_import("json").dumps is json.dumps
    missing = lazy_import("attnzoo_no_such_library")  # naming it is free
    with pytest.raises(ImportError):
        _ = missing.anything


def test_no_lazily_imported_package_is_read_for_a_submodule_it_has_not_imported():
    """``export = lazy_import("attnzoo.export")`` then ``export.formats.x`` fails where nothing imported
    ``attnzoo.export.formats`` first (a lazy package's submodules are no attributes of it): each such use names the
    submodule in its own ``lazy_import``. Read from every tracked module."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True).stdout.split()
    found = []
    for name in files:
        text = (root / name).read_text()
        for var, module in re.findall(r'^(\w+) = lazy_import\("(attnzoo[\w.]*)"\)', text, re.M):
            package = root.joinpath("attnzoo", *module.split(".")[1:])
            for attr in set(re.findall(rf"(?<![\w.]){var}\.(\w+)\.", text)):
                if (package / f"{attr}.py").exists() or (package / attr / "__init__.py").exists():
                    found.append(f"{name}: {var}.{attr}")
    assert len(files) > 100 and not found, found
