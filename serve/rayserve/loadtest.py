"""Load test of ``serve-models``: N concurrent clients against the Ray Serve deployment, next to the offline
benchmark of the same ONNX file on the same machine.

One command does everything, so that every number comes from one machine in one sitting:

1. ``bench-latency --backends ort-cpu`` on the model (ViT-Ti ``standard`` by default) at each ``--offline-threads``
   count: the offline images/s (its best is the reference for the serving overhead). It exports and verifies
   the ONNX file; the deployment then serves that very file.
2. For each replica count x max batch size (batching off = 1): deploy, warm up, then ``--clients`` closed-loop
   clients (asyncio + aiohttp; each sends one image, waits for the answer, sends the next) for ``--duration``
   seconds. Reported: throughput, p50/p95/p99 latency, errors, lost requests (no answer within
   ``--timeout``), the replicas' mean dynamic-batch size.
3. ``--soak S``: one long run of the first configuration that has the most replicas (errors and lost requests
   over S seconds).
4. ``--kill-replica``: with two replicas, one replica process is killed (SIGKILL) a third into the run; reported:
   which requests failed (in flight at the kill or sent later), and when the deployment had its replicas back.

Why aiohttp clients: they cost the least CPU per request of the Python options (httpx, locust's gevent
users), and the clients share the 2 cores with the server; locust would add a dependency and round its
percentiles. Requests send the image as the raw body (``Content-Type: image/png``), the cheaper of the two
upload forms.

Outputs in ``--out``: ``results.json`` (environment, settings, every number), ``results.md`` (the table) and
``loadtest.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.errors import UsageError, quoted
from attnzoo.fileio import default_cache_dir, sha256_file, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import environment
from attnzoo.runtime.backends import get_backend
from attnzoo.serve.examples import EXAMPLES_DIR
from attnzoo.serve.rayserve._load_clients import (
    Record,
    _mean_batch,
    kill_test,
    replica_stats,
    run_clients,
    summarize,
)
from attnzoo.serve.rayserve._load_report import _write
from attnzoo.serve.rayserve.config import DEPLOYMENT, ServeConfig
from attnzoo.serve.rayserve.environment import free_port, ray_serve_mode, start_ray
from attnzoo.serve.rayserve.launch import deploy
from attnzoo.serve.rayserve.reaping import stop
from attnzoo.serve.rayserve.selection import Selection

# imported on first use, so that a bad command line is refused at once: Ray, and the benchmark (torch, onnx)
serve = lazy_import("ray.serve")
bench_run = lazy_import("attnzoo.benchmarks.run")
models = lazy_import("attnzoo.models")

__all__ = ["main", "build_parser", "run_clients", "summarize", "Record"]

#: Shipped example the clients send by default (resized to the model's input by the server).
DEFAULT_IMAGE = "fashion_cls_0.png"


# ------------------------------------------------------------------------------------------ offline bench
def offline_bench(
    variant: str,
    arch: str,
    threads: int,
    batch_sizes: Sequence[int],
    min_time: float,
    out: Path,
    cache_dir: Path,
    backend: str = ServeConfig.backend,
) -> dict[str, Any]:
    """``bench-latency --backends BACKEND`` in a child process (its own threads); its rows of that backend.

    Args:
        backend: The backend timed (a name or alias); by default the one the load test's deployment serves with.
    """
    backend = get_backend(backend).name  # the rows carry the one name
    cmd = [
        sys.executable,
        "-m",
        "attnzoo.benchmarks.cli",
        "--variants",
        variant,
        "--arch",
        arch,
        "--backends",
        backend,
        "--batch-sizes",
        ",".join(map(str, batch_sizes)),
        "--threads",
        str(threads),
        "--min-time",
        str(min_time),
        "--no-pair-eager",
        "--out",
        str(out),
        "--cache-dir",
        str(cache_dir),
    ]
    print("$ " + " ".join(["bench-latency", *cmd[3:]]), flush=True)
    subprocess.run(cmd, check=True)
    result = json.loads((out / "results.json").read_text())
    rows = [
        {"threads": threads, "batch": r["batch"], "median_ms": r["median_ms"], "img_s": r["throughput_img_s"]}
        for r in result["results"]
        if r["backend"] == backend and r["status"] == "ok"
    ]
    if not rows:
        raise RuntimeError(f"bench-latency timed no {backend} row (see {out / 'results.json'})")
    return {"command": " ".join(["bench-latency", *cmd[3:]]), "rows": rows}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnzoo.serve.rayserve.loadtest",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n", 1)[0],
    )
    parser.add_argument("--variant", default="standard", help="model variant (default standard)")
    parser.add_argument(
        "--arch", default="tiny", help="architecture, random-init as bench-latency (default tiny: ViT-Ti)"
    )
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients (default 32)")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per configuration (default 60)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of load before measuring (default 10)")
    parser.add_argument("--replicas", default="1,2", help="replica counts to run (default 1,2)")
    parser.add_argument(
        "--max-batch-sizes", default="1,8", help="max batch sizes to run, 1 = batching off (default 1,8)"
    )
    parser.add_argument(
        "--batch-wait-ms", type=float, default=None, help="dynamic batching wait (default serve-models')"
    )
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads per replica (default 1)")
    parser.add_argument(
        "--offline-threads", default=None, help="bench-latency thread counts (default: 1 and the number of cores)"
    )
    parser.add_argument("--offline-batch-sizes", default="1,8", help="bench-latency batch sizes (default 1,8)")
    parser.add_argument("--offline-min-time", type=float, default=10.0, help="bench-latency --min-time (default 10)")
    parser.add_argument(
        "--soak", type=float, default=0.0, help="seconds of one long run with the most replicas (0: none)"
    )
    parser.add_argument("--kill-replica", action="store_true", help="run the replica-kill test (2 replicas)")
    parser.add_argument("--kill-duration", type=float, default=30.0, help="seconds of the kill test run (default 30)")
    parser.add_argument(
        "--kill-repeats",
        type=int,
        default=1,
        help="run the kill test this many times, each on a fresh deployment (default 1)",
    )
    parser.add_argument(
        "--kill-only",
        action="store_true",
        help="only the offline reference and the kill test: no configuration runs or soak",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="a request with no answer after this is lost")
    parser.add_argument("--image", type=Path, default=None, help="image the clients send (default a shipped example)")
    parser.add_argument("--port", type=int, default=None, help="HTTP port (default: a free one)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="bench-latency's cache (default as bench-latency)")
    parser.add_argument("--out", type=Path, default=Path("loadtest-out"), help="output folder")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short check: 15 s per configuration, 3 s warm-up, 2 s bench --min-time, 15 s kill run",
    )
    return add_debug_flag(parser)


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be integers separated by commas, got {quoted(text)}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{flag} must be positive integers, got {quoted(text)}")
    return values


def _check_sizes(args: argparse.Namespace, most_replicas: int, cores: int) -> None:
    """Refuse counts below 1, durations not above 0, and more replica threads than this machine has cores."""
    for flag, v in (("--clients", args.clients), ("--threads", args.threads), ("--kill-repeats", args.kill_repeats)):
        if v < 1:
            raise UsageError(f"{flag} must be at least 1, got {v}")
    for flag, v in (("--duration", args.duration), ("--timeout", args.timeout)):
        if not v > 0:
            raise UsageError(f"{flag} must be > 0, got {v}")
    if most_replicas * args.threads > cores:
        raise UsageError(
            f"{most_replicas} replicas x {args.threads} threads need {most_replicas * args.threads} "
            f"cores; this machine has {cores}"
        )


def _base_config(args: argparse.Namespace) -> ServeConfig:
    """The deployment settings every run shares (a free port unless ``--port``)."""
    port = args.port or free_port()
    base = ServeConfig(
        port=port,
        threads=args.threads,
        cpus_per_replica=float(args.threads),
        max_ongoing_requests=max(64, 2 * args.clients),
    )
    if args.batch_wait_ms is not None:
        base.batch_wait_ms = args.batch_wait_ms
    return base


def _config(base: ServeConfig, replicas: int, max_batch: int) -> ServeConfig:
    """``base`` with ``replicas`` and ``max_batch`` (batching off, no batch wait, at 1)."""
    return ServeConfig(
        **{
            **base.__dict__,
            "replicas": replicas,
            "max_batch_size": max_batch,
            "batch_wait_ms": base.batch_wait_ms if max_batch > 1 else 0.0,
        }
    )


def _settings(args: argparse.Namespace, base: ServeConfig, image: Path, body: bytes) -> dict[str, Any]:
    """The result's ``settings``: the clients, the timing, the replicas' threads and the request."""
    return {
        "clients": args.clients,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "threads_per_replica": args.threads,
        "batch_wait_ms": base.batch_wait_ms,
        "image": image.name,
        "image_bytes": len(body),
        "upload": "raw body, Content-Type image/png",
        "client": "asyncio + aiohttp, closed loop, same machine",
        "timeout_s": args.timeout,
    }


def _serve_run(
    args: argparse.Namespace,
    cfg: ServeConfig,
    selection: Selection,
    body: bytes,
    offline_rows: list[dict[str, Any]],
    best: dict[str, Any],
    offline_threads: list[int],
) -> dict[str, Any]:
    """Deploy ``cfg``, warm up, run the clients; the run's numbers against the offline ones."""
    r, b = cfg.replicas, cfg.max_batch_size
    url = deploy(cfg, selection)
    print(
        f"{r} replica(s) x {args.threads} thread(s), max batch {b}: warm-up {args.warmup:g} s, "
        f"then {args.clients} clients for {args.duration:g} s",
        flush=True,
    )
    run_clients(f"{url}/classify", body, args.clients, args.warmup, args.timeout)
    t0 = time.perf_counter()
    records = run_clients(f"{url}/classify", body, args.clients, args.duration, args.timeout)
    s = summarize(records, t0, t0 + args.duration)
    stats = replica_stats(url, r)
    run = {
        "replicas": r,
        "threads": args.threads,
        "max_batch_size": b,
        "batch_wait_ms": cfg.batch_wait_ms,
        "clients": args.clients,
        "summary": s,
        "mean_batch": _mean_batch(stats),
        "replicas_seen": len(stats),
        "vs_offline_best": round(s["throughput_rps"] / best["img_s"], 3),
    }
    same = [x["img_s"] for x in offline_rows if x["threads"] == min(r * args.threads, max(offline_threads))]
    run["vs_offline_same_threads"] = round(s["throughput_rps"] / max(same), 3) if same else None
    print(
        f"  {s['throughput_rps']:.1f} img/s ({run['vs_offline_best']:.0%} of offline best), "
        f"p50 {s['p50_ms']} p95 {s['p95_ms']} p99 {s['p99_ms']} ms, {s['errors']} errors, "
        f"{s['lost']} lost, mean batch {run['mean_batch']}",
        flush=True,
    )
    return run


def _soak(args: argparse.Namespace, cfg: ServeConfig, selection: Selection, body: bytes) -> dict[str, Any]:
    """One long run of ``cfg``: its summary over ``--soak`` seconds."""
    url = deploy(cfg, selection)
    top, b = cfg.replicas, cfg.max_batch_size
    print(f"soak: {top} replica(s), max batch {b}, {args.clients} clients for {args.soak:g} s", flush=True)
    t0 = time.perf_counter()
    records = run_clients(f"{url}/classify", body, args.clients, args.soak, args.timeout)
    return {"replicas": top, "max_batch_size": b, "summary": summarize(records, t0, t0 + args.soak)}


def _kill_tests(args: argparse.Namespace, cfg: ServeConfig, selection: Selection, body: bytes) -> list[dict[str, Any]]:
    """``--kill-repeats`` kill tests of ``cfg`` (two replicas), each on a fresh deployment."""
    kills = []
    for i in tqdm(range(args.kill_repeats), desc="kill tests", disable=args.kill_repeats == 1):
        url = deploy(cfg, selection)
        run_clients(f"{url}/classify", body, args.clients, min(args.warmup, 5.0), args.timeout)
        print(
            f"kill test {i + 1}/{args.kill_repeats}: 2 replicas, {args.clients} clients for "
            f"{args.kill_duration:g} s, one replica killed after {args.kill_duration / 3:.0f} s",
            flush=True,
        )
        kills.append(kill_test(url, body, args.clients, args.kill_duration, 2, args.timeout))
        serve.delete(DEPLOYMENT)  # the next run starts from two fresh replicas
    return kills


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """Run the load test; writes results.json, results.md and loadtest.png into ``--out``."""
    args = build_parser().parse_args(argv)
    if args.quick:
        args.duration, args.warmup, args.offline_min_time, args.kill_duration = 15.0, 3.0, 2.0, 15.0
    cores = os.cpu_count() or 1
    replicas, batches = _ints(args.replicas, "--replicas"), _ints(args.max_batch_sizes, "--max-batch-sizes")
    offline_threads = _ints(args.offline_threads, "--offline-threads") if args.offline_threads else sorted({1, cores})
    offline_batches = _ints(args.offline_batch_sizes, "--offline-batch-sizes")
    args.kill_replica = args.kill_replica or args.kill_only
    _check_sizes(args, max(replicas), cores)
    image = args.image or Path(EXAMPLES_DIR) / DEFAULT_IMAGE
    if not image.is_file():
        raise UsageError(f"--image {image} not found")
    body = image.read_bytes()
    out = writable_dir(args.out)
    cache = Path(args.cache_dir or default_cache_dir() / "bench-latency")

    # the offline reference also exports and verifies the served ONNX file (--kill-only keeps it: pass
    # --offline-threads 1 --offline-batch-sizes 1 --offline-min-time 1 to make it quick)
    offline = [
        offline_bench(
            args.variant, args.arch, t, offline_batches, args.offline_min_time, out / f"offline-threads{t}", cache
        )
        for t in offline_threads
    ]
    rows = [row for o in offline for row in o["rows"]]
    best = max(rows, key=lambda r: r["img_s"])
    model_file = bench_run.onnx_path(cache, args.variant, "cls", args.arch, "fp32", models.ARCHS[args.arch]["img_size"])
    selection = Selection(model_file.parent, {model_file.name: sha256_file(model_file)})

    base = _base_config(args)
    result: dict[str, Any] = {
        "command": "python -m attnzoo.serve.rayserve.loadtest " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": f"{args.variant} {args.arch} (random init, {model_file.name})",
        "environment": environment(),
        "settings": _settings(args, base, image, body),
        "offline": {"runs": offline, "best": best, "best_img_s": best["img_s"]},
        "runs": [],
    }
    started = start_ray(ServeConfig(replicas=max(replicas), cpus_per_replica=float(args.threads)))
    result["settings"]["ingress"] = ray_serve_mode()
    try:
        for r in [] if args.kill_only else replicas:
            for b in batches:
                run = _serve_run(args, _config(base, r, b), selection, body, rows, best, offline_threads)
                result["runs"].append(run)
        if args.soak > 0 and not args.kill_only:
            result["soak"] = _soak(args, _config(base, max(replicas), batches[0]), selection, body)
        if args.kill_replica:
            if 2 * args.threads > cores:
                raise UsageError("--kill-replica needs 2 replicas; this machine has too few cores for them")
            kills = _kill_tests(args, _config(base, 2, batches[0]), selection, body)
            result["kill"] = kills[0]
            if len(kills) > 1:
                result["kill_repeats"] = kills
    finally:
        stop(started)
    result["load_average_end"] = list(os.getloadavg())
    _write(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
