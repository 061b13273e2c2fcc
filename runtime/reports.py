"""Deprecated name of :mod:`attnzoo.runtime.schemas`, the report files' typed schemas (removed in the next
release): every name is read from there, with a ``DeprecationWarning`` at import, and
``python -m attnzoo.runtime.reports KIND`` still prints a kind's JSON Schema."""

from __future__ import annotations

import sys
import warnings
from typing import Any

from . import schemas

__all__ = schemas.__all__

warnings.warn(
    "attnzoo.runtime.reports is deprecated: import attnzoo.runtime.schemas (python -m attnzoo.runtime.schemas KIND)",
    DeprecationWarning,
    stacklevel=2,
)


def __getattr__(name: str) -> Any:
    """A name of :mod:`attnzoo.runtime.schemas`."""
    return getattr(schemas, name)


if __name__ == "__main__":
    sys.exit(schemas.main(prog="python -m attnzoo.runtime.reports"))
