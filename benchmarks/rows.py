"""What one benchmark row runs: a backend of the runtime's registry (:mod:`attnzoo.runtime.backends`), the model
it takes (the PyTorch module, the verified ONNX file, or an int8 copy of that file made for the runtime), the
parity tolerance of the row, and why a row cannot run here.

int8 (CPU runtimes): static post-training quantization of the same fp32 export, calibrated on
:data:`CALIBRATION_COUNT` seeded random images (the benchmark's models are random-init: no data set), with the
variant's extra-math nodes left fp32 (:func:`attnzoo.export.quantize.extra_math_nodes`). ``ort-cpu`` runs NVIDIA
ModelOpt's Q/DQ graph with the CPU placement (Q/DQ only in front of the weight MatMul/Gemm/Conv ops;
:data:`attnzoo.export.quantize.QDQ_PLACEMENTS`), written and verified by
:func:`attnzoo.export.quantize.quantize_verified` (the ``export-model --dtype int8`` checks: Q/DQ placement, extra
math fp32, finite outputs; no test-set accuracy for a random-init model); ``openvino`` runs NNCF's own
quantization of the OpenVINO model (:func:`attnzoo.targets.openvino.nncf_int8`, extra math in the ignored scope,
checked free of FakeQuantize), because OpenVINO gains nothing from the Q/DQ graph. Both are cached per fp32 file
(its SHA-256) and then pass the benchmark's int8 parity gate before they are timed.

bf16 (``openvino``, CPUs with bf16 units): the same fp32 file at OpenVINO's bf16 inference precision with the
variant's extra-math nodes pinned to f32 (:func:`extra_math`), refused unless OpenVINO's runtime model runs them at
f32 and the matmuls at bf16 (:class:`attnzoo.targets.openvino.OpenVINOSession`); the row's info has that read-back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from attnzoo.export.quantize import (
    CPU_QDQ_PLACEMENT,
    extra_math_nodes,
    quantize_unavailable_reason,
    quantize_verified,
    random_calibration,
)
from attnzoo.export.verify import report_path
from attnzoo.fileio import atomic_write_text, derived_is_current, record_derived, sha256_file
from attnzoo.runtime.backends import Call, get_backend
from attnzoo.runtime.parity import tolerance_key
from attnzoo.runtime.schemas import QuantizationReport
from attnzoo.targets.openvino import nncf_int8  # the int8 model of a backend whose int8_model is NNCF's

__all__ = [
    "CALIBRATION_COUNT",
    "row_unavailable_reason",
    "tolerance_for",
    "load_call",
    "int8_onnx",
    "int8_openvino",
    "extra_math",
]

#: Calibration images of the benchmark's int8 models (seeded standard normal: the models are random-init).
CALIBRATION_COUNT = 32


def row_unavailable_reason(backend: str, dtype: str, device: str) -> str | None:
    """Why a ``backend`` row at ``dtype`` cannot run here, or ``None`` (a TensorRT engine that can be built but
    not run without a GPU is a row: "built, not run")."""
    b = get_backend(backend)
    reason = b.unavailable_reason(dtype, device, build_only=True)
    if reason is None and dtype == "int8" and b.int8_model == "qdq":
        reason = quantize_unavailable_reason()
    return reason


def tolerance_for(backend: str, dtype: str, device: str) -> str:
    """The tolerance-table key of a row: its precision (fp32 is IEEE fp32 on every device, TF32 is the ``tf32``
    precision), except int8 on the CPU runtimes: static quantization of a random-init model (``int8-static``)."""
    b = get_backend(backend)
    if dtype == "int8" and b.takes == "onnx" and b.row_device(device) == "cpu":
        return "int8-static"
    return tolerance_key(dtype)


def _calibration(config: dict[str, Any]) -> tuple[np.ndarray, str]:
    size = int(config["img_size"])
    return (
        random_calibration((size, size), CALIBRATION_COUNT, seed=0),
        f"{CALIBRATION_COUNT} standard-normal images, seed 0 (random-init model: no data set)",
    )


def int8_onnx(
    onnx_path: Path, config: dict[str, Any], cache_dir: Path, placement: str = CPU_QDQ_PLACEMENT
) -> tuple[Path, dict[str, Any]]:
    """ModelOpt's int8 Q/DQ model of a verified fp32 export, by default with the CPU placement (``export-model
    --dtype int8 --qdq-placement cpu``), verified as that command does it (Q/DQ placement, extra math fp32, finite
    outputs; not scored: random-init), cached per fp32 SHA-256 and placement.

    Returns:
        ``(path, facts)``: the facts say what was verified, the quantizer and the quantized op counts.
    """
    out = Path(cache_dir) / "int8" / f"{onnx_path.stem}-{sha256_file(onnx_path)[:12]}.modelopt-int8-{placement}.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    report: QuantizationReport | None = None
    if out.is_file() and report_path(out).is_file():
        try:
            report = QuantizationReport.from_json(report_path(out).read_text())
        except ValueError:  # a report of another schema (or damaged): the cached model is made again
            report = None
    if report is None or not report.passed or report.sha256 != sha256_file(out):  # trusted by content, not date
        calibration, source = _calibration(config)
        # min_cosine 0: the fidelity is measured and reported, not gated -- a random-init model calibrated on
        # random inputs is a speed subject, and every row passes the benchmark's own parity gate (int8-static)
        report = QuantizationReport.from_dict(
            quantize_verified(
                onnx_path,
                out,
                config,
                dtype="int8",
                calibration=calibration,
                calibration_source=source,
                calibration_seed=0,
                measure_accuracy=False,
                placement=placement,
                min_cosine=0.0,
            )
        )
    qz = report.quantization
    return out, {
        "quantizer": f"{qz.quantizer} {qz.quantizer_version}",
        "verified": report.verified,
        "placement": qz.options["placement"],
        "quantized_ops": qz.qdq["quantized_ops"],
        "excluded_extra_math": len(qz.excluded_nodes),
        "calibration": qz.calibration["source"],
        "fidelity": report.fidelity,
        "model": out.name,
    }


def extra_math(onnx_path: Path, config: dict[str, Any] | None = None) -> list[str]:
    """The names of the extra-math nodes of an export (:func:`attnzoo.export.quantize.extra_math_nodes`)."""
    return extra_math_nodes(onnx.load(str(onnx_path), load_external_data=False), config)


def int8_openvino(onnx_path: Path, config: dict[str, Any], cache_dir: Path) -> tuple[Path, dict[str, Any]]:
    """NNCF's int8 OpenVINO IR of a verified fp32 export (extra math in the ignored scope, checked free of
    FakeQuantize; :func:`attnzoo.targets.openvino.nncf_int8`), cached per fp32 SHA-256 with its report, and
    reused only while the IR, its weights and the report are the files that were made
    (:func:`attnzoo.fileio.derived_is_current`)."""
    source_sha = sha256_file(onnx_path)
    out = Path(cache_dir) / "int8" / f"{onnx_path.stem}-{source_sha[:12]}.nncf-int8.xml"
    facts_path, record = out.with_suffix(".report.json"), out.with_suffix(".json")
    products = [out, out.with_suffix(".bin"), facts_path]
    out.parent.mkdir(parents=True, exist_ok=True)
    if derived_is_current(record, source_sha, products):  # the IR, its weights and facts as they were made
        return out, json.loads(facts_path.read_text())
    record.unlink(missing_ok=True)
    calibration, source = _calibration(config)
    extra = extra_math(onnx_path, config)
    facts = nncf_int8(onnx_path, out, calibration, ignored=extra)
    facts.update(
        calibration=source,
        excluded_extra_math=len(extra),
        verified="NNCF model checked: FakeQuantize inserted, none feeding the extra math",
    )
    atomic_write_text(facts_path, json.dumps(facts, indent=1) + "\n")
    record_derived(record, source_sha, products)
    return out, facts


def load_call(
    backend: str,
    model: Any,
    onnx_path: Path | None,
    x: np.ndarray,
    dtype: str,
    *,
    threads: int,
    device: str,
    cache_dir: Path,
    int8_placement: str = CPU_QDQ_PLACEMENT,
    dynamic_batch: bool = False,
) -> tuple[Call, dict[str, Any]]:
    """Load one row's model on ``backend`` and make its repeatable call on ``x``; the call owns its session
    (:meth:`attnzoo.runtime.backends.Call.close` frees it).

    Args:
        backend: A registered backend name.
        model: The PyTorch model (fp32, CPU); module backends run a copy of it.
        onnx_path: Its verified export (fp32, or fp16 for fp16 GPU rows); int8 rows quantize the fp32 one.
        x: Input batch (float32, host).
        dtype: The row's precision.
        threads: Intra-op threads of the CPU runtimes.
        device: PyTorch device of module backends.
        cache_dir: Where optimized graphs, int8 copies and engines are kept.
        int8_placement: ``qdq`` int8 (``ort-cpu``): ModelOpt's Q/DQ placement (``cpu``, or ``tensorrt`` to compare).
        dynamic_batch: A backend that compiles the module (``compile``) compiles it once with the batch dimension
            dynamic, for every batch size, instead of for ``len(x)``.

    Returns:
        ``(call, info)``: the call and the settings the session ended up with (plus the int8 copy's facts).
    """
    b = get_backend(backend)
    settings: dict[str, Any] = dict(dtype=dtype, threads=threads, device=device)
    int8: dict[str, Any] = {}
    if b.takes == "module":  # a backend that compiles the module keeps what it compiles in cache_dir
        batch = None if dynamic_batch else len(x)
        session = b.load(model, b.options(**settings, cache_dir=cache_dir, batch=batch))
    else:
        if onnx_path is None:
            raise ValueError(f"backend {b.name} needs the exported ONNX file")
        if dtype == "int8":
            config = dict(getattr(model, "attnzoo_config", {}) or {})
            if b.int8_model == "qdq":
                onnx_path, int8 = int8_onnx(onnx_path, config, cache_dir, int8_placement)
            elif b.int8_model == "nncf":
                onnx_path, int8 = int8_openvino(onnx_path, config, cache_dir)
            else:
                raise ValueError(f"{b.name} has no int8 path")
        if dtype == "bf16" and "keep_f32" in b.reads:
            settings["keep_f32"] = extra_math(onnx_path)
        session = b.load(onnx_path, b.options(**settings, batch=len(x), cache_dir=cache_dir))
    try:
        call, info = session.call(x), session.info()
    except BaseException:
        session.close()
        raise
    call.session = session
    return call, ({**info, "int8": int8} if int8 else info)
