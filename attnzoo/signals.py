"""Signals and native code: how Ctrl-C and SIGTERM end a command cleanly, also while native code runs.

While a command runs (:func:`signals_raise`, set up by :func:`attnzoo.cli.entry_point`), SIGTERM raises
:class:`Terminated` and SIGINT :class:`Interrupted` in the main thread, so ``finally`` blocks and context managers
run exactly as on an ordinary error.

Native code that calls back into Python (TensorRT's logger and progress monitor) must never see those exceptions:
TensorRT catches an exception raised in its callbacks, prints it and carries on. A short such call runs inside
:func:`signals_deferred`, which records the signal instead and raises it as soon as the native call returns; a
long one (a TensorRT build) runs in a worker thread (:func:`run_in_worker`), so that the main thread, where Python
handles signals, stops at once; a command that gave up on such work (:func:`abandon`) ends with ``os._exit`` after
printing its line and running its ``finally`` blocks (TensorRT's threads may still call the Python logger, which
aborts an interpreter that is shutting down).

A signal that arrives while a module imports is raised once that import returns: a native extension's
initialisation may run Python code (an enum made by nanobind in ``lief``, which ModelOpt imports), and an exception
raised there crosses C++ that cannot carry it (``std::terminate``: the process aborts).

Every SIGINT/SIGTERM handler the package installs goes through :func:`set_handler`, which runs it on the thread's
own stack, never on an alternate signal stack (``SA_ONSTACK`` cleared). OpenVINO's CPU plugin swaps the
thread's alternate stack for one of its own per plugin and compiled model and unmaps it on release; released out
of order, the thread is left registered on an unmapped stack, and the next signal handled there ends the
process with SIGSEGV or overwrites memory since reused (``libopenvino_intel_cpu_plugin``, ``SigAltStackSetup``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TypeVar

__all__ = [
    "Terminated",
    "Interrupted",
    "SIGNAL_EXITS",
    "signals_raise",
    "PendingSignal",
    "signals_deferred",
    "run_in_worker",
    "abandon",
    "abandoned",
    "set_handler",
    "off_altstack",
]

T = TypeVar("T")
#: Worker threads running native code that a signal made the main thread give up on (cancelled, maybe running).
_ABANDONED: list[threading.Thread] = []
#: How a command ends on a signal: exit status and its one line on stderr.
SIGNAL_EXITS = {signal.SIGINT: (130, "interrupted (Ctrl-C)"), signal.SIGTERM: (143, "terminated (SIGTERM)")}


class Terminated(BaseException):
    """SIGTERM arrived (raised in the main thread so that ``finally`` blocks and context managers run)."""


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) arrived while a command ran. Not a ``KeyboardInterrupt``: CPython may end a process whose
    ``KeyboardInterrupt`` reached certain points by killing itself with SIGINT at exit (status -2), whatever
    exit status the command chose; our own exception keeps the documented 130."""


class _SigAction(ctypes.Structure):
    """glibc's ``struct sigaction`` on Linux (x86-64, AArch64): handler, 1024-bit mask, flags, restorer."""

    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong)))),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


_SA_ONSTACK = 0x08000000
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def off_altstack(*signums: int) -> None:
    """Run the current handlers of ``signums`` (default SIGINT and SIGTERM) on the interrupted thread's own
    stack: clear ``SA_ONSTACK``, which Python sets on every handler it installs. Linux only; elsewhere, and for
    ``SIG_DFL`` / ``SIG_IGN``, nothing changes."""
    if _LIBC is None:
        return
    for signum in signums or (signal.SIGINT, signal.SIGTERM):
        act = _SigAction()
        if _LIBC.sigaction(int(signum), None, ctypes.byref(act)) != 0 or (act.handler or 0) in (0, 1):
            continue
        if act.flags & _SA_ONSTACK:
            act.flags &= ~_SA_ONSTACK
            _LIBC.sigaction(int(signum), ctypes.byref(act), None)


def set_handler(signum: int, handler) -> object:
    """``signal.signal(signum, handler)`` (``None``, a handler installed outside Python, becomes ``SIG_DFL``),
    run off any alternate signal stack (:func:`off_altstack`); returns the previous handler."""
    previous = signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    off_altstack(signum)
    return previous


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """While active (main thread only), SIGTERM raises :class:`Terminated` and SIGINT :class:`Interrupted`; one
    that arrives while a module imports is raised once the import returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    outside = _imports_under_way(sys._getframe())  # imports the command itself runs inside (none, usually)

    def handler(signum, frame):
        if _unsafe_to_raise(frame, outside):
            _send_after_imports(signum, outside)
            return
        raise Terminated() if signum == signal.SIGTERM else Interrupted()

    previous = {sig: set_handler(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            set_handler(sig, old)


_IMPORT_MACHINERY = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


#: Functions where Python prints and drops an exception instead of raising it: logging's lock hooks, which run
#: around every fork (``os.register_at_fork``; the parent's side of a subprocess start too).
_SWALLOWING = frozenset(
    f.__code__
    for f in (getattr(logging, name, None) for name in ("_acquireLock", "_releaseLock", "_prepareFork", "_afterFork"))
    if f is not None
)


def _unsafe_to_raise(frame: FrameType | None, outside: int) -> bool:
    """Whether an exception raised at ``frame`` would be lost or do harm: imports under way (more than ``outside``
    frames of the import machinery; the module would be left half-imported), or a function that drops exceptions
    on the stack (:data:`_SWALLOWING`, a finalizer)."""
    if _imports_under_way(frame) > outside:
        return True
    while frame is not None:  # the function itself or one it called
        if frame.f_code in _SWALLOWING or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _imports_under_way(frame: FrameType | None) -> int:
    """How many frames of the import machinery are on the stack that ends at ``frame``."""
    depth = 0
    while frame is not None:
        depth += frame.f_code.co_filename in _IMPORT_MACHINERY
        frame = frame.f_back
    return depth


def _send_after_imports(signum: int, outside: int) -> None:
    """Send ``signum`` to the main thread again once it has left the imports under way (down to ``outside``
    frames of the import machinery) and any function that drops exceptions (:func:`_unsafe_to_raise`), from a
    helper thread that looks every 20 ms: its handler then runs in Python's own code, where an exception is safe."""
    main = threading.main_thread()
    ident = main.ident
    assert ident is not None  # the main thread has started

    def resend() -> None:
        while main.is_alive():
            frame = sys._current_frames().get(ident)
            if not _unsafe_to_raise(frame, outside):
                signal.pthread_kill(ident, signum)
                return
            del frame
            time.sleep(0.02)

    threading.Thread(target=resend, name="attnzoo-signal-after-import", daemon=True).start()


@dataclass
class PendingSignal:
    """The first SIGINT/SIGTERM that arrived inside :func:`signals_deferred` (``None``: none yet)."""

    signum: int | None = None

    @property
    def pending(self) -> bool:
        """A signal arrived: the native work should stop as soon as it can (e.g. cancel a TensorRT build)."""
        return self.signum is not None


def _deliver(signum: int, handler) -> None:
    """Act on a recorded signal as its own handler would have (raises for the handlers of :func:`signals_raise`
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
    :class:`Interrupted` / :class:`Terminated` under :func:`attnzoo.cli.entry_point`, ``KeyboardInterrupt`` under
    Python's default; it replaces any exception the body raised (a build cancelled because of it). Off the main thread
    signals are not delivered to Python, and this does nothing.
    """
    state = PendingSignal()
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def record(signum, frame):  # never raises: it may run inside a C callback
        if state.signum is None:
            state.signum = signum

    previous: dict[int, object] = {sig: set_handler(sig, record) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            set_handler(sig, old)
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
    exception propagates at once; the worker is left behind, and :func:`attnzoo.cli.entry_point` then ends the
    process with ``os._exit`` once its line is printed (and the caller's ``finally`` blocks have run). Off the main
    thread ``fn()`` is simply called.
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


def abandoned() -> int:
    """How many worker threads this process has given up on so far (:func:`abandon`): a command compares the
    count before and after it ran, so only what it gave up on itself ends the process."""
    return len(_ABANDONED)
