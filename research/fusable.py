"""What a fusable export changes: each variant exported at opset 20 (attention as MatMul / Softmax / MatMul) and at
opset 23 (each dot-product core as one standard ``Attention`` op), audited and timed on each CPU runtime.

For each variant and input size: both exports verified as ``export-model`` verifies them (parity with eager, the
extra math kept), the fusion audit of each (:func:`attnzoo.runtime.fusion.audit`: which runtime runs each block's
core as one kernel), then eager PyTorch and both files in ONNX Runtime (the ``ort-cpu`` session of
``bench-latency``) and OpenVINO timed round-robin (every runner once per round, in the same order, so all see about
the same load). The effect of the opset-23 file on a runtime is the median over rounds of the opset-20 file's time /
the opset-23 file's time in that round, with quartiles. Variants whose scores are no dot product (the pairwise-L1
ones) export no ``Attention`` op and are listed with that reason.

Usage::

    python -m research.fusable --variants standard,belief2,wafe-mse --arch tiny --img-sizes 224,512 \\
        --threads 1 --out results/studies/fusable-amx
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attnzoo.benchmarks.fusable import OPSETS, speedups, time_opsets
from attnzoo.benchmarks.stats import summarize
from attnzoo.cli import entry_point, parse_names
from attnzoo.fileio import default_cache_dir, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary, environment, load_average
from attnzoo.runtime.fusion import FUSED, RUNTIMES, audit
from attnzoo.targets.openvino import unavailable_reason
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
export = lazy_import("attnzoo.export")

__all__ = ["export_pair", "markdown", "main"]


def export_pair(model, variant: str, img_size: int, folder: Path, threads: int) -> dict[int, dict[str, Any]]:
    """``model`` exported and verified at each of :data:`OPSETS`: ``{opset: {"path", "ops", "export_time_s",
    "audit"}}``. Raises ``RuntimeError`` when an export fails its verification."""
    out = {}
    for opset in OPSETS:
        path = folder / f"{variant}_{img_size}_opset{opset}.onnx"
        report = export.export_verified(
            model,
            path,
            model.attnzoo_config,
            opset=opset,
            input_hw=(img_size, img_size),
            batch_sizes=(1,),
            threads=threads,
        )
        if not report["passed"]:
            raise RuntimeError(f"{variant} at opset {opset}: export failed verification: {report['failures']}")
        found = audit(path, threads=threads)
        out[opset] = {
            "path": path,
            "ops": report["op_histogram"],
            "export_time_s": report["export_time_s"],
            "extra_math": report.get("extra_math"),
            "fused": {r["runtime"]: (r["fused"], r["cores"]) for r in found["runtimes"] if r["inspected"]},
            "not_inspected": {r["runtime"]: r.get("reason") for r in found["runtimes"] if not r["inspected"]},
            "dot_product_cores": sum(c["dot_product"] for c in found["cores"]),
        }
    return out


def _rows(times: dict[str, list[float]], variant: str, img_size: int, tokens: int) -> list[dict[str, Any]]:
    eager_ms = summarize(times["eager"], 1)["median_ms"]
    return [
        {"variant": variant, "img_size": img_size, "tokens": tokens, "runtime": runtime, **s, "eager_ms": eager_ms}
        for runtime, s in speedups(times).items()
    ]


def _inspected(result: dict[str, Any]) -> str:
    """Which runtimes' graphs the run read, and which it could not (with why)."""
    reasons: dict[str, str] = {}
    for e in result["exports"]:
        for x in e["opsets"].values():
            reasons.update({k: v for k, v in (x.get("not_inspected") or {}).items() if v})
    gpu = (result["environment"].get("gpu") or {}).get("name")
    missing = [k for k in RUNTIMES if k not in result["runtimes"] or k in reasons]
    for k in missing:  # a run that kept no reason: TensorRT's layers are read only on a GPU
        reasons.setdefault(
            k, "its layers are read only from an engine on a GPU" + ("" if gpu else "; this run had none")
        )
    seen = [RUNTIMES[k] for k in RUNTIMES if k in result["runtimes"] and k not in missing]
    return (
        f"Inspected: {', '.join(seen)}; not inspected: "
        + "; ".join(f"{RUNTIMES[k]} ({reasons[k]})" for k in missing)
        + "."
        if missing
        else f"Inspected: {', '.join(seen)}."
    )


def markdown(result: dict[str, Any]) -> str:
    """The result as markdown: the fusion audit of both exports, then the timings."""
    env = result["environment"]
    lines = [
        f"# Fusable export (opset 23 `Attention`) against the default (opset 20), {result['arch']}, "
        f"{result['threads']} thread(s), batch 1",
        "",
        f"`{result['command']}`",
        "",
        f"CPU: {cpu_summary(env['cpu'])}; load average at start {env['load_average']}, end "
        f"{result['load_average_end']}; onnxruntime {env['versions'].get('onnxruntime')}, openvino "
        f"{env['versions'].get('openvino')}. Every number here holds for this machine only.",
        "",
        "## Fused attention cores (read from each runtime's own optimized or compiled graph)",
        "",
        f"{FUSED[0].upper()}{FUSED[1:]}. {_inspected(result)} At opset 23 the transformer optimizer's count is the "
        "export's (\"as exported\": at `opt_level=0` it never splits a standard `Attention` op), and ONNX Runtime's "
        "CPU `Attention` kernel still computes the whole score matrix (fused there means one op, not less memory).",
        "",
        "| variant | tokens | opset | Attention ops | extra math kept | " + " | ".join(result["runtimes"]) + " |",
        "|---|---:|---:|---:|---|" + "---|" * len(result["runtimes"]),
    ]
    for e in result["exports"]:
        for opset in map(str, OPSETS):
            x = e["opsets"][opset]
            exported = x["ops"].get("Attention", 0)
            cells = [
                f"{x['fused'][r][0]} of {x['fused'][r][1]}"
                + (" (as exported)" if r == "onnxruntime-transformers" and exported else "")
                if r in x["fused"]
                else "not inspected"
                for r in result["runtimes"]
            ]
            kept = "yes" if (x["extra_math"] or {}).get("ok") else "no"
            lines.append(
                f"| {e['variant']} | {e['tokens']} | {opset} | {x['ops'].get('Attention', 0)} | {kept} | "
                + " | ".join(cells)
                + " |"
            )
    lines += [
        "",
        "## Latency (median ms of one call; speed-up: opset-20 time / opset-23 time per round, q1-q3)",
        "",
        "| variant | tokens | runtime | opset 20 ms | opset 23 ms | speed-up | eager ms |",
        "|---|---:|---|---:|---:|---|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['variant']} | {r['tokens']} | {r['runtime']} | {r['opset20_ms']:.2f} | "
            f"{r['opset23_ms']:.2f} | {r['speedup']:.2f} ({r['speedup_q1']:.2f}-{r['speedup_q3']:.2f}) | "
            f"{r['eager_ms']:.2f} |"
        )
    if result["no_dot_product"]:
        lines += [
            "",
            "Not exported in a fusable form: "
            + "; ".join(f"`{v}` ({why})" for v, why in result["no_dot_product"].items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


COMMAND = "python -m research.fusable"


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(COMMAND, __doc__)
    parser.add_argument("--variants", default="standard,belief2,wafe-mse", help="comma-separated variant names")
    parser.add_argument("--img-sizes", default="224,512", help="input sides, comma-separated (tokens: (side/16)^2 + 1)")
    add_round_robin_flags(parser, "variant and size")
    return add_output_flags(
        parser,
        "fusable.json, fusable.md",
        "exported models (default: <cache>/fusable)",
        "print the markdown of a fusable.json",
    )


def _measure(variant: str, size: int, args: argparse.Namespace, cache: Path) -> tuple[dict[str, Any], list]:
    """One variant at one input size: both exports (verified, audited) and their timing rows beside eager."""
    torch.manual_seed(args.seed)
    model = models.create_model(variant, task="cls", arch=args.arch, img_size=size).eval()
    tokens = (size // models.ARCHS[args.arch]["patch_size"]) ** 2 + 1
    pair = export_pair(model, variant, size, cache, args.threads)
    exported = {
        "variant": variant,
        "img_size": size,
        "tokens": tokens,
        "opsets": {str(o): {k: v for k, v in e.items() if k != "path"} for o, e in pair.items()},
    }
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(args.seed))
    with torch.no_grad():
        ref = model(x).numpy()
        times = time_opsets(
            {o: e["path"] for o, e in pair.items()},
            x.numpy(),
            ref,
            args.threads,
            cache,
            args.rounds,
            eager=partial(model, x),
            progress=not args.no_progress,
        )
    return exported, _rows(times, variant, size, tokens)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.fusable``."""
    argv, args = parse_study(build_parser(), argv, markdown)
    if args is None:
        return 0
    variants = parse_names(args.variants, models.canonical_name, "variant", ", ".join(models.VARIANT_NAMES))
    check_arch(args.arch)
    sizes = comma_ints(
        args.img_sizes,
        lambda side: 16 <= side <= 1024 and side % 16 == 0,
        f"--img-sizes must be comma-separated multiples of 16 from 16 to 1024, got {args.img_sizes!r}",
    )
    check_at_least(("--threads", args.threads, 1), ("--rounds", args.rounds, 2))
    writable_dir(args.out, "--out folder")
    cache = writable_dir(args.cache_dir or default_cache_dir() / "fusable", "--cache-dir folder")
    ov_missing = unavailable_reason()
    torch.set_num_threads(args.threads)
    env = environment()
    no_dot = {
        v: "its scores are a pairwise L1 distance, not a dot product, so no attention op computes them"
        for v in variants
        if models.VARIANTS[v].pairwise_scores
    }
    exports, rows = [], []
    jobs = [(v, size) for v in variants if v not in no_dot for size in sizes]
    for variant, size in tqdm(jobs, desc="fusable", disable=args.no_progress):
        exported, measured = _measure(variant, size, args, cache)
        exports.append(exported)
        rows += measured
    result = {
        "command": command_line(COMMAND, argv),
        "arch": args.arch,
        "threads": args.threads,
        "img_sizes": sizes,
        "rounds": args.rounds,
        "openvino": ov_missing or "used",
        "runtimes": ["openvino", "onnxruntime", "onnxruntime-transformers"],
        "exports": exports,
        "rows": rows,
        "no_dot_product": no_dot,
        "environment": env,
        "load_average_end": load_average(),
    }
    write_report(args.out, "fusable", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
