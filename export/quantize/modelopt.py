"""NVIDIA Model Optimizer (ModelOpt): whether it is here, and its ONNX quantizer run on a verified fp32 export
(:func:`quantize_onnx`)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import onnx

from attnzoo.errors import install_hint
from attnzoo.fileio import atomic_path, temporary_folder
from attnzoo.runtime.precision import QUANTIZED
from attnzoo.runtime.schemas import QuantizeReport

from .qdq import (
    QDQ_PLACEMENTS,
    TENSORRT_QDQ_PLACEMENT,
    _reroute_extra_math,
    extra_math_nodes,
    qdq_placement_error,
    qdq_summary,
)

__all__ = ["CALIBRATION_METHODS", "modelopt_version", "quantize_unavailable_reason", "quantize_onnx"]

#: ModelOpt's calibration method per mode (its own defaults for int8/fp8, named so the report states them).
CALIBRATION_METHODS: dict[str, str] = {"int8": "entropy", "fp8": "entropy"}


def modelopt_version() -> str | None:
    """Installed ``nvidia-modelopt`` version, or ``None``."""
    try:
        return version("nvidia-modelopt")
    except PackageNotFoundError:
        return None


def quantize_unavailable_reason() -> str | None:
    """Why ``--dtype int8|fp8`` cannot run here (ModelOpt's ONNX quantizer missing), else ``None``."""
    if modelopt_version() is None:
        return f"needs NVIDIA ModelOpt: {install_hint('quantize')} (included in [dev])"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            import modelopt.onnx.quantization  # noqa: F401  # optional: the [quantize] extra; is it installed?
    except ImportError as exc:
        return (
            f"ModelOpt's ONNX quantizer cannot be imported ({str(exc).splitlines()[0]}); "
            f"reinstall with {install_hint('quantize')}"
        )
    return None


def quantize_onnx(
    fp32_onnx: str | Path,
    out: str | Path,
    *,
    dtype: str,
    calibration: np.ndarray,
    exclude_nodes: Sequence[str] = (),
    calibration_method: str | None = None,
    calibration_source: str = "given array",
    calibration_seed: int | None = None,
    extra_nodes: Sequence[str] | None = None,
    placement: str = TENSORRT_QDQ_PLACEMENT,
) -> QuantizeReport:
    """Quantize an fp32 attnzoo export with ModelOpt; write the Q/DQ graph to ``out`` (temp + rename).

    The attnzoo metadata is carried over, with ``dtype`` set to ``int8``/``fp8`` and a ``quantization`` entry
    (JSON: quantizer, version, mode, calibration, excluded node count). Everything not quantized stays fp32
    (``high_precision_dtype="fp32"``). ``out`` is not verified here: see :func:`quantize_verified`.

    Args:
        fp32_onnx: The verified fp32 ONNX file.
        out: Output ``.onnx`` path.
        dtype: ``int8`` or ``fp8``.
        calibration: float32 NCHW inputs (normalised), e.g. :func:`calibration_images`.
        exclude_nodes: Exact node names ModelOpt must leave unquantized (:func:`extra_math_nodes`).
        calibration_method: ModelOpt's (``entropy``, ``max``); default :data:`CALIBRATION_METHODS`.
        calibration_source, calibration_seed: Recorded in the report.
        extra_nodes: Extra-math nodes for :func:`qdq_summary` (default: :func:`extra_math_nodes` of the graph).
        placement: One of ModelOpt's :data:`QDQ_PLACEMENTS` (``cpu``: int8 only); ``auto`` is chosen by
            :func:`quantize_verified`, which measures.

    Raises:
        ValueError: unknown dtype or placement, calibration not float32 NCHW or empty.
    """
    calibration = _checked(dtype, placement, calibration)
    fp32_onnx, out = Path(fp32_onnx), Path(out)
    method = calibration_method or CALIBRATION_METHODS[dtype]
    src = onnx.load(str(fp32_onnx))
    extra = list(extra_nodes) if extra_nodes is not None else extra_math_nodes(src)
    with atomic_path(out) as tmp:
        proto, elapsed = _modelopt_graph(src, dtype, calibration, method, exclude_nodes, placement)
        rerouted = _reroute_extra_math(proto, exclude_nodes)
        report = QuantizeReport(
            quantizer="nvidia-modelopt (modelopt.onnx.quantization.quantize)",
            quantizer_version=modelopt_version() or "?",
            mode=dtype,
            calibration={
                "source": calibration_source,
                "count": int(calibration.shape[0]),
                "seed": calibration_seed,
                "shape": list(calibration.shape[1:]),
                "method": method,
                "providers": ["cpu"],
            },
            excluded_nodes=list(exclude_nodes),
            qdq=qdq_summary(proto, extra),
            time_s=round(elapsed, 3),
            options={
                "high_precision_dtype": "fp32",
                "calibration_eps": ["cpu"],
                "placement": placement,
                **QDQ_PLACEMENTS[placement],
            },
            extra_math_inputs_unquantized=rerouted,
        )
        _carry_metadata(src, proto, dtype, report, quantize_extra_math=bool(set(extra) - set(exclude_nodes)))
        onnx.save(proto, str(tmp))
    return report


def _checked(dtype: str, placement: str, calibration: np.ndarray) -> np.ndarray:
    """``calibration`` as an array, once ``dtype``, ``placement`` and it are known to work (else ``ValueError``)."""
    if dtype not in QUANTIZED:
        raise ValueError(f"unknown quantized dtype {dtype!r}; valid: {', '.join(QUANTIZED)}")
    placement_error = qdq_placement_error(placement, dtype)
    if placement_error or placement not in QDQ_PLACEMENTS:
        raise ValueError(
            placement_error
            or f"the {placement} placement is measured by quantize_verified; "
            f"quantize_onnx places {', '.join(QDQ_PLACEMENTS)}"
        )
    calibration = np.asarray(calibration)
    if calibration.ndim != 4 or calibration.shape[0] == 0 or calibration.dtype != np.float32:
        raise ValueError(
            f"calibration must be a non-empty float32 (N, 3, H, W) array, got {calibration.dtype} {calibration.shape}"
        )
    return calibration


def _modelopt_graph(
    src: onnx.ModelProto,
    dtype: str,
    calibration: np.ndarray,
    method: str,
    exclude_nodes: Sequence[str],
    placement: str,
) -> tuple[onnx.ModelProto, float]:
    """ModelOpt's Q/DQ graph of ``src``, calibrated on the CPU, and the seconds it took (ModelOpt's import
    aside); its output silenced (export-model's own bar stands for the ORT calibrator's line and bar per batch)."""
    with contextlib.redirect_stdout(io.StringIO()):
        from modelopt.onnx.quantization import quantize as mo_quantize  # optional: the [quantize] extra
    start = time.perf_counter()
    with temporary_folder("attnzoo-quantize-") as work:
        staged = Path(work) / "model.onnx"
        onnx.save(src, str(staged))
        quantized = Path(work) / "model.quant.onnx"
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            mo_quantize(
                str(staged),
                quantize_mode=dtype,
                calibration_data=calibration,
                calibration_method=method,
                calibration_eps=["cpu"],
                nodes_to_exclude=[f"^{re.escape(n)}$" for n in exclude_nodes] or None,
                high_precision_dtype="fp32",
                output_path=str(quantized),
                log_level="ERROR",
                **QDQ_PLACEMENTS[placement],
            )
        return onnx.load(str(quantized)), time.perf_counter() - start


def _carry_metadata(
    src: onnx.ModelProto, dst: onnx.ModelProto, dtype: str, report: QuantizeReport, *, quantize_extra_math: bool
) -> None:
    """Copy the attnzoo metadata props; ``dtype`` becomes the quantized one; add ``quantization``."""
    props = {p.key: p.value for p in src.metadata_props}
    props["dtype"] = dtype
    props["quantization"] = json.dumps(
        {
            "quantizer": report.quantizer,
            "version": report.quantizer_version,
            "mode": dtype,
            "calibration": report.calibration,
            "excluded_nodes": len(report.excluded_nodes),
            "placement": report.options["placement"],
            "quantize_extra_math": quantize_extra_math,
        }
    )
    del dst.metadata_props[:]
    for key, value in props.items():
        dst.metadata_props.add(key=key, value=value)
