"""``export-model``: trained (or given) model -> verified ONNX (+ report) -> optional TensorRT engine.

The command parses its flags, calls :func:`attnzoo.export.export_model` (which does all the work and checks) and
prints the summary.

Examples::

    export-model --variant belief2
    export-model --variant belief-star --task seg --input-size 48x64 --dtype fp16
    export-model --checkpoint runs/belief2.safetensors --out exports/b2.onnx   # variant from its config
    export-model --variant belief2 --format tensorrt --batch-sizes 1,8,32
    export-model --variant belief2 --format tensorrt --compute-capability SM86   # no GPU needed
    export-model --variant belief2 --format triton --out triton-models --batch-sizes 1,8,32
    export-model --variant belief2 --dtype int8                         # ModelOpt Q/DQ, scored on the test set
    export-model --checkpoint vit.safetensors --dtype int8 --calibration-data photos/   # calibrated on your images
    export-model --variant belief2 --dtype fp8 --format tensorrt        # FP8 engine for SM89, built ahead of time

Errors: one ``error: ...`` line, exit 2 for a bad command line (refused before anything is loaded or
written), 1 for a failure; ``--debug`` shows the traceback (see :mod:`attnzoo.cli`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from attnzoo.cli import CommandParser, Later, check_choice, entry_point, flag_values, with_arguments
from attnzoo.errors import CommandError, UsageError
from attnzoo.lazy import lazy_import
from attnzoo.limits import MAX_BATCH_SIZE, check_batch_sizes, check_side
from attnzoo.modelconfig import ARCHS, BUILTIN_VARIANT_NAMES, TASKS, check_variant
from attnzoo.runtime.precision import PRECISIONS
from attnzoo.runtime.targets import FormatOption, targets

from .errors import ExportError, ExportWarning

# a bad command line is refused without torch, onnx and ModelOpt: these import at their first use (the help texts
# that quote them are Later, the choices they hold are checked after the cheap checks)
onnx_export = lazy_import("attnzoo.export.onnx_export")
pipeline = lazy_import("attnzoo.export.pipeline")
quantize = lazy_import("attnzoo.export.quantize")

__all__ = ["main", "build_parser"]


def _parse_ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what} must be integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{what} must be positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="export-model",
        description="Export an attnzoo model to ONNX (the variant's extra math kept as explicit ops, verified against "
        "eager PyTorch with ONNX Runtime) and optionally build a TensorRT engine.",
        epilog=f"variants: {', '.join(BUILTIN_VARIANT_NAMES)} (and installed plugins': python -m attnzoo.models)\n"
        f"archs: {', '.join(ARCHS)}\n"
        f"Default checkpoint: the zoo's trained model for the variant and task (attnzoo.zoo).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return with_arguments(parser, _model_arguments, _output_arguments, _target_arguments, _quantization_arguments)


def _quantization_arguments(parser: argparse.ArgumentParser) -> None:
    """The group of the int8 / fp8 flags: where the Q/DQ pairs go, the calibration and the accuracy gates."""
    quantization = parser.add_argument_group("quantization (--dtype int8 / fp8)")
    _placement_arguments(quantization)
    _calibration_arguments(quantization)
    _gate_arguments(quantization)


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    """What is exported: the variant, task and arch, the checkpoint, the opset and the precision."""
    parser.add_argument(
        "--variant",
        default=None,
        metavar="NAME",
        help="attention variant (see the list below; default: the --checkpoint's own)",
    )
    parser.add_argument("--task", choices=TASKS, default=None, help="cls or seg (default: the checkpoint's, else cls)")
    parser.add_argument(
        "--arch", choices=tuple(ARCHS), default=None, help="architecture (default: the checkpoint's, else micro)"
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help=".safetensors checkpoint, whose config names the variant, task and arch (or a plain .pt state "
        "dict with --variant; never unpickled)",
    )
    parser.add_argument(
        "--random-init",
        action="store_true",
        help="export a freshly initialised (untrained) model instead of a checkpoint",
    )
    parser.add_argument(
        "--opset",
        type=int,
        default=20,
        help=Later(lambda: f"ONNX opset ({', '.join(map(str, onnx_export.SUPPORTED_OPSETS))})"),
    )
    parser.add_argument(
        "--dtype",
        choices=tuple(PRECISIONS),
        default="fp32",
        help="fp32, fp16, or int8/fp8: post-training quantization with NVIDIA ModelOpt (Q/DQ nodes; the "
        "extra math stays fp32), its output compared with fp32's on held-out inputs (--min-cosine) "
        "and, for a model with a labelled test split, scored on it next to fp32",
    )


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    """Where it goes and how it is verified: the format, the file, the batch sizes and input size, the threads."""
    parser.add_argument("--format", default=None, metavar="FORMAT", help=Later(_format_help))  # checked in main
    parser.add_argument(
        "--batch-sizes",
        default=None,
        help=Later(
            lambda: (
                f"batch sizes verified (and the TensorRT profile range), each in 1..{MAX_BATCH_SIZE} "
                f"(default: {','.join(map(str, pipeline.DEFAULT_BATCH_SIZES))})"
            )
        ),
    )
    parser.add_argument(
        "--input-size",
        default=None,
        metavar="H[xW]",
        help="input size (default: the model's training size; segmenters take any H x W)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output file (default: exports/<variant>_<task>_<arch>[_<dtype>].onnx or .engine)",
    )
    parser.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads for the verification")


def _format_help() -> str:
    suffixes = ", ".join(f"{s} {name}" for name, ss in pipeline.SUFFIXES.items() for s in ss)
    return (
        f"{', '.join(pipeline.FORMATS)} (default: from the --out suffix: {suffixes}; no suffix: onnx, written to "
        "OUT.onnx); a format that writes a folder (triton: a Triton model repository) writes it into --out"
    )


def format_options() -> dict[str, FormatOption]:
    """Every format's own options by name, as the targets declare them (:attr:`~attnzoo.runtime.targets.Target.
    options`; read without importing a format), each once."""
    return {option.name: option for target in targets() for option in target.options}


def _target_arguments(parser: argparse.ArgumentParser) -> None:
    """The formats' own options (TensorRT's GPU, Triton's platform ...), a group per format that owns some: each
    target declares them, so a new one adds its flags here with no edit."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for option in format_options().values():
        if option.owner not in groups:
            groups[option.owner] = parser.add_argument_group(f"--format {option.owner}")
        groups[option.owner].add_argument(
            option.flag,
            type=option.parse,
            choices=option.choices,
            default=None,  # not given: the format's default (a format refuses another's option given)
            metavar=option.metavar,
            help=option.help,
        )


def _placement_arguments(group: argparse._ArgumentGroup) -> None:
    """``--dtype int8 / fp8``: what is quantized (the extra math, the Q/DQ placement, SmoothQuant)."""
    group.add_argument(
        "--quantize-extra-math",
        action="store_true",
        help="quantize the variant's extra-math scopes too (the projection; an ablation): by default "
        "every op in them stays unquantized and fp32",
    )
    group.add_argument(
        "--qdq-placement",
        default=None,
        metavar="PLACEMENT",
        help="where the Q/DQ nodes go: auto (default: the weight MatMuls, plus attention's two matmuls "
        "and the residual Adds of each block, each kept fp32 unless the cosine to fp32 that the "
        "choosing inputs promise for most inputs like them stays at --min-cosine), tensorrt (ModelOpt's placement, "
        "all of them, which TensorRT fuses) or cpu (int8 only: just in front of the MatMul/Gemm/Conv ops ONNX "
        "Runtime's CPU kernels run in int8; faster there)",
    )
    group.add_argument(
        "--smooth-quant",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="int8: migrate LayerNorm outputs' outlier channels into the MatMul weights they feed before "
        "calibrating (SmoothQuant; only outputs with a channel >= 8x the median channel's range move); default on "
        "with --qdq-placement auto, off otherwise (docs/quantization.md)",
    )


def _calibration_arguments(group: argparse._ArgumentGroup) -> None:
    """``--dtype int8 / fp8``: the calibration inputs."""
    group.add_argument(
        "--calibration-data",
        type=Path,
        default=None,
        metavar="DIR|FILE.npy",
        help="calibrate on a folder of images (preprocessed as the model's metadata says) or a float32 "
        "(N, 3, H, W) .npy array of normalised inputs (never unpickled) instead of the model's "
        "training split; the last --fidelity-count (at most a quarter) are held out",
    )
    group.add_argument(
        "--calibration-count",
        type=int,
        default=None,
        metavar="N",
        help=Later(
            lambda: f"images (training split or folder) to calibrate on (default {quantize.DEFAULT_CALIBRATION_COUNT})"
        ),
    )
    group.add_argument(
        "--calibration-seed",
        type=int,
        default=None,
        help=Later(lambda: f"seed of the calibration draw (default {quantize.DEFAULT_CALIBRATION_SEED})"),
    )


def _gate_arguments(group: argparse._ArgumentGroup) -> None:
    """``--dtype int8 / fp8``: the gates a quantized graph must pass (accuracy, fidelity) and their inputs."""
    group.add_argument(
        "--accept-accuracy-drop",
        action="store_true",
        help=Later(
            lambda: (
                "write the quantized model even when it scores more than the tolerance below fp32 "
                f"({quantize.ACCURACY_TOLERANCE['cls']:g} points top-1, {quantize.ACCURACY_TOLERANCE['seg']:g} mIoU)"
            )
        ),
    )
    group.add_argument(
        "--min-cosine",
        type=float,
        default=None,
        metavar="C",
        help=Later(
            lambda: (
                "fidelity gate: refuse a graph whose output's cosine similarity to fp32's on the worst "
                f"held-out input is below C (default {quantize.DEFAULT_MIN_COSINE:g} for a model without a labelled "
                "test split, which is gated on its accuracy instead; 0 measures without refusing)"
            )
        ),
    )
    group.add_argument(
        "--fidelity-count",
        type=int,
        default=None,
        metavar="N",
        help=Later(
            lambda: (
                f"held-out inputs the fidelity is measured on (default {quantize.DEFAULT_FIDELITY_COUNT}; with "
                "--qdq-placement auto half of them choose the placement)"
            )
        ),
    )
    group.add_argument(
        "--eval-limit",
        type=int,
        default=None,
        metavar="N",
        help="score on the first N test images only (quick checks, not served by serve-demo / serve-models; "
        "default: the whole test split)",
    )


@contextlib.contextmanager
def _warnings_as_lines():
    """Print the export's warnings as ``warning: ...`` lines on stderr as they come."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", ExportWarning)
        shown = warnings.showwarning

        def show(message, category, *args, **kwargs):
            if issubclass(category, ExportWarning):
                print(f"warning: {message}", file=sys.stderr)
            else:
                shown(message, category, *args, **kwargs)

        warnings.showwarning = show
        yield


def _cheap_checks(args: argparse.Namespace) -> tuple[list[int] | None, list[int] | None]:
    """What the command line can be refused for before torch or onnx is imported (exit 2 in a fraction of a
    second): the variant's name and the sizes' bounds; returns the input size and batch sizes given (or None)."""
    try:
        if args.variant is not None:
            check_variant(args.variant)  # a plugin's names are checked once the registry has run it
        input_size = None if args.input_size is None else _parse_ints(args.input_size, "--input-size")
        batch_sizes = None if args.batch_sizes is None else _parse_ints(args.batch_sizes, "--batch-sizes")
        for side in input_size or ():
            check_side(side, "--input-size sides")
        if batch_sizes:
            check_batch_sizes(batch_sizes)
    except UsageError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return input_size, batch_sizes


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``export-model``; errors exit non-zero with one ``error: ...`` line (2: refused before
    any work, 1: a failure)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    input_size, batch_sizes = _cheap_checks(args)
    check_choice(parser, "--format", args.format, pipeline.FORMATS)  # the heavy modules' choices, after the rest
    check_choice(parser, "--qdq-placement", args.qdq_placement, quantize.PLACEMENT_CHOICES)
    try:
        with _warnings_as_lines():
            result = pipeline.export_model(
                args.variant,
                **flag_values(args, "task", "arch", "checkpoint", "random_init", "out", "format", "dtype", "opset"),
                batch_sizes=batch_sizes or pipeline.DEFAULT_BATCH_SIZES,
                input_size=input_size,
                **flag_values(
                    args,
                    "threads",
                    "quantize_extra_math",
                    "qdq_placement",
                    "calibration_data",
                    "calibration_count",
                    "calibration_seed",
                    "accept_accuracy_drop",
                    "eval_limit",
                    "min_cosine",
                    "fidelity_count",
                    "smooth_quant",
                ),
                progress=True,
                **flag_values(args, *format_options()),
            )
    except ExportError as exc:
        raise CommandError(str(exc)) from exc
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
