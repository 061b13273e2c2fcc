"""How every attnzoo command ends: one ``error: ...`` line on stderr and an exit status, never a traceback
unless ``--debug`` is given.

Exit status: 0 success, 2 usage errors (bad flags or values, refused before any work starts; argparse's own
errors too), 1 failures (unreadable or invalid input files, a failed export, ...), 130 on Ctrl-C, 143 on
SIGTERM. SIGTERM is turned into an exception in the main thread, so temporary files are removed
(:func:`attnzoo.fileio.atomic_path`) exactly as on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
import threading
import traceback
from typing import Callable, Iterator, Optional, Sequence

__all__ = ["UsageError", "CommandError", "Terminated", "Interrupted", "CommandExit", "entry_point", "add_debug_flag", "first_line"]

DEBUG_FLAG = "--debug"


class UsageError(ValueError):
    """A bad command line (flag value, combination of flags): exit status 2."""


class CommandError(Exception):
    """A failure whose message already says what went wrong (a failed export, a failed build): exit status 1."""


class Terminated(BaseException):
    """SIGTERM arrived (raised in the main thread so that ``finally`` blocks and context managers run)."""


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) arrived while a command ran. Not a ``KeyboardInterrupt``: CPython may end a process whose
    ``KeyboardInterrupt`` reached certain points by killing itself with SIGINT at exit (status -2), whatever
    exit status the command chose; our own exception keeps the documented 130."""


class CommandExit(SystemExit):
    """What an entry point raises after printing its error line: ``code`` is the exit status, ``str()`` the
    line (so callers and tests see both)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def add_debug_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--debug`` (show tracebacks) to a command's parser."""
    parser.add_argument(DEBUG_FLAG, action="store_true", help="show the full traceback of an error")
    return parser


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """While active (main thread only), SIGTERM raises :class:`Terminated` and SIGINT :class:`Interrupted`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated() if signum == signal.SIGTERM else Interrupted()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _exit(code: int, message: str, exc: Optional[BaseException], debug: bool) -> CommandExit:
    if debug and exc is not None:
        traceback.print_exception(exc, file=sys.stderr)
    print(message, file=sys.stderr, flush=True)
    return CommandExit(code, message)


def entry_point(fn: Callable[..., Optional[int]]) -> Callable[..., int]:
    """Wrap a command's ``main(argv=None)``: errors become one line on stderr and :class:`CommandExit`.

    :class:`UsageError` exits 2; any other ``Exception`` exits 1 with its first line (prefixed with its type
    when it is not a ``ValueError``/``OSError``/:class:`CommandError`); ``SystemExit`` from argparse (help, usage errors) passes
    through; a legacy ``SystemExit("error: ...")`` exits 1. ``--debug`` in the arguments prints the traceback.
    """

    @functools.wraps(fn)
    def wrapper(argv: Optional[Sequence[str]] = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        debug = DEBUG_FLAG in args
        hint = "" if debug else f" (run with {DEBUG_FLAG} for the traceback)"
        try:
            with _signals_raise():
                return fn(argv) or 0
        except CommandExit:
            raise
        except SystemExit as exc:
            if isinstance(exc.code, str):  # SystemExit("error: ...") raised by a command
                raise _exit(1, exc.code, exc, debug) from None
            raise
        except UsageError as exc:
            raise _exit(2, f"error: {first_line(exc)}", exc, debug) from None
        except (KeyboardInterrupt, Interrupted) as exc:
            raise _exit(130, "interrupted (Ctrl-C)", exc, debug) from None
        except Terminated as exc:
            raise _exit(143, "terminated (SIGTERM)", exc, debug) from None
        except (ValueError, OSError, CommandError) as exc:
            raise _exit(1, f"error: {first_line(exc)}", exc, debug) from None
        except Exception as exc:  # noqa: BLE001 - the one place that turns any failure into one line
            raise _exit(1, f"error: {type(exc).__name__}: {first_line(exc)}{hint}", exc, debug) from None

    return wrapper
