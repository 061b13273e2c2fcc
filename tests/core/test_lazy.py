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
