"""``python -m research.int8_fidelity``: the pretrained-like ViT under each placement (the default), or one of
``--remedies``, ``--zoo-accuracy``, ``--zoo-outliers`` and ``--zoo``; ``--table`` reprints any of their reports."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.errors import UsageError
from attnzoo.fileio import atomic_write_text, writable_dir
from research.study import command_line, reprint, require_out, study_parser, write_json

from .placements import markdown, measure
from .remedies import remedies, remedies_markdown
from .zoo import (
    ZOO_PLACEMENTS,
    run_zoo_accuracy,
    run_zoo_drift,
    run_zoo_outliers,
    zoo_accuracy_markdown,
    zoo_outliers_markdown,
    zoo_selection,
)

__all__ = ["COMMAND", "build_parser", "any_markdown", "main"]

COMMAND = "python -m research.int8_fidelity"
DESCRIPTION = "int8 fidelity of a pretrained-like ViT under each Q/DQ placement, through ``export_model``."


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(COMMAND, DESCRIPTION)
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json and results.md")
    parser.add_argument(
        "--table",
        type=Path,
        default=None,
        metavar="FILE",
        help="print the markdown of an earlier results.json or zoo-accuracy.json and run nothing",
    )
    parser.add_argument("--img-size", type=int, default=None, help="default 64 (--remedies: 32)")
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--embed-dim", type=int, default=None, help="default 192 (--remedies: 96)")
    parser.add_argument("--depth", type=int, default=None, help="default 6 (--remedies: 4)")
    parser.add_argument("--num-heads", type=int, default=3)
    parser.add_argument(
        "--ln-outlier",
        type=float,
        default=None,
        help="gain of the LayerNorm outputs' outlier channels (pretrained_like_vit; default 1, --remedies: 30)",
    )
    parser.add_argument("--images", type=int, default=256, help="images in the calibration folder (a quarter held out)")
    parser.add_argument("--further", type=int, default=512, help="further images, never seen by the export")
    parser.add_argument("--runs", type=int, default=40, help="interleaved timed runs per model and runtime")
    parser.add_argument(
        "--zoo",
        default=None,
        metavar="VARIANT:TASK,...",
        help="instead: the logits' drift of these zoo models' int8 copies on 512 further training images "
        "(zoo-drift.json)",
    )
    parser.add_argument(
        "--zoo-accuracy",
        default=None,
        metavar="SELECTION",
        help="instead: export the zoo's models (VARIANT:TASK,... or cls, seg, all) to int8 with each of "
        f"{', '.join(ZOO_PLACEMENTS)} and record their accuracy gate (zoo-accuracy.json / .md)",
    )
    parser.add_argument(
        "--remedies",
        action="store_true",
        help="instead: calibrate on augmented crops of 3 images and measure each outlier remedy (placement x "
        "calibration method, NNCF's SmoothQuant) on the clean images, unrelated ones and further crops "
        "(remedies.json / .md; the stand-in is 32 px, width 96, depth 4 unless given)",
    )
    parser.add_argument(
        "--zoo-outliers",
        default=None,
        metavar="SELECTION",
        help="instead: the LayerNorm outputs' outlier ratio of these zoo models (VARIANT:TASK,... or cls, seg, "
        "all), i.e. whether auto's SmoothQuant step moves anything (zoo-outliers.json / .md)",
    )
    parser.add_argument("--data", default="fashion", help="the zoo's data set for --zoo-accuracy (default fashion)")
    parser.add_argument(
        "--name",
        default="zoo-accuracy",
        help="--zoo-accuracy's report: <out>/<name>.json and .md (default zoo-accuracy)",
    )
    return add_debug_flag(parser)


def any_markdown(result: dict[str, Any]) -> str:
    """The markdown of any of the study's reports, told apart by their keys."""
    if "zoo_accuracy" in result:
        return zoo_accuracy_markdown(result)
    if "remedies" in result:
        return remedies_markdown(result)
    if "zoo_outliers" in result:
        return zoo_outliers_markdown(result)
    return markdown(result)


def _stand_in(args: argparse.Namespace, remedy: bool) -> dict[str, Any]:
    """The pretrained-like ViT's size from the flags (the defaults of ``--remedies`` are smaller)."""
    return {
        "img_size": args.img_size or (32 if remedy else 64),
        "patch_size": args.patch_size,
        "embed_dim": args.embed_dim or (96 if remedy else 192),
        "depth": args.depth or (4 if remedy else 6),
        "num_heads": args.num_heads,
        "ln_outlier": (30.0 if remedy else 1.0) if args.ln_outlier is None else args.ln_outlier,
    }


def _write(out: Path, name: str, result: dict[str, Any], md: str) -> None:
    write_json(out / f"{name}.json", result, indent=2)
    atomic_write_text(out / f"{name}.md", md + "\n")
    print(md)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if reprint(args.table, any_markdown):
        return 0
    if not args.name or "/" in args.name or args.name.startswith("."):
        raise UsageError(f"--name: a plain file name, got {args.name!r}")
    out = writable_dir(require_out(args.out))
    command = command_line(COMMAND, argv)
    if args.zoo_accuracy:
        selection = zoo_selection(args.zoo_accuracy, args.data)
        return 0 if run_zoo_accuracy(selection, args.data, out, args.name, command) else 1
    if args.zoo_outliers:
        run_zoo_outliers(zoo_selection(args.zoo_outliers, args.data), out, command)
    elif args.remedies:
        with tempfile.TemporaryDirectory(prefix="attnzoo-int8-remedies-") as work:
            result = remedies(Path(work), runs=args.runs, command=command, **_stand_in(args, remedy=True))
        _write(out, "remedies", result, remedies_markdown(result))
    elif args.zoo:
        run_zoo_drift(args.zoo, out, command)
    else:
        with tempfile.TemporaryDirectory(prefix="attnzoo-int8-fidelity-") as work:
            model = _stand_in(args, remedy=False)
            result = measure(
                Path(work), images=args.images, further=args.further, runs=args.runs, command=command, **model
            )
        _write(out, "results", result, markdown(result))
    return 0
