"""``export_model()``: everything ``export-model`` does, as one library call.

The command line only parses its flags, calls :func:`export_model` and prints the summary (as optimum's
``optimum-cli export onnx`` calls ``main_export``). One call: the model (the zoo's, a checkpoint's, a fresh one
or a model object) -> the verified ONNX (fp32 / fp16) or a verified int8 / fp8 Q/DQ graph -> optionally a
TensorRT engine or a Triton model repository, each with its report beside it.

Errors, all one line:

- :class:`attnzoo.errors.UsageError` (a ``ValueError``): an argument or combination that cannot work, refused
  before anything is loaded or written (``export-model`` exits 2);
- ``ValueError``: a bad input file (missing or unsafe checkpoint, a bad calibration file);
- :class:`attnzoo.export.errors.ExportError`: a step failed its checks (verification, quantization accuracy or
  fidelity, engine build); nothing was written at the output path, its failed report is.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from torch import nn
from tqdm import tqdm

from attnzoo import zoo
from attnzoo.data.datasets import SHAPES_CLASSES, SHAPES_SEG_CLASSES
from attnzoo.errors import UsageError, quoted
from attnzoo.fileio import PathLike, atomic_write_text, sha256_file, temporary_folder
from attnzoo.limits import check_batch_sizes, check_side
from attnzoo.models import canonical_name, create_model
from attnzoo.models.checkpoint import NoConfigError, load_checkpoint, load_state_dict_file, load_weights, read_config
from attnzoo.models.memory import check_forward_memory
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD
from attnzoo.runtime.precision import PRECISIONS, QUANTIZED, get_precision

from . import quantize as quantization
from . import verify
from .errors import ExportWarning
from .formats import ExportFormat, ExportRequest, ExportResult, ModelSource, formats, get_format, run_step
from .onnx_export import SUPPORTED_OPSETS, config_hw
from .quantize import QuantizeOptions, calibration_for, check_quantize_arguments
from .verify import EXTRA_BATCH_SIZES

__all__ = [
    "FORMATS",
    "SUFFIXES",
    "DEFAULT_BATCH_SIZES",
    "ExportResult",
    "export_model",
    "load_for_export",
    "output_format",
]

#: Output file suffixes of each format (:mod:`attnzoo.export.formats`; the format is inferred from the suffix when
#: not given); ``triton`` writes a folder (a Triton model repository), named only with an explicit ``format="triton"``.
SUFFIXES: dict[str, tuple[str, ...]] = {name: part.suffixes for name, part in formats().items()}
FORMATS: tuple[str, ...] = tuple(SUFFIXES)
#: Batch sizes verified by default (and the TensorRT profile's range).
DEFAULT_BATCH_SIZES: tuple[int, ...] = (1, 8)


# ------------------------------------------------------------------------------------------------ the model
def _class_count(state: dict[str, Any], task: str) -> int | None:
    """Classes of a config-less state dict, from its head."""
    for key, axis in (("head.weight", 0), ("decoder.head.weight", 0), ("decoder.cls_emb", 1)):
        if key in state and (task == "cls") == (key == "head.weight"):
            return int(state[key].shape[axis])
    return None


def _checkpoint_config(path: Path) -> dict[str, Any] | None:
    """The config a checkpoint carries (``None`` for a plain state dict); read without loading the weights.

    Raises:
        ValueError: the file is missing or not a checkpoint (a directory, an ONNX model ...: named), or holds an
            unreadable config.
    """
    try:
        return read_config(path)
    except NoConfigError:
        return None


def _agree(config: dict[str, Any], source: str, variant: str | None, task: str | None, arch: str | None) -> None:
    """A usage error naming both values when an argument contradicts what a model's config says."""
    for key, wanted in (("variant", variant), ("task", task), ("arch", arch)):
        if wanted is None:
            continue
        have = config.get(key)
        if key == "variant":
            wanted = canonical_name(wanted)
        if have != wanted:
            raise UsageError(
                f"--{key} {wanted} contradicts {source}, which holds a {have!r} model (not "
                f"{wanted!r}); leave --{key} out to use the {source.split(' ')[0]}'s own"
            )


def load_for_export(
    variant: str | None = None,
    task: str | None = None,
    arch: str | None = None,
    checkpoint: PathLike | None = None,
    random_init: bool = False,
) -> tuple[nn.Module, dict[str, Any], str]:
    """``(model in eval mode, config, checkpoint sha256)`` for these choices.

    A checkpoint with a config (``save_checkpoint``'s) describes its model: ``variant``, ``task`` and ``arch``
    may be left out, and one that contradicts it is refused naming both. A plain state dict needs ``variant``.
    Without a checkpoint: the zoo's trained model of ``variant`` and ``task``, or a fresh one (``random_init``).

    Raises:
        UsageError: no variant where one is needed, or one that contradicts the checkpoint.
        ValueError: unknown variant, missing zoo model, missing or unsafe checkpoint (never unpickled).
    """
    if random_init and checkpoint is not None:
        raise UsageError("--random-init and --checkpoint exclude each other")
    if checkpoint is not None:
        path = Path(checkpoint)
        config = _checkpoint_config(path)
        if config is not None:
            _agree(config, f"checkpoint {path.name}", variant, task, arch)
            model, config = load_checkpoint(path)  # never unpickles
            return model.eval(), config, sha256_file(path)
        if variant is None:
            raise UsageError(
                f"{path.name} is a plain state dict without a config: pass --variant (and --task, "
                "--arch when not cls / micro)"
            )
        state = load_state_dict_file(path)  # raises for pickles (weights_only=True) and unreadable files
        task = task or "cls"
        model = create_model(canonical_name(variant), task, arch or "micro", num_classes=_class_count(state, task))
        load_weights(model, state, source=str(path))
        return model.eval(), dict(cast(dict[str, Any], model.attnzoo_config)), sha256_file(path)
    if variant is None:
        raise UsageError("--variant is required unless --checkpoint names a checkpoint with its config")
    variant = canonical_name(variant)
    if random_init:
        task = task or "cls"
        names = list(SHAPES_CLASSES if task == "cls" else SHAPES_SEG_CLASSES)
        model = create_model(variant, task, arch or "micro", num_classes=len(names))
        config = {
            **cast(dict[str, Any], model.attnzoo_config),
            "class_names": names,
            "mean": list(DEFAULT_MEAN),
            "std": list(DEFAULT_STD),
            "untrained": True,
        }
        return model.eval(), config, ""
    try:
        path = zoo.checkpoint_path(variant, task or "cls")
    except ValueError as exc:
        raise ValueError(f"{exc}; pass --checkpoint PATH, or --random-init for an untrained model") from None
    config = _checkpoint_config(Path(path)) or {}
    _agree(config, f"zoo model {Path(path).name}", None, None, arch)
    model, config = load_checkpoint(path)
    return model.eval(), config, sha256_file(path)


# ------------------------------------------------------------------------------------------------ arguments
def output_format(fmt: str | None, out: PathLike | None) -> str:
    """The output format: ``fmt``, else inferred from the suffix of ``out`` (none: ONNX, :func:`_with_suffix`); they
    must agree.

    Raises:
        UsageError: an unknown format, a suffix of no format, or a format and suffix that disagree.
    """
    part = None if fmt is None else get_format(fmt)
    if out is None:
        return fmt or "onnx"
    out = Path(out)
    parts = formats().values()
    implied = next((p for p in parts if out.suffix.lower() in p.suffixes), None)
    if part is not None and not part.suffixes:  # a folder
        assert fmt is not None  # part is its format
        if implied is not None:
            raise UsageError(
                f"with --format {fmt}, --out names the {part.title} folder, not a file ({out.name}); "
                f"e.g. --out {out.with_suffix('')}"
            )
        return fmt
    if implied is None and not out.suffix:  # no suffix: the format given, else ONNX
        return fmt or "onnx"
    if implied is None:
        raise UsageError(
            f"--out {out}: the file name must end in "
            + " or ".join(f"{p.suffixes[0]} ({p.title})" for p in parts if p.suffixes)
        )
    if part is not None and part is not implied:
        raise UsageError(part.mismatch(out, implied))
    return implied.name


def _with_suffix(fmt: str, out: PathLike | None) -> Path | None:
    """``out`` as written, or -- a file format's ``out`` without a suffix -- with the format's suffix added
    (``--out /tmp/m`` writes ``/tmp/m.onnx``).

    Raises:
        UsageError: ``out`` without a suffix is an existing folder (a file format writes one file).
    """
    if out is None:
        return None
    out, suffixes = Path(out), get_format(fmt).suffixes
    if out.suffix or not suffixes:
        return out
    if out.is_dir():
        raise UsageError(f"--out {out} is a folder; name the file, e.g. --out {out / ('model' + suffixes[0])}")
    return out.with_name(out.name + suffixes[0])


def _usage(check, *args) -> Any:
    """``check(*args)``, its ``ValueError`` as a :class:`UsageError`."""
    try:
        return check(*args)
    except UsageError:
        raise
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _input_hw(input_size: int | Sequence[int] | None, config: dict[str, Any]) -> tuple[int, int]:
    """The export's (H, W): ``input_size`` (an int or (H, W)), else the model's training size."""
    if input_size is None:
        return config_hw(config)
    hw = [input_size] if isinstance(input_size, int) else list(input_size)
    if not 1 <= len(hw) <= 2:
        raise UsageError(f"--input-size takes H or HxW, got {input_size!r}")
    h, w = hw[0], hw[-1]
    _usage(check_side, h, "--input-size sides")
    _usage(check_side, w, "--input-size sides")
    if config["task"] == "cls" and (h, w) != config_hw(config):
        raise UsageError(f"a classifier takes its training size {config['img_size']}, not {h}x{w}")
    return h, w


def _format_options(part: ExportFormat, given: dict[str, Any]) -> dict[str, Any]:
    """The format options given (``None``: not given), each one of ``part``'s own, normalized and in its choices.

    Raises:
        TypeError: a keyword that is no format's option (as Python says of an unknown keyword).
        UsageError: an option of another format, or a value outside its choices.
    """
    known = {o.name: o for p in formats().values() for o in p.options}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise TypeError(
            f"export_model() got unexpected keyword(s) {', '.join(unknown)}; format options: {', '.join(known)}"
        )
    own = {o.name: o for o in part.options}
    options = {}
    for name, value in given.items():
        if value is None:
            continue
        if name not in own:
            raise UsageError(f"{known[name].flag} applies to --format {known[name].owner} only")
        option = own[name]
        value = option.normalize(value) if option.normalize else value
        if option.choices is not None and value not in option.choices:
            what = option.title or option.flag
            raise UsageError(f"unknown {what} {quoted(value)}; valid: {', '.join(map(str, option.choices))}")
        options[name] = value
    return options


def _check_request(
    fmt: str | None,
    out: PathLike | None,
    dtype: str,
    opset: int,
    batch_sizes: Sequence[int],
    quantize: QuantizeOptions,
    format_options: dict[str, Any],
) -> ExportRequest:
    """Every argument that can be checked without the model, checked (UsageError otherwise)."""
    if opset not in SUPPORTED_OPSETS:
        raise UsageError(f"unsupported opset {opset}; supported: {', '.join(map(str, SUPPORTED_OPSETS))}")
    if dtype not in PRECISIONS:
        raise UsageError(f"unknown dtype {quoted(dtype)}; valid: {', '.join(PRECISIONS)}")
    sizes = [int(b) for b in batch_sizes]
    if not sizes:
        raise UsageError("--batch-sizes: give at least one batch size")
    _usage(check_batch_sizes, sizes)
    fmt = output_format(fmt, out)
    part = get_format(fmt)
    options = _format_options(part, format_options)
    _usage(check_quantize_arguments, quantize, part)
    req = ExportRequest(fmt, dtype, _with_suffix(fmt, out), opset, sizes, quantize, options)
    part.check(req)
    return req


# ------------------------------------------------------------------------------------------------ outputs
def _out_path(req: ExportRequest, config: dict[str, Any]) -> Path:
    """The output file (the model's folder in the repository for Triton); its folder is created and must be
    writable."""
    tag = get_precision(req.dtype).file_tag
    return get_format(req.format).out_path(req, f"{config['variant']}_{config['task']}_{config['arch']}{tag}")


def _warn(message: str, collected: list[str]) -> None:
    collected.append(message)
    warnings.warn(message, ExportWarning, stacklevel=3)


# ------------------------------------------------------------------------------------------------ the call
def export_model(
    variant: str | None = None,
    *,
    task: str | None = None,
    arch: str | None = None,
    checkpoint: PathLike | None = None,
    random_init: bool = False,
    model: nn.Module | None = None,
    out: PathLike | None = None,
    format: str | None = None,
    dtype: str = "fp32",
    opset: int = 20,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    input_size: int | Sequence[int] | None = None,
    threads: int | None = None,
    quantize_extra_math: bool = False,
    qdq_placement: str | None = None,
    calibration_data: PathLike | None = None,
    calibration_count: int | None = None,
    calibration_seed: int | None = None,
    accept_accuracy_drop: bool = False,
    eval_limit: int | None = None,
    min_cosine: float | None = None,
    fidelity_count: int | None = None,
    smooth_quant: bool | None = None,
    progress: bool = False,
    **format_options: Any,
) -> ExportResult:
    """Export a model to a verified ONNX file (fp32, fp16, int8 or fp8), and optionally build a TensorRT engine
    or write a Triton model repository from it: what ``export-model`` does (its flags are these arguments).

    The model is one of: ``model`` (an attnzoo model object with its ``attnzoo_config``, e.g. from
    ``convert_to_belief2``), ``checkpoint`` (its config names the variant, task and arch), a fresh untrained one
    (``random_init``), or the zoo's trained ``variant`` (default). Everything that can be checked is checked
    before the model is loaded or anything written.

    Args:
        variant, task, arch: The model; with a checkpoint or model object they may be left out, and must agree
            with it when given.
        out: Output ``.onnx`` / ``.engine`` file, or the Triton repository folder (default
            ``exports/<variant>_<task>_<arch>[_<dtype>].onnx`` / ``.engine``, ``triton-models/``).
        format: ``onnx``, ``tensorrt`` or ``triton`` (default: from ``out``'s suffix, else ``onnx``).
        dtype: ``fp32``, ``fp16``, ``int8`` or ``fp8`` (int8 / fp8: NVIDIA ModelOpt Q/DQ, the extra math fp32).
        batch_sizes: Verified batch sizes (and the TensorRT profile's range).
        input_size: ``H`` or ``(H, W)`` (segmenters take any; default the training size).
        quantize_extra_math, qdq_placement, calibration_data, calibration_count, calibration_seed,
        accept_accuracy_drop, eval_limit, min_cosine, fidelity_count, smooth_quant: int8 / fp8 only (see
            :func:`attnzoo.export.quantize.quantize_verified`; ``calibration_data``: a folder of images or a
            ``.npy`` array, :func:`attnzoo.export.quantize.calibration_for`). Every int8 / fp8 export measures its
            output's fidelity to fp32 on held-out inputs and is refused when the worst of them is below
            ``min_cosine`` (default 0.99 for a model without a labelled test split) or, with ``auto`` placement,
            when no placement promises it.
        progress: Show a progress bar on stderr.
        format_options: The format's own options (:attr:`~attnzoo.export.formats.ExportFormat.options`; ``export-model
            --help`` lists them by target), e.g. ``compute_capability="SM89"`` (TensorRT's target GPU, default: the
            GPU present, else SM89, built ahead of time), ``triton_platform="tensorrt"`` and
            ``triton_queue_delay_us`` (Triton's); one of another format is refused.

    Returns:
        :class:`ExportResult`: the paths written and the reports.

    Raises:
        UsageError: arguments refused before any work.
        ValueError: a bad checkpoint or calibration file.
        ExportError: a step failed its checks (nothing written at the output path; the failed report says why).
    """
    quantize = QuantizeOptions(
        dtype=dtype,
        quantize_extra_math=quantize_extra_math,
        placement=qdq_placement,
        calibration_data=calibration_data,
        calibration_count=calibration_count,
        calibration_seed=calibration_seed,
        accept_accuracy_drop=accept_accuracy_drop,
        eval_limit=eval_limit,
        min_cosine=min_cosine,
        fidelity_count=fidelity_count,
        smooth_quant=smooth_quant,
    )
    req = _check_request(format, out, dtype, opset, batch_sizes, quantize, format_options)
    collected: list[str] = []
    model, config, sha = _source(variant, task, arch, checkpoint, random_init, model)
    hw = _input_hw(input_size, config)
    _check_memory(config, hw, req.batch_sizes)
    calibration = _calibration(req, config, hw, random_init or bool(config.get("untrained")), collected)
    out_path = _out_path(req, config)
    if config.get("untrained"):
        _warn(
            f"--random-init: exporting an UNTRAINED {config['variant']} model with random weights; its "
            "predictions are meaningless",
            collected,
        )
    replacing = _replacing(req, out_path)
    with get_format(req.format).cleanup(out_path):
        result = _run(req, ModelSource(model, config, sha, hw, threads), calibration, out_path, progress, collected)
    result.replaced = replacing
    return result


def _replacing(req: ExportRequest, out: Path) -> list[str]:
    """What the export will replace once it passes, one line each: a file at the output (or at the ONNX beside an
    engine), or a symbolic link there. A link is replaced by the new file, never written through: the file it
    points to is left as it was (as ``mv`` and every atomic write do; docs/export.md)."""
    part = get_format(req.format)
    lines = []
    for path in dict.fromkeys([out, *([] if part.from_model else [part.onnx_path(req, out)])]):
        if path.is_symlink():
            lines.append(f"replaced: the symbolic link {path} (to {os.readlink(path)}, left as it was) by the new file")
        elif path.is_file():
            lines.append(f"replaced: the file that was at {path}")
    return lines


def _source(
    variant: str | None,
    task: str | None,
    arch: str | None,
    checkpoint: PathLike | None,
    random_init: bool,
    model: nn.Module | None,
) -> tuple[nn.Module, dict[str, Any], str]:
    """The model, its config and its checkpoint's sha256 (``''`` for a model object or a fresh model)."""
    if variant is not None:
        _usage(canonical_name, variant)
    if model is None:
        return load_for_export(variant, task, arch, checkpoint, random_init)
    if checkpoint is not None or random_init:
        raise UsageError("model= excludes --checkpoint and --random-init")
    config = getattr(model, "attnzoo_config", None)
    if config is None:
        raise UsageError(
            "the model has no attnzoo_config; build it with attnzoo.models.create_model or convert_to_belief2"
        )
    _agree(dict(config), "the model object", variant, task, arch)
    return model.eval(), dict(config), ""


def _check_memory(config: dict[str, Any], hw: tuple[int, int], batch_sizes: Sequence[int]) -> None:
    _usage(check_forward_memory, config, hw, max([*batch_sizes, *EXTRA_BATCH_SIZES]))


def _calibration(
    req: ExportRequest, config: dict[str, Any], hw: tuple[int, int], untrained: bool, collected: list[str]
) -> Any | None:
    """The calibration inputs of an int8 / fp8 export (``None`` otherwise, and for a format written from the model,
    which quantizes it itself)."""
    if req.dtype not in QUANTIZED or get_format(req.format).from_model:
        return None
    # a bad calibration folder is a bad input file (exit 1), not a bad command line
    q = req.quantize
    calibration = calibration_for(
        config,
        hw,
        untrained=untrained,
        calibration_data=q.calibration_data,
        calibration_count=q.calibration_count,
        calibration_seed=q.calibration_seed,
        fidelity_count=q.fidelity_count,
    )
    for message in calibration.warnings:
        _warn(message, collected)
    return calibration


def _run(
    req: ExportRequest,
    source: ModelSource,
    calibration: Any | None,
    out: Path,
    progress: bool,
    collected: list[str],
) -> ExportResult:
    """The steps: export + check + verify, quantize, then those of the format's part (engine, Triton config)."""
    part = get_format(req.format)
    if part.from_model:
        result = ExportResult(
            path=out, onnx_path=None, report={}, format=req.format, dtype=req.dtype, warnings=collected, writer=part
        )
        with tqdm(total=1, desc="export-model", unit="step", disable=not progress) as bar:
            bar.set_postfix_str("export + check + compile + verify")
            part.write_model(req, source, result)
            bar.update()
        return result
    onnx_out, writes = part.onnx_path(req, out), part.steps(req)
    steps = (
        ["export + check + verify"]
        + (["quantize + score"] if calibration is not None else [])
        + [name for name, _ in writes]
    )
    result = ExportResult(
        path=out, onnx_path=onnx_out, report={}, format=req.format, dtype=req.dtype, warnings=collected, writer=part
    )
    with tqdm(total=len(steps), desc="export-model", unit="step", disable=not progress) as bar:
        bar.set_postfix_str(steps[0])
        _export_onnx_step(req, source, calibration, onnx_out, progress, result, bar)
        for name, write in writes:
            bar.set_postfix_str(name)
            write(req, result)
            bar.update()
    return result


def _failure_beside(exc: verify.VerificationError, kept: Path, out: Path) -> verify.VerificationError:
    """The refusal of the fp32 graph an int8 / fp8 export quantizes, which was verified in a temporary folder
    (removed when the command ends): its failed report copied beside ``out``, where it stays, and the line naming it
    there (or no path, when the verification wrote none)."""
    failed, kept_failed = verify.failed_report_path(out), verify.failed_report_path(kept)
    line = str(exc)
    if kept_failed.is_file():
        atomic_write_text(failed, kept_failed.read_text())
        return verify.VerificationError(line.replace(str(kept_failed), str(failed)))
    return verify.VerificationError(line.replace(f"; see {kept_failed}", ""))


def _export_onnx_step(
    req: ExportRequest,
    source: ModelSource,
    calibration: Any | None,
    onnx_out: Path,
    progress: bool,
    result: ExportResult,
    bar,
) -> None:
    """The verified ONNX at ``onnx_out``: exported and verified, and for int8 / fp8 quantized from a verified
    fp32 graph kept in a temporary folder."""
    with contextlib.ExitStack() as stack:
        fp32_out = onnx_out
        if calibration is not None:  # the verified fp32 model is the quantizer's input, kept aside
            fp32_out = stack.enter_context(temporary_folder("attnzoo-fp32-")) / onnx_out.name
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the exporter's own progress lines
                report = run_step(
                    verify.export_verified,
                    "export failed",
                    source.model,
                    fp32_out,
                    source.config,
                    opset=req.opset,
                    dtype="fp32" if calibration is not None else req.dtype,
                    input_hw=source.hw,
                    batch_sizes=req.batch_sizes,
                    checkpoint_sha256=source.checkpoint_sha256,
                    threads=source.threads,
                )
        except verify.VerificationError as exc:
            if fp32_out == onnx_out:
                raise
            raise _failure_beside(exc, fp32_out, onnx_out) from None
        bar.update()
        if calibration is None:
            result.report = report
            return
        bar.set_postfix_str("quantize + score")
        result.fp32_report = report
        options = req.quantize.with_calibration(calibration, threads=source.threads, progress=progress, fp32_kept=False)
        result.report = run_step(
            quantization.quantize_verified, "quantization failed", fp32_out, onnx_out, source.config, options
        )
        bar.update()
