"""The package's error types: what a command's one error line and exit status are made of
(:func:`attnzoo.cli.entry_point` turns them into both), and :func:`first_line`, how an error is said in one line.

Exit status: 2 for :class:`UsageError` (refused before any work starts), 1 for every other failure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UsageError", "CommandError", "CommandExit", "first_line", "quoted", "install_hint", "MAX_NAME_SHOWN"]

#: Most characters of a name or path someone else chose (a client's, a command line's, a file's) that an error line
#: quotes (:func:`quoted`): a 60 KB name comes back as its first 77 characters and ``...``. One of the bounds
#: :mod:`attnzoo.limits` lists.
MAX_NAME_SHOWN = 80


class UsageError(ValueError):
    """A bad command line (flag value, combination of flags): exit status 2."""


class CommandError(Exception):
    """A failure whose message already says what went wrong (a failed export, a failed build): exit status 1."""


class CommandExit(SystemExit):
    """What an entry point raises after printing its error line: ``code`` is the exit status, ``str()`` the
    line (so callers and tests see both)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def first_line(exc: BaseException, typed: bool = False) -> str:
    """The first non-empty line of an exception's message, or its type name; ``typed``: prefixed with the type
    name (``ValueError: ...``, at most 300 characters), for reports that keep the error of a failed row.

    An exception that carries the one it stands for in ``cause`` (Ray's ``RayTaskError``, whose first line only
    names the task and its process) ends with that one's typed first line."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:
        line = f"{line}: {first_line(cause, typed=True)}" if line else first_line(cause, typed=True)
    if typed:
        return f"{type(exc).__name__}: {line}"[:300] if line else type(exc).__name__
    return line or type(exc).__name__


def quoted(value: Any, limit: int = MAX_NAME_SHOWN) -> str:
    """``value`` (a name or path someone else chose) as an error line quotes it: its ``repr``, whose text between
    the quotes is at most ``limit`` characters (:data:`attnzoo.limits.MAX_NAME_SHOWN`), cut with ``...``; the one
    place every message that echoes a client's, a command line's or a file's name shortens it. A value that is not
    a string is its ``repr`` cut the same way (a number stays unquoted)."""
    if not isinstance(value, str):
        shown = repr(value)
        return shown if len(shown) <= limit else shown[: limit - 3] + "..."
    shown = repr(value)
    if len(shown) - 2 <= limit:
        return shown
    cut = value[:limit]  # escapes (\x00, \U0001f600) make repr longer than the text: cut until it fits
    while cut and len(repr(cut + "...")) - 2 > limit:
        cut = cut[: min(len(cut) - 1, limit - 3)]
    return repr(cut + "...")


def install_hint(extra: str) -> str:
    """The command that adds the optional dependencies ``extra`` to this installation: ``pip install -e
    ".[extra]"`` where the package runs from its source checkout (an editable install: ``pyproject.toml`` beside
    the package), ``pip install "attnzoo[extra]"`` where it was installed from a wheel."""
    from pathlib import Path

    if (Path(__file__).resolve().parent.parent / "pyproject.toml").is_file():
        return f'pip install -e ".[{extra}]"'
    return f'pip install "attnzoo[{extra}]"'
