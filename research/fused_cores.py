"""Fused attention cores: each variant's encoder block, eager and ``torch.compile``, against ``standard``.

One ViT-S encoder block (width 384, 6 heads: LayerNorm, the variant's attention, MLP) per variant, seeded
random weights, on token tensors of 197 (ViT-S at 224 px) and 1,025 (512 px) tokens, batch 1 and 8. Where this
package changed a variant's core, the block also runs with its previous core (``before``):

- ``belief2`` (``zz`` on): ``[Q|Z] [K|Z]^T`` beside V of half the width, which PyTorch runs on its unfused math
  path; now V is zero-padded so that the fused flash kernel takes the call (``Belief2Attention.pad_value``);
- ``wafe-mae``, ``anti-wafe-mae`` under ``torch.compile``: ``cdist`` before; now the broadcast ``|q_i - k_j|``
  sum that Inductor fuses into one reduction loop (``attnzoo.models.wafe.auto_mae_impl``). Eager runs
  ``cdist`` both times, so MAE has no eager ``before`` row.

Every other dot-product variant already ran its core as ``F.scaled_dot_product_attention`` (flash on the CPU).
Within one (mode, tokens, batch) group every block is called once per round, in a fixed order, so all of them
see about the same load; a row's ``x standard`` is the median over rounds of its time / ``standard``'s time
in that round, and ``speed-up`` the median of ``before`` / ``after``. Each output is checked against the eager
block with the current core (fp32 tolerance of :mod:`attnzoo.runtime.parity`).

Rows are kept in ``fused-cores.partial.json`` as each group finishes; a run stopped (Ctrl-C) and started
again with the same settings skips the groups it has.

Usage::

    python -m attnzoo.studies.fused_cores --out results/studies/fused-cores
    python -m attnzoo.studies.fused_cores --variants all --compiled-variants all --out DIR   # every compiled row
    python -m attnzoo.studies.fused_cores --table results/studies/fused-cores/fused-cores.json
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attnzoo.benchmarks.cli import variant_list
from attnzoo.benchmarks.stats import ratio_stats, summarize
from attnzoo.benchmarks.timing import time_round_robin
from attnzoo.cli import add_debug_flag, entry_point, parse_batch_sizes
from attnzoo.errors import UsageError
from attnzoo.fileio import atomic_write_text, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary, environment, load_1min, load_average
from attnzoo.runtime.parity import TOLERANCES, parity_error
from research.study import reprint, require_out

# --help, --table and usage errors load without torch and timm
torch = lazy_import("torch")
models = lazy_import("attnzoo.models")

__all__ = ["BEFORE", "MODES", "runners", "run_group", "markdown", "main"]

MODES = ("eager", "compiled")
#: Variants whose core changed, and how to put their previous core back on a block (per mode it applies to).
BEFORE: dict[str, tuple[tuple[str, ...], Callable[[Any], None]]] = {
    "belief2": (MODES, lambda attn: setattr(attn, "pad_value", False)),
    "wafe-mae": (("compiled",), lambda attn: setattr(attn.distance, "impl", "cdist")),
    "anti-wafe-mae": (("compiled",), lambda attn: setattr(attn.distance, "impl", "cdist")),
}
ARCH, WIDTH = "small", 384
DEFAULT_COMPILED = ("standard", "belief2", "wafe-mae")


def _block(variant: str, seed: int):
    """The first encoder block of a seeded ViT-S of ``variant`` (the variant's default options), eval mode."""
    torch.manual_seed(seed)
    return models.create_model(variant, task="cls", arch=ARCH, num_classes=10).blocks[0].eval()


def runners(variants: Sequence[str], mode: str, seed: int) -> dict[str, Any]:
    """``"<variant>"`` (the current core) and ``"<variant> before"`` (the previous one, where it differs in
    ``mode``) -> a block; ``standard`` first."""
    out: dict[str, Any] = {}
    for v in dict.fromkeys(["standard", *variants]):
        block = _block(v, seed)
        out[v] = block
        modes, restore = BEFORE.get(v, ((), None))
        if mode in modes and restore is not None:
            before = copy.deepcopy(block)
            restore(before.attn)
            out[f"{v} before"] = before
    return out


def run_group(
    variants: Sequence[str], mode: str, tokens: int, batch: int, rounds: int, seed: int, progress: bool = True
) -> list[dict[str, Any]]:
    """Rows of one (mode, tokens, batch) group: every block round-robin, ratios to ``standard`` per round."""
    blocks = runners(variants, mode, seed)
    x = torch.randn(batch, tokens, WIDTH, generator=torch.Generator().manual_seed(seed + tokens + batch))
    with torch.inference_mode():
        refs = {name: blocks[name](x) for name in blocks if not name.endswith(" before")}  # eager, current core
    calls: dict[str, Callable[[], Any]] = {}
    compile_s: dict[str, float] = {}
    errors: dict[str, float] = {}
    for name, block in blocks.items():
        fn = torch.compile(block, dynamic=False) if mode == "compiled" else block
        start = time.perf_counter()
        with torch.inference_mode():
            out = fn(x)  # the compile, in compiled mode
        compile_s[name] = time.perf_counter() - start
        errors[name] = parity_error(out.numpy(), refs[name.removesuffix(" before")].numpy())

        def call(fn=fn) -> Any:
            with torch.inference_mode():
                return fn(x)

        calls[name] = call
    times = time_round_robin(calls, rounds, progress=progress)
    rows = []
    for name, samples in times.items():
        variant, _, before = name.partition(" ")
        row: dict[str, Any] = {
            "mode": mode,
            "tokens": tokens,
            "batch": batch,
            "variant": variant,
            "core": "before" if before else "current",
            **summarize(samples, batch),
            "x_standard": ratio_stats(times["standard"], samples),
            "parity_error": errors[name],
            "parity_ok": errors[name] <= TOLERANCES["fp32"],
            "load_1min": load_1min(),
        }
        if mode == "compiled":
            row["compile_s"] = compile_s[name]
        if before:
            row["speedup"] = ratio_stats(times[variant], samples)  # before / after, per round
        rows.append(row)
    return rows


def _ratio(r: dict[str, float]) -> str:
    return f"{r['ratio_median']:.2f} ({r['ratio_q1']:.2f}-{r['ratio_q3']:.2f})"


def markdown(result: dict[str, Any]) -> str:
    """The result as README text: command, machine, and one table per mode."""
    env, s = result["environment"], result["settings"]
    lines = [
        "# Fused attention cores on the CPU",
        "",
        f"Command: `{result['command']}`",
        "",
        f"CPU: {cpu_summary(env['cpu'])}; torch {env['versions']['torch']}, {s['threads']} thread(s); load "
        f"average at the start {env['load_average']}, at the end {result.get('load_end')} (the machine was "
        f"shared with other jobs when the 1-minute load passes {s['threads']}). One ViT-S encoder block "
        f"(width {WIDTH}, 6 heads) per variant, seeded random weights, fp32; {s['rounds']} rounds, every block "
        "once per round. `x standard`: median over rounds of the block's time / `standard`'s in the same round "
        "(quartiles in brackets); `speed-up`: the previous core's time / the current core's. `before`: the "
        "core this package ran before (belief2: the unpadded `[Q|Z] [K|Z]^T` call on PyTorch's unfused math "
        "path; MAE under torch.compile: `cdist`). Parity: max abs difference from the eager block with the "
        "current core.",
        "",
    ]
    if not result.get("complete", True):
        lines += ["**Partial run**: stopped before every group was measured.", ""]
    for mode in MODES:
        rows = [r for r in result["rows"] if r["mode"] == mode]
        if not rows:
            continue
        lines += [
            f"## {mode}",
            "",
            "| tokens | batch | variant | core | median ms | x standard | speed-up | parity |"
            + (" compile s |" if mode == "compiled" else ""),
            "|---:|---:|---|---|---:|---|---|---:|" + ("---:|" if mode == "compiled" else ""),
        ]
        for r in rows:
            lines.append(
                f"| {r['tokens']} | {r['batch']} | `{r['variant']}` | {r['core']} | {r['median_ms']:.1f} | "
                f"{_ratio(r['x_standard'])} | {_ratio(r['speedup']) if 'speedup' in r else ''} | "
                f"{r['parity_error']:.1e}{'' if r['parity_ok'] else ' FAIL'} |"
                + (f" {r['compile_s']:.0f} |" if mode == "compiled" else "")
            )
        lines.append("")
    return "\n".join(lines)


def _ints(value: str, flag: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {value!r}") from None
    if not out or min(out) < 2:
        raise UsageError(f"{flag} must list token counts >= 2, got {value!r}")
    return list(dict.fromkeys(out))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m attnzoo.studies.fused_cores",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--variants", default="all", help="'all' or comma-separated variant names (eager rows)")
    p.add_argument(
        "--compiled-variants",
        default=",".join(DEFAULT_COMPILED),
        help="'all', 'none' or comma-separated variant names for the torch.compile rows (one compile each per shape)",
    )
    p.add_argument("--tokens", default="197,1025", help="token counts")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--rounds", type=int, default=5, help="timed rounds per group (every block once per round)")
    p.add_argument("--threads", type=int, default=1, help="PyTorch intra-op threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="output folder (fused-cores.json, README.md)")
    p.add_argument("--table", type=Path, metavar="JSON", default=None, help="print the table of a fused-cores.json")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return add_debug_flag(p)


def _settings(a: argparse.Namespace) -> dict[str, Any]:
    """The parsed command line as the JSON settings (the resume key); ``UsageError`` before any work."""
    if a.rounds < 2:
        raise UsageError(f"--rounds must be >= 2, got {a.rounds}")
    if a.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {a.threads}")
    compiled = a.compiled_variants.strip()
    return {
        "variants": variant_list(a.variants),
        "compiled_variants": [] if compiled == "none" else variant_list(compiled),
        "tokens": _ints(a.tokens, "--tokens"),
        "batch_sizes": parse_batch_sizes(a.batch_sizes),
        "rounds": a.rounds,
        "threads": a.threads,
        "seed": a.seed,
    }


def mode_variants(s: dict[str, Any], mode: str) -> list[str]:
    """The variants a run times in ``mode`` (one of :data:`MODES`)."""
    return dict(zip(MODES, (s["variants"], s["compiled_variants"]), strict=True))[mode]


def groups(s: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(mode, tokens, batch) in run order: eager first, small before large."""
    return [(mode, t, b) for mode in MODES if mode_variants(s, mode) for t in s["tokens"] for b in s["batch_sizes"]]


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnzoo.studies.fused_cores``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    a = build_parser().parse_args(argv)
    if reprint(a.table, markdown):
        return 0
    require_out(a.out)
    s = _settings(a)
    writable_dir(a.out, "--out folder")
    partial = a.out / "fused-cores.partial.json"
    result: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "attnzoo.studies.fused_cores", *argv]),
        "settings": s,
        "environment": environment(),
        "rows": [],
        "complete": False,
    }
    if partial.is_file():
        kept = json.loads(partial.read_text())
        if kept.get("settings") == s:
            result["rows"] = kept["rows"]
            print(f"resuming: {len(kept['rows'])} rows kept from {partial}", file=sys.stderr)
    torch.set_num_threads(s["threads"])
    done = {(r["mode"], r["tokens"], r["batch"]) for r in result["rows"]}
    todo = [g for g in groups(s) if g not in done]
    for mode, tokens, batch in tqdm(todo, desc="fused cores", unit="group", disable=a.no_progress):
        variants = mode_variants(s, mode)
        result["rows"] += run_group(variants, mode, tokens, batch, s["rounds"], s["seed"], not a.no_progress)
        atomic_write_text(partial, json.dumps(result, indent=1) + "\n")  # kept if stopped
        torch._dynamo.reset()  # compiled blocks of this group are not needed again
    result["complete"] = True
    result["load_end"] = load_average()
    md = markdown(result)
    atomic_write_text(a.out / "fused-cores.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(a.out / "README.md", md)
    partial.unlink(missing_ok=True)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
