"""``bench-latency``: latency of attention variants on every backend, measured the way trtexec does.

Example::

    bench-latency --arch tiny --batch-sizes 1,8 --backends eager,compile,ort-cpu --min-time 1 \\
        --out benchmarks/results/cpu-tiny
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from attnzoo.limits import MAX_BATCH_SIZE, check_batch_sizes

from attnzoo.cli import UsageError, add_debug_flag, entry_point

from .backends import BACKENDS, DTYPES
from .ceiling import DEFAULT_SIZE, MAX_SIZE

__all__ = ["main", "build_parser", "parse_settings"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench-latency", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--variants", default="all", help="'all' or comma-separated variant names")
    p.add_argument("--task", default="cls", choices=("cls", "seg"))
    p.add_argument("--arch", default="tiny", choices=("micro", "tiny", "small", "base"))
    p.add_argument("--backends", default=",".join(BACKENDS),
                   help=f"comma-separated, from: {', '.join(BACKENDS)} (those this machine lacks are listed as "
                        "skipped, with the reason)")
    p.add_argument("--dtypes", "--dtype", dest="dtype", default="fp32",
                   help=f"comma-separated, from: {', '.join(DTYPES)} (int8: ModelOpt Q/DQ on ort-cpu, NNCF on "
                        "openvino; --dtype is the old spelling)")
    p.add_argument("--batch-sizes", default="1,8,32", help=f"comma-separated integers in 1..{MAX_BATCH_SIZE}")
    p.add_argument("--threads", type=int, default=None,
                   help="intra-op threads for PyTorch and ONNX Runtime (default: the usable cores)")
    p.add_argument("--min-time", type=float, default=3.0, help="seconds timed per measurement (>= 10 iterations)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="exported / optimized models (default: <cache>/bench-latency, <cache> being "
                        "$ATTNZOO_CACHE, else $XDG_CACHE_HOME/attnzoo, else ~/.cache/attnzoo, as for serve-demo)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="device of eager/compile")
    p.add_argument("--seed", type=int, default=0, help="seed of the random-init weights and the inputs")
    p.add_argument("--compile-budget", type=float, default=600.0,
                   help="seconds of torch.compile compilation allowed; later compile jobs are skipped")
    p.add_argument("--ceiling-size", type=int, default=DEFAULT_SIZE, metavar="N",
                   help="side of the square matmul that measures the machine's fp32/int8 ceiling at the start "
                        "(0: not measured; then no row has a ceiling fraction)")
    p.add_argument("--profile", action="store_true",
                   help="profile ONNX Runtime CPU ops (naive vs tuned session) -> ort_profile.md")
    p.add_argument("--no-pair-eager", action="store_true", help="skip the backend/eager A B A B speed-up run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--roofline", metavar="GPUS", default=None,
                   help="measure nothing: print the roofline lower bound of --variants/--arch/--task/--batch-sizes "
                        "per precision on these GPUs (all, auto, h100, h100-sxm, h100-pcie, h200, a100) and write "
                        "roofline.md/.json to --out")
    p.add_argument("--against", metavar="RESULTS_JSON", type=Path, default=None,
                   help="with --roofline: read a GPU run's results.json as fractions of the bound")
    return add_debug_flag(p)


def _names(value: str, valid: Sequence[str], kind: str) -> List[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise UsageError(f"unknown {kind} {', '.join(map(repr, bad)) or '(none given)'}; "
                         f"valid: {', '.join(valid)}")
    return list(dict.fromkeys(names))


def _variants(value: str) -> List[str]:
    from attnzoo.models import VARIANT_NAMES, VARIANTS, canonical_name

    if value.strip() == "all":
        return list(VARIANT_NAMES)
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = []
    out = []
    for n in names:
        try:
            out.append(canonical_name(n))
        except ValueError:
            bad.append(n)
    if bad or not names:
        raise UsageError(f"unknown variant {', '.join(map(repr, bad)) or '(none given)'}; "
                         f"valid: all, {', '.join(sorted(VARIANTS))}")
    return list(dict.fromkeys(out))


def _batches(value: str) -> List[int]:
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise UsageError(f"--batch-sizes must be comma-separated positive integers, got {value!r}")
    try:
        check_batch_sizes(sizes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return list(dict.fromkeys(sizes))


def _check_memory(settings) -> None:
    """Refuse (exit 2) a largest batch whose forward pass would not fit in the memory available now."""
    import torch

    from attnzoo.limits import check_forward_memory
    from attnzoo.models import create_model

    for variant in settings.variants:
        with torch.device("meta"):  # the config only: no weights are allocated
            config = create_model(variant, task=settings.task, arch=settings.arch).attnzoo_config
        try:
            check_forward_memory(config, (config["img_size"],) * 2, max(settings.batch_sizes))
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def parse_settings(argv: Optional[Sequence[str]] = None):
    """Command line -> :class:`attnzoo.benchmarks.run.Settings`.

    Raises:
        UsageError: a bad flag value (one line).
    """
    from attnzoo.fileio import default_cache_dir

    from .run import Settings

    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if not a.min_time > 0:
        raise UsageError(f"--min-time must be > 0, got {a.min_time}")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = a.threads if a.threads is not None else usable
    if threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    if a.ceiling_size != 0 and not 64 <= a.ceiling_size <= MAX_SIZE:
        raise UsageError(f"--ceiling-size must be 0 or in 64..{MAX_SIZE}, got {a.ceiling_size}")
    out = a.out
    cache = a.cache_dir or default_cache_dir() / "bench-latency"
    return Settings(variants=_variants(a.variants), backends=_names(a.backends, BACKENDS, "backend"),
                    dtypes=_names(a.dtype, DTYPES, "dtype"), batch_sizes=_batches(a.batch_sizes), task=a.task,
                    arch=a.arch, threads=threads, min_time=a.min_time, out=out, cache_dir=cache, device=a.device,
                    seed=a.seed, compile_budget=a.compile_budget, profile=a.profile,
                    pair_eager=not a.no_pair_eager, progress=not a.no_progress, ceiling_size=a.ceiling_size,
                    command=shlex.join(["bench-latency", *argv]))


def roofline_main(a: argparse.Namespace) -> int:
    """``bench-latency --roofline GPUS``: the roofline tables (:mod:`attnzoo.benchmarks.roofline`), no timing."""
    import json

    from attnzoo.fileio import atomic_write_text, writable_dir

    from .roofline import against_results, markdown, resolve_gpus, roofline

    try:
        gpus = resolve_gpus(a.roofline)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    variants, batches = _variants(a.variants), _batches(a.batch_sizes)
    if a.against is not None and not a.against.is_file():
        raise UsageError(f"--against {a.against}: no such file")
    writable_dir(a.out, "--out folder")
    result = roofline(variants, a.task, a.arch, batches, gpus)
    against = against_results(result, a.against) if a.against is not None else None
    result["against"] = against
    md = markdown(result, against)
    atomic_write_text(a.out / "roofline.md", md + "\n")
    atomic_write_text(a.out / "roofline.json", json.dumps(result, indent=1) + "\n")
    print(md)
    print(f"wrote {a.out / 'roofline.md'}, {a.out / 'roofline.json'}")
    return 0


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``bench-latency``; the output folder is checked writable before anything is measured."""
    from attnzoo.fileio import writable_dir

    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if a.roofline is not None:
        return roofline_main(a)
    if a.against is not None:
        raise UsageError("--against needs --roofline")
    settings = parse_settings(argv)
    if settings.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda but no CUDA GPU is available")
    writable_dir(settings.out, "--out folder")
    writable_dir(settings.cache_dir, "--cache-dir folder")
    _check_memory(settings)
    from .report import markdown, write_outputs, write_profile
    from .run import run_benchmark

    result = run_benchmark(settings)
    files = write_outputs(result, settings.out)
    if result["ort_profile"]:
        files["profile"] = write_profile(result["ort_profile"], settings.out / "ort_profile.md")
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
