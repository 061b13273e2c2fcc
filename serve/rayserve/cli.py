"""``serve-models``: the zoo's verified ONNX models behind a Ray Serve HTTP deployment with dynamic batching.

Examples::

    serve-models                                      # the zoo, local Ray (no setup), http://127.0.0.1:8000
    serve-models --variants standard,belief2 --task cls --port 8080
    serve-models --arch tiny --replicas 2 --threads 1 # random-init ViT-Ti (224 px), two 1-thread replicas
    serve-models --models exported/ --max-batch-size 1  # a folder of export-model files, batching off
    serve-models --config serve.yaml --address auto   # settings from a file; join a running Ray cluster
    curl -F file=@shirt.png http://127.0.0.1:8000/classify

Errors: one ``error: ...`` line, exit 2 for a bad command line (refused before Ray starts), 1 for a failure;
Ctrl-C or SIGTERM stops the app (and the local Ray) and exits 130 / 143.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.errors import UsageError, quoted
from attnzoo.lazy import lazy_import
from attnzoo.modelconfig import ARCHS, check_variant
from attnzoo.runtime.sessions import SERVED_DTYPES
from attnzoo.serve.loading import resolve_backend
from attnzoo.serve.rayserve.config import DEFAULT_MAX_BATCH, TASK_CHOICES, ServeConfig, merged, read_config_file
from attnzoo.serve.rayserve.environment import _LOCAL, divert_native_stderr
from attnzoo.serve.rayserve.launch import serve_models, startup_line

registry = lazy_import("attnzoo.models")  # timm: a plugin's variant names are checked against it

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The ``serve-models`` argument parser (every setting defaults to None: config file, then built-in)."""
    builtin = ServeConfig()
    parser = argparse.ArgumentParser(
        prog="serve-models",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve attnzoo models over HTTP with Ray Serve (dynamic batching, "
        "replicas). Flags override --config, which overrides the defaults.",
        epilog="examples:\n" + __doc__.split("Examples::\n\n", 1)[1],
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML or JSON file with any of the settings below (keys as the long flags)",
    )
    parser.add_argument("--host", help=f"address the HTTP proxy listens on (default {builtin.host})")
    parser.add_argument("--port", type=int, help=f"HTTP port (default {builtin.port})")
    parser.add_argument(
        "--address",
        help="join this Ray cluster (e.g. auto, or ray://head:10001) instead of starting "
        "a local Ray; --models must then be readable at the same path on every node",
    )
    _add_model_args(parser.add_argument_group("models (default: the zoo)"), builtin)
    run = parser.add_argument_group("replicas and batching")
    _add_replica_args(run, builtin)
    _add_request_args(run, builtin)
    parser.add_argument(
        "--cache-dir", type=Path, help="zoo / random-init exports (default $ATTNZOO_CACHE or ~/.cache/attnzoo)"
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="local Ray only: port of Ray's Prometheus metrics (default: a free port, printed)",
    )
    return add_debug_flag(parser)


def _add_model_args(src: argparse._ArgumentGroup, builtin: ServeConfig) -> None:
    """Which models are served: a folder of exports, or the zoo's (or fresh ones of an arch) by variant and task;
    ``builtin``: the built-in settings the help names."""
    src.add_argument("--models", type=Path, metavar="DIR", help="serve this folder of export-model .onnx files")
    src.add_argument("--data", help=f"zoo models trained on this data set (default {builtin.data})")
    src.add_argument(
        "--arch",
        help="serve freshly initialised models of this arch (e.g. tiny: ViT-Ti at 224 px), "
        "exported and verified once into the cache; untrained, for measuring serving",
    )
    src.add_argument("--variants", help="comma-separated variants to serve (default: all; standard with --arch)")
    src.add_argument(
        "--task", choices=TASK_CHOICES, help="which models: cls, seg or both (default both; cls with --arch)"
    )


def _add_replica_args(run: argparse._ArgumentGroup, builtin: ServeConfig) -> None:
    """How many replicas, what each reserves, and the dynamic batching; ``builtin``: the built-in settings."""
    run.add_argument("--replicas", type=int, help=f"Ray Serve replicas (default {builtin.replicas})")
    run.add_argument(
        "--cpus-per-replica", type=float, help=f"CPUs each replica reserves (default {builtin.cpus_per_replica:g})"
    )
    run.add_argument(
        "--gpus-per-replica",
        type=float,
        help=f"GPUs each replica reserves (default {builtin.gpus_per_replica:g}); with --backend tensorrt",
    )
    run.add_argument("--threads", type=int, help="ONNX Runtime threads per replica (default: --cpus-per-replica)")
    run.add_argument(
        "--max-batch-size",
        type=int,
        help=f"most requests in one dynamic batch; 1 turns batching off (default "
        f"{DEFAULT_MAX_BATCH['cpu']} on CPU replicas, where ONNX Runtime runs ViT-Ti faster per "
        f"image at batch 1 than at 8; {DEFAULT_MAX_BATCH['gpu']} with --gpus-per-replica)",
    )
    run.add_argument(
        "--batch-wait-ms",
        type=float,
        help=f"how long a batch waits for more requests (default {builtin.batch_wait_ms:g})",
    )
    run.add_argument("--no-batching", action="store_true", help="same as --max-batch-size 1 --batch-wait-ms 0")


def _add_request_args(run: argparse._ArgumentGroup, builtin: ServeConfig) -> None:
    """What a replica admits at once and what it runs: decode memory, requests in flight, the backend and the
    precision; ``builtin``: the built-in settings."""
    run.add_argument(
        "--decode-memory-mb",
        type=float,
        metavar="MIB",
        help="memory the images one replica decodes at once may hold, in MiB; uploads beyond it wait, "
        "then get 503 (default: a quarter of the memory available to the replica, at most 3.2 GB: "
        "two images at the 40 MP cap)",
    )
    run.add_argument(
        "--max-ongoing-requests",
        type=int,
        help=f"requests a replica takes at once, the rest wait in the proxy (default {builtin.max_ongoing_requests})",
    )
    run.add_argument(
        "--backend",
        help="ort-cpu (default; alias onnxruntime) or openvino on the CPU, or tensorrt (engines "
        "built once per replica's GPU, checked against ONNX Runtime); any backend of "
        "python -m attnzoo.runtime that runs ONNX files, by name or alias",
    )
    run.add_argument(
        "--dtype",
        choices=SERVED_DTYPES,
        help="int8: serve only int8 models whose export-model verification report holds (the "
        "zoo's, quantized and scored on their test split once into the cache; or the files of "
        "--models DIR from export-model --dtype int8, unverified ones skipped with the reason); "
        "bf16 (with --backend openvino, on a CPU with bf16 units): the fp32 exports at OpenVINO's "
        "bf16 precision, extra math pinned to f32, each verified on its test split first; "
        "default fp32: the unquantized files (fp32 and fp16 exports)",
    )


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    """Defaults < ``--config`` file < flags; ``UsageError`` for a bad value."""
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "debug", "no_batching", "metrics_port")}
    if args.no_batching:
        if args.max_batch_size not in (None, 1):
            raise UsageError("--no-batching and --max-batch-size > 1 contradict each other")
        flags.update(max_batch_size=1, batch_wait_ms=0.0)
    try:
        file_values = read_config_file(args.config) if args.config else {}
        cfg = merged(file_values, flags)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    if cfg.arch is not None and cfg.arch not in ARCHS:
        raise UsageError(f"unknown arch {quoted(cfg.arch)}; valid: {', '.join(ARCHS)}")
    try:  # the names first, without torch where no variant plugin is installed; then the backend, whose check
        for v in cfg.variants or ():  # imports its library
            if check_variant(v) is None:  # a plugin is installed: the registry knows its names
                registry.canonical_name(v)
        resolve_backend(cfg.backend)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return cfg


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``serve-models``: runs until Ctrl-C / SIGTERM."""
    args = build_parser().parse_args(argv)
    cfg = config_from_args(args)

    try:
        with serve_models(cfg, metrics_port=args.metrics_port) as served:
            _announce(cfg, served)
            if served.selection.pending:
                print(f"  {served.export_pending()} model(s) ready", flush=True)
            while True:
                time.sleep(3600)
    finally:
        if _LOCAL["shutdown_abandoned"]:  # the process ends with the command's line (attnzoo.signals.abandon)
            _native_stderr_off()


def _native_stderr_off() -> None:
    """Once the stop is done: what native threads write to file descriptor 2 goes to ``/dev/null`` (Ray's core
    worker in this process, whose shutdown was given up on, logs each failed write to the raylet the stop ended,
    every half second until the process exits), while ``sys.stderr`` goes on to the real stream: the command's own
    line is its last. Never put back: the process is ending."""
    divert_native_stderr(os.devnull)


def _announce(cfg: ServeConfig, served) -> None:
    """The start-up lines: what is served where (the first one is what scripts wait for), where the start went."""
    selection, url, mode, metrics = served.selection, served.url, served.mode, served.metrics
    assert cfg.max_batch_size is not None  # ServeConfig sets its default
    batching = (
        f"dynamic batching up to {cfg.max_batch_size} requests, {cfg.batch_wait_ms:g} ms wait"
        if cfg.max_batch_size > 1
        else "batching off"
    )
    print(
        f"serving {len(selection.files)} model(s) with {cfg.replicas} replica(s) x {cfg.intra_op_threads} "
        f"thread(s), {batching}, {mode}, on {url}",
        flush=True,
    )
    print(
        f"  POST {url}/classify   POST {url}/segment   GET {url}/models   GET {url}/health   GET {url}/stats",
        flush=True,
    )
    if metrics:
        print(f"  Ray Serve metrics (Prometheus): {metrics}", flush=True)
    if served.startup_s:
        print(f"  {startup_line(served.startup_s)}", flush=True)
    if served.logs:
        folder, kept = served.logs
        print(
            f"  logs of Ray, Serve and the replicas (a 500's traceback): {folder}"
            + ("" if kept else " (removed at the stop; set RAY_TMPDIR to keep them)"),
            flush=True,
        )
    if selection.pending:
        print(
            f"  exporting and verifying the other {len(selection.pending)} zoo model(s) in the background; each "
            "answers 503 until it is ready",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
