"""``export-model``: trained (or given) model -> verified ONNX (+ report) -> optional TensorRT engine.

Examples::

    export-model --variant belief2
    export-model --variant belief-star --task seg --input-size 48x64 --dtype fp16
    export-model --variant belief2 --checkpoint runs/belief2.safetensors --out exports/b2.onnx
    export-model --variant belief2 --format tensorrt --batch-sizes 1,8,32
    export-model --variant belief2 --format tensorrt --compute-capability SM86   # no GPU needed
    export-model --variant belief2 --format triton --out triton-models --batch-sizes 1,8,32
    export-model --variant belief2 --dtype int8                         # ModelOpt Q/DQ, scored on the test set
    export-model --variant belief2 --dtype fp8 --format tensorrt        # FP8 engine for SM89, built ahead of time

Errors: one ``error: ...`` line, exit 2 for a bad command line (refused before anything is loaded or
written), 1 for a failure; ``--debug`` shows the traceback (see :mod:`attnzoo.cli`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from torch import nn

from attnzoo.cli import CommandError, UsageError, add_debug_flag, entry_point, first_line

__all__ = ["main", "build_parser", "load_for_export"]


#: ``--out`` suffixes of each ``--format`` (the format is inferred from the suffix when not given); ``triton``
#: writes a folder (a Triton model repository), named only with an explicit ``--format triton``.
SUFFIXES = {"onnx": (".onnx",), "tensorrt": (".engine", ".plan"), "triton": ()}
#: ``--format triton`` without ``--out``.
DEFAULT_TRITON_DIR = Path("triton-models")


def _parse_ints(text: str, what: str) -> List[int]:
    try:
        values = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{what} must be integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{what} must be positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    from attnzoo.models import ARCHS, TASKS, VARIANT_NAMES

    from attnzoo.limits import MAX_BATCH_SIZE

    from .onnx_export import DTYPES, SUPPORTED_OPSETS
    from .quantize import (ACCURACY_TOLERANCE, DEFAULT_CALIBRATION_COUNT, DEFAULT_CALIBRATION_SEED, QDQ_PLACEMENTS,
                           QUANT_DTYPES)

    p = argparse.ArgumentParser(
        prog="export-model",
        description="Export an attnzoo model to ONNX (projection kept as explicit ops, verified against eager "
                    "PyTorch with ONNX Runtime) and optionally build a TensorRT engine.",
        epilog=f"variants: {', '.join(VARIANT_NAMES)}\narchs: {', '.join(ARCHS)}\n"
               f"Default checkpoint: the zoo's trained model for the variant and task (attnzoo.zoo).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", required=True, metavar="NAME", help="attention variant (see the list below)")
    p.add_argument("--task", choices=TASKS, default=None, help="cls or seg (default: the checkpoint's, else cls)")
    p.add_argument("--arch", choices=tuple(ARCHS), default=None,
                   help="architecture for --random-init (default: the checkpoint's, else micro)")
    p.add_argument("--checkpoint", type=Path, default=None,
                   help=".safetensors checkpoint (or a plain .pt state dict; never unpickled)")
    p.add_argument("--random-init", action="store_true",
                   help="export a freshly initialised (untrained) model instead of a checkpoint")
    p.add_argument("--opset", type=int, default=20, help=f"ONNX opset ({', '.join(map(str, SUPPORTED_OPSETS))})")
    p.add_argument("--dtype", choices=(*DTYPES, *QUANT_DTYPES), default="fp32",
                   help="fp32, fp16, or int8/fp8: post-training quantization with NVIDIA ModelOpt (Q/DQ nodes; the "
                        "extra math stays fp32), verified on the test split next to fp32")
    p.add_argument("--format", choices=tuple(SUFFIXES), default=None,
                   help="onnx, tensorrt or triton (default: from the --out suffix, .onnx or .engine; else onnx); "
                        "triton writes a Triton model repository into the --out folder (default "
                        f"{DEFAULT_TRITON_DIR}): <name>/config.pbtxt, labels.txt, 1/model.onnx (or 1/model.plan)")
    p.add_argument("--batch-sizes", default="1,8",
                   help=f"batch sizes verified (and the TensorRT profile range), each in 1..{MAX_BATCH_SIZE}")
    p.add_argument("--input-size", default=None, metavar="H[xW]",
                   help="input size (default: the model's training size; segmenters take any H x W)")
    p.add_argument("--out", type=Path, default=None,
                   help="output file (default: exports/<variant>_<task>_<arch>[_fp16].onnx or .engine)")
    p.add_argument("--threads", type=int, default=None, help="ONNX Runtime threads for the verification")
    from .triton import DEFAULT_QUEUE_DELAY_US, PLATFORMS

    p.add_argument("--triton-platform", choices=tuple(PLATFORMS), default="onnxruntime",
                   help="--format triton: onnxruntime (platform onnxruntime_onnx, default) or tensorrt "
                        "(tensorrt_plan: an engine of TensorRT proper, built on the GPU it will serve on); "
                        "max_batch_size is the largest of --batch-sizes")
    p.add_argument("--triton-queue-delay-us", type=int, default=DEFAULT_QUEUE_DELAY_US, metavar="US",
                   help=f"--format triton: dynamic batching's max_queue_delay_microseconds "
                        f"(default {DEFAULT_QUEUE_DELAY_US})")
    from attnzoo.runtime.tensorrt import COMPUTE_CAPABILITIES, DEFAULT_COMPUTE_CAPABILITY

    p.add_argument("--compute-capability", type=str.upper, choices=COMPUTE_CAPABILITIES, default=None,
                   metavar="SM",
                   help=f"--format tensorrt: GPU to build for, one of {', '.join(COMPUTE_CAPABILITIES)} (default: "
                        f"CURRENT, the GPU present; without a GPU {DEFAULT_COMPUTE_CAPABILITY}, built ahead of time "
                        "with tensorrt-rtx and not run)")
    q = p.add_argument_group("quantization (--dtype int8 / fp8)")
    q.add_argument("--quantize-extra-math", "--quantize-projection", dest="quantize_extra_math", action="store_true",
                   help="quantize the variant's extra-math scopes too (the projection; an ablation): by default "
                        "every op in them stays unquantized and fp32")
    q.add_argument("--qdq-placement", choices=tuple(QDQ_PLACEMENTS), default=None,
                   help="where the Q/DQ nodes go: tensorrt (default: ModelOpt's placement, also on residual Adds "
                        "and attention's two matmuls, which TensorRT fuses) or cpu (int8 only: just in front of "
                        "the MatMul/Gemm/Conv ops ONNX Runtime's CPU kernels run in int8; faster there)")
    q.add_argument("--calibration-data", type=Path, default=None, metavar="FILE.npy",
                   help="calibrate on this float32 (N, 3, H, W) array of normalised images (never unpickled) "
                        "instead of the model's training split")
    q.add_argument("--calibration-count", type=int, default=None, metavar="N",
                   help=f"training images to calibrate on (default {DEFAULT_CALIBRATION_COUNT})")
    q.add_argument("--calibration-seed", type=int, default=None,
                   help=f"seed of the calibration draw (default {DEFAULT_CALIBRATION_SEED})")
    q.add_argument("--accept-accuracy-drop", action="store_true",
                   help="write the quantized model even when it scores more than the tolerance below fp32 "
                        f"({ACCURACY_TOLERANCE['cls']:g} points top-1, {ACCURACY_TOLERANCE['seg']:g} mIoU)")
    q.add_argument("--eval-limit", type=int, default=None, metavar="N",
                   help="score on the first N test images only (quick checks, not served by serve-demo / serve-models; "
                        "default: the whole test split)")
    return add_debug_flag(p)


def _class_count(state: Dict[str, Any], task: str) -> Optional[int]:
    """Classes of a config-less state dict, from its head."""
    for key, axis in (("head.weight", 0), ("decoder.head.weight", 0), ("decoder.cls_emb", 1)):
        if key in state and (task == "cls") == (key == "head.weight"):
            return int(state[key].shape[axis])
    return None


def _from_checkpoint(path: Path, variant: str, task: Optional[str],
                     arch: Optional[str]) -> Tuple[nn.Module, Dict[str, Any]]:
    """Model + config from a checkpoint; the variant (and task/arch when given) must match it."""
    from attnzoo.models.checkpoint import NoConfigError, load_checkpoint, load_state_dict_file, load_weights, read_config
    from attnzoo.models import create_model

    if not path.is_file():
        raise ValueError(f"checkpoint not found: {path}")
    try:
        config = read_config(path)
    except NoConfigError:  # a plain state dict: the command line describes the model
        state = load_state_dict_file(path)  # raises for pickles (weights_only=True) and unreadable files
        task = task or "cls"
        model = create_model(variant, task, arch or "micro", num_classes=_class_count(state, task))
        load_weights(model, state, source=str(path))
        return model, dict(model.attnzoo_config)
    for key, wanted in (("variant", variant), ("task", task), ("arch", arch)):
        if wanted is not None and config.get(key) != wanted:
            raise ValueError(f"{path} holds a {key} {config.get(key)!r} model, not {wanted!r}")
    return load_checkpoint(path)  # also never unpickles


def load_for_export(variant: str, task: Optional[str] = None, arch: Optional[str] = None,
                    checkpoint: Optional[Path] = None, random_init: bool = False) -> Tuple[nn.Module, Dict[str, Any], str]:
    """``(model in eval mode, config, checkpoint sha256)`` for the command line's choices.

    Raises:
        ValueError: unknown variant, missing zoo model, mismatching or unsafe checkpoint.
    """
    from attnzoo import zoo
    from attnzoo.fileio import sha256_file
    from attnzoo.models import canonical_name, create_model
    from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD

    variant = canonical_name(variant)
    if random_init:
        if checkpoint is not None:
            raise ValueError("--random-init and --checkpoint exclude each other")
        from attnzoo.data.datasets import SHAPES_CLASSES, SHAPES_SEG_CLASSES

        task = task or "cls"
        names = list(SHAPES_CLASSES if task == "cls" else SHAPES_SEG_CLASSES)
        model = create_model(variant, task, arch or "micro", num_classes=len(names))
        config = {**model.attnzoo_config, "class_names": names, "mean": list(DEFAULT_MEAN),
                  "std": list(DEFAULT_STD), "untrained": True}
        return model.eval(), config, ""
    if checkpoint is None:
        try:
            checkpoint = zoo.checkpoint_path(variant, task or "cls")
        except ValueError as exc:
            raise ValueError(f"{exc}; pass --checkpoint PATH, or --random-init for an untrained model") from None
    model, config = _from_checkpoint(Path(checkpoint), variant, task, arch)
    return model.eval(), config, sha256_file(checkpoint)


def _format(fmt: Optional[str], out: Optional[Path]) -> str:
    """The output format: ``--format``, else inferred from the ``--out`` suffix; they must agree."""
    if out is None:
        return fmt or "onnx"
    if fmt == "triton":
        if out.suffix.lower() in {s for suffixes in SUFFIXES.values() for s in suffixes}:
            raise UsageError(f"with --format triton, --out names the model repository folder, not a file "
                             f"({out.name}); e.g. --out {out.with_suffix('')}")
        return fmt
    implied = next((f for f, suffixes in SUFFIXES.items() if out.suffix.lower() in suffixes), None)
    if implied is None:
        raise UsageError(f"--out {out}: the file name must end in .onnx (ONNX) or .engine (TensorRT engine)")
    if fmt is not None and fmt != implied:
        if fmt == "tensorrt":
            raise UsageError(f"with --format tensorrt, --out names the engine file (e.g. {out.with_suffix('.engine')}); "
                             "the verified ONNX is written beside it")
        raise UsageError(f"--out {out} names a TensorRT engine but --format is onnx; use --out "
                         f"{out.with_suffix('.onnx')}, or --format tensorrt")
    return implied


def _out_path(args: argparse.Namespace, config: Dict[str, Any]) -> Path:
    """The output file (the model's folder in the repository for ``--format triton``); its folder is created
    and must be writable."""
    from attnzoo.fileio import writable_dir

    dtype = "" if args.dtype == "fp32" else f"_{args.dtype}"
    stem = f"{config['variant']}_{config['task']}_{config['arch']}{dtype}"
    if args.format == "triton":
        repo = args.out or DEFAULT_TRITON_DIR
        if repo.exists() and not repo.is_dir():
            raise UsageError(f"--out {repo} is a file; --format triton writes a model repository folder")
        return writable_dir(writable_dir(repo, "Triton model repository") / stem / "1", "model version folder").parent
    suffix = SUFFIXES[args.format][0]
    out = args.out or Path("exports") / f"{stem}{suffix}"
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name")
    writable_dir(out.parent)
    return out


def _input_hw(text: Optional[str], config: Dict[str, Any]) -> Tuple[int, int]:
    if text is None:
        return int(config["img_size"]), int(config["img_size"])
    from attnzoo.limits import check_side

    hw = _parse_ints(text, "--input-size")
    if len(hw) > 2:
        raise UsageError(f"--input-size takes H or HxW, got {text!r}")
    h, w = hw[0], hw[-1]
    try:
        check_side(max(h, w), "--input-size sides")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if config["task"] == "cls" and (h, w) != (config["img_size"],) * 2:
        raise UsageError(f"a classifier takes its training size {config['img_size']}, not {h}x{w}")
    return h, w


@entry_point
def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``export-model``; errors exit non-zero with one ``error: ...`` line.

    Everything that can be checked is checked before the export starts: flags, the batch-size bound and the
    memory a verification pass at the largest batch needs, the output folder.
    """
    from tqdm import tqdm

    from attnzoo.limits import check_batch_sizes
    from attnzoo.models.memory import check_forward_memory
    from attnzoo.models import canonical_name

    from .onnx_export import SUPPORTED_OPSETS
    from .quantize import QUANT_DTYPES
    from .verify import EXTRA_BATCH_SIZES, VerificationError, export_verified, summary

    args = build_parser().parse_args(argv)
    if args.opset not in SUPPORTED_OPSETS:
        raise UsageError(f"unsupported opset {args.opset}; supported: {', '.join(map(str, SUPPORTED_OPSETS))}")
    batch_sizes = _parse_ints(args.batch_sizes, "--batch-sizes")
    try:
        check_batch_sizes(batch_sizes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    args.format = _format(args.format, args.out)
    if args.random_init and args.checkpoint is not None:
        raise UsageError("--random-init and --checkpoint exclude each other")
    try:
        canonical_name(args.variant)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _check_quantize_flags(args)
    if args.format == "tensorrt":
        from .tensorrt import tensorrt_unavailable_reason

        reason = tensorrt_unavailable_reason(run=False)  # building needs no GPU with tensorrt-rtx
        if reason:
            raise UsageError(f"--format tensorrt: {reason}")
        from attnzoo.runtime.tensorrt import gpu_available

        if args.compute_capability == "CURRENT" and not gpu_available():
            raise UsageError("--compute-capability CURRENT needs a GPU and none is visible; name one to "
                             "build ahead of time (e.g. SM89)")
    elif args.format == "triton":
        _check_triton(args)
    elif args.compute_capability:
        raise UsageError("--compute-capability applies to --format tensorrt only")
    model, config, sha = load_for_export(args.variant, args.task, args.arch, args.checkpoint, args.random_init)
    hw = _input_hw(args.input_size, config)
    try:
        check_forward_memory(config, hw, max([*batch_sizes, *EXTRA_BATCH_SIZES]))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    calibration = _calibration(args, config, hw) if args.dtype in QUANT_DTYPES else None  # (x, source, seed)
    out = _out_path(args, config)
    if args.random_init:
        print(f"warning: --random-init: exporting an UNTRAINED {config['variant']} model with random weights; "
              "its predictions are meaningless", file=sys.stderr)
    onnx_out = _onnx_out(args, out)
    steps = ["export + check + verify"] + (["quantize + score"] if calibration is not None else []) + \
        (["tensorrt"] if args.format == "tensorrt" else [])
    if args.format == "triton":
        steps += (["tensorrt"] if args.triton_platform == "tensorrt" else []) + ["triton config"]
    with _removed_if_empty(out if args.format == "triton" else None), \
            tqdm(total=len(steps), desc="export-model", unit="step", file=sys.stderr) as bar:
        bar.set_postfix_str(steps[0])
        captured = io.StringIO()
        quantized = None
        try:
            with contextlib.ExitStack() as stack:
                fp32_out = onnx_out
                if calibration is not None:  # the verified fp32 model is the quantizer's input, kept aside
                    fp32_out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attnzoo-fp32-"))) / \
                        onnx_out.name
                with contextlib.redirect_stdout(captured):  # the exporter's own progress lines
                    report = export_verified(model, fp32_out, config, opset=args.opset,
                                             dtype="fp32" if calibration is not None else args.dtype,
                                             input_hw=hw, batch_sizes=batch_sizes, checkpoint_sha256=sha,
                                             threads=args.threads)
                bar.update()
                if calibration is not None:
                    bar.set_postfix_str(steps[1])
                    quantized = _quantize(args, fp32_out, onnx_out, config, calibration)
                    bar.update()
        except VerificationError as exc:
            raise CommandError(str(exc)) from exc
        except (ValueError, OSError, CommandError):
            raise
        except Exception as exc:  # ONNX Runtime / exporter errors: one line (traceback with --debug)
            raise CommandError(f"export failed: {type(exc).__name__}: {first_line(exc)}") from exc
        engine_report = None
        if "tensorrt" in steps:
            from .tensorrt import build_engine

            bar.set_postfix_str("tensorrt")
            engine = _engine_out(args, out)
            try:
                engine_report = build_engine(onnx_out, engine, batch_sizes=batch_sizes,
                                             compute_capability=args.compute_capability)
            except Exception as exc:  # TensorRT / CUDA / file-system errors: one line (traceback with --debug)
                raise CommandError(f"TensorRT build failed: {first_line(exc)}") from exc
            bar.update()
        triton_check = None
        if args.format == "triton":
            from attnzoo.runtime.contract import ModelContract

            from .triton import PLATFORMS, write_config

            bar.set_postfix_str("triton config")
            triton_check = write_config(out, ModelContract.from_onnx(onnx_out), onnx_out,
                                        PLATFORMS[args.triton_platform], max(batch_sizes), args.triton_queue_delay_us)
            bar.update()
    print(summary(report) if quantized is None else _quantized_summary(quantized, report))
    if triton_check:
        from .triton import summary as triton_summary

        print(triton_summary(out, triton_check))
    if engine_report:
        from .tensorrt import engine_report_path, summary as engine_summary

        print(engine_summary(engine_report))
        print(f"  report: {engine_report_path(_engine_out(args, out))}")
    return 0


@contextlib.contextmanager
def _removed_if_empty(model_dir: Optional[Path]):
    """On failure, remove the Triton model folder made for this export when nothing is in it (Triton refuses a
    repository with a model folder that has no model)."""
    try:
        yield
    except BaseException:
        for folder in ((model_dir / "1", model_dir) if model_dir is not None else ()):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only succeeds when empty
        raise


def _onnx_out(args: argparse.Namespace, out: Path) -> Path:
    """Where the verified ONNX goes: ``out`` itself, beside the engine, or in the Triton model folder
    (``1/model.onnx`` for onnxruntime_onnx; beside ``1/`` for tensorrt_plan, whose version folder holds the
    engine)."""
    if args.format == "triton":
        from .triton import MODEL_FILES, PLATFORMS

        if args.triton_platform == "onnxruntime":
            return out / "1" / MODEL_FILES[PLATFORMS["onnxruntime"]]
        return out / "model.onnx"
    return out if args.format == "onnx" else out.with_suffix(".onnx")


def _engine_out(args: argparse.Namespace, out: Path) -> Path:
    """The engine file: ``out``, or ``1/model.plan`` in the Triton model folder."""
    if args.format == "triton":
        from .triton import MODEL_FILES, PLATFORMS

        return out / "1" / MODEL_FILES[PLATFORMS["tensorrt"]]
    return out


def _check_triton(args: argparse.Namespace) -> None:
    """Refuse ``--format triton`` flags that cannot work here, before any work."""
    from .triton import triton_unavailable_reason

    reason = triton_unavailable_reason()
    if reason:
        raise UsageError(f"--format triton: {reason}")
    if args.triton_queue_delay_us < 0:
        raise UsageError(f"--triton-queue-delay-us must be >= 0, got {args.triton_queue_delay_us}")
    if args.triton_platform == "tensorrt":
        from attnzoo.runtime.tensorrt import gpu_available, load_library

        from .tensorrt import tensorrt_unavailable_reason

        reason = tensorrt_unavailable_reason(run=False)
        if reason:
            raise UsageError(f"--triton-platform tensorrt: {reason}")
        lib = load_library()
        if lib.name != "tensorrt" or not gpu_available():
            raise UsageError("--triton-platform tensorrt: Triton's tensorrt_plan backend loads engines of TensorRT "
                             f"proper built on the GPU it serves on; here only {lib.describe()} "
                             f"{'is installed' if gpu_available() else 'without a GPU'} (run this on the GPU machine "
                             "with pip install -e \".[tensorrt10]\", or use --triton-platform onnxruntime)")
    elif args.compute_capability:
        raise UsageError("--compute-capability applies to --format tensorrt and --triton-platform tensorrt only")


def _check_quantize_flags(args: argparse.Namespace) -> None:
    """Refuse quantization flags that cannot work, before any work (ModelOpt missing, FP8 below SM 8.9, ...)."""
    from .quantize import (CPU_QDQ_PLACEMENT, DEFAULT_QDQ_PLACEMENT, QUANT_DTYPES, fp8_compute_capability_error,
                           qdq_placement_error, quantize_unavailable_reason)

    flags = {"--quantize-extra-math": args.quantize_extra_math, "--calibration-data": args.calibration_data,
             "--qdq-placement": args.qdq_placement is not None,
             "--calibration-count": args.calibration_count is not None,
             "--calibration-seed": args.calibration_seed is not None,
             "--accept-accuracy-drop": args.accept_accuracy_drop, "--eval-limit": args.eval_limit is not None}
    if args.dtype not in QUANT_DTYPES:
        given = [flag for flag, value in flags.items() if value]
        if given:
            raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --dtype int8 / fp8 only")
        return
    if args.format == "triton":
        raise UsageError(f"--dtype {args.dtype}: --format triton is not supported yet; export the ONNX "
                         "(--format onnx) or a TensorRT engine")
    if args.dtype == "fp8" and args.format == "tensorrt":
        error = fp8_compute_capability_error(args.compute_capability)
        if error:
            raise UsageError(error)
    error = qdq_placement_error(args.qdq_placement or DEFAULT_QDQ_PLACEMENT, args.dtype)
    if error:
        raise UsageError(error)
    if args.qdq_placement == CPU_QDQ_PLACEMENT and args.format == "tensorrt":
        raise UsageError("--qdq-placement cpu is for ONNX Runtime on the CPU; a TensorRT engine wants the tensorrt "
                         "placement (the default)")
    reason = quantize_unavailable_reason()
    if reason:
        raise UsageError(f"--dtype {args.dtype} {reason}")
    for flag, value in (("--calibration-count", args.calibration_count), ("--eval-limit", args.eval_limit)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if args.calibration_data is not None:
        if args.calibration_count is not None or args.calibration_seed is not None:
            raise UsageError("--calibration-count/--calibration-seed draw from the training split; with "
                             "--calibration-data the file's images are used as they are")
        from .quantize import load_calibration_file

        try:
            load_calibration_file(args.calibration_data, None)  # shape (but H, W), dtype, emptiness
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def _calibration(args: argparse.Namespace, config: Dict[str, Any], hw: Tuple[int, int]) -> Tuple[Any, str, Optional[int]]:
    """``(float32 NCHW calibration batch, what it is, seed)``: a file, the training split, or random inputs."""
    import numpy as np

    from .quantize import (DEFAULT_CALIBRATION_COUNT, DEFAULT_CALIBRATION_SEED, calibration_images,
                           load_calibration_file, random_calibration)

    count = args.calibration_count or DEFAULT_CALIBRATION_COUNT
    seed = DEFAULT_CALIBRATION_SEED if args.calibration_seed is None else args.calibration_seed
    if args.calibration_data is not None:
        try:
            x = load_calibration_file(args.calibration_data, hw)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return x, f"--calibration-data {args.calibration_data}", None
    if args.random_init:
        print(f"warning: --random-init: calibrating the UNTRAINED model on {count} random (standard normal) inputs; "
              "the quantized model's accuracy is meaningless and is not measured", file=sys.stderr)
        return random_calibration(hw, count, seed), "random standard-normal inputs (--random-init)", seed
    try:
        x = calibration_images(config, count, seed)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if x.shape[2:] != tuple(hw):
        raise UsageError(f"the training images are {x.shape[2]}x{x.shape[3]}, --input-size {hw[0]}x{hw[1]}; "
                         "calibrate at the training size or pass --calibration-data")
    return np.ascontiguousarray(x), f"{config['data']} training split", seed


def _quantize(args: argparse.Namespace, fp32_onnx: Path, out: Path, config: Dict[str, Any],
              calibration: Tuple[Any, str, Optional[int]]) -> Dict[str, Any]:
    """Quantize, check and score (:func:`attnzoo.export.quantize.quantize_verified`); failures as CommandError."""
    from .quantize import DEFAULT_QDQ_PLACEMENT, AccuracyDropError, QuantizationCheckError, quantize_verified

    x, source, seed = calibration
    try:
        return quantize_verified(fp32_onnx, out, config, dtype=args.dtype, calibration=x,
                                 calibration_source=source, calibration_seed=seed,
                                 quantize_extra_math=args.quantize_extra_math,
                                 accept_accuracy_drop=args.accept_accuracy_drop,
                                 measure_accuracy=not args.random_init, eval_limit=args.eval_limit,
                                 threads=args.threads, progress=True, fp32_kept=False,
                                 placement=args.qdq_placement or DEFAULT_QDQ_PLACEMENT)
    except (AccuracyDropError, QuantizationCheckError) as exc:
        raise CommandError(str(exc)) from exc


def _quantized_summary(quantized: Dict[str, Any], fp32_report: Dict[str, Any]) -> str:
    from .quantize import summary as quantize_summary
    from .verify import report_path

    par = fp32_report["parity"]
    return (f"fp32 source verified: parity vs eager max abs err {par['max_abs_err']:.2e} at batch sizes "
            f"{par['batch_sizes']}\n" + quantize_summary(quantized)
            + f"\n  report: {report_path(quantized['path'])}")


if __name__ == "__main__":
    sys.exit(main())
