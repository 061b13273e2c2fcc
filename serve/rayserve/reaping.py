"""Ending a local Ray completely: every process it started (found by the mark they inherit), its folders and
the environment defaults it set; or, for a joined cluster, the app alone (:func:`stop`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from attnzoo.lazy import lazy_import
from attnzoo.serve.rayserve.config import DEPLOYMENT
from attnzoo.serve.rayserve.environment import (
    _LOCAL,
    _LOOPBACK_ENV,
    _METRICS,
    _OWN_ENV,
    _RAYLET_PID_ENV,
    OWNER_ENV,
    SET_BY_ATTNZOO_ENV,
    _ray_initialized,
)
from attnzoo.signals import abandon, set_handler

psutil = lazy_import("psutil")  # comes with ray (the [serving] extra); serve-models --help loads without it

__all__ = ["STOP_GRACE_S", "STOP_ROUNDS", "stop"]

#: Seconds Ray's own shutdown of a local Ray gets, and then what its processes still running get to end after
#: SIGTERM before SIGKILL (a stop must take under 10 s on a loaded 2-core machine).
STOP_GRACE_S = 1.5
#: Most SIGTERM-then-SIGKILL rounds of a stop: the first ends what runs, a later one what was started meanwhile.
STOP_ROUNDS = 5


def _marked_processes() -> list[Any]:
    """This user's processes that carry this process's :data:`OWNER_ENV` mark: everything the local Ray
    started, also what was orphaned to PID 1 (an HAProxy whose manager died first)."""
    mark = _LOCAL.get("mark")
    found: list[Any] = []
    if not mark:
        return found
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(OWNER_ENV) == mark:
                found.append(p)
        except psutil.Error:  # another user's process, or one that just ended
            continue
    return found


def _end_marked(grace: float = STOP_GRACE_S) -> None:
    """SIGTERM every process that carries this process's mark, SIGKILL those still running ``grace`` s later, and
    scan again until a scan finds none (at most :data:`STOP_ROUNDS` rounds). A process started *during* the stop
    (an HAProxy that a Serve proxy still running reloads with ``-sf <old pid>``, then orphaned to PID 1 when its
    manager dies) is not in the first scan; once every process that could start one is gone, a scan that finds
    nothing is final."""
    for _ in range(STOP_ROUNDS):
        alive = _marked_processes()
        if not alive:
            time.sleep(0.1)  # one forked or exec'ing at the very moment of the scan shows in the next one
            alive = _marked_processes()
            if not alive:
                return
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(alive, timeout=grace)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=grace)
    left = []
    for p in _marked_processes():
        with contextlib.suppress(psutil.Error):
            left.append(f"{p.pid} {p.name()}")
    if left:
        print(
            f"warning: {len(left)} process(es) of the local Ray still running after the stop: {', '.join(left)}",
            file=sys.stderr,
            flush=True,
        )


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """While the stop runs (main thread only), a further SIGINT/SIGTERM is ignored instead of raising in the
    middle of it: Ctrl-C twice, or SIGTERM to the process and then to its group, must not leave half of the local
    Ray running. The stop is bounded (:data:`STOP_GRACE_S`, :data:`STOP_ROUNDS`) and the watchdog
    (:func:`stop_watchdog`) still ends the process if it is not."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: set_handler(sig, lambda signum, frame: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            set_handler(sig, handler)


def _stop_local_ray() -> None:
    """End the local Ray this process started, fast and completely: Ray's driver shutdown (for at most
    :data:`STOP_GRACE_S`), then every process this process started (GCS, raylet, workers, replicas, HAProxy, a
    background export), and any that one of them starts meanwhile, gets SIGTERM and, after :data:`STOP_GRACE_S`,
    SIGKILL (:func:`_end_marked`). They are found by the environment mark they all inherit (:data:`OWNER_ENV`),
    so one orphaned to PID 1 is found too and no other process of the caller is touched. Serve's graceful
    shutdown is skipped: it drains the replicas and HAProxy first, and a local Ray keeps nothing that
    needs it. A further signal during the stop is ignored (:func:`_signals_held`)."""
    with _signals_held():
        _stop_processes()
        _forget_local_ray()


def _stop_processes() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        done = threading.Event()

        def shutdown() -> None:
            try:
                ray.shutdown()
            finally:
                done.set()

        thread = threading.Thread(target=shutdown, name="attnzoo-ray-shutdown", daemon=True)
        thread.start()
        if not done.wait(STOP_GRACE_S):  # its native threads would hold up the interpreter's exit for seconds
            abandon(thread)  # a command then ends with os._exit once its line is printed
            _LOCAL["shutdown_abandoned"] = True
    _end_marked()


def _forget_local_ray() -> None:
    """Remove the files and environment defaults of the local Ray that :func:`_stop_processes` ended."""
    ray = sys.modules.get("ray")
    for folder in _LOCAL["temp_dirs"]:
        shutil.rmtree(folder, ignore_errors=True)
    _LOCAL["temp_dirs"] = []
    for key in (*_LOOPBACK_ENV, _RAYLET_PID_ENV, OWNER_ENV):  # a later start_ray with --address: as Ray decides
        os.environ.pop(key, None)
    for key, value in _OWN_ENV.items():  # the defaults this start set (the wrapper's path among them, now
        if os.environ.get(key) == value:  # deleted) must not reach a later start, nor a child that would take
            os.environ.pop(key)  # them for the user's own settings
    _OWN_ENV.clear()
    os.environ.pop(SET_BY_ATTNZOO_ENV, None)
    _LOCAL["mark"] = _LOCAL["serve_host"] = _LOCAL["logs"] = None
    if ray is not None and _LOCAL.get("cluster_flag") is not None:
        from ray._private import ray_constants  # optional: ray (the [serving] extra), imported by now

        ray_constants.ENABLE_RAY_CLUSTER = _LOCAL.pop("cluster_flag")
    _LOCAL["started"] = False
    _METRICS["port"] = None


def stop(started_ray: bool, name: str | None = None) -> None:
    """With a Ray this process started (or began to start), end it and every process it started; with a joined
    cluster, delete the app and disconnect."""
    if started_ray or _LOCAL["started"]:
        _stop_local_ray()
        return
    if not _ray_initialized():
        return
    import ray  # optional: ray (the [serving] extra), imported by now
    from ray import serve

    try:
        serve.delete(name or DEPLOYMENT)
    finally:
        ray.shutdown()  # disconnect this driver; the cluster stays
