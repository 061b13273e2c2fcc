"""Which ONNX form of the MAE variants' pairwise L1 runs fastest on this CPU, against eager ``cdist``.

For one MAE variant and arch: export one model per form, each verified as ``export-model`` verifies it
(``mae_impl=broadcast``: the direct ``|q_i - k_j|`` tensor; ``blocked`` at each ``--blocks`` size:
:func:`attnzoo.models.wafe.pairwise_l1`), then time eager PyTorch (``cdist``) and every form in ONNX Runtime
(the ``ort-cpu`` session of ``bench-latency``) and OpenVINO round-robin: each round calls every runner once
in the same order, so all of them see about the same load. The speed-up of a runner is the median over
rounds of eager's time / its time in that round, with quartiles. The same seeded weights and input for all.

Usage::

    python -m research.mae_forms --arch tiny --batch-sizes 1,8 --blocks 8,16,32 --threads 1 \\
        --out results/bench-latency/cpu-tiny-mae/forms
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

from tqdm import tqdm

from attnzoo.benchmarks.stats import ratio_stats, summarize
from attnzoo.benchmarks.timing import time_round_robin
from attnzoo.cli import entry_point, parse_batch_sizes
from attnzoo.errors import UsageError
from attnzoo.fileio import default_cache_dir, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary, environment, load_average
from attnzoo.runtime.backends import Call, get_backend, reference_backend
from attnzoo.runtime.parity import check
from research.study import (
    add_output_flags,
    add_round_robin_flags,
    check_arch,
    check_at_least,
    comma_ints,
    command_line,
    parse_study,
    study_parser,
    write_report,
)

# --help and usage errors load without torch, onnx and timm: these import at their first use
torch = lazy_import("torch")
models = lazy_import("attnzoo.models")
wafe = lazy_import("attnzoo.models.wafe")
export = lazy_import("attnzoo.export")

__all__ = ["forms", "markdown", "main"]

MAE_VARIANTS = ("wafe-mae", "anti-wafe-mae")


def forms(blocks: Sequence[int]) -> list[str]:
    """Form names: ``broadcast``, then ``blocked<b>`` per block size."""
    return ["broadcast", *(f"blocked{b}" for b in blocks)]


def _export(model, form: str, path: Path, threads: int) -> dict[str, Any]:
    """Export ``model`` with the pairwise L1 in ``form``, verified; returns the verification report."""
    impl, block = ("broadcast", None) if form == "broadcast" else ("blocked", int(form[len("blocked") :]))
    layers = [m for m in model.modules() if isinstance(m, wafe.PairwiseL1)]
    for layer in layers:
        layer.impl = impl
    try:
        # exactly ``block`` queries per block (the default rule would cap the block count instead)
        with mock.patch("attnzoo.models.wafe.mae_block", (lambda n: block) if block else wafe.mae_block):
            cfg = model.attnzoo_config
            return export.export_verified(
                model, path, cfg, input_hw=(cfg["img_size"],) * 2, batch_sizes=(1,), threads=threads
            )
    finally:
        for layer in layers:
            layer.impl = "auto"


def _rows(times: dict[str, list[float]], batch: int, parity: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for name, samples in times.items():
        row = {"runner": name, "batch": batch, **summarize(samples, batch)}
        if name != reference_backend():
            ratios = ratio_stats(samples, times[reference_backend()])  # eager / runner per round: the speed-up
            row.update(
                speedup=ratios["ratio_median"],
                speedup_q1=ratios["ratio_q1"],
                speedup_q3=ratios["ratio_q3"],
                parity_error=parity[name],
            )
        rows.append(row)
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The result as a markdown table, with the command and the machine."""
    env = result["environment"]
    lines = [
        f"# Pairwise L1 forms of `{result['variant']}`, {result['arch']}, {result['threads']} thread(s)",
        "",
        f"`{result['command']}`",
        "",
        f"CPU: {cpu_summary(env['cpu'])}; load average at start {env['load_average']}, end "
        f"{result['load_average_end']}.",
        "",
        "| batch | runner | median ms | speed-up over eager (q1-q3) | parity error vs eager |",
        "|---:|---|---:|---|---:|",
    ]
    for row in result["rows"]:
        sp = f"{row['speedup']:.2f} ({row['speedup_q1']:.2f}-{row['speedup_q3']:.2f})" if "speedup" in row else "1"
        err = f"{row['parity_error']:.1e}" if "parity_error" in row else "-"
        lines.append(f"| {row['batch']} | {row['runner']} | {row['median_ms']:.1f} | {sp} | {err} |")
    lines += ["", "| form | ONNX nodes | export s (this machine) | verified at batch sizes |", "|---|---:|---:|---|"]
    for form, e in result["exports"].items():
        lines.append(f"| {form} | {e['nodes']} | {e['export_time_s']:.1f} | {e['verified_batch_sizes']} |")
    return "\n".join(lines) + "\n"


COMMAND = "python -m research.mae_forms"


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(COMMAND, __doc__)
    parser.add_argument("--variant", default="wafe-mae", help=f"one of {', '.join(MAE_VARIANTS)}")
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated integers")
    parser.add_argument("--blocks", default="8,16,32", help="query block sizes of the blocked form, comma-separated")
    add_round_robin_flags(parser, "batch size")
    return add_output_flags(
        parser,
        "mae_forms.json, mae_forms.md",
        "exported models (default: <cache>/mae-forms)",
        "print the markdown of a mae_forms.json",
    )


def _exports(model, args: argparse.Namespace, blocks: Sequence[int], cache: Path) -> tuple[dict, dict]:
    """Every form of ``model`` exported and verified: ``({form: path}, {form: what its verification reported})``."""
    paths, exports = {}, {}
    for form in tqdm(forms(blocks), desc="export + verify", disable=args.no_progress):
        paths[form] = cache / f"{args.variant}_{args.arch}_{form}.onnx"
        report = _export(model, form, paths[form], args.threads)
        if not report["passed"]:
            raise RuntimeError(f"{form}: export failed verification: {report['failures']}")
        exports[form] = {
            "export_time_s": report["export_time_s"],
            "nodes": sum(report["op_histogram"].values()),
            "ops": report["op_histogram"],
            "verified_batch_sizes": report["parity"]["batch_sizes"],
        }
    return paths, exports


def _time_batch(model, paths: dict[str, Path], batch: int, args: argparse.Namespace, cache: Path) -> list:
    """Every form on each CPU runtime at one batch size, parity-gated against eager, then timed round-robin."""
    gen = torch.Generator().manual_seed(args.seed + batch)
    x = torch.randn(batch, 3, *(model.attnzoo_config["img_size"],) * 2, generator=gen)
    with torch.no_grad():
        ref = model(x).numpy()
    calls: dict[str, Call] = {}
    runtimes = [b for b in (get_backend("ort-cpu"), get_backend("openvino")) if b.unavailable_reason("fp32") is None]
    for form, path in paths.items():
        for backend in runtimes:
            options = backend.options(threads=args.threads, batch=batch, cache_dir=cache)
            calls[f"{backend.name} {form}"] = backend.load(path, options).call(x.numpy())
    parity: dict[str, float] = {}
    for name, call in calls.items():  # the parity gate of bench-latency (the shared tolerance table)
        ok, parity[name] = check(call.output(), ref, "fp32")
        if not ok:
            raise RuntimeError(f"batch {batch}, {name}: parity error {parity[name]:.1e} against eager")
    runners: dict[str, Callable[[], object]] = {reference_backend(): partial(model, x)}
    runners.update({name: call.fn for name, call in calls.items()})
    with torch.no_grad():
        times = time_round_robin(runners, args.rounds, progress=not args.no_progress)
    for call in calls.values():
        call.close()
    return _rows(times, batch, parity)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.mae_forms``."""
    argv, args = parse_study(build_parser(), argv, markdown)
    if args is None:
        return 0
    if args.variant not in MAE_VARIANTS:
        raise UsageError(f"--variant: unknown {args.variant!r}; valid: {', '.join(MAE_VARIANTS)}")
    check_arch(args.arch)
    batches = parse_batch_sizes(args.batch_sizes)
    blocks = comma_ints(
        args.blocks, lambda b: b >= 1, f"--blocks must be comma-separated positive integers, got {args.blocks!r}", True
    )
    check_at_least(("--threads", args.threads, 1), ("--rounds", args.rounds, 2))
    writable_dir(args.out, "--out folder")
    cache = writable_dir(args.cache_dir or default_cache_dir() / "mae-forms", "--cache-dir folder")
    ov_missing = get_backend("openvino").unavailable_reason("fp32")
    torch.set_num_threads(args.threads)
    env = environment()
    torch.manual_seed(args.seed)
    model = models.create_model(args.variant, task="cls", arch=args.arch).eval()
    paths, exports = _exports(model, args, blocks, cache)
    rows = [row for batch in batches for row in _time_batch(model, paths, batch, args, cache)]
    result = {
        "command": command_line(COMMAND, argv),
        "variant": args.variant,
        "arch": args.arch,
        "threads": args.threads,
        "batch_sizes": batches,
        "blocks": blocks,
        "rounds": args.rounds,
        "openvino": ov_missing or "used",
        "exports": exports,
        "environment": env,
        "load_average_end": load_average(),
        "rows": rows,
    }
    write_report(args.out, "mae_forms", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
