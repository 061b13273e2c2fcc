"""What the study commands share: the parser and command line, the zoo models they select, the ``--table``
reprint, the machine line, and writing a report.

Each study writes ``<name>.json`` (every number, the command and the machine) and ``<name>.md`` (its tables) into
``--out``; ``--table FILE`` prints the markdown of an earlier ``<name>.json`` and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.cli import variant_list
from attnzoo.benchmarks.stats import ratio_stats
from attnzoo.cli import add_debug_flag
from attnzoo.errors import UsageError
from attnzoo.fileio import atomic_write_text
from attnzoo.lazy import lazy_import
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.runtime.parity import check as check_parity

zoo = lazy_import("attnzoo.zoo")  # its models and data load torch: the light studies' --table runs without them
models = lazy_import("attnzoo.models")
bench_rows = lazy_import("attnzoo.benchmarks.rows")  # torch and onnx: a study's --table runs without them

__all__ = [
    "study_parser",
    "add_output_flags",
    "add_round_robin_flags",
    "comma_ints",
    "add_speed_arch",
    "parse_study",
    "command_line",
    "zoo_entries",
    "contended",
    "reprint",
    "require_out",
    "write_report",
    "write_json",
    "add_zoo_selection",
    "cpu_line",
    "check_at_least",
    "check_above_zero",
    "check_arch",
    "gated_calls",
    "paired_speedup",
]


def study_parser(command: str, doc: str | None) -> argparse.ArgumentParser:
    """A study's parser: ``command`` as its usage (``python -m research.<name>``), its docstring's first line as
    its description, every default shown."""
    return argparse.ArgumentParser(
        prog=command,
        description=(doc or "").split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )


def add_output_flags(
    parser: argparse.ArgumentParser, files: str, cache: str | None, table: str | None = "print its markdown"
) -> argparse.ArgumentParser:
    """``--out``, ``--cache-dir`` (where ``cache`` names its default folder in the cache), ``--table``,
    ``--no-progress`` and ``--debug``: the flags every study ends with.

    Args:
        parser: The study's parser.
        files: What ``--out`` receives (``bf16.md/.json``).
        cache: What the cache holds and its default folder, as ``--cache-dir``'s help says it; ``None``: no flag.
        table: What ``--table JSON`` does (it runs nothing); ``None``: the study adds its own.
    """
    parser.add_argument("--out", type=Path, default=None, help=f"output folder ({files})")
    if cache is not None:
        parser.add_argument("--cache-dir", type=Path, default=None, help=cache)
    if table is not None:
        parser.add_argument("--table", type=Path, metavar="JSON", default=None, help=f"{table}; runs nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return add_debug_flag(parser)


def add_round_robin_flags(parser: argparse.ArgumentParser, rounds_per: str) -> None:
    """``--arch``, ``--threads``, ``--rounds`` (every runner once a round, ``rounds_per``: of what) and ``--seed``:
    the flags of a study that times its runners round-robin (:func:`attnzoo.benchmarks.timing.time_round_robin`)."""
    parser.add_argument("--arch", default="tiny", help="model arch (attnzoo.models.ARCHS)")
    parser.add_argument("--threads", type=int, default=1, help="threads of PyTorch, ONNX Runtime and OpenVINO")
    parser.add_argument("--rounds", type=int, default=15, help=f"timed rounds per {rounds_per} (>= 2)")
    parser.add_argument("--seed", type=int, default=0)


def add_speed_arch(parser: argparse.ArgumentParser) -> None:
    """``--speed-arch``: the random-init model a study's speed comparison times."""
    parser.add_argument(
        "--speed-arch",
        default="small",
        choices=("micro", "tiny", "small", "base"),
        help="architecture of the speed comparison (small: ViT-S 224)",
    )


def comma_ints(text: str, ok: Callable[[int], bool], message: str, empty_ok: bool = False) -> list[int]:
    """A flag's comma-separated integers, without repeats, in the order given, each ``ok``; ``UsageError(message)``
    for anything else (and for none, unless ``empty_ok``)."""
    try:
        values = list(dict.fromkeys(int(v) for v in text.split(",") if v.strip()))
    except ValueError:
        raise UsageError(message) from None
    if (not values and not empty_ok) or not all(ok(v) for v in values):
        raise UsageError(message)
    return values


def parse_study(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, markdown: Callable[[dict[str, Any]], str]
) -> tuple[list[str], argparse.Namespace | None]:
    """The command line (``sys.argv`` by default) and its flags; ``None`` for the flags once ``--table`` printed
    its report (the command then ends). ``--out`` is required otherwise (``UsageError``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if reprint(args.table, markdown):
        return argv, None
    require_out(args.out)
    return argv, args


def command_line(command: str, argv: Sequence[str]) -> str:
    """The command as it was run, quoted for a shell: what a result records."""
    return shlex.join([*command.split(), *argv])


def zoo_entries(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Zoo entries of ``--data`` / ``--task`` / ``--variants``; ``UsageError`` naming what the zoo has otherwise."""
    have = [e for e in zoo.entries() if e["data"] == args.data and args.task in ("all", e["task"])]
    if not have:
        datasets = sorted({e["data"] for e in zoo.entries()})
        raise UsageError(
            f"the zoo has no {args.task} models for data {args.data!r}; it has data: {', '.join(datasets)}"
        )
    if args.variants.strip() == "all":
        return have
    wanted = variant_list(args.variants)
    missing = [v for v in wanted if v not in {e["variant"] for e in have}]
    if missing:
        raise UsageError(f"the zoo has no {args.task} {args.data} model of {', '.join(missing)}")
    return [e for e in have if e["variant"] in wanted]


def contended(load_start: list[float], load_end: list[float], threads: int) -> bool:
    """Whether the 1-minute load average at the start or the end exceeds the study's own threads (+0.5)."""
    loads = [v[0] for v in (load_start, load_end) if v]
    return bool(loads) and max(loads) > threads + 0.5


def reprint(table: Path | None, markdown: Callable[[dict[str, Any]], str]) -> bool:
    """With ``--table FILE``, print ``markdown`` of that JSON report and return True (the command then ends)."""
    if table is None:
        return False
    if not table.is_file():
        raise UsageError(f"--table: no such file: {table}")
    print(markdown(json.loads(table.read_text())))
    return True


def require_out(out: Path | None, table_does: str = "print a report") -> Path:
    """``--out``, required unless ``--table`` is given."""
    if out is None:
        raise UsageError(f"--out is required (or --table to {table_does})")
    return out


def write_json(path: Path, result: Any, indent: int = 1) -> None:
    """``result`` (a JSON value: a report, or the rows so far) as a JSON file, written whole (atomically)."""
    atomic_write_text(path, json.dumps(result, indent=indent) + "\n")


def write_report(out: Path, name: str, result: Mapping[str, Any], md: str, indent: int = 1) -> None:
    """``<out>/<name>.json`` and ``<out>/<name>.md``, each written whole (atomically), then the markdown printed."""
    write_json(out / f"{name}.json", result, indent)
    atomic_write_text(out / f"{name}.md", md)
    print(md)


def add_zoo_selection(parser: argparse.ArgumentParser, task: str = "cls") -> None:
    """The flags that choose which zoo models a study scores and on how much of the test split.

    Args:
        parser: The study's parser.
        task: ``--task``'s default (``cls``, ``seg`` or ``all``).
    """
    parser.add_argument("--variants", default="all", help="'all' or comma-separated variant names")
    parser.add_argument("--task", choices=("cls", "seg", "all"), default=task)
    parser.add_argument("--data", default=zoo.DEFAULT_DATA, help="zoo data set (zoo/manifest.json)")
    parser.add_argument("--limit", type=int, default=None, help="first N test images only (default: the whole split)")


def cpu_line(cpu: Mapping[str, Any]) -> str:
    """One line naming the CPU a result was measured on: its model, cores and key instruction-set flags."""
    return (
        f"CPU: {cpu.get('model', '?')}, {cpu.get('usable_cores', cpu.get('logical_cores', '?'))} usable cores; "
        f"flags: {', '.join(cpu.get('key_flags', [])) or 'none recorded'}"
    )


def check_at_least(*checks: tuple[str, int | float, int | float]) -> None:
    """``UsageError`` for the first ``(flag, value, lowest)`` whose value is below its lowest."""
    for flag, value, lowest in checks:
        if value < lowest:
            raise UsageError(f"{flag} must be >= {lowest}, got {value}")


def check_above_zero(flag: str, value: float) -> None:
    """``UsageError`` unless ``value`` is above zero (a time: ``--min-time``)."""
    if not value > 0:
        raise UsageError(f"{flag} must be > 0, got {value}")


def check_arch(arch: str) -> str:
    """``--arch``, a name of :data:`attnzoo.models.ARCHS`; ``UsageError`` listing them otherwise."""
    if arch not in models.ARCHS:
        raise UsageError(f"--arch: unknown {arch!r}; valid: {', '.join(models.ARCHS)}")
    return arch


def gated_calls(
    backend: str, model, onnx_path: Path, x, ref, dtypes: Sequence[str], name: str, **load: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    """``backend``'s call of ``onnx_path`` at each of ``dtypes`` (``bench-latency``'s own, :func:`attnzoo.benchmarks.
    rows.load_call`, on the CPU), each output checked against ``ref`` (eager fp32) under the shared tolerance table
    before anything is timed: ``(calls, infos, parity errors)``, by dtype. The caller closes the calls.

    Raises:
        RuntimeError: an output beyond its tolerance, named by ``name`` (``{dtype}`` in it stands for the dtype);
            the calls made so far are closed.
    """
    calls: dict[str, Any] = {}
    infos: dict[str, Any] = {}
    parity: dict[str, float] = {}
    try:
        for dtype in dtypes:
            calls[dtype], infos[dtype] = bench_rows.load_call(
                backend, model, onnx_path, x.numpy(), dtype, device="cpu", **load
            )
            key = bench_rows.tolerance_for(backend, dtype, "cpu")
            ok, parity[dtype] = check_parity(calls[dtype].output(), ref, key)
            if not ok:
                raise RuntimeError(
                    f"{name.format(dtype=dtype)}: parity error {parity[dtype]:.3g} beyond the {key} tolerance "
                    f"{TOLERANCES[key]:g}"
                )
    except BaseException:
        for call in calls.values():
            call.close()
        raise
    return calls, infos, parity


def paired_speedup(reference: Sequence[float], other: Sequence[float]) -> dict[str, float]:
    """The speed-up of ``other`` over ``reference`` from A B A B pairs (:func:`attnzoo.benchmarks.timing.
    measure_pair`): the median and quartiles of the per-pair ratio reference time / other time, and the pairs."""
    ratios = ratio_stats(list(other), list(reference))
    return {
        "speedup_median": ratios["ratio_median"],
        "speedup_q1": ratios["ratio_q1"],
        "speedup_q3": ratios["ratio_q3"],
        "pairs": ratios["pairs"],
    }
