"""What an int8 / fp8 export is asked to do (:class:`QuantizeOptions`: ``export-model``'s quantization flags and
the calibration inputs once drawn), and the arguments refused before any work (:func:`check_quantize_arguments`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from attnzoo.runtime.precision import QUANTIZED

from .calibration import Calibration, load_calibration_file
from .modelopt import quantize_unavailable_reason
from .qdq import CPU_QDQ_PLACEMENT, DEFAULT_QDQ_PLACEMENT, qdq_placement_error

__all__ = [
    "ACCURACY_TOLERANCE",
    "QuantizeOptions",
    "check_quantize_arguments",
]

#: Largest accuracy drop (percentage points: top-1 for classifiers, mIoU for segmenters) of the quantized model
#: below the fp32 model on the test split that is accepted.
ACCURACY_TOLERANCE: dict[str, float] = {"cls": 0.5, "seg": 1.0}


class OutputFormat(Protocol):
    """What :func:`check_quantize_arguments` reads of the export's format (an
    :class:`~attnzoo.export.formats.ExportFormat`, resolved by the caller: quantization sits below the formats)."""

    name: str
    dynamic_int8: bool
    builds_engine: bool


@dataclass(frozen=True, eq=False)
class QuantizeOptions:
    """How :func:`attnzoo.export.quantize.quantize_verified` quantizes, checks and gates an fp32 export.

    ``export-model`` builds one from its flags (``None`` / ``False``: not given), draws the inputs with
    :func:`attnzoo.export.quantize.calibration_for` and fills them in with :meth:`with_calibration`.

    Attributes:
        dtype: ``int8`` or ``fp8``.
        calibration: float32 NCHW calibration inputs (normalised as the model expects).
        calibration_source: What they are, for the report (e.g. ``fashion training split``).
        calibration_seed: The seed of their draw (``None`` for a user's array).
        held_out: Inputs of the calibration source never calibrated on (default: held-out training images of
            the model's data set, else the last quarter of ``calibration``, at most ``DEFAULT_FIDELITY_COUNT``,
            which then is not calibrated on).
        calibration_random: The calibration inputs are random, not images (the report warns for a trained model).
        warnings: Other warnings for the report.
        calibration_data, calibration_count, fidelity_count: Where :func:`calibration_for` draws the inputs from
            (``--calibration-data``: a folder of images or a ``.npy`` array) and how many.
        placement: ``PLACEMENT_CHOICES``: ``auto`` (measured), ``tensorrt`` (ModelOpt's) or ``cpu`` (int8 for ONNX
            Runtime on the CPU); ``None``: ``DEFAULT_QDQ_PLACEMENT``.
        quantize_extra_math: Quantize the extra-math scopes too (the ablation); default: excluded, fp32.
        min_cosine: The fidelity gate on the worst held-out input's cosine (0 measures without refusing, and
            ``auto`` then aims at ``DEFAULT_MIN_COSINE``). Default: ``DEFAULT_MIN_COSINE`` for a model without a
            labelled test split; 0 for one scored on its test split, which the accuracy gate decides (a
            classifier's logits can drift on a few inputs without changing a prediction).
        accept_accuracy_drop: Write even when the drop exceeds the tolerance (the report says so).
        measure_accuracy: ``False`` for a model without a labelled test split (``--random-init``, a converted
            pretrained model): no accuracy, the fidelity gate only.
        eval_limit: Score on the first N test images only (quick checks; the report names N).
        tolerance: Accepted drop in points (default :data:`ACCURACY_TOLERANCE` for the task).
        threads: ONNX Runtime threads.
        progress: Show progress bars on stderr.
        fp32_kept: ``False`` when the fp32 graph is a temporary file (``export-model --dtype int8``): the report
            records its SHA-256 and verification report, not a path that will not exist.
        smooth_quant: Migrate the outlier channels of LayerNorm outputs into the MatMul weights they feed before
            calibrating (:func:`attnzoo.export.quantize.smooth.smooth_layernorm_matmuls`, SmoothQuant); the
            fidelity is measured against the original fp32 graph; only LayerNorm outputs with an outlier channel
            move. ``None``: on for int8 with the ``auto`` placement, off otherwise (measured:
            docs/quantization.md).
        calibration_method: ModelOpt's calibration method (``entropy``, ``max``); ``None``: the precision's
            default (:data:`~attnzoo.export.quantize.modelopt.CALIBRATION_METHODS`).
    """

    dtype: str
    calibration: np.ndarray | None = None
    calibration_source: str = "given array"
    calibration_seed: int | None = None
    held_out: np.ndarray | None = None
    calibration_random: bool = False
    warnings: Sequence[str] = ()
    calibration_data: str | Path | None = None
    calibration_count: int | None = None
    fidelity_count: int | None = None
    placement: str | None = None
    quantize_extra_math: bool = False
    min_cosine: float | None = None
    accept_accuracy_drop: bool = False
    measure_accuracy: bool = True
    eval_limit: int | None = None
    tolerance: float | None = None
    threads: int | None = None
    progress: bool = False
    fp32_kept: bool = True
    smooth_quant: bool | None = None
    calibration_method: str | None = None

    def with_calibration(self, calibration: Calibration, **changes: Any) -> QuantizeOptions:
        """These options with the inputs :func:`calibration_for` drew (scored only when they are labelled) and
        ``changes`` to other fields."""
        return replace(
            self,
            calibration=calibration.inputs,
            calibration_source=calibration.source,
            calibration_seed=calibration.seed,
            held_out=calibration.held_out,
            calibration_random=calibration.random,
            measure_accuracy=calibration.labelled,
            warnings=tuple(calibration.warnings),
            **changes,
        )


def check_quantize_arguments(options: QuantizeOptions, fmt: OutputFormat) -> None:
    """Refuse quantization arguments that cannot work, before any work (ModelOpt missing, a placement for another
    dtype or target, bad counts, a bad calibration file); what a target needs of a precision (FP8's tensor cores)
    its format checks (:meth:`~attnzoo.export.formats.ExportFormat.check`).

    Args:
        options: The export's dtype and its quantization flags (``None`` / ``False``: not given).
        fmt: The export's format (an :class:`~attnzoo.export.formats.ExportFormat`).

    Raises:
        ValueError: one line naming the flag.
    """
    dtype = options.dtype
    given = _given_flags(options)
    if dtype not in QUANTIZED:
        if given:
            raise ValueError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --dtype int8 / fp8 only")
        return
    if fmt.dynamic_int8:  # it quantizes int8 itself, at run time: no ModelOpt, no calibration
        if dtype != "int8" or given:
            raise ValueError(
                f"--format {fmt.name} quantizes dynamically (--dtype int8, no calibration); "
                f"{dtype if dtype != 'int8' else ', '.join(given)} does not apply"
            )
        return
    if fmt.name == "triton":
        raise ValueError(
            f"--dtype {dtype}: --format triton is not supported yet; export the ONNX (--format onnx) "
            "or a TensorRT engine"
        )
    error = qdq_placement_error(options.placement or DEFAULT_QDQ_PLACEMENT, dtype)
    if error:
        raise ValueError(error)
    if options.placement == CPU_QDQ_PLACEMENT and fmt.builds_engine:
        raise ValueError(
            "--qdq-placement cpu is for ONNX Runtime on the CPU; a TensorRT engine wants the tensorrt "
            "placement (the default)"
        )
    reason = quantize_unavailable_reason()
    if reason:
        raise ValueError(f"--dtype {dtype} {reason}")
    _check_values(options, given)


def _given_flags(options: QuantizeOptions) -> list[str]:
    """The quantization flags given (``None`` / ``False``: not given), by their command-line names."""
    flags = {
        "--quantize-extra-math": options.quantize_extra_math,
        "--qdq-placement": options.placement is not None,
        "--calibration-data": options.calibration_data is not None,
        "--calibration-count": options.calibration_count is not None,
        "--calibration-seed": options.calibration_seed is not None,
        "--accept-accuracy-drop": options.accept_accuracy_drop,
        "--eval-limit": options.eval_limit is not None,
        "--min-cosine": options.min_cosine is not None,
        "--fidelity-count": options.fidelity_count is not None,
        "--smooth-quant": options.smooth_quant is not None,
    }
    return [flag for flag, value in flags.items() if value]


def _check_values(options: QuantizeOptions, given: list[str]) -> None:
    """Refuse counts below 1, a cosine outside 0..1 and a bad ``.npy`` calibration file."""
    for flag, value in (
        ("calibration-count", options.calibration_count),
        ("eval-limit", options.eval_limit),
        ("fidelity-count", options.fidelity_count),
    ):
        if value is not None and value < 1:
            raise ValueError(f"--{flag} must be >= 1, got {value}")
    if options.min_cosine is not None and not 0.0 <= options.min_cosine <= 1.0:
        raise ValueError(f"--min-cosine must be in 0..1, got {options.min_cosine}")
    if options.calibration_data is not None and not Path(options.calibration_data).is_dir():
        if "--calibration-count" in given or "--calibration-seed" in given:
            raise ValueError(
                "--calibration-count/--calibration-seed draw images from the training split or a "
                "folder; the images of a .npy --calibration-data are used as they are"
            )
        load_calibration_file(options.calibration_data, None)  # shape (but H, W), dtype, emptiness
