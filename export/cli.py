"""``export-model``: trained (or given) model -> verified ONNX (+ report) -> optional TensorRT engine.

Examples::

    export-model --variant belief2
    export-model --variant belief-star --task seg --input-size 48x64 --dtype fp16
    export-model --variant belief2 --checkpoint runs/belief2.safetensors --out exports/b2.onnx
    export-model --variant belief2 --format tensorrt --batch-sizes 1,8,32
    export-model --variant belief2 --format tensorrt --compute-capability SM86   # no GPU needed
    export-model --variant belief2 --format triton --out triton-models --batch-sizes 1,8,32

Errors: one ``error: ...`` line, exit 2 for a bad command line (refused before anything is loaded or
written), 1 for a failure; ``--debug`` shows the traceback (see :mod:`attnzoo.cli`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
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
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
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
    from attnzoo.checkpoint import NoConfigError, load_checkpoint, load_state_dict_file, load_weights, read_config
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
        from attnzoo.training.data import SHAPES_CLASSES, SHAPES_SEG_CLASSES

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

    dtype = "_fp16" if args.dtype == "fp16" else ""
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

    from attnzoo.limits import check_batch_sizes, check_forward_memory
    from attnzoo.models import canonical_name

    from .onnx_export import SUPPORTED_OPSETS
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
    out = _out_path(args, config)
    if args.random_init:
        print(f"warning: --random-init: exporting an UNTRAINED {config['variant']} model with random weights; "
              "its predictions are meaningless", file=sys.stderr)
    onnx_out = _onnx_out(args, out)
    steps = ["export + check + verify"] + (["tensorrt"] if args.format == "tensorrt" else [])
    if args.format == "triton":
        steps += (["tensorrt"] if args.triton_platform == "tensorrt" else []) + ["triton config"]
    with _removed_if_empty(out if args.format == "triton" else None), \
            tqdm(total=len(steps), desc="export-model", unit="step", file=sys.stderr) as bar:
        bar.set_postfix_str(steps[0])
        captured = io.StringIO()
        try:
            with contextlib.redirect_stdout(captured):  # the exporter's own progress lines
                report = export_verified(model, onnx_out, config, opset=args.opset, dtype=args.dtype,
                                         input_hw=hw, batch_sizes=batch_sizes, checkpoint_sha256=sha,
                                         threads=args.threads)
        except VerificationError as exc:
            raise CommandError(str(exc)) from exc
        except (ValueError, OSError):
            raise
        except Exception as exc:  # ONNX Runtime / exporter errors: one line (traceback with --debug)
            raise CommandError(f"export failed: {type(exc).__name__}: {first_line(exc)}") from exc
        bar.update()
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
    print(summary(report))
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


if __name__ == "__main__":
    sys.exit(main())
