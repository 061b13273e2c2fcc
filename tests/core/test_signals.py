"""Signals and native work (attnzoo.signals): Ctrl-C and SIGTERM raise in the main thread while a command runs,
are recorded (never raised) inside native callbacks and raised when the native call returns, and a worker thread
running native code is cancelled and given up on at once."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap


def _isolated(code: str) -> None:
    """Run ``code`` in a fresh interpreter: a signal sent to the test process itself could land in native threads
    that earlier tests left in it (Ray, TensorRT)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        done.returncode,
        done.stdout[-2000:],
        done.stderr[-2000:],
    )


def _under_pythons_own_handler(setup: str, body: str) -> subprocess.CompletedProcess:
    """A control: ``setup``, then ``body`` in a fresh interpreter whose SIGTERM handler is installed the usual way
    (``signal.signal``) and raises at once."""
    code = (
        textwrap.dedent(setup)
        + textwrap.dedent("""
        def handler(signum, frame):
            raise KeyboardInterrupt
        signal.signal(signal.SIGTERM, handler)
    """)
        + textwrap.dedent(body)
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_run_in_worker_raises_a_signal_at_once_and_cancels_the_work():
    _isolated("""
        import os, signal, threading, time
        from attnzoo import signals as cli

        stop = threading.Event()

        def native():  # stands for a build that ends at its next step once cancelled
            stop.wait(30)
            return "finished"

        with cli.signals_raise():
            assert cli.run_in_worker(lambda: 42, stop.set) == 42 and not stop.is_set() and not cli.abandoned()
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            start = time.perf_counter()
            timer.start()
            try:
                cli.run_in_worker(native, stop.set)
                raise SystemExit("no Interrupted")
            except cli.Interrupted:
                pass
            assert time.perf_counter() - start < 3 and stop.is_set()
            assert cli.abandoned() == 1  # entry_point would now end the process with os._exit
        print("ok")
    """)


def test_signals_deferred_records_then_raises_on_exit():
    _isolated("""
        import os, signal, time
        from attnzoo.signals import Interrupted, Terminated, signals_deferred, signals_raise

        # raise_signal signals this thread, so the handler runs at the next bytecode; os.kill(getpid()) could land
        # in another thread and reach Python late on a loaded machine (a late SIGTERM cut the test short)
        reached = False
        before = signal.getsignal(signal.SIGINT)  # Python's own handler, or SIG_IGN in a process started with `&`
        with signals_raise():
            try:
                with signals_deferred() as outer:
                    with signals_deferred() as inner:
                        signal.raise_signal(signal.SIGINT)
                        deadline = time.monotonic() + 10  # the handler runs between bytecodes (late under load)
                        while not inner.pending and time.monotonic() < deadline:
                            pass
                        assert inner.pending and inner.signum == signal.SIGINT
                        signal.raise_signal(signal.SIGTERM)  # a second signal: the first one wins
                    assert outer.pending  # the inner region handed it to the outer one, which still defers
                    reached = True
                raise SystemExit("no Interrupted on leaving the region")
            except Interrupted:
                pass
            assert reached
            try:  # outside any region the handler raises again
                signal.raise_signal(signal.SIGTERM)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    pass
                raise SystemExit("no Terminated")
            except Terminated:
                pass
        assert signal.getsignal(signal.SIGINT) is before  # whatever was there before comes back
        print("ok")
    """)


_DANGLING = """
    import ctypes, mmap, os, signal, sys, time

    class Stack(ctypes.Structure):
        _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]

    # what OpenVINO's CPU plugin can leave behind: this thread registered on an alternate stack that is unmapped
    libc = ctypes.CDLL(None, use_errno=True)
    size = 1 << 16
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert libc.sigaltstack(ctypes.byref(Stack(addr, 0, size)), None) == 0
    assert libc.munmap(ctypes.c_void_p(addr), ctypes.c_size_t(size)) == 0

    def raised_by(_):
        signal.raise_signal(signal.SIGTERM)  # this thread: the kernel sets the handler's frame up right here
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pass
        raise SystemExit("no exception")
"""


def test_a_handler_runs_even_where_the_alternate_signal_stack_was_unmapped():
    """The package's handlers run on the thread's own stack, so a signal still raises in a thread that a native
    library left on an unmapped alternate stack; Python's own way of installing one ends the process with
    SIGSEGV there (the control, so the setup is known to reproduce the fault)."""
    _isolated(
        textwrap.dedent(_DANGLING)
        + textwrap.dedent("""
        from attnzoo.signals import Terminated, signals_raise
        with signals_raise():
            try:
                raised_by(None)
            except Terminated:
                pass
        print("ok")
    """)
    )
    control = _under_pythons_own_handler(
        _DANGLING,
        """
        try:
            raised_by(None)
        except KeyboardInterrupt:
            print("ok")
    """,
    )
    assert control.returncode == -signal.SIGSEGV, (control.returncode, control.stdout, control.stderr[-2000:])


_SLOW_IMPORT = """
    import pathlib, signal, sys, tempfile, time

    # a module whose own import is signalled halfway: its code goes on for 0.3 s after the signal (a native
    # extension's initialisation, calling Python, stands in the same place: an exception there aborts the process)
    folder = pathlib.Path(tempfile.mkdtemp())
    (folder / "slow_module.py").write_text(
        "import signal, time\\n"
        "signal.raise_signal(signal.SIGTERM)\\n"
        "end = time.monotonic() + 0.3\\n"
        "while time.monotonic() < end:\\n"
        "    pass\\n"
        "FINISHED = True\\n")
    sys.path.insert(0, str(folder))
"""


def test_a_signal_during_an_import_is_raised_once_the_import_returns():
    _isolated(
        textwrap.dedent(_SLOW_IMPORT)
        + textwrap.dedent("""
        from attnzoo.signals import Terminated, signals_raise
        after = None
        with signals_raise():
            try:
                import slow_module
                after = time.monotonic()
                while time.monotonic() < after + 10:
                    pass
                raise SystemExit("no Terminated")
            except Terminated:
                raised = time.monotonic()
        assert sys.modules["slow_module"].FINISHED and after is not None and raised - after < 2, after
        print("ok")
    """)
    )
    # the control: a handler that raises at once cuts the import short, inside the module's own code
    control = _under_pythons_own_handler(
        _SLOW_IMPORT,
        """
        try:
            import slow_module
        except KeyboardInterrupt:
            assert "slow_module" not in sys.modules
            print("cut short")
    """,
    )
    assert control.stdout.strip() == "cut short", (control.returncode, control.stdout, control.stderr[-2000:])


def test_a_signal_inside_loggings_fork_hook_is_raised_after_it():
    """Python runs logging's ``_releaseLock`` around every fork, the parent's side of a subprocess start included,
    and prints and drops an exception raised there: a SIGTERM that lands in it must be raised after it returns, or
    the command goes on as if no signal had come."""
    _isolated("""
        import logging, signal, sys, time
        from attnzoo.signals import Terminated, signals_raise
        # the hooks logging registers around a fork: _acquireLock/_releaseLock up to Python 3.12, then renamed
        acquire = getattr(logging, "_acquireLock", None) or logging._prepareFork
        release, inside = getattr(logging, "_releaseLock", None) or logging._afterFork, []
        with signals_raise():
            handler = signal.getsignal(signal.SIGTERM)

            def trace(frame, event, arg):  # the signal, as if it arrived while the hook runs
                if event == "call" and frame.f_code is release.__code__:
                    try:
                        handler(signal.SIGTERM, frame)
                    except Terminated:
                        inside.append("raised inside the hook")

            acquire()
            sys.settrace(trace)
            release()
            sys.settrace(None)
            try:
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    pass
                raise SystemExit("no Terminated after the hook")
            except Terminated:
                pass
        assert not inside, inside
        print("ok")
    """)
