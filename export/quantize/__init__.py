"""INT8 / FP8 post-training quantization of a verified fp32 export with NVIDIA Model Optimizer (ModelOpt).

``export-model --dtype int8|fp8`` (see :func:`quantize_verified`):

1. the fp32 model is exported and verified as usual (in a temporary folder);
2. ModelOpt's ONNX quantizer (:func:`modelopt.onnx.quantization.quantize`, calibrated on the CPU) places Q/DQ
   nodes, calibrated on real training-split images of the model's data set (:func:`calibration_images`, the
   project's one preprocessing path) or on a user's ``.npy`` file (:func:`load_calibration_file`). By default
   every op under the variant's extra-math scopes (:func:`extra_math_nodes`: the projection, or whatever the
   variant declares in :func:`attnzoo.export.check.expected_scopes`) is excluded and stays fp32;
3. the quantized graph is checked (:func:`qdq_summary`: which MatMul/Gemm/Conv are fed by a DequantizeLinear, and
   that no extra-math op is unless asked for) and scored with ONNX Runtime (CPU) on the test split next to the
   fp32 model in the same run (:func:`evaluate_onnx`). ONNX Runtime's CPU provider cannot run ModelOpt's FP8 graph
   (float8 tensors into Transpose), so FP8 is scored on :func:`attnzoo.runtime.fp8.simulate_fp8`, the same graph
   with every FP8 Q -> DQ pair rewritten into float ops that round to the float8 e4m3 grid exactly as QuantizeLinear
   does (RNE, saturating at +-448) with the same scales;
4. a drop beyond :data:`ACCURACY_TOLERANCE` refuses to write (:class:`AccuracyDropError`) unless
   ``accept_accuracy_drop``; otherwise the model is renamed into place (temp + rename: an interrupted run leaves
   nothing half-written) and its report ``<model>.report.json`` written beside it.

The parts: :mod:`.calibration` (the inputs), :mod:`.qdq` (the placements and the Q/DQ graph), :mod:`.modelopt`
(the quantizer), :mod:`.placement` (``auto``), :mod:`.fidelity` (the agreement
with fp32 and its gate), :mod:`.options` (:class:`QuantizeOptions`, the arguments refused before work),
:mod:`.verified` (the export) and :mod:`.report` (:class:`QuantizationReport`, written and read).
"""

from __future__ import annotations

from .calibration import (
    DEFAULT_CALIBRATION_COUNT,
    DEFAULT_CALIBRATION_SEED,
    DEFAULT_FIDELITY_COUNT,
    Calibration,
    calibration_for,
    calibration_images,
    heldout_images,
    load_calibration_file,
    load_calibration_folder,
    random_calibration,
)
from .fidelity import (
    DEFAULT_MIN_COSINE,
    FIRM_GATE_INPUTS,
    NEAR_COPY_SIMILARITY,
    PROMISE_CONFIDENCE,
    PROMISE_COVERAGE,
    onnx_outputs,
    output_agreement,
    per_input_fidelity,
    pixel_similarity,
    promised_cosine,
    related_inputs,
    tolerance_factor,
)
from .modelopt import CALIBRATION_METHODS, modelopt_version, quantize_onnx, quantize_unavailable_reason
from .options import (
    ACCURACY_TOLERANCE,
    QuantizeOptions,
    check_quantize_arguments,
)
from .placement import SPEED_RUNS, auto_placement, group_speed
from .qdq import (
    AUTO_QDQ_PLACEMENT,
    CPU_QDQ_PLACEMENT,
    DEFAULT_QDQ_PLACEMENT,
    PLACEMENT_CHOICES,
    QDQ_PLACEMENTS,
    QUANTIZED_OP_TYPES,
    TENSORRT_QDQ_PLACEMENT,
    extra_math_nodes,
    qdq_groups,
    qdq_placement_error,
    qdq_summary,
)
from .record import QuantizationReport, QuantizeReport, read_quantization_report, summary, write_report
from .smooth import smooth_layernorm_matmuls
from .verified import (
    AccuracyDropError,
    FidelityError,
    QuantizationCheckError,
    evaluate_onnx,
    quantize_verified,
)

__all__ = [
    "QDQ_PLACEMENTS",
    "PLACEMENT_CHOICES",
    "DEFAULT_QDQ_PLACEMENT",
    "CPU_QDQ_PLACEMENT",
    "TENSORRT_QDQ_PLACEMENT",
    "AUTO_QDQ_PLACEMENT",
    "DEFAULT_MIN_COSINE",
    "DEFAULT_FIDELITY_COUNT",
    "FIRM_GATE_INPUTS",
    "PROMISE_COVERAGE",
    "PROMISE_CONFIDENCE",
    "SPEED_RUNS",
    "FidelityError",
    "output_agreement",
    "per_input_fidelity",
    "onnx_outputs",
    "NEAR_COPY_SIMILARITY",
    "pixel_similarity",
    "related_inputs",
    "smooth_layernorm_matmuls",
    "tolerance_factor",
    "promised_cosine",
    "qdq_groups",
    "auto_placement",
    "group_speed",
    "heldout_images",
    "load_calibration_folder",
    "ACCURACY_TOLERANCE",
    "DEFAULT_CALIBRATION_COUNT",
    "DEFAULT_CALIBRATION_SEED",
    "CALIBRATION_METHODS",
    "QUANTIZED_OP_TYPES",
    "QuantizeOptions",
    "QuantizeReport",
    "QuantizationReport",
    "Calibration",
    "AccuracyDropError",
    "QuantizationCheckError",
    "quantize_unavailable_reason",
    "modelopt_version",
    "extra_math_nodes",
    "calibration_images",
    "random_calibration",
    "load_calibration_file",
    "quantize_onnx",
    "qdq_placement_error",
    "qdq_summary",
    "evaluate_onnx",
    "check_quantize_arguments",
    "calibration_for",
    "quantize_verified",
    "summary",
    "write_report",
    "read_quantization_report",
]
