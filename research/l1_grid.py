"""The L1 core's grid: the MAE variants' block against ``standard``'s on every runtime, token count, batch and
thread count, gathered from one CPU's fused-cores studies into one table and one chart.

The grid of :mod:`research.fused_cores` (five runtimes, four token counts, two batch sizes, two thread counts)
takes hours on a small machine, so it runs in pieces, each a study folder of its own (its command, machine and
load in its README). This command reads the ``fused-cores.json`` of each folder given, refuses pieces measured on
different CPUs or a setting measured twice, and writes into ``--out``:

- ``README.md``: per (tokens, batch, threads), the arithmetic bound and each runtime's ``x standard`` of the
  current core (``wafe-mae`` / ``anti-wafe-mae``), then the same for peak memory, then the pieces it read;
- ``l1-grid.png``: ``x standard`` against tokens, one panel per (batch, threads), one line per runtime and
  variant, with the bound and the 2x aim.

Nothing is measured here: every number is a row of a piece, and the pieces' READMEs hold the rest (quartiles,
alternative cores, parity, build times).

Usage::

    python -m research.l1_grid results/studies/fused-cores/l1-numba-*-xeon \\
        --out results/studies/fused-cores/l1-grid-xeon
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.errors import UsageError
from attnzoo.fileio import atomic_write_text, save_png, writable_dir
from attnzoo.machine import cpu_summary
from research.study import study_parser

__all__ = ["AIM", "Setting", "load_pieces", "grid", "markdown", "plot", "main"]

MAE_VARIANTS = ("wafe-mae", "anti-wafe-mae")
#: The aim of a block's time against ``standard``'s on the best CPU runtime, drawn on the chart.
AIM = 2.0
RESULT = "fused-cores.json"
CHART = "l1-grid.png"
#: (tokens, batch, threads): one column of the grid.
Setting = tuple[int, int, int]


def _piece(folder: Path) -> dict[str, Any]:
    """A piece's result; ``UsageError`` naming the folder when it holds no finished fused-cores study."""
    path = folder / RESULT
    if not path.is_file():
        partial = (folder / "fused-cores.partial.json").is_file()
        why = "a partial run only: finish it first" if partial else f"no {RESULT}"
        raise UsageError(f"{folder}: {why}")
    try:
        result = json.loads(path.read_text())
    except ValueError:
        result = None
    if not (isinstance(result, dict) and isinstance(result.get("rows"), list) and "settings" in result):
        raise UsageError(f"{path}: not a fused-cores result")
    if not isinstance(result.get("environment"), dict) or "cpu" not in result["environment"]:
        raise UsageError(f"{path}: names no CPU, so it cannot join a grid")
    return result


def load_pieces(folders: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Each folder's result, in the order given; ``UsageError`` unless all were measured on one CPU (model and
    key flags) and no (mode, tokens, batch, threads) group appears in two of them."""
    if not folders:
        raise UsageError("give at least one fused-cores study folder")
    pieces = [(f, _piece(f)) for f in folders]
    first_folder, first = pieces[0]
    cpu = cpu_summary(first["environment"]["cpu"])
    seen: dict[tuple[str, int, int, int], Path] = {}
    for folder, result in pieces:
        other = cpu_summary(result["environment"]["cpu"])
        if other != cpu:
            raise UsageError(f"{folder} was measured on {other}, {first_folder} on {cpu}: one grid is one CPU")
        for r in result["rows"]:
            key = (r["mode"], r["tokens"], r["batch"], r["threads"])
            if seen.setdefault(key, folder) != folder:
                raise UsageError(
                    f"{r['mode']} at {r['tokens']} tokens, batch {r['batch']}, {r['threads']} thread(s) is in "
                    f"both {seen[key]} and {folder}: give one of them"
                )
    return pieces


def grid(rows: Sequence[Mapping[str, Any]]) -> dict[Setting, dict[str, Any]]:
    """Per setting: ``bound`` and, per (mode, variant), the current core's row of the MAE variants."""
    out: dict[Setting, dict[str, Any]] = {}
    for r in rows:
        if r["variant"] not in MAE_VARIANTS or r["core"] != "current":
            continue
        cell = out.setdefault((r["tokens"], r["batch"], r["threads"]), {"bound": r.get("bound"), "rows": {}})
        cell["rows"][(r["mode"], r["variant"])] = r
    return dict(sorted(out.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])))


def _modes(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The runtimes of the MAE rows, in the study's order (its groups run mode by mode)."""
    return list(dict.fromkeys(r["mode"] for r in rows if r["variant"] in MAE_VARIANTS))


def _pair(cell: Mapping[str, Any], mode: str, value: Any) -> str:
    """``wafe-mae / anti-wafe-mae`` of one mode; ``-`` where not measured, ``FAIL`` where parity failed."""
    parts = []
    for v in MAE_VARIANTS:
        r = cell["rows"].get((mode, v))
        x = None if r is None else value(r)
        parts.append("-" if x is None else f"{x:.2f}" + ("" if r["parity_ok"] else " FAIL"))
    return " / ".join(parts)


def markdown(pieces: Sequence[tuple[Path, Mapping[str, Any]]], command: str, out: Path) -> str:
    """The grid as README text: two tables (time and peak memory against ``standard``) and the pieces."""
    rows = [r for _, result in pieces for r in result["rows"]]
    cells, modes = grid(rows), _modes(rows)

    def table(value: Any, bound: bool) -> list[str]:
        lines = [
            "| tokens | batch | threads |" + (" bound |" if bound else "") + "".join(f" {m} |" for m in modes),
            "|---:|---:|---:|" + ("---:|" if bound else "") + "---|" * len(modes),
        ]
        for (tokens, batch, threads), cell in cells.items():
            b = (" -" if cell["bound"] is None else f" {cell['bound']:.2f}") + " |" if bound else ""
            lines.append(
                f"| {tokens} | {batch} | {threads} |{b}" + "".join(f" {_pair(cell, m, value)} |" for m in modes)
            )
        return lines

    cpu = cpu_summary(pieces[0][1]["environment"]["cpu"])
    lines = [
        "# The L1 core on every runtime: the grid",
        "",
        f"Command: `{command}`",
        "",
        f"CPU: {cpu}. One ViT-S encoder block (width 384, 6 heads), seeded random weights, fp32, on every runtime "
        "of the fused-cores study (`python -m research.fused_cores`); each cell is `wafe-mae / anti-wafe-mae` "
        "with the core a user's call runs (`mae_impl=\"auto\"`), against `standard`'s block in the same group. "
        "Each number is a row of one of the pieces listed below, whose READMEs give its quartiles, the other "
        "cores, parity and build times; `-`: not measured; `FAIL`: the output missed the fp32 parity tolerance.",
        "",
        f"![x standard against tokens]({CHART})",
        "",
        "## Time x standard",
        "",
        "Median over rounds of the block's time / `standard`'s in the same round; `bound`: that ratio's arithmetic "
        "bound (an L1 term costs 3x a multiply-add).",
        "",
        *table(lambda r: r["x_standard"]["ratio_median"], bound=True),
        "",
        "## Peak memory x standard",
        "",
        "The row's peak resident memory above the level before its call, against `standard`'s.",
        "",
        *table(lambda r: r.get("mem_x_standard"), bound=False),
        "",
        "## Pieces",
        "",
        "| study | tokens | batch | threads | rounds | torch | load at start / end |",
        "|---|---|---|---|---:|---|---|",
    ]
    for folder, result in pieces:
        s, env = result["settings"], result["environment"]
        link = Path(os.path.relpath(folder.resolve(), out.resolve())).as_posix()
        lines.append(
            f"| [{folder.name}]({link}/README.md) | {', '.join(map(str, s['tokens']))} | "
            f"{', '.join(map(str, s['batch_sizes']))} | {', '.join(map(str, s['threads']))} | {s['rounds']} | "
            f"{env.get('versions', {}).get('torch', '?')} | {env.get('load_average')} / {result.get('load_end')} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """``x standard`` against tokens (both axes log scale), one panel per (batch, threads): a line per runtime (solid:
    ``wafe-mae``, dashed: ``anti-wafe-mae``), the bound (black dotted) and the 2x aim (grey)."""
    from matplotlib.figure import Figure  # heavy: matplotlib, for the chart only (no pyplot state)

    cells = grid(rows)
    panels = sorted({(b, n) for _, b, n in cells}, key=lambda bn: (bn[1], bn[0]))
    modes = _modes(rows)
    fig = Figure(figsize=(4.2 * len(panels) + 0.8, 3.8))
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    colours = {m: f"C{i}" for i, m in enumerate(modes)}
    for ax, (batch, threads) in zip(axes, panels, strict=True):
        mine = {t: c for (t, b, n), c in cells.items() if (b, n) == (batch, threads)}
        tokens = sorted(mine)
        bounds = [(t, mine[t]["bound"]) for t in tokens if mine[t]["bound"] is not None]
        ax.plot(*zip(*bounds, strict=True), "k:", label="bound")
        ax.axhline(AIM, color="0.6", lw=1, label=f"{AIM:g}x aim")
        for mode in modes:
            for v, style in zip(MAE_VARIANTS, ("-o", "--s"), strict=True):
                pts = [
                    (t, mine[t]["rows"][(mode, v)]["x_standard"]["ratio_median"])
                    for t in tokens
                    if (mode, v) in mine[t]["rows"]
                ]
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, color=colours[mode], ms=4, label=f"{mode} {v}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(tokens, [str(t) for t in tokens])
        ax.set_title(f"batch {batch}, {threads} thread{'s' if threads > 1 else ''}")
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)
    top = max(ax.get_ylim()[1] for ax in axes)
    axes[0].set_yscale("log")
    ticks = [t for t in (1, 1.5, 2, 3, 5, 8, 13, 20, 30) if t <= max(top, 3)]
    axes[0].set_yticks(ticks, [f"{t:g}" for t in ticks])
    axes[0].set_ylim(0.9, max(top, 3))
    axes[0].set_ylabel("time x standard (log)")
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save_png(fig, path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser("python -m research.l1_grid", __doc__)
    parser.add_argument("studies", nargs="*", type=Path, help="fused-cores study folders (one CPU)")
    parser.add_argument("--out", type=Path, required=True, help=f"output folder (README.md, {CHART})")
    return add_debug_flag(parser)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m research.l1_grid``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    pieces = load_pieces(args.studies)
    out = writable_dir(args.out, "--out folder")
    command = shlex.join(["python", "-m", "research.l1_grid", *argv])
    md = markdown(pieces, command, args.out)
    plot([r for _, result in pieces for r in result["rows"]], out / CHART)
    atomic_write_text(out / "README.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
