"""``serve-demo``: the Gradio demo on http://127.0.0.1:7860 (offline, CPU by default).

Examples::

    serve-demo                                   # the zoo's models, exported to ONNX once, on the faster CPU runtime
    serve-demo --models exported/ --port 8000    # any folder of .onnx files from export-model
    serve-demo --backend pytorch                 # the zoo checkpoints run by PyTorch
    serve-demo --dtype int8                      # the zoo's models quantized to int8 (verified) on the CPU
    serve-demo --backend-url http://127.0.0.1:8000   # the models of a running serve-models deployment
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnzoo.cli import entry_point, with_arguments
from attnzoo.errors import UsageError
from attnzoo.fileio import CACHE_ENV
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import canonical_backend, cpu_runtimes
from attnzoo.runtime.sessions import SERVED_DTYPES
from attnzoo.serve.loading import AUTO, load_models, load_remote
from attnzoo.serve.network import exposure_warning
from attnzoo.zoo import DEFAULT_DATA

demo_app = lazy_import("attnzoo.serve.demo.app")  # gradio: --help and usage errors load without it

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The ``serve-demo`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="serve-demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The attnzoo Gradio demo (offline; on the CPU by default).",
        epilog="examples:\n" + __doc__.split("Examples::\n\n", 1)[1],
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    return with_arguments(parser, _add_model_args, _add_run_args)


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    """Which models the demo serves (a folder, or the zoo's of a data set), on which backend and precision."""
    parser.add_argument(
        "--models",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve this folder of .onnx files from export-model (.safetensors checkpoints with "
        "--backend pytorch) instead of the zoo",
    )
    parser.add_argument(
        "--backend",
        default=AUTO,
        help="auto (default: the faster of the CPU runtimes ort-cpu and openvino on this machine, timed "
        "at start-up on the served files), or a backend by name or alias (python -m attnzoo.runtime "
        "lists them): ort-cpu (alias onnxruntime), openvino, eager (alias pytorch: the checkpoints), "
        "tensorrt (needs an NVIDIA GPU; engines are built once into the cache folder)",
    )
    parser.add_argument(
        "--backend-url",
        default=None,
        metavar="URL",
        help="run the models on a serve-models deployment at URL (Ray Serve, dynamic batching) "
        "instead of in this process; the demo preprocesses and draws as always",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=SERVED_DTYPES,
        help="int8: serve only int8 models whose export-model verification report is intact (the "
        "zoo: quantized once with ModelOpt, calibrated on training images, scored on the test "
        "set, refused beyond the tolerance); bf16 (OpenVINO, CPUs with bf16 units): the fp32 exports "
        "at bf16, extra math pinned to f32, each verified on its test split first; fp32: only the "
        "unquantized files (fp32 and fp16 exports) "
        "(default: every file of --models, a quantized one only when verified; the zoo at fp32)",
    )
    parser.add_argument(
        "--data",
        default=DEFAULT_DATA,
        help=f"which zoo models to serve: those trained on this data set (default {DEFAULT_DATA})",
    )


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    """Where the exports are kept, the CPU threads of a model call and the segmentation's image size."""
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"where the zoo's ONNX exports and TensorRT engines are kept (default ${CACHE_ENV} or ~/.cache/attnzoo)",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU runtime threads per model call")
    parser.add_argument(
        "--seg-max-side",
        type=int,
        default=None,
        metavar="PX",
        help="downscale images for segmentation to this longest side (default: the model's input "
        "size); larger values run sliding windows",
    )


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``serve-demo``: one ``error: ...`` line and exit 2 (usage) or 1 (failure) on errors."""
    args = build_parser().parse_args(argv)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")

    warning = exposure_warning(args.host, args.port)
    if warning:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    for flag, value in (("--threads", args.threads), ("--seg-max-side", args.seg_max_side)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if args.backend != AUTO:
        try:
            args.backend = canonical_backend(args.backend)
        except ValueError as exc:
            raise UsageError(f"--backend: {exc}; or {AUTO}") from None
    if args.backend_url:
        if args.models or args.backend != AUTO or args.threads or args.dtype:
            raise UsageError(
                "--backend-url serves the deployment's models; it excludes --models, --backend, "
                "--threads and --dtype (give those to serve-models)"
            )

        models = load_remote(args.backend_url)
    else:
        cpu = [b.name for b in cpu_runtimes()]
        if args.dtype == "int8" and args.backend not in (AUTO, *cpu):
            raise UsageError(
                f"--dtype int8 runs on the CPU runtimes (--backend {AUTO}, {' or '.join(cpu)}), not {args.backend}"
            )
        models = load_models(
            args.models, args.backend, data=args.data, cache_dir=args.cache_dir, threads=args.threads, dtype=args.dtype
        )

    source = (
        f"`{args.backend_url}`" if args.backend_url else f"`{args.models}`" if args.models else f"the zoo ({args.data})"
    )
    with demo_app.private_upload_folder():  # every upload goes with the server
        demo = demo_app.build_demo(models, source=source, seg_max_side=args.seg_max_side)
        note = f" (--backend auto: {models[0].backend_note})" if models[0].backend_note else ""
        dtypes = sorted({m.dtype for m in models})
        print(
            f"serving {len(models)} {'/'.join(dtypes)} models with {models[0].backend}{note} on "
            f"http://{args.host}:{args.port}"
        )
        try:
            demo_app.launch(demo, args.host, args.port)
        except OSError as exc:  # port taken, address not available
            raise OSError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
