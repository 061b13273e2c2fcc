"""``python -m attnzoo.benchmarks.scaling``: the command line, checked before any work."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from attnzoo.benchmarks.cli import variant_list
from attnzoo.cli import add_debug_flag, entry_point, flag_values, one_of, parse_names
from attnzoo.errors import UsageError
from attnzoo.fileio import default_cache_dir, writable_dir
from attnzoo.limits import check_batch_sizes, check_side
from attnzoo.models import ARCHS
from attnzoo.runtime.backends import backends

from .fits import DEFAULT_VARIANTS, derive
from .sweep import Settings, run_scaling
from .tables import markdown, write_outputs

__all__ = ["COMMAND", "QUICK", "cpu_backends", "build_parser", "parse_settings", "main"]

COMMAND = "python -m attnzoo.benchmarks.scaling"
#: --quick: the defaults it sets (micro models at small sizes, short timing; the test suite's run).
QUICK = dict(
    arch="micro", sizes=(32, 64), seg_sizes=(32, 64), batch_sizes=(1, 4), batch_px=32, min_time=0.05, min_iters=2
)


def _ints(value: str, flag: str) -> list[int]:
    if not value.strip():
        return []
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {value!r}") from None
    return list(dict.fromkeys(out))


def cpu_backends() -> list[str]:
    """The registry's backends that compute on the CPU (the ones this command times)."""
    return [b.name for b in backends() if b.row_device("cpu") == "cpu"]


def _add_sweep_flags(parser: argparse.ArgumentParser) -> None:
    """What is measured: variants, backends, the model and the sizes of each sweep."""
    parser.add_argument(
        "--variants",
        default=",".join(DEFAULT_VARIANTS),
        help="'all' or comma-separated variant names (default: one per cost family)",
    )
    parser.add_argument(
        "--backends",
        default="eager,ort-cpu",
        help=f"comma-separated, from the registry's CPU backends: {', '.join(cpu_backends())}",
    )
    parser.add_argument("--arch", default="small", choices=("micro", "tiny", "small", "base"))
    parser.add_argument("--sizes", default="224,384,512", help="classifier input sizes (px), batch 1")
    parser.add_argument("--seg-sizes", default="512,1024", help="Segmenter input sizes (px), batch 1; '' for none")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16", help="batch sweep at --batch-px; '' for none")
    parser.add_argument("--batch-px", type=int, default=224, help="classifier input size of the batch sweep")


def _add_timing_flags(parser: argparse.ArgumentParser) -> None:
    """How each measurement is timed and when a call is skipped."""
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of PyTorch and ONNX Runtime")
    parser.add_argument("--min-time", type=float, default=2.0, help="seconds timed per measurement")
    parser.add_argument("--min-iters", type=int, default=2, help="timed calls per measurement, at least")
    parser.add_argument(
        "--max-call-s",
        type=float,
        default=120.0,
        help="skip a call predicted (from the previous size) to take longer than this",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="micro models at 32/64 px, batch 1/4, short timing: checks the pipeline in a minute or two",
    )
    parser.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Scaling: latency and peak memory against tokens and batch size, one variant per cost family, "
        "eager and ONNX.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_sweep_flags(parser)
    _add_timing_flags(parser)
    parser.add_argument("--out", type=Path, default=Path("scaling-out"), help="output folder")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="exported models (default: <cache>/scaling, <cache> as for bench-latency)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        default=None,
        help="measure nothing: redo the fits, cost model, scaling.md and scaling.png of a scaling.json into --out",
    )
    return add_debug_flag(parser)


def _check_sizes(args: argparse.Namespace) -> tuple[list[int], list[int], list[int]]:
    """``--sizes``, ``--seg-sizes`` and ``--batch-sizes``, each checked; ``UsageError`` naming the flag."""
    sizes, seg_sizes = _ints(args.sizes, "--sizes"), _ints(args.seg_sizes, "--seg-sizes")
    batch_sizes = _ints(args.batch_sizes, "--batch-sizes")
    patch = ARCHS[args.arch]["patch_size"]
    if not (sizes or seg_sizes or batch_sizes):
        raise UsageError("nothing to measure: --sizes, --seg-sizes and --batch-sizes are all empty")
    sides = (("--sizes", sizes), ("--seg-sizes", seg_sizes), ("--batch-px", [args.batch_px] if batch_sizes else []))
    try:
        for flag, values in sides:
            for v in values:
                check_side(v, flag)
                if v % patch:
                    raise ValueError(f"{flag}: {v} px is not a multiple of the {args.arch} patch size {patch}")
        check_batch_sizes(batch_sizes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return sorted(sizes), sorted(seg_sizes), sorted(batch_sizes)


def _check_timing(args: argparse.Namespace) -> None:
    """``UsageError`` for a thread count, call count or time out of range."""
    for flag, v, lo in (("--threads", args.threads, 1), ("--min-iters", args.min_iters, 2)):
        if v < lo:
            raise UsageError(f"{flag} must be >= {lo}, got {v}")
    for flag, v in (("--min-time", args.min_time), ("--max-call-s", args.max_call_s)):
        if not v > 0:
            raise UsageError(f"{flag} must be > 0, got {v}")


def parse_settings(argv: Sequence[str]) -> Settings:
    """Command line -> :class:`Settings`; ``UsageError`` (one line) for a bad value, before any work."""
    parser = build_parser()
    if parser.parse_args(list(argv)).quick:  # --quick changes the defaults; flags given explicitly still win
        parser.set_defaults(**{k: ",".join(map(str, v)) if isinstance(v, tuple) else v for k, v in QUICK.items()})
    args = parser.parse_args(list(argv))
    chosen = parse_names(args.backends, one_of(cpu_backends()), "backend", ", ".join(cpu_backends()))
    sizes, seg_sizes, batch_sizes = _check_sizes(args)
    _check_timing(args)
    return Settings(
        variants=variant_list(args.variants),
        backends=chosen,
        arch=args.arch,
        sizes=sizes,
        seg_sizes=seg_sizes,
        batch_sizes=batch_sizes,
        **flag_values(args, "batch_px", "threads", "min_time", "min_iters", "max_call_s", "seed", "out"),
        cache_dir=args.cache_dir or default_cache_dir() / "scaling",
        progress=not args.no_progress,
        command=shlex.join([*COMMAND.split(), *argv]),
        quick=args.quick,
    )


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnzoo.benchmarks.scaling``: the output folders are checked writable before any work."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.render is not None:
        if not args.render.is_file():
            raise UsageError(f"--render {args.render}: no such file")
        writable_dir(args.out, "--out folder")
        files = write_outputs(derive(json.loads(args.render.read_text())), args.out)
        print("wrote " + ", ".join(str(p) for p in files.values()))
        return 0
    settings = parse_settings(argv)
    writable_dir(settings.out, "--out folder")
    writable_dir(settings.cache_dir, "--cache-dir folder")
    result = run_scaling(settings, partial=settings.out / "scaling.json")
    files = write_outputs(result, settings.out)
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0
