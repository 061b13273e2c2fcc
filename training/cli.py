"""Command lines ``train-model`` and ``evaluate-model``.

train-model --variant belief2 --task cls --data shapes --epochs 5 --out runs
evaluate-model runs/belief2_cls_shapes.safetensors --limit 500
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from attnzoo.cli import add_debug_flag, add_range_flag, entry_point, flag_values
from attnzoo.errors import CommandError, UsageError
from attnzoo.fileio import atomic_write_text, parse_json
from attnzoo.filekind import checkpoint_kind
from attnzoo.lazy import lazy_import
from attnzoo.limits import check_side
from attnzoo.modelconfig import ARCHS, check_variant

# a bad command line is refused without torch: these import at their first use, once the cheap checks have passed
datasets = lazy_import("attnzoo.data.datasets")
fashion = lazy_import("attnzoo.data.fashion")
models = lazy_import("attnzoo.models")
checkpoint = lazy_import("attnzoo.models.checkpoint")
training = lazy_import("attnzoo.training.train")

__all__ = ["main", "evaluate_main"]


def _parse_options(items: list[str]) -> dict:
    """``KEY=VALUE`` pairs; values parsed as JSON when possible (``eps=1e-6``, ``zz=false``)."""
    options = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"--option expects KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        try:
            options[key] = parse_json(value)
        except ValueError:  # not JSON (or NaN, or nested too deep): the text itself
            options[key] = value
    return options


def _train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="train-model",
        description="Train an attnzoo model (AdamW, cosine schedule with warm-up, validation each epoch, resumable).",
    )
    _add_recipe_args(parser)
    _add_scene_args(
        parser.add_argument_group(
            "Fashion-MNIST scenes (--data fashion --task seg; default: 2-4 garments of 35-60 % of the "
            "canvas, at most 15 % of a garment on earlier ones; the zoo's: --scene-garment-px 28 28 "
            "--scene-overlap 0 1)"
        )
    )
    _add_run_args(parser)
    return add_debug_flag(parser)


def _add_recipe_args(parser: argparse.ArgumentParser) -> None:
    """What is trained and how: the variant, task, data, model size and the optimiser's schedule."""
    parser.add_argument("--variant", required=True, help="attention variant (see attnzoo.models.VARIANTS)")
    parser.add_argument("--task", choices=("cls", "seg"), default="cls")
    parser.add_argument(
        "--data",
        default="shapes",
        help="fashion (Fashion-MNIST), shapes, digits, a class-per-folder image folder or an ADE20K-layout folder",
    )
    parser.add_argument("--arch", default="micro", choices=tuple(ARCHS), help="architecture (default micro)")
    parser.add_argument("--img-size", type=int, default=None, help="input size (default 32)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--weight-decay", type=float, default=0.05)
    parser.add_argument("--warmup-epochs", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-size", type=int, default=None, help="train images (default: all / 8000 shapes)")
    parser.add_argument("--val-size", type=int, default=None, help="validation images (default: the data set's)")
    parser.add_argument("--decoder", choices=("linear", "mask"), default="linear", help="segmentation decoder")


def _add_scene_args(scene: argparse._ArgumentGroup) -> None:
    """How the Fashion-MNIST segmentation scenes are composed."""
    add_range_flag(scene, "--scene-garments", int, None, "garments per scene, inclusive range (default 2 4)")
    add_range_flag(
        scene, "--scene-fraction", float, None, "garment side as a fraction of the canvas (default 0.35 0.6)"
    )
    add_range_flag(
        scene,
        "--scene-garment-px",
        int,
        None,
        "garment side in pixels instead of a fraction (28 28: native, not resized)",
    )
    scene.add_argument(
        "--scene-overlap",
        type=float,
        nargs="+",
        metavar="CAP",
        default=None,
        help="the most of a garment's pixels that may land on earlier garments: one cap (default "
        "0.15; 1: anywhere) or LO HI, a cap drawn per scene",
    )


def _add_run_args(parser: argparse.ArgumentParser) -> None:
    """The variant's options, the output folder, threads, a starting checkpoint, resuming and the progress bar."""
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="variant option, e.g. --option eps=1e-6 --option param_matched=true",
    )
    parser.add_argument("--out", default="runs", help="output folder")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 for the micro archs, as the zoo was trained: their small matrices gain "
        "little from a second thread, and on a busy machine two threads made each step several times slower; "
        "the usable cores for tiny, small and base)",
    )
    parser.add_argument(
        "--init-from",
        default=None,
        metavar="CKPT",
        help="start the encoder from this checkpoint of the same variant and arch (e.g. its classifier "
        "for a segmenter); the head starts fresh",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the saved state in --out (<name>.state.safetensors + <name>.state.json); "
        "an error when it is missing or damaged",
    )
    parser.add_argument("--no-progress", action="store_true")


def default_threads(arch: str) -> int | None:
    """train-model's threads without ``--threads``: 1 for the micro archs (the zoo's setting), else ``None``
    (PyTorch's default, the usable cores)."""
    return 1 if arch.startswith("micro") else None


@entry_point
def main(argv: list[str] | None = None) -> int:
    """``train-model``: train one model and write ``<out>/<variant>_<task>_<data>.safetensors`` + ``.json``."""
    args = _train_parser().parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.lr <= 0:
        raise UsageError("--epochs and --batch-size must be >= 1 and --lr > 0")
    try:  # before torch is imported: a bad name or size is refused at once
        check_variant(args.variant)  # a plugin's names are checked below, once the registry has run it
        if args.img_size is not None:
            check_side(args.img_size, "--img-size")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.init_from:
        checkpoint_kind(args.init_from)  # a path that is no checkpoint, named (exit 1)
        checkpoint.check_encoder_source(args.init_from, args.variant, args.arch)  # before any data is loaded
    scene = _scene_options(args)
    options = _parse_options(args.option)
    try:  # bad flags refused before any data is loaded: exit 2, as every command's usage errors
        scene = fashion.check_scene_options(scene)
        datasets.check_source(args.data, args.task, scene)
        models.split_options(models.canonical_name(args.variant), **options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    cfg = _train_config(args, options, scene)
    try:
        result = training.train(cfg, resume=args.resume, progress=not args.no_progress)
    except RuntimeError as exc:  # a diverged loss: its message says where
        raise CommandError(str(exc)) from exc
    print(
        f"saved {result['path']}  val {result['metric_name']} {result['val_metric']:.2f}  "
        f"({result['train_time_s']:.0f} s)"
    )
    return 0


def _scene_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--scene-*`` options given (for :func:`attnzoo.data.fashion.check_scene_options`); refused with
    a :class:`UsageError` when malformed or given without ``--data fashion --task seg``."""
    scene = {
        "per_scene": args.scene_garments,
        "fraction": args.scene_fraction,
        "garment_px": args.scene_garment_px,
        "overlap": args.scene_overlap,
    }
    if scene["overlap"] is not None and len(scene["overlap"]) not in (1, 2):
        raise UsageError("--scene-overlap takes one cap or a range LO HI")
    if scene["overlap"] is not None and len(scene["overlap"]) == 1:
        scene["overlap"] = scene["overlap"][0]
    scene = {k: v for k, v in scene.items() if v is not None}
    if scene and (args.data != "fashion" or args.task != "seg"):
        raise UsageError("--scene-* options compose Fashion-MNIST scenes: use them with --data fashion --task seg")
    return scene


def _train_config(args: argparse.Namespace, options: dict[str, Any], scene: dict[str, Any]) -> Any:
    """The run's :class:`~attnzoo.training.train.TrainConfig` from the flags (its module is imported lazily)."""
    return training.TrainConfig(
        **flag_values(
            args,
            "variant",
            "task",
            "data",
            "arch",
            "img_size",
            "epochs",
            "batch_size",
            "lr",
            "weight_decay",
            "warmup_epochs",
            "seed",
            "train_size",
            "val_size",
        ),
        options=options,
        out=args.out,
        threads=default_threads(args.arch) if args.threads is None else args.threads,
        init_from=args.init_from,
        decoder=args.decoder,
        scene=scene,
    )


@entry_point
def evaluate_main(argv: list[str] | None = None) -> int:
    """``evaluate-model``: top-1 (cls) or mIoU + per-class IoU and the garments named right (seg) of a checkpoint on
    the test split."""
    parser = argparse.ArgumentParser(prog="evaluate-model", description="Re-evaluate a checkpoint on the test split.")
    parser.add_argument("checkpoint", help=".safetensors written by train-model (or a zoo file)")
    parser.add_argument("--data", default=None, help="data source (default: the one recorded in the checkpoint)")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test")
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N images")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--out", default=None, help="also write the result, with this command, as JSON to this file (written whole)"
    )
    args = add_debug_flag(parser).parse_args(argv)
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be >= 1")
    if args.out is not None and (Path(args.out).is_dir() or not Path(args.out).parent.is_dir()):
        raise UsageError(f"--out {args.out}: not a file in an existing folder")
    checkpoint_kind(args.checkpoint)  # a path that is no checkpoint, named before torch is imported (exit 1)
    result = training.evaluate_checkpoint(args.checkpoint, data=args.data, limit=args.limit, split=args.split)
    if args.out is not None:
        command = shlex.join(["evaluate-model", *(sys.argv[1:] if argv is None else argv)])
        atomic_write_text(Path(args.out), json.dumps({"command": command, **result}, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.checkpoint}: {result['metric_name']} {result['metric']:.2f} on {result['n_images']} "
        f"{args.split} images of {result['data']}"
    )
    for name, iou in (result.get("per_class_iou") or {}).items():
        print(f"  {name:>12s}  IoU {'-' if iou is None else f'{iou:.2f}'}")
    named = result.get("named")
    if named:
        print(
            f"garments named right: {named['garments_right']} of {named['garments']}; scenes with every garment "
            f"named right: {named['scenes_right']} of {named['scenes']} "
            f"({100.0 * named['scenes_right'] / max(named['scenes'], 1):.1f} %)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
