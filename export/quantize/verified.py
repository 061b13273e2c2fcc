"""The export: quantize a verified fp32 graph, check it, measure its fidelity to fp32 and score it next to
fp32, and only then write it with its report (:func:`quantize_verified`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from attnzoo.fileio import atomic_path, sha256_file, temporary_folder
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.contract import BATCH_DIM
from attnzoo.runtime.evaluate import score_runs
from attnzoo.runtime.precision import Precision, get_precision

from ..check import check_extra_math
from ..divergence import DIVERGENCE_INPUTS, divergence_vs_onnx, not_exposed
from ..errors import ExportError
from ..onnx_export import op_histogram
from ..verify import failed_report_path, report_path
from .calibration import DEFAULT_FIDELITY_COUNT, _split, heldout_images
from .fidelity import DEFAULT_MIN_COSINE, FIRM_GATE_INPUTS, _fidelity, _finite_outputs, onnx_outputs
from .modelopt import quantize_onnx
from .options import ACCURACY_TOLERANCE, QuantizeOptions
from .placement import auto_placement, group_speed
from .qdq import (
    AUTO_QDQ_PLACEMENT,
    DEFAULT_QDQ_PLACEMENT,
    TENSORRT_QDQ_PLACEMENT,
    extra_math_nodes,
    qdq_placement_error,
    qdq_summary,
)
from .record import QuantizationReport, QuantizeReport, write_report
from .smooth import layernorm_outliers, outlier_note, smooth_layernorm_matmuls

__all__ = ["AccuracyDropError", "QuantizationCheckError", "FidelityError", "evaluate_onnx", "quantize_verified"]


class AccuracyDropError(ExportError):
    """The quantized model lost more accuracy than :data:`ACCURACY_TOLERANCE` allows; nothing was written."""


class QuantizationCheckError(ExportError):
    """The quantized graph breaks a promise (Q/DQ in the extra math, non-finite outputs, no quantized op)."""


class FidelityError(ExportError):
    """The quantized graph's output is further from fp32's than the fidelity gate allows; nothing was written."""


def evaluate_onnx(
    models: Mapping[str, str | Path | onnx.ModelProto],
    config: Mapping[str, Any],
    *,
    limit: int | None = None,
    threads: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Score ONNX models (``{label: ONNX file or proto}``) on the model's test split with ONNX Runtime (CPU), all on
    the same images (:func:`attnzoo.runtime.evaluate.score_runs`, whose result it returns)."""
    runs = {label: onnx_reference().session(model, threads).run for label, model in models.items()}
    return score_runs(runs, config, limit=limit, progress=progress)


def quantize_verified(
    fp32_onnx: str | Path,
    out: str | Path,
    config: Mapping[str, Any],
    options: QuantizeOptions | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Quantize a verified fp32 export, check it, measure its fidelity to fp32 and score it, and only then write it.

    Writes ``out`` and its report ``<out>.report.json`` (:func:`attnzoo.export.verify.report_path`,
    :class:`QuantizationReport`) when every check passes; otherwise writes ``<out>.failed.report.json`` and raises,
    leaving a good model and report already at ``out`` untouched. Nothing is half-written: the model goes through a
    temporary file renamed into place, also on Ctrl-C.

    Fidelity (every model): the outputs of the quantized graph and of the fp32 graph on held-out inputs
    (:func:`output_agreement`); a worst input below ``min_cosine`` refuses the graph (:class:`FidelityError`),
    naming the figure and what the weights-only placement measures. With ``placement="auto"`` half of the held-out
    inputs choose the placement with a margin (:func:`auto_placement`) and the other half are the gate's; when no
    placement promises ``min_cosine`` on the choosing inputs the graph is refused too. The report states the
    split, marks a gate of fewer than :data:`FIRM_GATE_INPUTS` inputs as weak, and says what each group ``auto``
    kept fp32 costs in speed here (:func:`group_speed`, int8).

    Args:
        fp32_onnx: The verified fp32 export (its report beside it is referenced).
        out: The quantized ``.onnx`` to write.
        config: The model config.
        options: :class:`QuantizeOptions`: the dtype, the calibration inputs, the placement, the gates.
        **fields: :class:`QuantizeOptions` fields given one by one (``dtype="int8", calibration=x, ...``), or
            replacing those of ``options``.

    Returns:
        The report's JSON object (:meth:`QuantizationReport.to_dict`).

    Raises:
        QuantizationCheckError: Q/DQ in the extra math (unless asked for), no quantized op, non-finite outputs.
        FidelityError: the worst output cosine to fp32 on the gate's held-out inputs is below ``min_cosine``, or
            (``auto``) no placement promises it on the choosing inputs.
        AccuracyDropError: the accuracy drop exceeds the tolerance.
    """
    resolved = replace(options, **fields) if options is not None else QuantizeOptions(**fields)
    run = _prepare(Path(fp32_onnx), Path(out), config, resolved)
    with atomic_path(run.out) as tmp, temporary_folder("attnzoo-smooth-") as work:
        q, proto, decision = _quantized_graph(run, tmp, Path(work))
        runnable = run.precision.ort_graph(proto)
        unpromised = run.placement == AUTO_QDQ_PLACEMENT and run.gate > 0 and not decision.get("promised")
        failures = [_unpromised(run, decision)] if unpromised else []  # first: auto's fallback may hold no int8 op
        checks, extra_check = _graph_failures(run, q, proto, runnable, unpromised)
        failures += checks
        fidelity, blocks = None, None
        if len(failures) == int(unpromised):  # the other checks passed: measured, also to say why auto refused
            fidelity, blocks = _measured_fidelity(run, proto, runnable)
            if not fidelity["within_gate"] and not unpromised:
                failures.append(fidelity["failure"])
        accuracy, too_low = _scored(run, runnable, failures)
        report = _report(run, q, proto, tmp, extra_check, fidelity, accuracy, blocks, failures)
        if failures:
            write_report(report, failed_report_path(run.out))
            kind = (
                AccuracyDropError
                if too_low
                else FidelityError
                if unpromised or (fidelity and not fidelity["within_gate"])
                else QuantizationCheckError
            )
            raise kind(f"{run.out.name} not written: {'; '.join(failures[:3])}; see {failed_report_path(run.out)}")
    # the report after the model: stopped in between, the old report names another SHA-256 and nothing serves it
    write_report(report, report_path(run.out))
    failed_report_path(run.out).unlink(missing_ok=True)
    return report.to_dict()


@dataclass
class _Run:
    """One :func:`quantize_verified` call, its options resolved: the fp32 graph and its extra math, the placement,
    the fidelity gate and the accuracy tolerance, the calibration inputs and the held-out ones (``choose``: the
    ``auto`` placement's half, ``check``: the gate's), the warnings so far, and the precision (how ONNX Runtime
    runs its graph: FP8 simulated)."""

    options: QuantizeOptions
    config: Mapping[str, Any]
    fp32_onnx: Path
    out: Path
    src: onnx.ModelProto
    extra: list[str]
    placement: str
    gate: float
    tol: float
    notes: list[str]
    calibration: np.ndarray
    held_source: str
    choose: np.ndarray
    check: np.ndarray
    precision: Precision


def _prepare(fp32_onnx: Path, out: Path, config: Mapping[str, Any], options: QuantizeOptions) -> _Run:
    """The options resolved against the fp32 graph (``ValueError``: no calibration, a placement for another
    dtype)."""
    if options.calibration is None:
        raise ValueError("quantize_verified needs calibration inputs (QuantizeOptions.calibration)")
    placement = options.placement or DEFAULT_QDQ_PLACEMENT
    error = qdq_placement_error(placement, options.dtype)
    if error:
        raise ValueError(error)
    src = onnx.load(str(fp32_onnx))
    notes = list(options.warnings)
    calibration, held_out, held_source = _held_out(
        config, options.calibration, options.calibration_seed, options.held_out, options.calibration_source
    )
    if options.calibration_random and not config.get("untrained"):
        notes.append("a trained model calibrated on random inputs: real inputs' activations differ")
    choose, check = (
        (held_out[: len(held_out) // 2], held_out[len(held_out) // 2 :])
        if placement == AUTO_QDQ_PLACEMENT and len(held_out) >= 2
        else (held_out[:0], held_out)
    )
    return _Run(
        options=options,
        config=config,
        fp32_onnx=fp32_onnx,
        out=out,
        src=src,
        extra=extra_math_nodes(src, config),
        placement=placement,
        gate=(0.0 if options.measure_accuracy else DEFAULT_MIN_COSINE)
        if options.min_cosine is None
        else float(options.min_cosine),
        tol=ACCURACY_TOLERANCE[config["task"]] if options.tolerance is None else float(options.tolerance),
        notes=notes,
        calibration=calibration,
        held_source=held_source,
        choose=choose,
        check=check,
        precision=get_precision(options.dtype),
    )


def _quantized_graph(run: _Run, tmp: Path, work: Path) -> tuple[QuantizeReport, onnx.ModelProto, dict[str, Any]]:
    """The quantized graph written at ``tmp``: SmoothQuant's migration first where asked (``auto`` int8 by default;
    calibrated on the migrated graph, measured against the original), ModelOpt's quantization, then for ``auto``
    the placement chosen on the choosing inputs (:func:`_auto`). Returns the quantizer's report, the graph and the
    ``auto`` decision (empty otherwise)."""
    options, exclude = run.options, [] if run.options.quantize_extra_math else run.extra
    source, smoothing = run.fp32_onnx, None
    smooth = (
        options.smooth_quant
        if options.smooth_quant is not None
        else run.placement == AUTO_QDQ_PLACEMENT and run.precision.smooth_quant
    )
    if smooth:
        migrated, smoothing = smooth_layernorm_matmuls(
            run.src, run.calibration, exclude=run.extra, threads=options.threads
        )
        if smoothing["migrated"]:  # no outlier channel: the graph as it was
            source = work / "smoothed.onnx"
            onnx.save(migrated, str(source))
    q = quantize_onnx(
        source,
        tmp,
        dtype=options.dtype,
        calibration=run.calibration,
        exclude_nodes=exclude,
        calibration_source=options.calibration_source,
        calibration_seed=options.calibration_seed,
        calibration_method=options.calibration_method,
        extra_nodes=run.extra,
        placement=TENSORRT_QDQ_PLACEMENT if run.placement == AUTO_QDQ_PLACEMENT else run.placement,
    )
    if smoothing is not None:
        q.options["smooth_quant"] = smoothing
    proto = onnx.load(str(tmp))
    if run.placement != AUTO_QDQ_PLACEMENT:
        return q, proto, {}
    return (q, *_auto(run, q, proto, tmp))


def _auto(
    run: _Run, quantization: QuantizeReport, full: onnx.ModelProto, tmp: Path
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """``auto``: the Q/DQ groups kept that promise the gate on the choosing inputs (:func:`auto_placement`), what
    each group kept fp32 costs in speed (int8), recorded in ``q`` and written back to ``tmp``."""
    fixed = run.extra if run.options.quantize_extra_math else ()
    proto = full
    if len(run.choose):
        proto, decision = auto_placement(
            full,
            onnx_outputs(run.fp32_onnx, run.choose, run.options.threads),
            run.choose,
            run.config["task"],
            min_cosine=run.gate or DEFAULT_MIN_COSINE,
            runnable=run.precision.ort_graph,
            threads=run.options.threads,
            fixed=fixed,
        )
    else:
        decision = {
            "selection_inputs": 0,
            "promised": False,
            "note": "too few held-out inputs to choose: ModelOpt's full placement",
        }
    if run.precision.cpu_runtimes and any(not d["quantized"] for d in decision.get("groups", {}).values()):
        decision["speed"] = group_speed(proto, full, decision, run.check, fixed=fixed)
    quantization.options.update(placement=AUTO_QDQ_PLACEMENT, auto=decision)
    quantization.qdq = qdq_summary(proto, run.extra)
    _set_placement(proto, AUTO_QDQ_PLACEMENT)
    onnx.save(proto, str(tmp))
    return proto, decision


def _unpromised(run: _Run, decision: Mapping[str, Any]) -> str:
    """The line refusing an ``auto`` graph when no placement promises the gate on the choosing inputs: the best
    one tried, an outlier note where the fp32 graph has outlier channels, what to do."""
    named = {
        "ModelOpt's full placement": "all_quantized",
        "the weight MatMuls alone": "weights_only",
        "the best choice": "chosen",
    }
    tried = {label: decision[key] for label, key in named.items() if key in decision}
    best = max(tried, key=lambda label: tried[label]["promised"], default=None)
    note = outlier_note(layernorm_outliers(run.src, run.calibration, exclude=run.extra, threads=run.options.threads))
    return (
        f"no Q/DQ placement promises a cosine to fp32 >= {run.gate:g} on inputs like the {len(run.choose)} "
        f"choosing one(s)"
        + (f" ({best} promises {tried[best]['promised']:.4f}, worst {tried[best]['worst']:.4f})" if best else "")
        + (f"; {note}" if note else "")
        + "; calibrate on more images like the model's inputs (--calibration-data DIR) or lower --min-cosine"
    )


def _graph_failures(
    run: _Run, quantization: QuantizeReport, proto: onnx.ModelProto, runnable: onnx.ModelProto, unpromised: bool
) -> tuple[list[str], dict[str, Any]]:
    """What the quantized graph breaks, one line each (no quantized op, Q/DQ read by the extra math unless asked,
    the extra math's own check, non-finite outputs, a batch dimension that is not the contract's), and the extra
    math's check."""
    failures, qdq = [], quantization.qdq
    if not unpromised and sum(qdq["quantized_ops"].values()) == 0:
        failures.append("no MatMul/Gemm/Conv was quantized")
    if not run.options.quantize_extra_math and qdq["extra_math_quantized"]:
        failures.append(
            f"{len(qdq['extra_math_quantized'])} extra-math op(s) read quantized values, e.g. "
            f"{qdq['extra_math_quantized'][0]}"
        )
    extra_check = check_extra_math(proto, dict(run.config), "fp32")
    failures += [f"extra math: {f}" for f in extra_check["failures"]] if not run.options.quantize_extra_math else []
    if not _finite_outputs(runnable, run.calibration[: min(8, len(run.calibration))], run.options.threads):
        failures.append("non-finite outputs on calibration inputs")
    dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    if (dim.dim_param or dim.dim_value) != BATCH_DIM:
        failures.append(f"input batch dimension is {dim.dim_param or dim.dim_value!r}, not {BATCH_DIM!r}")
    return failures, extra_check


def _measured_fidelity(
    run: _Run, proto: onnx.ModelProto, runnable: onnx.ModelProto
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The gate's measurement on the held-out inputs (:func:`_fidelity`, its sources and split, a weak gate
    named), and the per-block errors against the fp32 graph (:func:`_divergence`)."""
    options, check = run.options, run.check
    fidelity = _fidelity(
        proto,
        runnable,
        run.fp32_onnx,
        check,
        run.config["task"],
        run.gate,
        run.placement,
        run.precision.ort_graph,
        options.threads,
        None if options.measure_accuracy else run.calibration,  # the promise of a model its test split does not score
    )
    if (fidelity.get("related") or {}).get("warning"):
        run.notes.append(fidelity["related"]["warning"])
    fidelity.update(
        source=run.held_source,
        warnings=run.notes,
        split={"calibration": int(len(run.calibration)), "choose": int(len(run.choose)), "gate": int(len(check))},
    )
    if len(check) < FIRM_GATE_INPUTS:
        fidelity["weak"] = (
            f"only {len(check)} gate input(s) (firm from {FIRM_GATE_INPUTS}): a further input "
            f"falls below their worst with probability about 1/{len(check) + 1}"
        )
    return fidelity, _divergence(runnable, run.src, run.config, check, run.gate or DEFAULT_MIN_COSINE, options.threads)


def _scored(run: _Run, runnable: onnx.ModelProto, failures: list[str]) -> tuple[dict[str, Any], bool]:
    """The quantized graph and the fp32 graph scored on the test split (when the model has one and every check
    passed), the drop against the tolerance (a line in ``failures`` when over it and not accepted); and whether
    it was too low."""
    options, dtype, tol = run.options, run.options.dtype, run.tol
    if not options.measure_accuracy:
        return {
            "measured": False,
            "warning": "no labelled test split (an untrained or converted model): "
            "accuracy not measured; the fidelity to fp32 is the gate",
        }, False
    if failures:
        return {"measured": False, "reason": "checks failed before scoring"}, False
    ev = evaluate_onnx(
        {"fp32": run.fp32_onnx, dtype: runnable},
        run.config,
        limit=options.eval_limit,
        threads=options.threads,
        progress=options.progress,
    )
    drop = ev["metrics"]["fp32"] - ev["metrics"][dtype]
    accuracy = {
        **ev,
        "limit": options.eval_limit,
        "drop": drop,
        "tolerance": tol,
        "within_tolerance": drop <= tol,
        "accepted_drop": bool(options.accept_accuracy_drop and drop > tol),
        "runtime": "onnxruntime CPUExecutionProvider",
        "how": (
            "the FP8 Q/DQ graph simulated in float ops (simulate_fp8: e4m3 RNE round trip at the "
            "same Q/DQ points, same scales); ONNX Runtime's CPU provider refuses float8 tensors "
            "into Transpose"
        )
        if run.precision.ort_simulated
        else "the Q/DQ graph itself",
    }
    too_low = drop > tol and not options.accept_accuracy_drop
    if too_low:
        failures.append(
            f"{ev['metric_name']} {ev['metrics'][dtype]:.2f} is {drop:.2f} points below fp32's "
            f"{ev['metrics']['fp32']:.2f} (tolerance {tol:g}); pass --accept-accuracy-drop to "
            "write it anyway"
        )
    return accuracy, too_low


def _report(
    run: _Run,
    quantization: QuantizeReport,
    proto: onnx.ModelProto,
    tmp: Path,
    extra_check: Mapping[str, Any],
    fidelity: dict[str, Any] | None,
    accuracy: dict[str, Any],
    blocks: dict[str, Any] | None,
    failures: list[str],
) -> QuantizationReport:
    """The report of the graph at ``tmp``: the fp32 graph it came from (its own report; no path when it was a
    temporary file), the quantizer's, the checks, the fidelity, the score."""
    options = run.options
    fp32_report = report_path(run.fp32_onnx)
    fp32_verified = json.loads(fp32_report.read_text()) if fp32_report.is_file() else None
    if fp32_verified is not None and not options.fp32_kept:
        fp32_verified["path"] = None  # a temporary file: its hash and report, no path that dangles
    return QuantizationReport(
        path=str(run.out),
        variant=run.config["variant"],
        task=run.config["task"],
        arch=run.config["arch"],
        dtype=options.dtype,
        fp32_source={
            "path": str(run.fp32_onnx) if options.fp32_kept else None,
            "kept": options.fp32_kept,
            "sha256": sha256_file(run.fp32_onnx),
            "report": fp32_verified,
        },
        quantization=quantization,
        quantize_extra_math=options.quantize_extra_math,
        extra_math_scope_check={
            "nodes": len(run.extra),
            "quantized": quantization.qdq["extra_math_quantized"],
            "checker": extra_check["ok"] or extra_check["failures"],
        },
        fidelity=fidelity,
        accuracy=accuracy,
        warnings=run.notes,
        file_size=tmp.stat().st_size,
        sha256=sha256_file(tmp),
        num_nodes=len(proto.graph.node),
        op_histogram=op_histogram(proto),
        batch_dim=BATCH_DIM,
        onnxruntime=__import__("onnxruntime").__version__,
        verified="quantized graph checked (Q/DQ placement, extra math fp32), its output compared with fp32's "
        "on held-out inputs"
        + (" and scored with ONNX Runtime CPU on the test split next to fp32" if options.measure_accuracy else ""),
        passed=not failures,
        failures=failures,
        divergence=blocks,
    )


def _divergence(
    runnable: onnx.ModelProto,
    fp32: onnx.ModelProto,
    config: Mapping[str, Any],
    x: np.ndarray,
    min_cosine: float,
    threads: int | None,
) -> dict[str, Any]:
    """The report's ``divergence`` entry: block by block against the fp32 graph on the first held-out inputs; a
    graph whose blocks cannot be read says why instead (the figures explain the verdict, they are not one)."""
    try:
        return divergence_vs_onnx(runnable, fp32, config, x[:DIVERGENCE_INPUTS], min_cosine=min_cosine, threads=threads)
    except Exception as exc:  # a diagnosis that cannot run never decides the export
        return not_exposed(f"block outputs could not be compared: {type(exc).__name__}: {exc}")


def _held_out(
    config: Mapping[str, Any], calibration: np.ndarray, seed: int | None, held_out: np.ndarray | None, source: str
) -> tuple[np.ndarray, np.ndarray, str]:
    """``(calibration, held-out inputs, what they are)``: the given ones, held-out training images, or the last
    part of the calibration batch (then not calibrated on)."""
    if held_out is not None:
        if len(held_out) == 0:
            raise ValueError("held_out holds no inputs")
        return calibration, np.ascontiguousarray(held_out, dtype=np.float32), f"held out of {source}"
    if config.get("data") and not config.get("untrained"):
        images = heldout_images(config, DEFAULT_FIDELITY_COUNT, len(calibration), seed or 0)
        if images.shape[1:] == calibration.shape[1:]:
            return calibration, images, f"{config['data']} training images outside the calibration draw"
    calibration, held = _split(calibration, DEFAULT_FIDELITY_COUNT, "calibration")
    return calibration, held, f"the last {len(held)} of the calibration inputs ({source}), not calibrated on"


def _set_placement(proto: onnx.ModelProto, placement: str) -> None:
    """Record ``placement`` in the graph's ``quantization`` metadata."""
    for prop in proto.metadata_props:
        if prop.key == "quantization":
            prop.value = json.dumps({**json.loads(prop.value), "placement": placement})
