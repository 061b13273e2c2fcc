"""The stop watchdog: a SIGINT/SIGTERM ends the local Ray and the process even when the main thread is held up."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from attnzoo.serve.rayserve.environment import _LOCAL
from attnzoo.serve.rayserve.reaping import _stop_local_ray
from attnzoo.signals import SIGNAL_EXITS

__all__ = ["WATCHDOG_S", "stop_watchdog"]

#: Seconds after SIGINT/SIGTERM that :func:`stop_watchdog` gives the normal stop before it ends the process.
WATCHDOG_S = 6.0


@contextlib.contextmanager
def stop_watchdog() -> Iterator[None]:
    """While the ``with`` body runs, a SIGINT/SIGTERM stops the process even if the main thread does not act on
    it (a handler that only defers the signal, as Ray's do inside ``ray.init``; Python runs handlers only between
    bytecodes). The C-level handler writes the signal to a wakeup pipe at once; a daemon thread reading it gives
    the normal path (:func:`stop` from the main thread's ``finally``) :data:`WATCHDOG_S`, then ends every process
    of the local Ray itself and exits with 128 + the signal. Leaving the body stops a local Ray still running (its
    stop never began: a second signal came first), then disarms the watchdog and restores the previous wakeup fd,
    so a process that goes on (a test, an embedding program) keeps its own signal handling. A stop the watchdog
    ends prints the warning, then the command's own line for the signal, and exits with its status, as any other
    stop does. Whether a signal in the GCS-port wait of ``ray.init`` is covered: see docs/serving.md ("Stopping").
    Main thread only."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    disarmed = threading.Event()

    def watch() -> None:  # the read end stays open until the body has left: a later signal's write must not fail
        data = os.read(r, 1)
        if not data or disarmed.wait(WATCHDOG_S):
            return  # disarmed (the body ended) before the stop needed help
        print(
            f"warning: still stopping {WATCHDOG_S:g} s after the signal (blocked in Ray); ending its processes",
            file=sys.stderr,
            flush=True,
        )
        code, line = SIGNAL_EXITS.get(signal.Signals(data[0]), (128 + data[0], f"stopped by signal {data[0]}"))
        try:
            _stop_local_ray()
        finally:
            print(line, file=sys.stderr, flush=True)
            os._exit(code)

    watcher = threading.Thread(target=watch, name="attnzoo-stop-watchdog", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        if _LOCAL["started"]:  # the body's own stop never ran (a second signal before it began)
            _stop_local_ray()
        disarmed.set()
        signal.set_wakeup_fd(previous)
        os.close(w)  # the watcher reads end-of-file (or sees the disarm) and returns
        watcher.join(1.0)
        os.close(r)
