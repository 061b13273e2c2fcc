"""Fused attention cores: each variant's encoder block on every runtime, against ``standard``'s.

One ViT-S encoder block (width 384, 6 heads: LayerNorm, the variant's attention, MLP) per variant, seeded
random weights, on token tensors of ``--tokens`` (197: ViT-S at 224 px, 577: 384 px, 1,025: 512 px, 4,096),
batch ``--batch-sizes``, ``--threads`` threads, on each of ``--modes`` (:mod:`research.core_runners`:
eager, ``torch.compile``, AOTInductor, ONNX Runtime, OpenVINO). Where this package changed or offers another core,
the block also runs with it:

- ``belief2`` (``zz`` on; eager, compiled): ``before``, ``[Q|Z] [K|Z]^T`` beside V of half the width, which
  PyTorch runs on its unfused math path; now V is zero-padded so that the fused flash kernel takes the call
  (``Belief2Attention.pad_value``);
- ``wafe-mae``, ``anti-wafe-mae``: the current core is what ``mae_impl="auto"`` runs there
  (``core_runners.current_impl``: the fused op ``attnzoo::l1_attention`` in eager and under ``torch.compile``, the
  tiled core in AOTInductor, the blocked or Loop ONNX form), and each alternative of :data:`MAE_ALTERNATIVES`
  runs beside it (``cdist``: the form before the fused core, in eager and AOTInductor; ``broadcast``: the
  compiled form before it; ``tiled``: the core in ordinary ops, fused by the compiler; ``fused``: the op, opaque
  to the compiler; ``blocked`` / ``loop``: the other ONNX form).

Within one (mode, tokens, batch, threads) group every block is called once per round, in a fixed order, so all of
them see about the same load; a row's ``x standard`` is the median over rounds of its time / ``standard``'s time
in that round, ``speed-up`` the median of the alternative's time / the current core's, and ``bound`` the arithmetic
bound of that ratio (``core_runners.l1_bound``: an L1 term costs 3x a multiply-add of ``Q K^T``; 1 for the
variants whose scores are dot products). ``peak MB`` is the row's peak resident memory (``core_runners``) and
``mem x std`` its ratio to ``standard``'s current row of the group. Each output is checked against the eager block
with the current core (fp32 tolerance of :mod:`attnzoo.runtime.parity`).

Rows are kept in ``fused-cores.partial.json`` as each group finishes; a run stopped (Ctrl-C) and started
again with the same settings skips the groups it has. Exports and packages are cached in
``<cache>/fused-cores/`` by the block's fingerprint (its code and weights).

Usage::

    python -m research.fused_cores --out results/studies/fused-cores
    python -m research.fused_cores --variants standard,wafe-mae,anti-wafe-mae \\
        --compiled-variants standard,wafe-mae,anti-wafe-mae --modes eager,compiled,aoti,ort,openvino \\
        --tokens 197,577,1025,4096 --batch-sizes 1,8 --threads 1,2 --out results/studies/fused-cores/l1
    python -m research.fused_cores --table results/studies/fused-cores/fused-cores.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attnzoo.benchmarks.cli import variant_list
from attnzoo.benchmarks.stats import ratio_stats, summarize
from attnzoo.benchmarks.timing import time_round_robin
from attnzoo.cli import add_debug_flag, entry_point, parse_batch_sizes
from attnzoo.errors import UsageError
from attnzoo.fileio import atomic_write_text, default_cache_dir, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary, environment, load_1min, load_average
from attnzoo.runtime.parity import TOLERANCES, parity_error
from attnzoo.runtime.torch_export import fingerprint
from research.core_runners import COMPILING, MEASURES, MODES, build_runner, configured, current_impl, l1_bound
from research.study import reprint, require_out

# --help, --table and usage errors load without torch and timm
torch = lazy_import("torch")
models = lazy_import("attnzoo.models")
aoti = lazy_import("attnzoo.targets.aoti.package")

__all__ = ["BEFORE", "MAE_ALTERNATIVES", "MODES", "cores", "run_group", "markdown", "main"]

#: Variants whose core changed, and how to put their previous core back on a block (per mode it applies to).
BEFORE: dict[str, tuple[tuple[str, ...], Callable[[Any], None]]] = {
    "belief2": (("eager", "compiled"), lambda attn: setattr(attn, "pad_value", False)),
}
#: The MAE cores run beside the current one, per mode (the current one left out where it is one of them).
MAE_ALTERNATIVES: dict[str, tuple[str, ...]] = {
    "eager": ("cdist",),
    "compiled": ("broadcast", "tiled", "fused"),
    "aoti": ("cdist", "fused"),
    "ort": ("blocked", "loop"),
    "openvino": ("blocked", "loop"),
}
MAE_VARIANTS = ("wafe-mae", "anti-wafe-mae")
ARCH, WIDTH = "small", 384
DEFAULT_COMPILED = ("standard", "belief2", "wafe-mae")


def _block(variant: str, seed: int):
    """The first encoder block of a seeded ViT-S of ``variant`` (the variant's default options), eval mode."""
    torch.manual_seed(seed)
    return models.create_model(variant, task="cls", arch=ARCH, num_classes=10).blocks[0].eval()


def cores(
    variants: Sequence[str], mode: str, tokens: int, seed: int, current_only: bool = False
) -> dict[tuple[str, str], Any]:
    """(variant, core) -> a block, ``standard`` first: ``current`` (as ``auto`` runs it, :func:`current_impl`)
    and, unless ``current_only``, ``before`` (:data:`BEFORE`) and, for the MAE variants, each core of
    :data:`MAE_ALTERNATIVES`."""
    out: dict[tuple[str, str], Any] = {}
    for v in dict.fromkeys(["standard", *variants]):
        block = _block(v, seed)
        now = current_impl(v in MAE_VARIANTS, mode, tokens)
        out[(v, "current")] = configured(block, None)  # auto: what a user's call runs
        if current_only:
            continue
        modes, restore = BEFORE.get(v, ((), None))
        if mode in modes and restore is not None:
            out[(v, "before")] = before = configured(block, None)
            restore(before.attn)
        for impl in MAE_ALTERNATIVES[mode] if v in MAE_VARIANTS else ():
            if impl != now:
                out[(v, impl)] = configured(block, impl)
    return out


def _name(variant: str, core: str, block: Any, tokens: int) -> str:
    """The cache name of a block's export: variant, core, tokens and its fingerprint (code and weights)."""
    modules = (*aoti.CODE_MODULES, "attnzoo.export.onnx_l1")
    key = fingerprint(block, {"variant": variant, "core": core, "tokens": tokens}, modules=modules)
    return f"{variant}-{core}-{tokens}-{key[:12]}"


def run_group(
    settings: dict[str, Any], mode: str, tokens: int, batch: int, threads: int, cache: Path, progress: bool = True
) -> list[dict[str, Any]]:
    """Rows of one (mode, tokens, batch, threads) group: every block round-robin, ratios to ``standard`` per
    round, each row's peak memory, bound and parity against the eager block with the current core."""
    seed = settings["seed"]
    blocks = cores(mode_variants(settings, mode), mode, tokens, seed, settings.get("current_only", False))
    x = torch.randn(batch, tokens, WIDTH, generator=torch.Generator().manual_seed(seed + tokens + batch))
    torch.set_num_threads(threads)
    with torch.inference_mode():
        refs = {v: b(x).numpy() for (v, core), b in blocks.items() if core == "current"}  # eager, auto
    runners = {key: build_runner(mode, b, x, threads, cache, _name(*key, b, tokens)) for key, b in blocks.items()}
    errors = {key: parity_error(r.call(), refs[key[0]]) for key, r in runners.items()}
    named = time_round_robin(
        {"/".join(key): r.call for key, r in runners.items()}, settings["rounds"], progress=progress
    )
    times = {key: named["/".join(key)] for key in runners}
    std = runners[("standard", "current")].peak_mb
    rows = []
    for (variant, core), samples in times.items():
        runner = runners[(variant, core)]
        row: dict[str, Any] = {
            "mode": mode,
            "tokens": tokens,
            "batch": batch,
            "threads": threads,
            "variant": variant,
            "core": core,
            "impl": current_impl(variant in MAE_VARIANTS, mode, tokens) if core == "current" else core,
            **summarize(samples, batch),
            "x_standard": ratio_stats(times[("standard", "current")], samples),
            "bound": round(l1_bound(variant, tokens, WIDTH, ARCH), 3),
            "peak_mb": runner.peak_mb,
            "mem_x_standard": runner.peak_mb / std if runner.peak_mb is not None and std else None,
            "parity_error": errors[(variant, core)],
            "parity_ok": errors[(variant, core)] <= TOLERANCES["fp32"],
            "load_1min": load_1min(),
        }
        if runner.build_s is not None:
            row["build_s"] = runner.build_s
        if core != "current":
            row["speedup"] = ratio_stats(times[(variant, "current")], samples)  # this core / the current one
        rows.append(row)
    return rows


def _ratio(ratios: dict[str, float]) -> str:
    return f"{ratios['ratio_median']:.2f} ({ratios['ratio_q1']:.2f}-{ratios['ratio_q3']:.2f})"


def _mb(v: float | None, fmt: str = "{:.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(result: dict[str, Any]) -> str:
    """The result as README text: command, machine, and one table per mode."""
    env, s = result["environment"], result["settings"]
    threads = s["threads"] if isinstance(s["threads"], list) else [s["threads"]]
    lines = [
        "# Fused attention cores on the CPU",
        "",
        f"Command: `{result['command']}`",
        "",
        f"CPU: {cpu_summary(env['cpu'])}; torch {env['versions']['torch']}, {', '.join(map(str, threads))} "
        f"thread(s); load average at the start {env['load_average']}, at the end {result.get('load_end')} (the "
        "machine was shared with other jobs when the 1-minute load passes the threads). One ViT-S encoder block "
        f"(width {WIDTH}, 6 heads) per variant, seeded random weights, fp32; {s['rounds']} rounds, every block "
        "once per round. `x standard`: median over rounds of the block's time / `standard`'s in the same round "
        "(quartiles in brackets); `bound`: that ratio's arithmetic bound (an L1 term costs 3x a multiply-add); "
        "`speed-up`: this core's time / the current core's; `peak MB`: peak resident memory above the level "
        f"before the row's call (or its load), median of {MEASURES} tries, `mem x std` its ratio to `standard`'s "
        "(research/core_runners.py). `before`: the core this package ran before (belief2: the unpadded "
        "`[Q|Z] [K|Z]^T` call on PyTorch's unfused math path); the MAE cores are named by `mae_impl`. Parity: max "
        "abs difference from the eager block with the current core.",
        "",
    ]
    if not result.get("complete", True):
        lines += ["**Partial run**: stopped before every group was measured.", ""]
    if s.get("current_only"):
        lines += ["Only the current cores were timed (`--current-only`): no previous or alternative core.", ""]
    for mode in MODES:
        rows = [r for r in result["rows"] if r["mode"] == mode]
        if not rows:
            continue
        build = any("build_s" in r or "compile_s" in r for r in rows)
        lines += [
            f"## {mode}",
            "",
            "| tokens | batch | threads | variant | core | median ms | x standard | bound | speed-up | peak MB | "
            "mem x std | parity |" + (" build s |" if build else ""),
            "|---:|---:|---:|---|---|---:|---|---:|---|---:|---:|---:|" + ("---:|" if build else ""),
        ]
        for r in rows:
            core = r["core"] if r["core"] in ("current", "before") else f"`{r['core']}`"
            if r["core"] == "current" and r.get("impl"):
                core += f" (`{r['impl']}`)"
            lines.append(
                f"| {r['tokens']} | {r['batch']} | {r.get('threads', threads[0])} | `{r['variant']}` | {core} | "
                f"{r['median_ms']:.1f} | {_ratio(r['x_standard'])} | {_mb(r.get('bound'), '{:.2f}')} | "
                f"{_ratio(r['speedup']) if 'speedup' in r else ''} | {_mb(r.get('peak_mb'))} | "
                f"{_mb(r.get('mem_x_standard'), '{:.2f}')} | "
                f"{r['parity_error']:.1e}{'' if r['parity_ok'] else ' FAIL'} |"
                + (f" {_mb(r.get('build_s', r.get('compile_s')))} |" if build else "")
            )
        lines.append("")
    return "\n".join(lines)


def _ints(value: str, flag: str, least: int) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {value!r}") from None
    if not out or min(out) < least:
        raise UsageError(f"{flag} must list integers >= {least}, got {value!r}")
    return list(dict.fromkeys(out))


def _modes(value: str) -> list[str]:
    modes = [m.strip() for m in value.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise UsageError(f"--modes: unknown {', '.join(unknown) or repr(value)}; valid: {', '.join(MODES)}")
    return [m for m in MODES if m in modes]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m research.fused_cores",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--variants", default="all", help="'all', 'none' or comma-separated variants (eager, ort, openvino)"
    )
    parser.add_argument(
        "--compiled-variants",
        default=",".join(DEFAULT_COMPILED),
        help="'all', 'none' or comma-separated variants of the compiling modes (compiled, aoti: a compile each)",
    )
    parser.add_argument("--modes", default="eager,compiled", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--tokens", default="197,1025", help="token counts")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument(
        "--threads", default="1", help="comma-separated thread counts (PyTorch, ONNX Runtime, OpenVINO)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per group (every block once per round)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="output folder (fused-cores.json, README.md)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="exports and packages (default: attnzoo's cache)")
    parser.add_argument(
        "--table", type=Path, metavar="JSON", default=None, help="print the table of a fused-cores.json"
    )
    parser.add_argument(
        "--current-only",
        action="store_true",
        help="time only the core a user's call runs, beside standard (no previous or alternative cores)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return add_debug_flag(parser)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The parsed command line as the JSON settings (the resume key); ``UsageError`` before any work."""
    if args.rounds < 2:
        raise UsageError(f"--rounds must be >= 2, got {args.rounds}")
    compiled, eager = args.compiled_variants.strip(), args.variants.strip()
    return {
        "variants": [] if eager == "none" else variant_list(eager),
        "compiled_variants": [] if compiled == "none" else variant_list(compiled),
        "modes": _modes(args.modes),
        "tokens": _ints(args.tokens, "--tokens", 2),
        "batch_sizes": parse_batch_sizes(args.batch_sizes),
        "threads": _ints(args.threads, "--threads", 1),
        "rounds": args.rounds,
        "seed": args.seed,
        **({"current_only": True} if args.current_only else {}),  # absent: every core (earlier runs' key)
    }


def mode_variants(settings: dict[str, Any], mode: str) -> list[str]:
    """The variants a run times in ``mode`` (the compiling modes take ``compiled_variants``)."""
    return settings["compiled_variants"] if mode in COMPILING else settings["variants"]


def groups(settings: dict[str, Any]) -> list[tuple[str, int, int, int]]:
    """(mode, tokens, batch, threads) in run order: by threads, then mode, small before large."""
    return [
        (mode, t, b, n)
        for n in settings["threads"]
        for mode in settings["modes"]
        if mode_variants(settings, mode)
        for t in settings["tokens"]
        for b in settings["batch_sizes"]
    ]


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.fused_cores``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if reprint(args.table, markdown):
        return 0
    require_out(args.out)
    settings = _settings(args)
    writable_dir(args.out, "--out folder")
    cache = writable_dir(args.cache_dir or default_cache_dir() / "fused-cores", "--cache-dir")
    partial = args.out / "fused-cores.partial.json"
    result: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "research.fused_cores", *argv]),
        "settings": settings,
        "environment": environment(),
        "rows": [],
        "complete": False,
    }
    if partial.is_file():
        kept = json.loads(partial.read_text())
        if kept.get("settings") == settings:
            result["rows"] = kept["rows"]
            print(f"resuming: {len(kept['rows'])} rows kept from {partial}", file=sys.stderr)
    done = {(r["mode"], r["tokens"], r["batch"], r["threads"]) for r in result["rows"]}
    todo = [g for g in groups(settings) if g not in done]
    for mode, tokens, batch, threads in tqdm(todo, desc="fused cores", unit="group", disable=args.no_progress):
        result["rows"] += run_group(settings, mode, tokens, batch, threads, cache, not args.no_progress)
        atomic_write_text(partial, json.dumps(result, indent=1) + "\n")  # kept if stopped
        torch._dynamo.reset()  # compiled blocks of this group are not needed again
    result["complete"] = True
    result["load_end"] = load_average()
    md = markdown(result)
    atomic_write_text(args.out / "fused-cores.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(args.out / "README.md", md)
    partial.unlink(missing_ok=True)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
