"""bf16 on the CPU: the zoo's accuracy at fp32 and OpenVINO bf16, ViT-S speed at fp32 / bf16 / int8, and the
check that the extra math runs at f32.

1. Extra-math check (every zoo model chosen, every CPU): the model's verified fp32 export, its extra-math ops
   pinned to f32 (:func:`attnzoo.targets.openvino.pin_f32`) and compiled by OpenVINO at bf16 where the CPU has bf16
   units, else at f32; OpenVINO's runtime model is read back (:func:`attnzoo.targets.openvino.runtime_precisions`):
   the kernels that compute extra-math ops, their runtime precisions, the matmuls' precisions, and the "unpinned"
   kernels (an extra-math op inside a kernel whose own op carries no pin, which OpenVINO is then free to run at
   the inference precision). At f32 the precisions say nothing about bf16; the pins and kernels do.
2. Accuracy (CPUs with bf16 units): the test split at OpenVINO f32 and bf16 on the same images
   (:func:`attnzoo.runtime.evaluate.score_runs`), the drop against :data:`attnzoo.targets.openvino.bf16.ACCURACY_GATE`.
3. Speed (CPUs with bf16 units): random-init ``--speed-arch`` models (ViT-S 224 by default) of
   ``--speed-variants``: OpenVINO fp32, bf16 (extra math pinned, read back) and NNCF int8
   (:mod:`attnzoo.benchmarks.rows`), each gated against eager fp32 by the shared tolerance table, then timed
   against fp32 alternately (A B A B) at each batch size and thread count.

On a CPU without bf16 units 2 and 3 are not measured: the report says why (one line) and names the command.

Usage::

    python -m research.bf16 --out results/studies/bf16-amx
    python -m research.bf16 --table results/studies/bf16-amx/bf16.json
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from attnzoo.benchmarks.cli import variant_list
from attnzoo.benchmarks.tables import markdown_table
from attnzoo.benchmarks.timing import measure_pair
from attnzoo.cli import entry_point, parse_batch_sizes
from attnzoo.errors import UsageError, first_line
from attnzoo.fileio import default_cache_dir, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary, environment, load_1min, load_average
from attnzoo.runtime.backends import LoadOptions
from attnzoo.runtime.contract import metadata_props
from attnzoo.runtime.evaluate import score_runs
from attnzoo.runtime.sessions import verification_problem
from attnzoo.targets.openvino import (
    OPENVINO,
    PrecisionCheckError,
    bf16_unavailable_reason,
    check_runtime_precisions,
    unavailable_reason,
)
from attnzoo.targets.openvino.bf16 import ACCURACY_GATE
from research.study import (
    add_output_flags,
    add_speed_arch,
    add_zoo_selection,
    check_above_zero,
    check_at_least,
    command_line,
    gated_calls,
    paired_speedup,
    parse_study,
    study_parser,
    write_json,
    write_report,
    zoo_entries,
)

# --table loads without torch, onnx and timm: these import at their first use
onnx = lazy_import("onnx")
torch = lazy_import("torch")
models = lazy_import("attnzoo.models")
checkpoint = lazy_import("attnzoo.models.checkpoint")
zoo = lazy_import("attnzoo.zoo")
export = lazy_import("attnzoo.export")
quantize = lazy_import("attnzoo.export.quantize")
bench_rows = lazy_import("attnzoo.benchmarks.rows")

__all__ = ["zoo_row", "speed_rows", "markdown", "main"]

#: Labels of the precisions timed against fp32 in the speed rows.
SPEED_DTYPES = ("bf16", "int8")


def _fp32_export(entry: Mapping[str, Any], cache: Path, threads: int | None) -> Path:
    """The zoo model's verified fp32 export, made once (reused while its report holds and it names the checkpoint)."""
    path = cache / f"{entry['variant']}_{entry['task']}_{entry['data']}.onnx"
    if (
        path.is_file()
        and verification_problem(path, "fp32") is None
        and metadata_props(path).get("checkpoint_sha256") == entry.get("sha256")
    ):
        return path
    model, cfg = zoo.load(entry["variant"], entry["task"], entry["data"])
    path.parent.mkdir(parents=True, exist_ok=True)
    export.export_verified(
        model, path, cfg, batch_sizes=(1,), checkpoint_sha256=entry.get("sha256", ""), threads=threads
    )
    return path


def zoo_row(
    entry: Mapping[str, Any], cache: Path, *, bf16: bool, threads: int | None = None, limit: int | None = None
) -> dict[str, Any]:
    """One zoo model: the extra-math check (at bf16 when ``bf16``, else f32) and, with ``bf16``, the accuracy of
    both precisions on its test split. A model whose check or scoring fails is a row with the reason."""
    cfg = checkpoint.read_config(zoo.checkpoint_path(entry["variant"], entry["task"], entry["data"]))
    row: dict[str, Any] = {
        "variant": entry["variant"],
        "task": entry["task"],
        "data": entry["data"],
        "arch": cfg.get("arch"),
        "checkpoint_sha256": entry.get("sha256"),
    }
    path = _fp32_export(entry, cache, threads)
    names = quantize.extra_math_nodes(onnx.load(str(path), load_external_data=False), cfg)
    precision = "bf16" if bf16 else "fp32"
    try:
        session = OPENVINO.load(path, LoadOptions(dtype=precision, threads=threads, keep_f32=tuple(names))).live()
    except PrecisionCheckError as exc:  # the check itself failed: a result, with the reason
        return {**row, "status": "failed", "reason": first_line(exc), "extra_math_nodes": len(names)}
    check = session.precision_check
    assert check is not None  # keep_f32 given: the session checked its precisions
    row.update(
        status="ok",
        extra_math_nodes=len(names),
        compiled_at=check["inference_precision"],
        extra_math=check["extra_math"],
        matmuls=check["matmuls"]["by_precision"],
    )
    if not bf16:
        return row
    try:
        check_runtime_precisions(check, "bf16")
        ev = score_runs(
            {"fp32": OPENVINO.load(path, LoadOptions(threads=threads)).run, "bf16": session.run}, cfg, limit=limit
        )
    except (PrecisionCheckError, FloatingPointError) as exc:
        return {**row, "status": "failed", "reason": first_line(exc)}
    drop = ev["metrics"]["fp32"] - ev["metrics"]["bf16"]
    gate = ACCURACY_GATE[entry["task"]]
    row["accuracy"] = {**ev, "limit": limit, "drop": drop, "gate": gate, "within_gate": drop <= gate}
    return row


def _threads(spec: str) -> list[int]:
    """``1,all`` -> [1, the cores this process may use]."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    out = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        n = usable if part == "all" else int(part)
        if n < 1:
            raise ValueError(f"thread counts must be >= 1 or 'all', got {part}")
        out.append(n)
    return list(dict.fromkeys(out))


def _speed_row(arch: str, variant: str, threads: int, batch: int, min_time: float, cache: Path) -> dict[str, Any]:
    """One variant at one thread count and batch size: OpenVINO fp32, bf16 and int8, parity-gated, then each of
    bf16 and int8 timed A B A B against fp32."""
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    model = models.create_model(variant, task="cls", arch=arch).eval()
    cfg = model.attnzoo_config
    size = int(cfg["img_size"])
    fp32 = cache / f"{variant}_cls_{arch}_fp32.onnx"
    if not fp32.is_file():
        export.export_verified(model, fp32, cfg, input_hw=(size, size), batch_sizes=(1,), threads=threads)
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
    with torch.inference_mode():
        ref = model(x).float().numpy()
    dtypes = ("fp32", *SPEED_DTYPES)
    name = f"{variant} {{dtype}} b{batch} t{threads}"
    calls, infos, parity = gated_calls("openvino", model, fp32, x, ref, dtypes, name, threads=threads, cache_dir=cache)
    try:
        row: dict[str, Any] = {
            "variant": variant,
            "arch": arch,
            "batch": batch,
            "threads": threads,
            "load_1min": load_1min(),
            "precision_check": infos["bf16"].get("precision_check"),
            "fp32": {},
        }
        fp32_ms = []
        for dtype in SPEED_DTYPES:
            t32, tx = measure_pair(calls["fp32"].fn, calls[dtype].fn, min_time)
            fp32_ms += t32
            row[dtype] = {"median_ms": float(np.median(tx) * 1e3), **paired_speedup(t32, tx)}
            row[dtype]["parity_error"] = parity[dtype]
        row["fp32"] = {"median_ms": float(np.median(fp32_ms) * 1e3), "parity_error": parity["fp32"]}
        return row
    finally:  # each call owns its compiled model: freed now, not by the garbage collector
        for call in calls.values():
            call.close()


def speed_rows(
    arch: str,
    variants: Sequence[str],
    batch_sizes: Sequence[int],
    thread_counts: Sequence[int],
    min_time: float,
    cache: Path,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """OpenVINO fp32 against bf16 and NNCF int8, per variant, thread count and batch size: each model gated
    against eager fp32 under the tolerance table, then timed A B A B against fp32."""
    jobs = [(v, t, n) for v in variants for t in thread_counts for n in batch_sizes]
    return [
        _speed_row(arch, variant, threads, batch, min_time, cache)
        for variant, threads, batch in tqdm(jobs, desc="bf16 speed", unit="job", disable=not progress)
    ]


# ------------------------------------------------------------------------------------------------ report
def _f(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _check_cell(row: Mapping[str, Any]) -> str:
    extra = row.get("extra_math") or {}
    if row.get("status") != "ok" and not extra:
        return f"failed: {row.get('reason')}"
    if not row.get("extra_math_nodes"):
        return "no extra math"
    kernels = ", ".join(f"{n} {p}" for p, n in sorted((extra.get("by_precision") or {}).items()))
    unpinned = len(extra.get("unpinned") or [])
    return f"{kernels} kernel(s); {'all pinned' if not unpinned else f'{unpinned} unpinned'}"


def _zoo_cells(row: Mapping[str, Any], bf16: bool) -> list[str]:
    """One zoo model's row: its extra-math check and, where bf16 was measured, its accuracy at both precisions."""
    cells = [
        row["variant"],
        row["task"],
        str(row.get("extra_math_nodes", "-")),
        _check_cell(row),
        ", ".join(f"{n} {p}" for p, n in sorted((row.get("matmuls") or {}).items())) or "-",
    ]
    if bf16:
        acc = row.get("accuracy") or {}
        metrics = acc.get("metrics") or {}
        cells += [
            acc.get("metric_name", "-"),
            _f(metrics.get("fp32")),
            _f(metrics.get("bf16")),
            _f(acc.get("drop")),
            _f(acc.get("gate")),
            _f((acc.get("agreement") or {}).get("bf16"), ".4f"),
        ]
    return cells


def _zoo_section(result: Mapping[str, Any]) -> list[str]:
    """The zoo models' table (the extra-math check, and the accuracy where bf16 was measured), the images scored
    and the unpinned kernels."""
    rows = result.get("zoo") or []
    if not rows:
        return []
    bf16 = not result.get("bf16_unavailable")
    head = ["model", "task", "extra-math ops", f"extra-math kernels (compiled at {'bf16' if bf16 else 'f32'})"]
    head += ["matmul kernels", *(["metric", "fp32", "bf16", "drop", "gate", "agreement"] if bf16 else [])]
    parts = [
        "## Zoo models: the extra-math check" + (" and test-split accuracy" if bf16 else ""),
        "",
        markdown_table(head, [_zoo_cells(row, bf16) for row in rows]),
        "",
    ]
    n_img = {n for row in rows if (n := (row.get("accuracy") or {}).get("n_images")) is not None}
    if n_img:
        parts += [f"Test images per model: {', '.join(str(n) for n in sorted(n_img))}.", ""]
    unpinned = [
        f"{row['variant']} {row['task']}: {', '.join((row.get('extra_math') or {}).get('unpinned', [])[:3])}"
        for row in rows
        if (row.get("extra_math") or {}).get("unpinned")
    ]
    if unpinned:
        parts += ["Unpinned extra-math kernels (their own op carries no pin):", "", *[f"- {u}" for u in unpinned], ""]
    return parts


def _speed_cells(row: Mapping[str, Any]) -> list[str]:
    """One speed row: fp32, bf16 and int8 latency, each speed-up with its quartiles, the kernels kept at f32."""
    kernels = (row.get("precision_check") or {}).get("extra_math_runtime_nodes") or {}
    speedups = [
        f"{_f(row[d]['speedup_median'])} [{_f(row[d]['speedup_q1'])}, {_f(row[d]['speedup_q3'])}]" for d in SPEED_DTYPES
    ]
    return [
        row["variant"],
        str(row["threads"]),
        str(row["batch"]),
        _f(row["fp32"]["median_ms"]),
        _f(row["bf16"]["median_ms"]),
        speedups[0],
        _f(row["int8"]["median_ms"]),
        speedups[1],
        f"{kernels.get('f32', 0)} of {sum(kernels.values())}" if kernels else "no extra math",
        _f(row.get("load_1min")),
    ]


def _speed_section(result: Mapping[str, Any]) -> list[str]:
    """The speed table, or why it was not measured."""
    speed = result.get("speed") or []
    if not speed:
        why = result.get("speed_not_measured")
        return ["## Speed", "", f"Not measured: {why}", ""] if why else []
    head = ["variant", "threads", "batch", "fp32 ms", "bf16 ms", "bf16 speed-up [Q1, Q3]", "int8 ms"]
    head += ["int8 speed-up [Q1, Q3]", "extra-math kernels at f32", "load (1 min)"]
    settings = result["speed_settings"]
    return [
        f"## Speed: OpenVINO, {settings['arch']} random init, fp32 against bf16 and NNCF int8",
        "",
        f"Each model passes the parity gate against eager fp32 (fp32 1e-4, bf16 6e-2, static int8 0.5) "
        f"before it is timed alternately with fp32 (A B A B, {settings['min_time']:g} s); speed-up = median "
        "[Q1, Q3] of per-pair fp32 / other ratios.",
        "",
        markdown_table(head, [_speed_cells(row) for row in speed]),
        "",
    ]


def markdown(result: Mapping[str, Any]) -> str:
    """The report: machine, the refusal (if any), the extra-math check and accuracy table, the speed table."""
    env = result["environment"]
    versions = env.get("versions", {})
    parts = [
        "# bf16 on the CPU: zoo accuracy, extra-math precision, ViT-S speed",
        "",
        f"Command: `{result['command']}`",
        "",
        f"CPU: {cpu_summary(env['cpu'])}, {env['cpu']['usable_cores']} usable cores; OpenVINO "
        f"{versions.get('openvino')}, torch {versions.get('torch')}. Load average {result.get('load_start')} at "
        f"the start, {result.get('load_end')} at the end.",
        "",
    ]
    if result.get("bf16_unavailable"):
        parts += [
            f"**bf16 is refused on this CPU:** {result['bf16_unavailable']}",
            "",
            "Not measured here: the zoo's bf16 accuracy and the bf16 speed (they need a CPU with bf16 units). "
            "The extra-math check below compiled each model at f32: its pins and kernels are what bf16 would "
            "compile from, its precisions are f32 by construction.",
            "",
        ]
    return "\n".join(parts + _zoo_section(result) + _speed_section(result))


# ------------------------------------------------------------------------------------------------ command
COMMAND = "python -m research.bf16"


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(COMMAND, __doc__)
    add_zoo_selection(parser, task="all")
    parser.add_argument(
        "--threads", type=int, default=None, help="OpenVINO threads of the zoo check and scoring (default: all cores)"
    )
    add_speed_arch(parser)
    parser.add_argument("--speed-variants", default="standard,belief2", help="variants of the speed comparison")
    parser.add_argument(
        "--speed-threads", default="1,all", help="thread counts of the speed comparison ('all': every usable core)"
    )
    parser.add_argument("--batch-sizes", default="1,8", help="batch sizes of the speed comparison")
    parser.add_argument("--min-time", type=float, default=3.0, help="seconds of A B A B timing per pair")
    parser.add_argument("--no-speed", action="store_true", help="the zoo only")
    return add_output_flags(
        parser,
        "bf16.md/.json",
        "exported and quantized models (default: <cache>/bf16-study, <cache> as for bench-latency)",
        "print the markdown report of this bf16.json",
    )


def _speed_plan(args: argparse.Namespace) -> dict[str, Any]:
    """The speed comparison's settings from the command line; ``UsageError`` for a bad value, before any work."""
    batches = parse_batch_sizes(args.batch_sizes)
    try:
        thread_counts = _threads(args.speed_threads)
        speed_variants = variant_list(args.speed_variants)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_at_least(("--threads", 1 if args.threads is None else args.threads, 1))
    check_above_zero("--min-time", args.min_time)
    return {
        "arch": args.speed_arch,
        "variants": speed_variants,
        "batch_sizes": batches,
        "threads": thread_counts,
        "min_time": args.min_time,
    }


def _speed(args: argparse.Namespace, plan: Mapping[str, Any], refused: str | None, cache: Path) -> dict[str, Any]:
    """``speed`` (the rows) or ``speed_not_measured`` (why not: ``--no-speed``, or the CPU's refusal)."""
    if args.no_speed or refused:
        return {"speed_not_measured": "--no-speed" if args.no_speed else refused}
    rows = speed_rows(
        plan["arch"],
        plan["variants"],
        plan["batch_sizes"],
        plan["threads"],
        plan["min_time"],
        cache,
        progress=not args.no_progress,
    )
    return {"speed": rows}


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.bf16``."""
    argv, args = parse_study(build_parser(), argv, markdown)
    if args is None:
        return 0
    plan = _speed_plan(args)
    reason = unavailable_reason()
    if reason:
        raise ValueError(reason)
    entries = zoo_entries(args)
    writable_dir(args.out, "--out folder")
    cache = writable_dir(args.cache_dir or default_cache_dir() / "bf16-study", "--cache-dir folder")
    refused = bf16_unavailable_reason()
    if refused:
        print(f"bf16 not measured on this CPU: {refused}", file=sys.stderr)
    result: dict[str, Any] = {
        "command": command_line(COMMAND, argv),
        "environment": environment(),
        "bf16_unavailable": refused,
        "load_start": load_average(),
    }
    rows: list[dict[str, Any]] = []
    for entry in tqdm(entries, desc="bf16 zoo", unit="model", disable=args.no_progress):
        rows.append(zoo_row(entry, cache, bf16=refused is None, threads=args.threads, limit=args.limit))
        write_json(args.out / "bf16.partial.json", rows)  # kept if stopped
    result.update(zoo=rows, speed_settings=plan, **_speed(args, plan, refused, cache))
    result["load_end"] = load_average()
    write_report(args.out, "bf16", result, markdown(result))
    (args.out / "bf16.partial.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
