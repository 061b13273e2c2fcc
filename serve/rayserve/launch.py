"""Serving verified models with Ray Serve: the launch flow of ``serve-models``.

:func:`serve_models` checks the settings, selects the models (:mod:`~attnzoo.serve.rayserve.selection`), starts or
joins Ray (:mod:`~attnzoo.serve.rayserve.environment`), deploys the app (:func:`deploy`) and, when it ends, stops
everything it started (:mod:`~attnzoo.serve.rayserve.reaping`), with a watchdog for a stop that Ray holds up
(:mod:`~attnzoo.serve.rayserve.watchdog`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnzoo.errors import UsageError, first_line
from attnzoo.fileio import atomic_write_text
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import get_backend
from attnzoo.serve.network import exposure_warning
from attnzoo.serve.rayserve.config import DEPLOYMENT, ServeConfig
from attnzoo.serve.rayserve.environment import (
    _LOCAL,
    metrics_url,
    port_problem,
    ray_logs,
    ray_serve_mode,
    start_ray,
)
from attnzoo.serve.rayserve.reaping import stop
from attnzoo.serve.rayserve.selection import (
    Selection,
    check_zoo_selection,
    export_pending,
    select_models,
)
from attnzoo.serve.rayserve.watchdog import stop_watchdog

ray_app = lazy_import("attnzoo.serve.rayserve.app")  # imports ray: loaded by the first deploy

__all__ = ["startup_line", "start_serve", "deploy", "serve_models", "Served", "check_serve_config"]


#: Ray Serve's logging for the controller, the proxy and the replicas: warnings and errors, no access log.
_SERVE_LOG = {"log_level": "WARNING", "enable_access_log": False}


def start_serve(cfg: ServeConfig) -> None:
    """Start Serve's controller and HTTP proxy on ``cfg.host:cfg.port`` (nothing when they run already), which
    needs no model: :func:`serve_models` does it while the models are still being checked."""
    from ray import serve  # optional: ray (the [serving] extra); --help and usage errors load without it

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's "Started Serve ..." lines
    serve.start(
        http_options={"host": _LOCAL.get("serve_host") or cfg.host, "port": cfg.port}, logging_config=_SERVE_LOG
    )


def deploy(cfg: ServeConfig, selection: Selection, name: str | None = None) -> str:
    """Start Serve's HTTP proxy on ``cfg.host:cfg.port`` (:func:`start_serve`) and run the app (replaces a running
    one of the same name); returns the URL once every replica is up."""
    from ray import serve  # optional: ray (the [serving] extra); --help and usage errors load without it

    cfg.validate()  # resolves the defaults that depend on other settings
    start_serve(cfg)
    settings = {
        "backend": cfg.backend,
        "threads": cfg.intra_op_threads,
        "dtype": cfg.dtype,
        "cache_dir": str(cfg.cache_dir) if cfg.cache_dir else None,
        "max_batch_size": cfg.max_batch_size,
        "batch_wait_s": cfg.batch_wait_ms / 1000.0,
        "replicas": cfg.replicas,
        "decode_memory_mb": cfg.decode_memory_mb,
    }
    if selection.pending:
        if selection.ready_file is None:
            selection.ready_file = Path(tempfile.mkdtemp(prefix="attnzoo-serve-")) / "ready.json"
            _LOCAL["temp_dirs"].append(selection.ready_file.parent)
        atomic_write_text(selection.ready_file, json.dumps(selection.files))
        settings.update(pending=list(selection.pending), ready_file=str(selection.ready_file))
    app = ray_app.build_app(
        selection.folder,
        selection.files,
        replicas=cfg.replicas,
        cpus_per_replica=cfg.cpus_per_replica,
        gpus_per_replica=cfg.gpus_per_replica,
        max_ongoing_requests=cfg.max_ongoing_requests,
        settings=settings,
    )
    try:
        serve.run(app, name=name or DEPLOYMENT, route_prefix="/", logging_config=_SERVE_LOG)
    except Exception as exc:  # Ray says only "Failed to update the deployments"; the replica's own error is in status
        raise ValueError(f"the deployment did not start: {_deployment_error(name or DEPLOYMENT, exc)}") from None
    _report_skipped(selection, serve.get_app_handle(name or DEPLOYMENT))
    host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
    return f"http://{host if ':' not in host else f'[{host}]'}:{cfg.port}"


def _deployment_error(name: str, exc: BaseException) -> str:
    """The last line of the error a replica's constructor raised (from Serve's status), else Ray's own line."""
    from ray import serve  # optional: ray (the [serving] extra), imported by now

    try:
        app = serve.status().applications[name]
        messages = [d.message for d in app.deployments.values() if d.message] + [app.message]
    except Exception:  # the status itself is out of reach: Ray's line is all there is
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
        raise ValueError(
            f"no model in {selection.folder} could be loaded: " + "; ".join(f"{f}: {why}" for f, why in skipped.items())
        )


@dataclass
class Served:
    """What :func:`serve_models` started: the models' ``url``, the :class:`Selection` served, Ray Serve's ingress
    mode, its Prometheus ``metrics`` URL (None when off), where the start-up went (``startup_s``: seconds by
    step, :func:`startup_line`) and where the local Ray's logs are (``logs``:
    :func:`attnzoo.serve.rayserve.environment.ray_logs`)."""

    url: str
    selection: Selection
    mode: str
    metrics: str | None
    cache_dir: Path | None = None
    startup_s: dict[str, float] = field(default_factory=dict)
    logs: tuple[str, bool] | None = None

    def export_pending(self) -> int:
        """Export and verify the zoo models still pending (each answers 503 until then); return how many are ready."""
        return export_pending(self.selection, self.cache_dir) if self.selection.pending else 0


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    return fn(*args), time.perf_counter() - t0


def startup_line(startup_s: dict[str, float]) -> str:
    """``started in T s: step a s, ...`` (the steps of :attr:`Served.startup_s`; ``total`` is the wall time)."""
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in startup_s.items() if k != "total")
    return f"started in {startup_s['total']:.1f} s: {steps}"


def check_serve_config(cfg: ServeConfig, metrics_port: int | None = None) -> list[str]:
    """What ``cfg`` cannot start with, raised before anything starts; returns the warnings to show.

    Raises:
        UsageError: a bad metrics port, or the port cannot be listened on (a ValueError: exit status 2).
        ValueError: bf16 on a CPU without bf16 units.
    """
    if cfg.dtype == "bf16":
        reason = get_backend(cfg.backend).unavailable_reason("bf16")  # the config admits only bf16 backends
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
def serve_models(cfg: ServeConfig, *, metrics_port: int | None = None) -> Iterator[Served]:
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
    t0 = time.perf_counter()
    for warning in check_serve_config(cfg, metrics_port):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    started = False
    steps: dict[str, float] = {}
    with stop_watchdog(), ThreadPoolExecutor(1, thread_name_prefix="attnzoo-select") as pool:
        try:  # a signal during start-up too: stop() ends whatever ray.init had started
            chosen = None
            if cfg.models is None and cfg.arch is None:  # the zoo: what it lacks is refused before Ray starts,
                check_zoo_selection(cfg)  # its first models are verified while Ray starts
                chosen = pool.submit(_timed, select_models, cfg)
            else:  # a folder's files (quick), or random-init models: refused or exported before Ray starts
                selection, steps["model selection and checks"] = _timed(select_models, cfg)
            started, steps["Ray start"] = _timed(start_ray, cfg, metrics_port)
            if chosen is not None:
                _, steps["Serve start (beside the checks)"] = _timed(start_serve, cfg)
                t_wait = time.perf_counter()
                selection, steps["model selection and checks (beside Ray and Serve start)"] = chosen.result()
                steps["waiting for them after Serve start"] = time.perf_counter() - t_wait
            url, steps["deploy (replicas load and warm up)"] = _timed(deploy, cfg, selection)
            steps["total"] = time.perf_counter() - t0
            yield Served(url, selection, ray_serve_mode(), metrics_url(), cfg.cache_dir, steps, ray_logs())
        finally:
            stop(started)
