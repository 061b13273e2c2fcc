"""``bench-latency``: latency of attention variants on every backend, measured the way trtexec does.

With no flags it runs a representative table in minutes (:data:`DEFAULT_SCOPE`: three variants from the cheapest
to the dearest cost family, batch 1, every backend here) and says what it left out; ``--all`` runs everything.

Example::

    bench-latency --arch tiny --batch-sizes 1,8 --backends eager,compile,ort-cpu --min-time 1 \\
        --out results/bench-latency/cpu-tiny
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.ceiling import DEFAULT_SIZE, MAX_SIZE
from attnzoo.benchmarks.roofline import against_results, resolve_gpus, roofline
from attnzoo.benchmarks.roofline import markdown as roofline_markdown
from attnzoo.benchmarks.tables import LOG_NAME, charts_unavailable, markdown, scope_line, write_outputs
from attnzoo.cli import entry_point, flag_values, one_of, parse_batch_sizes, parse_names, with_arguments
from attnzoo.errors import CommandError, UsageError
from attnzoo.fileio import atomic_write_text, default_cache_dir, private_dir, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.limits import MAX_BATCH_SIZE
from attnzoo.machine import usable_cores
from attnzoo.modelconfig import check_variant, known_variants, variant_names
from attnzoo.runtime.backends import DTYPES, backend_names, canonical_backend, get_backend
from attnzoo.signals import Interrupted, Terminated, signals_deferred

# --help and usage errors load without torch, onnx and timm: these import at their first use
torch = lazy_import("torch")
models = lazy_import("attnzoo.models")
model_memory = lazy_import("attnzoo.models.memory")
bench_run = lazy_import("attnzoo.benchmarks.run")

__all__ = ["main", "build_parser", "parse_settings", "DEFAULT_SCOPE", "FULL_SCOPE", "scope"]

#: What a run with no flags measures (argparse dest -> value as typed): the cheapest and the two dearest cost
#: families of the bench's own overhead table (``results/bench-latency/cpu-tiny/README.md``; docs/benchmarks.md
#: quotes it): standard; belief2, the dearest projection, with its extra matrices; wafe-mae, whose pairwise L1 is
#: N^2 vector work (horizontal-vertical, the axial family, is left out and named); batch 1 (in the committed
#: default run with batch 1 and 8, batch 8's rows were about 85 % of the timed and paired calls' seconds, counted
#: from their medians and call counts), 0.5 s per measurement (still >= 10 iterations)
#: and 30 s of torch.compile (one or two compilations). Its measured time is in docs/benchmarks.md. A flag given
#: on the command line wins.
DEFAULT_SCOPE = {"variants": "standard,belief2,wafe-mae", "batch_sizes": "1", "min_time": 0.5, "compile_budget": 30.0}
#: ``--all``: every variant, batch 1, 8 and 32, 3 s per measurement, 600 s of torch.compile (the committed
#: runs under ``results/bench-latency/``, whose READMEs say how long they took).
FULL_SCOPE = {"variants": "all", "batch_sizes": "1,8,32", "min_time": 3.0, "compile_budget": 600.0}
_FLAGS = {
    "variants": "--variants",
    "batch_sizes": "--batch-sizes",
    "min_time": "--min-time",
    "compile_budget": "--compile-budget",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench-latency", description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    return with_arguments(parser, _add_scope_args, _add_run_args, _add_timing_args, _add_roofline_args)


def _add_scope_args(parser: argparse.ArgumentParser) -> None:
    """What is measured: the variants, the model, the backends, the precisions and the batch sizes."""
    parser.add_argument(
        "--all",
        action="store_true",
        help="measure everything: "
        + " ".join(f"{_FLAGS[k]} {v:g}" if isinstance(v, float) else f"{_FLAGS[k]} {v}" for k, v in FULL_SCOPE.items())
        + " (45-80 minutes on 2 cores); flags given as well still win",
    )
    parser.add_argument(
        "--variants",
        default=argparse.SUPPRESS,
        help=f"'all' or comma-separated variant names (default: {DEFAULT_SCOPE['variants']})",
    )
    parser.add_argument("--task", default="cls", choices=("cls", "seg"))
    parser.add_argument("--arch", default="tiny", choices=("micro", "tiny", "small", "base"))
    parser.add_argument(
        "--img-size",
        type=int,
        default=None,
        metavar="PX",
        help="input side in pixels (default: the arch's own, 224 for tiny/small/base)",
    )
    parser.add_argument(
        "--backends",
        default=",".join(backend_names()),
        help=f"comma-separated, from: {', '.join(backend_names())} (python -m attnzoo.runtime lists them "
        "with their aliases; those this machine lacks are listed as "
        "skipped, with the reason)",
    )
    parser.add_argument(
        "--dtypes",
        "--dtype",
        dest="dtype",
        default="fp32",
        help=f"comma-separated, from: {', '.join(DTYPES)} (fp32: IEEE fp32 everywhere, TF32 off; tf32: "
        "a GPU's TF32 tensor cores; int8: ModelOpt Q/DQ on ort-cpu, NNCF on openvino; --dtype is "
        "the old spelling)",
    )
    parser.add_argument(
        "--batch-sizes",
        default=argparse.SUPPRESS,
        help=f"comma-separated integers in 1..{MAX_BATCH_SIZE} (default: {DEFAULT_SCOPE['batch_sizes']})",
    )


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    """Where and how the run works: threads, time per measurement, its folders, the device and the seed."""
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads for PyTorch and ONNX Runtime (default: the usable cores)",
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=argparse.SUPPRESS,
        help=f"seconds timed per measurement, >= 10 iterations (default: {DEFAULT_SCOPE['min_time']:g})",
    )
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="exported / optimized models (default: <cache>/bench-latency, <cache> being "
        "$ATTNZOO_CACHE, else $XDG_CACHE_HOME/attnzoo, else ~/.cache/attnzoo, as for serve-demo)",
    )
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="device of eager/compile")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random-init weights and the inputs")


def _add_timing_args(parser: argparse.ArgumentParser) -> None:
    """What the run spends time on: compiles, the matmul ceiling, the profile, the paired run, its own limit."""
    parser.add_argument(
        "--compile-budget",
        type=float,
        default=argparse.SUPPRESS,
        help="seconds of compilation allowed (torch.compile, AOTInductor, ExecuTorch); a compile job the "
        "compiles so far predict would pass it is skipped, and says so "
        f"(default: {DEFAULT_SCOPE['compile_budget']:g})",
    )
    parser.add_argument(
        "--ceiling-size",
        type=int,
        default=DEFAULT_SIZE,
        metavar="N",
        help="side of the square matmul that measures the machine's fp32/int8 ceiling at the start "
        "(0: not measured; then no row has a ceiling fraction)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile ONNX Runtime CPU ops (naive vs tuned session) -> ort_profile.md"
    )
    parser.add_argument("--no-pair-eager", action="store_true", help="skip the backend/eager A B A B speed-up run")
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no new row after this many seconds: the rows measured are written and the same "
        "command measures the rest (every finished row is kept in <out>/rows.jsonl)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_roofline_args(parser: argparse.ArgumentParser) -> None:
    """``--roofline``: the bound alone, measured against a GPU run's results."""
    parser.add_argument(
        "--roofline",
        metavar="GPUS",
        default=None,
        help="measure nothing: print the roofline lower bound of --variants/--arch/--task/--batch-sizes "
        "per precision on these GPUs (all, auto, h100, h100-sxm, h100-pcie, h200, a100) and write "
        "roofline.md/.json to --out",
    )
    parser.add_argument(
        "--against",
        metavar="RESULTS_JSON",
        type=Path,
        default=None,
        help="with --roofline: read a GPU run's results.json as fractions of the bound",
    )


def _backends(value: str) -> list[str]:
    """``--backends``: names or aliases of the runtime's registry -> their one names."""
    return parse_names(
        value, canonical_backend, "backend", f"{', '.join(backend_names())} (aliases: python -m attnzoo.runtime)"
    )


def variant_list(value: str) -> list[str]:
    """``--variants``: ``all`` or comma-separated variant names (aliases resolved); ``UsageError`` otherwise. Checked
    without torch where no variant plugin is installed (:func:`attnzoo.modelconfig.known_variants`), by the
    registry otherwise."""
    if value.strip() == "all":
        return list(_all_variants())
    known = known_variants()
    if known is None:  # a plugin is installed (or the registry is loaded here): the registry knows the names
        return parse_names(value, models.canonical_name, "variant", f"all, {', '.join(sorted(models.VARIANTS))}")
    return parse_names(value, lambda n: check_variant(n) or n, "variant", f"all, {', '.join(sorted(known))}")


def _all_variants() -> Sequence[str]:
    return variant_names() or models.VARIANT_NAMES


def _check_memory(settings) -> None:
    """Refuse (exit 2) a largest batch whose forward pass would not fit in the memory available now."""
    for variant in settings.variants:
        with torch.device("meta"):  # the config only: no weights are allocated
            config = models.create_model(
                variant, task=settings.task, arch=settings.arch, img_size=settings.img_size
            ).attnzoo_config
        try:
            model_memory.check_forward_memory(config, (config["img_size"],) * 2, max(settings.batch_sizes))
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def _flag(key: str, value: Any) -> str:
    return f"{_FLAGS[key]} {value:g}" if isinstance(value, float) else f"{_FLAGS[key]} {value}"


def scope(args: argparse.Namespace) -> dict[str, Any]:
    """Fill the scope flags not given from :data:`DEFAULT_SCOPE` (``--all``: :data:`FULL_SCOPE`) into ``args``;
    return what the run covers against ``--all``: ``{"preset", "from_preset", "left_out", "everything"}``.

    ``left_out`` lists, in words, what ``--all`` would measure beyond this run (empty when nothing).
    """
    preset = FULL_SCOPE if args.all else DEFAULT_SCOPE
    from_preset = [k for k in preset if not hasattr(args, k)]
    for k in from_preset:
        setattr(args, k, preset[k])
    left_out = []
    variants = variant_list(args.variants)
    every = _all_variants()
    missing = [v for v in every if v not in variants]
    if missing:
        left_out.append(f"{len(missing)} of {len(every)} variants ({', '.join(missing)})")
    batches = [
        b for b in parse_batch_sizes(str(FULL_SCOPE["batch_sizes"])) if b not in parse_batch_sizes(args.batch_sizes)
    ]
    if batches:
        left_out.append(f"batch {', '.join(map(str, batches))}")
    for key, what in (("min_time", "s per measurement"), ("compile_budget", "s of torch.compile")):
        if getattr(args, key) < FULL_SCOPE[key]:
            left_out.append(f"{getattr(args, key):g} {what} instead of {FULL_SCOPE[key]:g}")
    full = " ".join(_flag(k, v) for k, v in FULL_SCOPE.items())
    return {
        "preset": "all" if args.all else "default",
        "from_preset": {k: preset[k] for k in from_preset},
        "left_out": left_out,
        "everything": f"bench-latency --all (= {full}; 45-80 minutes on 2 cores), or those flags one by one",
    }


def parse_settings(argv: Sequence[str] | None = None):
    """Command line -> :class:`attnzoo.benchmarks.run.Settings`.

    Raises:
        UsageError: a bad flag value (one line).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    covered = scope(args)
    if not args.min_time > 0:
        raise UsageError(f"--min-time must be > 0, got {args.min_time}")
    threads = args.threads if args.threads is not None else usable_cores()
    if threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    if args.img_size is not None and not 16 <= args.img_size <= 4096:
        raise UsageError(f"--img-size must be in 16..4096 pixels, got {args.img_size}")
    if args.time_limit is not None and not args.time_limit > 0:
        raise UsageError(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    if args.ceiling_size != 0 and not 64 <= args.ceiling_size <= MAX_SIZE:
        raise UsageError(f"--ceiling-size must be 0 or in 64..{MAX_SIZE}, got {args.ceiling_size}")
    out = args.out
    cache = args.cache_dir or default_cache_dir() / "bench-latency"
    backends = _backends(args.backends)
    dtypes = parse_names(args.dtype, one_of(DTYPES), "dtype", ", ".join(DTYPES))
    named = any(x == "--backends" or x.startswith("--backends=") for x in argv)
    if not args.all and not named:  # the default table: what runs here (an engine no GPU here runs is not timed;
        # torch is asked whether a GPU is here, so every name above is checked first)
        build_only = build_only_backends(backends, args.device)
        backends = [b for b in backends if b not in build_only]
        if build_only:
            covered["left_out"].append(
                f"{', '.join(build_only)} engine builds (no GPU here runs them; --backends {','.join(build_only)} "
                "builds them)"
            )
    return bench_run.Settings(
        variants=variant_list(args.variants),
        backends=backends,
        dtypes=dtypes,
        batch_sizes=parse_batch_sizes(args.batch_sizes),
        **flag_values(args, "task", "arch", "img_size", "time_limit"),
        threads=threads,
        min_time=args.min_time,
        out=out,
        cache_dir=cache,
        **flag_values(args, "device", "seed", "compile_budget", "profile"),
        pair_eager=not args.no_pair_eager,
        progress=not args.no_progress,
        ceiling_size=args.ceiling_size,
        command=shlex.join(["bench-latency", *argv]),
        scope=covered,
    )


def build_only_backends(backends: Sequence[str], device: str = "auto") -> list[str]:
    """The ``backends`` that would only build an engine here, not run it: they build ahead of time and the run's
    device has no GPU that runs their engines."""
    where = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    return [b for b in backends if get_backend(b).builds_engine and get_backend(b).unavailable_reason("fp32", where)]


def roofline_main(args: argparse.Namespace) -> int:
    """``bench-latency --roofline GPUS``: the roofline tables (:mod:`attnzoo.benchmarks.roofline`), no timing."""
    try:
        gpus = resolve_gpus(args.roofline)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    variants, batches = variant_list(args.variants), parse_batch_sizes(args.batch_sizes)
    if args.against is not None and not args.against.is_file():
        raise UsageError(f"--against {args.against}: no such file")
    writable_dir(args.out, "--out folder")
    result = roofline(variants, args.task, args.arch, batches, gpus)
    against = against_results(result, args.against) if args.against is not None else None
    result["against"] = against
    md = roofline_markdown(result, against)
    atomic_write_text(args.out / "roofline.md", md + "\n")
    atomic_write_text(args.out / "roofline.json", json.dumps(result, indent=1) + "\n")
    print(md)
    print(f"wrote {args.out / 'roofline.md'}, {args.out / 'roofline.json'}")
    return 0


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``bench-latency``; the output folder is checked writable before anything is measured."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.roofline is not None:
        args.all = True  # nothing is timed: the full scope costs nothing
        scope(args)
        return roofline_main(args)
    if args.against is not None:
        raise UsageError("--against needs --roofline")
    settings = parse_settings(argv)
    if settings.device == "cuda":
        if not torch.cuda.is_available():
            raise UsageError("--device cuda but no CUDA GPU is available")
    writable_dir(settings.out, "--out folder")
    private_dir(settings.cache_dir, "--cache-dir folder")  # it keeps compiled programs and engines: yours alone
    _check_memory(settings)
    print(scope_line(settings.scope), flush=True)
    # from the end of the jobs (run_benchmark calls hold_signals) until the results are written, a signal waits:
    # a second Ctrl-C or SIGTERM after the one that stopped the jobs cannot cut the writing of what was measured
    with contextlib.ExitStack() as held:
        result = bench_run.run_benchmark(settings, hold_signals=lambda: held.enter_context(signals_deferred()))
        try:
            files = write_outputs(result, settings.out)
        except OSError as exc:
            raise CommandError(
                f"{exc.strerror or exc}; every finished row is in {settings.out / LOG_NAME}: the "
                "same command writes the results without measuring them again"
            ) from None
    print(markdown(result))
    print("wrote " + ", ".join(str(p) for p in files.values()))
    if charts_unavailable() and not result["interrupted"]:
        print(f"note: {charts_unavailable()}")
    stopped = result["interrupted"]
    if stopped:  # the rows are written: now exit as the signal asks (130 / 143); a time limit ends normally
        print(stopped["note"], file=sys.stderr)
        if stopped["signal"]:
            raise Terminated() if stopped["signal"] == "SIGTERM" else Interrupted()
    return 0


if __name__ == "__main__":
    sys.exit(main())
