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

The error types are in :mod:`attnzoo.errors`; signals and native work (``signals_deferred``, ``run_in_worker``) in
:mod:`attnzoo.signals`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import os
import re
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from attnzoo.errors import MAX_NAME_SHOWN, CommandError, CommandExit, UsageError, first_line, quoted
from attnzoo.limits import check_batch_sizes
from attnzoo.signals import (
    SIGNAL_EXITS,
    Interrupted,
    Terminated,
    abandoned,
    set_handler,
    signals_raise,
)

__all__ = [
    "entry_point",
    "add_debug_flag",
    "with_arguments",
    "CommandParser",
    "Later",
    "check_choice",
    "parse_names",
    "parse_batch_sizes",
    "one_of",
    "flag_values",
    "add_range_flag",
    "COMMANDS",
    "export_model",
    "bench_latency",
    "serve_demo",
    "serve_models",
    "train_model",
    "evaluate_model",
    "report_variant",
]

DEBUG_FLAG = "--debug"
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


def parse_names(value: str, canonical: Callable[[str], str], kind: str, valid: str) -> list[str]:
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
        shown = ", ".join(map(quoted, bad[:3])) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise UsageError(f"unknown {kind} {shown or '(none given)'}; valid: {valid}")
    return list(dict.fromkeys(names))


def parse_batch_sizes(value: str, flag: str = "--batch-sizes") -> list[int]:
    """Comma-separated batch sizes from the command line, without repeats, in the order given.

    Raises:
        UsageError: anything but integers in ``1..MAX_BATCH_SIZE`` (:func:`attnzoo.limits.check_batch_sizes`),
            or none: one line naming ``flag``.
    """
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise UsageError(f"{flag} must be comma-separated positive integers, got {quoted(value)}")
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


def flag_values(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The parsed values of the flags whose ``dest`` is one of ``names``, by that name: the keyword arguments of a
    command's settings whose fields are named like its flags."""
    return {name: getattr(args, name) for name in names}


def add_range_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, kind: type, default: Any, help: str
) -> None:
    """Add ``flag``, an inclusive range given as two numbers of type ``kind`` (``LO HI``)."""
    parser.add_argument(flag, type=kind, nargs=2, metavar=("LO", "HI"), default=default, help=help)


class Later(str):
    """A help text or epilog whose words come from a module a command's parser should not import to be built (the
    defaults and choices of heavy modules): empty until :class:`CommandParser` prints the help, which calls
    ``text``. Parsing and usage errors never read it."""

    text: Callable[[], str]

    def __new__(cls, text: Callable[[], str]) -> Later:
        self = super().__new__(cls, "")
        self.text = text
        return self


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose help texts and epilog may be :class:`Later`: ``--help`` imports what they quote,
    a bad command line is refused without it. Choices that live in heavy modules are given to
    :func:`check_choice` after the cheap checks instead of ``choices=``."""

    def format_help(self) -> str:
        for action in self._actions:
            if isinstance(action.help, Later):
                action.help = action.help.text()
        if isinstance(self.epilog, Later):
            self.epilog = self.epilog.text()
        return super().format_help()


def check_choice(parser: argparse.ArgumentParser, flag: str, value: str | None, valid: Sequence[str]) -> None:
    """argparse's own refusal of a ``value`` of ``flag`` outside ``valid`` (the usage line and ``invalid choice``,
    exit 2), for a flag whose choices are read only once the cheap checks have passed; ``None`` (not given) passes."""
    if value is not None and value not in valid:
        parser.error(f"argument {flag}: invalid choice: {value!r} (choose from {', '.join(map(repr, valid))})")


def add_debug_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--debug`` (show tracebacks) to a command's parser, whose own errors (``invalid choice: ...``,
    ``unrecognized arguments: ...``) then quote what they were given as every error line does: each word cut to
    :data:`attnzoo.errors.MAX_NAME_SHOWN` characters."""
    parser.add_argument(DEBUG_FLAG, action="store_true", help="show the full traceback of an error")
    error = parser.error
    parser.error = lambda message: error(_LONG_WORD.sub(_cut_word, message))  # type: ignore[method-assign]
    return parser


def with_arguments(
    parser: argparse.ArgumentParser, *parts: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    """A command's parser: ``parser`` with the arguments each of ``parts`` adds, in order, then ``--debug``
    (:func:`add_debug_flag`)."""
    for add in parts:
        add(parser)
    return add_debug_flag(parser)


#: A word (no white space) longer than an error line quotes, between the quotes and brackets around it.
_LONG_WORD = re.compile(rf"(['\"(\[]*)(\S{{{MAX_NAME_SHOWN + 1},}}?)([)\]'\",]*)(?=\s|$)")


def _cut_word(match: re.Match[str]) -> str:
    opening, word, closing = match.groups()
    return f"{opening}{word[: MAX_NAME_SHOWN - 3]}...{closing}"


def _exit_line(code: int, message: str, exc: BaseException | None, debug: bool, abandoned: bool) -> CommandExit:
    if debug and exc is not None:
        traceback.print_exception(exc, file=sys.stderr)
    print(message, file=sys.stderr, flush=True)
    if abandoned:  # this command gave up on native work: no interpreter shutdown beside it (a TensorRT thread
        # calling its Python logger during shutdown aborts the process)
        sys.stdout.flush()
        os._exit(code)
    return CommandExit(code, message)


def entry_point(fn: Callable[..., int | None]) -> Callable[..., int]:
    """Wrap a command's ``main(argv=None)``: errors become one line on stderr and :class:`CommandExit`.

    :class:`UsageError` exits 2; any other ``Exception`` exits 1 with its first line (prefixed with its type
    when it is not a ``ValueError``/``OSError``/:class:`CommandError`); ``SystemExit`` from argparse (help, usage
    errors) passes through. ``--debug`` in the arguments prints the traceback.
    """

    @functools.wraps(fn)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        args = list(sys.argv[1:] if argv is None else argv)
        debug = DEBUG_FLAG in args
        hint = "" if debug else f" (run with {DEBUG_FLAG} for the traceback)"
        before = abandoned()  # only what this command gives up on ends the process (a program or a test
        # may run several commands, or call a library function that abandoned a thread, in one process)

        def _exit(code: int, message: str, exc: BaseException | None, debug: bool) -> CommandExit:
            return _exit_line(code, message, exc, debug, abandoned() > before)

        try:
            with signals_raise():
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
        except Exception as exc:  # the one place that turns any failure into one line
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

    previous = {sig: set_handler(sig, handler) for sig in SIGNAL_EXITS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            set_handler(sig, old)


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
