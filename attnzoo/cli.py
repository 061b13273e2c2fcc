"""How every attnzoo command ends: one ``error: ...`` line on stderr and an exit status, never a traceback
unless ``--debug`` is given.

Exit status: 0 success, 2 usage errors (bad flags or values, refused before any work starts; argparse's own
errors too), 1 failures (unreadable or invalid input files, a failed export, ...), 130 on Ctrl-C, 143 on
SIGTERM. SIGTERM is turned into an exception in the main thread, so temporary files are removed
(:func:`attnzoo.fileio.atomic_path`) exactly as on Ctrl-C.

The console scripts start each command through a launcher here (:data:`COMMANDS`; ``export-model`` runs
:func:`export_model` ...), which imports the command's module only once a signal would end it with the same one
line: importing torch, ONNX Runtime or Ray takes seconds, during which Python's own handling of Ctrl-C would
print a traceback.

Native code that calls back into Python (TensorRT's logger and progress monitor) must never see those exceptions:
TensorRT catches an exception raised in its callbacks, prints it and carries on. A short such call runs inside
:func:`signals_deferred`, which records the signal instead and raises it as soon as the native call returns; a
long one (a TensorRT build) runs in a worker thread (:func:`run_in_worker`), so that the main thread, where Python
handles signals, stops at once; a command that gave up on such work ends with ``os._exit`` after printing its line
and running its ``finally`` blocks (TensorRT's threads may still call the Python logger, which aborts an
interpreter that is shutting down).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, TypeVar

__all__ = ["UsageError", "CommandError", "Terminated", "Interrupted", "CommandExit", "entry_point", "add_debug_flag",
           "first_line", "parse_names", "parse_batch_sizes", "one_of", "PendingSignal", "signals_deferred", "run_in_worker", "abandon",
           "COMMANDS", "SIGNAL_EXITS",
           "export_model", "bench_latency", "serve_demo", "serve_models", "train_model", "evaluate_model",
           "report_variant"]

T = TypeVar("T")
#: Worker threads running native code that a signal made the main thread give up on (cancelled, maybe running).
_ABANDONED: List[threading.Thread] = []

DEBUG_FLAG = "--debug"
#: How a command ends on a signal: exit status and its one line on stderr.
SIGNAL_EXITS = {signal.SIGINT: (130, "interrupted (Ctrl-C)"), signal.SIGTERM: (143, "terminated (SIGTERM)")}
#: Every command and the ``main`` that runs it (``module:function``); ``pyproject.toml``'s ``[project.scripts]``
#: point each at its launcher below, named like the command (``serve-models`` -> :func:`serve_models`).
COMMANDS = {
    "export-model": "attnzoo.export.cli:main",
    "bench-latency": "attnzoo.benchmarks.cli:main",
    "serve-demo": "attnzoo.serve.demo.cli:main",
    "serve-models": "attnzoo.serve.rayserve.cli:main",
    "train-model": "attnzoo.training.cli:main",
    "evaluate-model": "attnzoo.training.cli:evaluate_main",
    "report-variant": "attnzoo.report.cli:main",
}


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


def first_line(exc: BaseException, typed: bool = False) -> str:
    """The first non-empty line of an exception's message, or its type name; ``typed``: prefixed with the type
    name (``ValueError: ...``, at most 300 characters), for reports that keep the error of a failed row."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    if typed:
        return f"{type(exc).__name__}: {line}"[:300] if line else type(exc).__name__
    return line or type(exc).__name__


def parse_names(value: str, canonical: Callable[[str], str], kind: str, valid: str) -> List[str]:
    """A comma-separated command-line list of names, each turned into its one name by ``canonical`` (which raises
    ``ValueError`` for an unknown one), without repeats, in the order given.

    Raises:
        UsageError: an unknown name or an empty list: one line naming them and ``valid`` (the names accepted).
    """
    names, bad = [], []
    for name in (v.strip() for v in value.split(",") if v.strip()):
        try:
            names.append(canonical(name))
        except ValueError:
            bad.append(name)
    if bad or not names:
        raise UsageError(f"unknown {kind} {', '.join(map(repr, bad)) or '(none given)'}; valid: {valid}")
    return list(dict.fromkeys(names))


def parse_batch_sizes(value: str, flag: str = "--batch-sizes") -> List[int]:
    """Comma-separated batch sizes from the command line, without repeats, in the order given.

    Raises:
        UsageError: anything but integers in ``1..MAX_BATCH_SIZE`` (:func:`attnzoo.limits.check_batch_sizes`),
            or none: one line naming ``flag``.
    """
    from attnzoo.limits import check_batch_sizes

    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise UsageError(f"{flag} must be comma-separated positive integers, got {value!r}")
    try:
        check_batch_sizes(sizes, flag)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return list(dict.fromkeys(sizes))


def one_of(valid: Sequence[str]) -> Callable[[str], str]:
    """A ``canonical`` for :func:`parse_names` that accepts exactly the names in ``valid``."""
    def canonical(name: str) -> str:
        if name not in valid:
            raise ValueError(name)
        return name

    return canonical


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


@dataclass
class PendingSignal:
    """The first SIGINT/SIGTERM that arrived inside :func:`signals_deferred` (``None``: none yet)."""

    signum: Optional[int] = None

    @property
    def pending(self) -> bool:
        """A signal arrived: the native work should stop as soon as it can (e.g. cancel a TensorRT build)."""
        return self.signum is not None


def _deliver(signum: int, handler) -> None:
    """Act on a recorded signal as its own handler would have (raises for the handlers of :func:`_signals_raise`
    and Python's default SIGINT handler; records it in an enclosing :func:`signals_deferred`)."""
    if callable(handler):
        handler(signum, None)
    elif handler != signal.SIG_IGN:  # SIG_DFL, or a handler installed outside Python
        signal.raise_signal(signum)


@contextlib.contextmanager
def signals_deferred() -> Iterator[PendingSignal]:
    """Record SIGINT/SIGTERM instead of raising while native code with Python callbacks runs; raise on exit.

    Inside, a signal only sets ``PendingSignal.signum`` (a callback may poll ``.pending`` to cancel the work; it
    must never raise). On exit the previous handlers come back and a recorded signal is handed to its handler:
    :class:`Interrupted` / :class:`Terminated` under :func:`entry_point`, ``KeyboardInterrupt`` under Python's
    default; it replaces any exception the body raised (a build cancelled because of it). Off the main thread
    signals are not delivered to Python, and this does nothing.
    """
    state = PendingSignal()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def record(signum, frame):  # never raises: it may run inside a C callback
        if state.signum is None:
            state.signum = signum

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)
        if state.signum is not None:
            _deliver(state.signum, previous[state.signum])


def abandon(thread: threading.Thread) -> None:
    """Native work in ``thread`` was given up on (a cancelled TensorRT build, a Ray shutdown that did not finish):
    the command then ends with ``os._exit`` once its line is printed and its ``finally`` blocks have run, instead
    of an interpreter shutdown that would wait for, or run beside, that native code."""
    _ABANDONED.append(thread)


def run_in_worker(fn: Callable[[], T], cancel: Callable[[], None]) -> T:
    """``fn()`` (native code that releases the GIL, e.g. a TensorRT build) in a worker thread, waited for by the
    main thread, so that Ctrl-C / SIGTERM is acted on at once and never raised inside ``fn``'s C callbacks
    (signal handlers run in the main thread only).

    On a signal (or any exception while waiting) ``cancel()`` asks ``fn`` to stop (it must not raise) and the
    exception propagates at once; the worker is left behind, and :func:`entry_point` then ends the process with
    ``os._exit`` once its line is printed (and the caller's ``finally`` blocks have run). Off the main thread
    ``fn()`` is simply called.
    """
    if threading.current_thread() is not threading.main_thread():
        return fn()
    box: dict = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc

    worker = threading.Thread(target=work, name="attnzoo-native", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.05)  # the main thread runs Python between waits: signal handlers run here
    except BaseException:
        cancel()
        abandon(worker)  # even once it returns, TensorRT's own threads may still call back
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]


def _exit_line(code: int, message: str, exc: Optional[BaseException], debug: bool, abandoned: bool) -> CommandExit:
    if debug and exc is not None:
        traceback.print_exception(exc, file=sys.stderr)
    print(message, file=sys.stderr, flush=True)
    if abandoned:  # this command gave up on native work: no interpreter shutdown beside it (a TensorRT thread
        # calling its Python logger during shutdown aborts the process)
        sys.stdout.flush()
        os._exit(code)
    return CommandExit(code, message)


def entry_point(fn: Callable[..., Optional[int]]) -> Callable[..., int]:
    """Wrap a command's ``main(argv=None)``: errors become one line on stderr and :class:`CommandExit`.

    :class:`UsageError` exits 2; any other ``Exception`` exits 1 with its first line (prefixed with its type
    when it is not a ``ValueError``/``OSError``/:class:`CommandError`); ``SystemExit`` from argparse (help, usage errors) passes
    through. ``--debug`` in the arguments prints the traceback.
    """

    @functools.wraps(fn)
    def wrapper(argv: Optional[Sequence[str]] = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        debug = DEBUG_FLAG in args
        hint = "" if debug else f" (run with {DEBUG_FLAG} for the traceback)"
        before = len(_ABANDONED)  # only what this command gives up on ends the process (a program or a test
        # may run several commands, or call a library function that abandoned a thread, in one process)

        def _exit(code: int, message: str, exc: Optional[BaseException], debug: bool) -> CommandExit:
            return _exit_line(code, message, exc, debug, len(_ABANDONED) > before)

        try:
            with _signals_raise():
                return fn(argv) or 0
        except SystemExit:  # CommandExit of a nested command, argparse's help and usage errors
            raise
        except UsageError as exc:
            raise _exit(2, f"error: {first_line(exc)}", exc, debug) from None
        except (KeyboardInterrupt, Interrupted) as exc:
            raise _exit(*SIGNAL_EXITS[signal.SIGINT], exc, debug) from None
        except Terminated as exc:
            raise _exit(*SIGNAL_EXITS[signal.SIGTERM], exc, debug) from None
        except (ValueError, OSError, CommandError) as exc:
            raise _exit(1, f"error: {first_line(exc)}", exc, debug) from None
        except Exception as exc:  # noqa: BLE001 - the one place that turns any failure into one line
            raise _exit(1, f"error: {type(exc).__name__}: {first_line(exc)}{hint}", exc, debug) from None

    return wrapper


@contextlib.contextmanager
def _exit_on_signal() -> Iterator[None]:
    """While a command's modules import (main thread): SIGINT / SIGTERM print the command's line and end the
    process at once with 130 / 143 (:data:`SIGNAL_EXITS`); nothing has started yet that would need cleaning up.
    :func:`entry_point` puts its own handlers over these while the command runs."""

    def handler(signum, frame):
        code, line = SIGNAL_EXITS[signum]
        print(line, file=sys.stderr, flush=True)
        os._exit(code)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNAL_EXITS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)


def _launcher(command: str) -> Callable[[], int]:
    """The console-script function of ``command``: imports and runs its ``main`` (:data:`COMMANDS`) under
    :func:`_exit_on_signal`."""
    module, _, name = COMMANDS[command].partition(":")

    def launch() -> int:
        with _exit_on_signal():
            main = getattr(importlib.import_module(module), name)
            return main()

    launch.__name__ = launch.__qualname__ = command.replace("-", "_")
    launch.__doc__ = f"``{command}``: :func:`{module}.{name}`, imported once a Ctrl-C would end it with one line."
    return launch


export_model = _launcher("export-model")
bench_latency = _launcher("bench-latency")
serve_demo = _launcher("serve-demo")
serve_models = _launcher("serve-models")
train_model = _launcher("train-model")
evaluate_model = _launcher("evaluate-model")
report_variant = _launcher("report-variant")
