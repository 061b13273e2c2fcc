"""``--format openvino``: an OpenVINO IR (``model.xml`` + ``model.bin``) converted from the verified ONNX, what the
``openvino`` backend (``bench-latency --backends openvino``) and :class:`attnzoo.runtime.openvino.OpenVINOSession`
read natively.

The fp32 ONNX is exported and verified first, as every export is (:func:`attnzoo.export.verify.export_verified`,
kept in a temporary folder: the IR is the output). OpenVINO's ONNX front end reads it (``Core.read_model``; no
conversion tool, no telemetry) and it is written as IR by ``openvino.save_model``:

- ``fp32``: weights and compute f32;
- ``fp16``: the weights compressed to fp16 (``compress_to_fp16``; half the ``.bin``), decompressed to f32 where
  they are used, so every activation stays f32 (checked: no op but a weight constant is 16-bit);
- ``int8``: the verified int8 Q/DQ ONNX that ``--dtype int8`` writes
  (:func:`attnzoo.export.quantize.quantize_verified`, the ``cpu`` placement unless asked, its gates passed on ONNX
  Runtime), converted: each Q/DQ pair becomes a FakeQuantize that OpenVINO runs in int8. The IR is held to the
  same gates on OpenVINO itself (:meth:`OpenVINOFormat._check_int8`): its worst output cosine to the fp32 graph on
  the held-out inputs, and its own test-split score within the accuracy tolerance of fp32's, instead of a parity
  tolerance against eager.

The model contract (``metadata_props`` of the ONNX, its ``dtype`` the IR's) goes into the IR's ``rt_info``
(:data:`attnzoo.runtime.contract.IR_RT_INFO`), where :class:`~attnzoo.runtime.contract.ModelContract` reads it.
The IR is written under a temporary name beside ``--out`` and verified before it is renamed:

- the variant's extra math must be in the IR's own graph: for each block and each of the variant's
  ``extra_scopes``, the ops of ``ov.Model.get_ops()`` whose friendly name (OpenVINO keeps the ONNX node names) is
  ``<blocks>.N.attn.<scope>/...`` are counted (:func:`count_extra_math`) with the op counts a scope declares (the
  projection's ``Multiply`` x3, ``ReduceSum`` x2, ``Add`` of eps, ``Divide``, ``Subtract``), each computing in f32,
  none reading a FakeQuantize;
- the batch dimension must stay dynamic, and the IR must run in the ``openvino`` backend and match eager fp32
  PyTorch on real and random inputs at the requested batch sizes and
  :data:`attnzoo.export.verify.EXTRA_BATCH_SIZES` (the ONNX was traced at batch 2), under the tolerance of its
  precision (:data:`attnzoo.runtime.parity.TOLERANCES`: ``fp32``, ``fp16``); an int8 IR, the gates above.

Only an IR that passes is renamed to ``--out`` (its ``.bin`` first, the ``.xml`` last), with its report
``<out>.json``; one that fails, or that OpenVINO refuses to read or compile (the op and OpenVINO's reason in one
line), leaves ``--out`` as it was and writes ``<out>.failed.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from attnzoo.errors import UsageError, first_line
from attnzoo.fileio import no_space_problem, sha256_file, temporary_folder
from attnzoo.models import PROJECTION_OPS
from attnzoo.runtime import openvino as ovrt
from attnzoo.runtime.backends import get_backend
from attnzoo.runtime.backends.openvino import tensor_values
from attnzoo.runtime.contract import BATCH_DIM, INPUT_NAME, ModelContract, metadata_props
from attnzoo.runtime.evaluate import EVAL_BATCH, score_runs
from attnzoo.runtime.precision import QUANTIZED, get_precision
from attnzoo.runtime.sessions import IR_SUFFIX

from .. import quantize, verify
from ..check import block_prefix, variant_spec, walk_extra_scopes
from ..divergence import DIVERGENCE_INPUTS, divergence_vs_onnx, not_exposed
from ..errors import DiskFullError, ExportError, ExportWarning
from ..verify import VerificationError, checked_batch_sizes
from .base import (
    ExportFormat,
    ExportRequest,
    ModelSource,
    keep_report,
    record_failure,
    report_path,
    run_step,
    summary_text,
)

__all__ = [
    "OpenVINOFormat",
    "FORMAT",
    "IR_DTYPES",
    "ONNX_TO_OV",
    "count_extra_math",
    "summary",
]


@dataclasses.dataclass
class _Quantized:
    """The verified int8 Q/DQ graph an int8 IR is converted from: its report, the inputs it was calibrated and
    gated on, what the IR's report says of it, and whether a drop in accuracy was accepted."""

    report: dict[str, Any]
    calibration: Any
    summary: dict[str, Any]
    accept_drop: bool


#: Precisions the IR is written at.
IR_DTYPES: tuple[str, ...] = ("fp32", "fp16", "int8")
#: ONNX op types of the extra math's declared counts (:meth:`attnzoo.models.VariantSpec.required_ops`) -> the
#: OpenVINO op each becomes.
ONNX_TO_OV: dict[str, str] = {
    "Mul": "Multiply",
    "Div": "Divide",
    "Sub": "Subtract",
    "Add": "Add",
    "ReduceSum": "ReduceSum",
}
#: OpenVINO ops that only move, view or retype data: a scope of these alone holds no extra math.
NO_MATH_OPS = frozenset({"Constant", "Convert", "Reshape", "Squeeze", "Unsqueeze", "Transpose", "ShapeOf"})
#: The batch the ONNX is traced at (:func:`attnzoo.export.onnx_export.export_onnx`), never verified.
TRACE_BATCH = 2


class ConversionError(VerificationError):
    """OpenVINO refused the graph (an op its ONNX front end or its CPU plugin does not take)."""


def _constant_value(output: Any) -> np.ndarray | None:
    """The value behind an op input, when it is a Constant (through a decompression ``Convert``)."""
    node = output.get_node()
    while node.get_type_name() == "Convert" and node.get_input_size():
        node = node.input_value(0).get_node()
    if node.get_type_name() != "Constant":
        return None
    return np.asarray(node.get_data(), dtype=np.float64)


#: Integer outputs that carry quantized values, not shapes or indices (an extra-math op that outputs one was
#: quantized).
QUANTIZED_TYPES = frozenset({"i8", "u8", "i4", "u4", "u1", "nf4"})


def _keeps_f32(element_type: Any) -> bool:
    """Whether an op's output keeps the extra math at f32: an f32 tensor, or an integer one that is shape or index
    arithmetic (``i64`` / ``i32`` / ``boolean``: a ``Concat`` of a reshape's target shape). A 16-bit or 8-bit float,
    or a quantized integer type (:data:`QUANTIZED_TYPES`), is not."""
    name = str(element_type.get_type_name())
    if element_type.is_real():
        return name == "f32"
    return name not in QUANTIZED_TYPES


def count_extra_math(model: Any, config: dict[str, Any], eps: float | None = None) -> dict[str, Any]:
    """Count each block's extra-math ops in an OpenVINO model (an IR read back): for each scope of
    :func:`attnzoo.export.check.expected_scopes`, the ops whose friendly name starts with ``<scope>/``. A scope must
    hold its declared op counts (ONNX op types, :data:`ONNX_TO_OV`), else at least one op outside
    :data:`NO_MATH_OPS`; every op of it that computes must output f32 (integer shape and index arithmetic aside:
    :func:`_keeps_f32`) and read no FakeQuantize; a projection's
    ``Add`` must add ``eps`` (the metadata's, when given). No op outside the weight constants may be 16-bit (the fp16
    IR compresses weights only). Never raises for a missing scope (see ``failures``).

    Returns:
        ``{"ok", "failures", "blocks": {scope: {"ops": {op: n}, "nodes": [names]}}, "nodes_per_block", "depth",
        "half_ops"}``.
    """
    block = re.compile(rf"^{re.escape(block_prefix(config))}\.(\d+)[./]")
    ops = list(model.get_ops())
    depth = 1 + max((int(m.group(1)) for m in (block.match(o.get_friendly_name()) for o in ops) if m), default=-1)
    spec = variant_spec(config)

    def judge(scope: str) -> tuple[list[str], dict[str, Any], int]:
        found = [o for o in ops if o.get_friendly_name().startswith(scope + "/")]
        entry = {"ops": dict(_onnx_counts(found)), "nodes": [o.get_friendly_name() for o in found]}
        return _scope_failures(model, scope, found, spec, eps), entry, len(found)

    walk = walk_extra_scopes(config, depth, "ops in the IR", judge)
    half = _half_ops(ops)
    failures = walk.failures + ([f"{len(half)} op(s) compute in 16 bits, not f32, e.g. {half[0]}"] if half else [])
    return {
        "ok": not failures,
        "failures": failures,
        "blocks": walk.blocks,
        "nodes_per_block": dict(walk.nodes_per_block),
        "depth": depth,
        "half_ops": len(half),
    }


def _onnx_counts(found: list[Any]) -> Counter:
    """The OpenVINO ops ``found`` counted by the ONNX op type they come from (:data:`ONNX_TO_OV`)."""
    to_onnx = {v: k for k, v in ONNX_TO_OV.items()}
    return Counter(to_onnx.get(o.get_type_name(), o.get_type_name()) for o in found)


def _scope_failures(model: Any, scope: str, found: list[Any], spec: Any, eps: float | None) -> list[str]:
    """What is wrong with one extra-math scope's ops ``found`` in ``model`` (see :func:`count_extra_math`)."""
    counts = _onnx_counts(found)
    module = scope.split(".attn.", 1)[1]
    required = spec.required_ops(module)
    if not found:
        return [
            f"{scope}: no ops named {scope}/... in the IR (variant {spec.name!r} declares extra scope {module!r}; "
            "its ops are missing, folded away or renamed)"
        ]
    failures = [
        f"{scope}: {counts[op]} {ONNX_TO_OV.get(op, op)} op(s), need {need}"
        for op, need in required.items()
        if counts[op] < need
    ]
    computing = [o for o in found if o.get_type_name() not in NO_MATH_OPS]
    if not required and not computing:
        failures.append(f"{scope}: only {', '.join(sorted(counts))} op(s), no op computes anything")
    failures += [
        f"{scope}: {o.get_friendly_name()} computes in {o.get_output_element_type(0)}, not f32"
        for o in computing
        if not _keeps_f32(o.get_output_element_type(0))
    ]
    failures += [
        f"{scope}: {name} reads a FakeQuantize"
        for name in ovrt.fake_quantized(model, [o.get_friendly_name() for o in computing])
    ]
    if dict(required) == dict(PROJECTION_OPS):
        failures += [f for o in computing if o.get_type_name() == "Add" for f in _eps_failures(scope, o, eps)]
    return failures


def _eps_failures(scope: str, add: Any, eps: float | None) -> list[str]:
    """A projection's ``Add`` must add a constant, ``eps`` when that is given."""
    values = [v for v in (_constant_value(add.input_value(i)) for i in range(add.get_input_size())) if v is not None]
    if not values:
        return [f"{scope}: {add.get_friendly_name()} adds no constant (eps)"]
    added = float(np.ravel(values[0])[0])
    if eps is not None and not np.isclose(added, eps, rtol=1e-3, atol=0.0):
        return [f"{scope}: {add.get_friendly_name()} adds {added:g}, metadata eps {eps:g}"]
    return []


def _half_ops(ops: list[Any]) -> list[str]:
    """The ops outside the weight constants with a 16-bit float output (the fp16 IR compresses weights only)."""
    return [
        f"{o.get_friendly_name()} ({o.get_type_name()})"
        for o in ops
        if o.get_type_name() != "Constant"
        and any(
            str(o.get_output_element_type(i).get_type_name()) in ("f16", "bf16") for i in range(o.get_output_size())
        )
    ]


def _op_histogram(model: Any) -> dict[str, int]:
    return dict(sorted(Counter(o.get_type_name() for o in model.get_ops()).items()))


def _weight_types(model: Any) -> dict[str, int]:
    """Element types of the IR's floating-point constants (its weights): ``f16`` in a compressed IR."""
    types: Counter = Counter()
    for o in model.get_ops():
        if o.get_type_name() == "Constant":
            t = str(o.get_output_element_type(0).get_type_name())
            if t.startswith(("f", "bf", "i8", "u8")):
                types[t] += 1
    return dict(sorted(types.items()))


class OpenVINOFormat(ExportFormat):
    """``model.xml`` + ``model.bin``, an OpenVINO IR verified against eager PyTorch, and its report
    ``model.xml.json``."""

    name = "openvino"
    title = "OpenVINO IR"
    suffixes = (IR_SUFFIX,)
    from_model = True

    def check(self, req: ExportRequest) -> None:
        super().check(req)
        if req.dtype not in IR_DTYPES:
            raise UsageError(f"--format openvino writes {', '.join(IR_DTYPES)}, not {req.dtype}")
        reason = ovrt.unavailable_reason()
        if reason:
            raise UsageError(f"--format openvino: {reason}")

    def write_model(self, req: ExportRequest, source: ModelSource, result) -> None:
        result.report = run_step(self.export_verified, "OpenVINO IR export failed", req, source, result.path)
        result.warnings += (result.report.get("quantized_onnx") or {}).get("warnings", [])  # issued as it ran

    def export_verified(self, req: ExportRequest, source: ModelSource, out: Path) -> dict[str, Any]:
        """Export and verify the ONNX (for int8, its Q/DQ graph too), convert it, count the extra math, check parity
        (int8: the gates of :meth:`_check_int8`); rename to ``out`` only when all passed."""
        config, hw = source.config, (source.hw[0], source.hw[1])
        sizes = checked_batch_sizes(req.batch_sizes)
        with temporary_folder("attnzoo-openvino-") as work:
            fp32_path = Path(work) / f"{out.stem}_fp32.onnx"
            onnx_path, quantized = fp32_path, None
            report = _report(out, req.dtype, source, self._verified_onnx(req, source, fp32_path, out))
            if req.dtype in QUANTIZED:  # converted from the verified Q/DQ graph, which passed its gates
                onnx_path = Path(work) / f"{out.stem}.onnx"
                quantized = self._quantized(req, source, fp32_path, onnx_path, out, report)
                report["quantized_onnx"] = quantized.summary
            props = {**metadata_props(onnx_path), "dtype": req.dtype}
            with ovrt.temporary_ir(out) as tmp:
                start = time.perf_counter()
                self._convert(req, onnx_path, tmp, props, config, hw, source, out, report)
                report["convert_time_s"] = round(time.perf_counter() - start, 3)
                failures = _graph_failures(tmp, report, config, props, req.dtype, source.checkpoint_sha256)
                if failures:  # refused before it is run
                    return self.fail(out, report, failures)
                backend = get_backend("openvino")
                try:
                    session = backend.load(tmp, backend.options(dtype=req.dtype, threads=source.threads))
                except Exception as exc:  # the plugin's refusal, as one line
                    raise self._refused(out, report, "OpenVINO's CPU plugin cannot compile the IR", exc) from None
                report["bin_sha256"] = sha256_file(tmp.with_suffix(".bin"))
                with session:
                    hint = session.info().get("inference_precision_hint", "f32")
                    runtime = f"OpenVINO {ovrt.version()} CPU, {hint}"
                    if quantized is not None:  # int8: the gates its Q/DQ graph passed, measured on the IR
                        self._check_int8(
                            out, report, session, tmp, fp32_path, onnx_path, quantized, config, runtime, source.threads
                        )
                    else:
                        self._check_parity(out, report, source, session, tmp, onnx_path, req.dtype, sizes, runtime)
                report.update(passed=True, failures=[])
                ovrt.place_ir(tmp, out)
        return keep_report(out, report)

    def _verified_onnx(self, req: ExportRequest, source: ModelSource, fp32: Path, out: Path) -> dict[str, Any]:
        """The fp32 ONNX the IR is converted from, exported and verified at ``fp32`` (a temporary file); its report.
        A graph its checks refuse (its extra math lost, its parity off) refuses ``out``: the IR's failed report holds
        the graph's failures and figures, not a path into the temporary folder."""
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the exporter's own progress lines
                return verify.export_verified(
                    source.model,
                    fp32,
                    source.config,
                    opset=req.opset,
                    dtype="fp32",
                    input_hw=(source.hw[0], source.hw[1]),
                    batch_sizes=req.batch_sizes,
                    checkpoint_sha256=source.checkpoint_sha256,
                    threads=source.threads,
                )
        except VerificationError:
            failed = verify.failed_report_path(fp32)
            if not failed.is_file():  # every refusal of the verification writes it first
                raise
            onnx_report = json.loads(failed.read_text())
            failures = [f"the ONNX graph: {f}" for f in onnx_report["failures"]]
            self.fail(out, _report(out, req.dtype, source, onnx_report), failures)

    def _check_parity(
        self,
        out: Path,
        report: dict[str, Any],
        source: ModelSource,
        session: Any,
        ir: Path,
        onnx_path: Path,
        dtype: str,
        sizes: Sequence[int],
        runtime: str,
    ) -> None:
        """An fp32 / fp16 IR against eager fp32 at ``sizes`` (:meth:`check_parity`), its block outputs read from the
        IR itself by the names of the ONNX graph it was converted from."""
        self.check_parity(
            out,
            report,
            source,
            session.run,
            dtype=dtype,
            sizes=sizes,
            runtime=runtime,
            files=[ir, ir.with_suffix(".bin")],
            divergence=lambda record: verify.block_divergence(
                source.model,
                onnx.load(str(onnx_path)),
                source.config,
                dtype,
                source.threads,
                record,
                values=lambda names, x: tensor_values(ir, names, x, threads=source.threads),
            ),
        )

    def _quantized(
        self, req: ExportRequest, source: ModelSource, fp32: Path, int8: Path, out: Path, report: dict[str, Any]
    ) -> _Quantized:
        """The verified int8 Q/DQ graph ``int8`` of the verified fp32 graph ``fp32``, made as ``export-model --dtype
        int8`` makes it (:func:`~attnzoo.export.quantize.quantize_verified`: calibration, the extra math kept
        fp32, the fidelity gate and the test-split score); its placement ``cpu`` unless asked. A graph that fails
        its gates refuses ``out`` with its failures."""
        config, q = source.config, req.quantize
        calibration = quantize.calibration_for(
            config,
            (source.hw[0], source.hw[1]),
            untrained=bool(config.get("untrained")),
            calibration_data=q.calibration_data,
            calibration_count=q.calibration_count,
            calibration_seed=q.calibration_seed,
            fidelity_count=q.fidelity_count,
        )
        for message in calibration.warnings:  # as export-model --dtype int8 warns
            warnings.warn(message, ExportWarning, stacklevel=2)
        options = q.with_calibration(calibration, threads=source.threads, fp32_kept=False)
        options = dataclasses.replace(options, placement=options.placement or quantize.CPU_QDQ_PLACEMENT)
        try:
            made = quantize.quantize_verified(fp32, int8, config, options)
        except ExportError as exc:  # its gates refused it: its failures, not a path into this temporary folder
            failed = verify.failed_report_path(int8)
            failures = json.loads(failed.read_text())["failures"] if failed.is_file() else [first_line(exc)]
            self.fail(out, report, [f"the int8 Q/DQ graph: {f}" for f in failures])
        fidelity, accuracy = made["fidelity"], made["accuracy"]
        summary = {
            "sha256": made["sha256"],
            "num_nodes": made["num_nodes"],
            "quantizer": f"{made['quantization']['quantizer']} {made['quantization']['quantizer_version']}",
            "placement": made["quantization"]["options"].get("placement"),
            "calibration": {k: made["quantization"]["calibration"].get(k) for k in ("source", "count", "seed")},
            "fidelity_worst_cosine": fidelity["cosine"]["min"],
            "min_cosine": fidelity["min_cosine"],
            "accuracy": accuracy.get("metrics"),
            "warnings": made["warnings"],
        }
        return _Quantized(made, calibration, summary, q.accept_accuracy_drop)

    def _check_int8(
        self,
        out: Path,
        report: dict[str, Any],
        session: Any,
        ir: Path,
        fp32: Path,
        int8: Path,
        quantized: _Quantized,
        config: dict[str, Any],
        runtime: str,
        threads: int | None,
    ) -> None:
        """An int8 IR against the gates its Q/DQ graph passed, run on OpenVINO itself: its worst output cosine to
        the fp32 graph on the held-out inputs (the same gate), and, for a model with a labelled test split, its
        own score there within the accuracy tolerance of fp32's; the per-block errors against the fp32 graph.
        A failed gate refuses ``out`` (:meth:`fail`)."""
        made, x = quantized.report, quantized.calibration.held_out
        gate = float(made["fidelity"]["min_cosine"])
        output = np.concatenate([session.run(x[i : i + EVAL_BATCH]) for i in range(0, len(x), EVAL_BATCH)])
        report["fidelity"] = fidelity = _int8_fidelity(
            quantize.onnx_outputs(fp32, x, threads), output, gate, config, made["fidelity"].get("source"), runtime
        )
        report["divergence"] = self._int8_divergence(
            ir, fp32, int8, config, x, gate or quantize.DEFAULT_MIN_COSINE, threads
        )
        report.update(file_size=ir.stat().st_size + ir.with_suffix(".bin").stat().st_size, sha256=sha256_file(ir))
        failures = [] if fidelity["within_gate"] else [fidelity.pop("failure")]
        measured = made["accuracy"]
        if not measured.get("metrics"):  # no labelled test split: what the Q/DQ graph's report says of it
            report["accuracy"] = {k: v for k, v in measured.items() if k in ("measured", "warning", "reason")}
        elif failures:
            report["accuracy"] = {"measured": False, "reason": "checks failed before scoring"}
        else:
            accept = bool(measured.get("accepted_drop") or quantized.accept_drop)
            report["accuracy"] = accuracy = _int8_accuracy(session.run, measured, config, runtime, accept)
            failures += [accuracy.pop("failure")] if "failure" in accuracy else []
        if failures:
            self.fail(out, report, failures)

    @staticmethod
    def _int8_divergence(
        ir: Path, fp32: Path, int8: Path, config: dict[str, Any], x: np.ndarray, min_cosine: float, threads: int | None
    ) -> dict[str, Any]:
        """The IR's block outputs against the fp32 graph's, tensor by tensor of the same names (the IR keeps the
        Q/DQ graph's names); a diagnosis that cannot run says why and never decides the export."""
        try:
            return divergence_vs_onnx(
                onnx.load(str(int8)),
                onnx.load(str(fp32)),
                config,
                x[:DIVERGENCE_INPUTS],
                min_cosine=min_cosine,
                threads=threads,
                values=lambda names, v: tensor_values(ir, names, v, threads=threads),
            )
        except Exception as exc:
            return not_exposed(f"block outputs could not be compared: {type(exc).__name__}: {exc}")

    def _convert(
        self,
        req: ExportRequest,
        onnx_path: Path,
        tmp: Path,
        props: dict[str, str],
        config: dict[str, Any],
        hw: tuple[int, int],
        source: ModelSource,
        out: Path,
        report: dict[str, Any],
    ) -> None:
        """Write the IR of ``onnx_path`` to ``tmp`` at ``req.dtype``; a write that found no room is a full disk
        (OpenVINO says only ``basic_ios::clear: iostream error``), not a graph OpenVINO refuses."""
        try:
            ovrt.save_ir(ovrt.read_onnx(onnx_path), tmp, compress_to_fp16=get_precision(req.dtype).half, metadata=props)
        except Exception as exc:  # OpenVINO's refusal, as one line
            full = no_space_problem(exc, tmp.parent, needed=onnx_path.stat().st_size)
            if full:
                raise DiskFullError(f"OpenVINO IR export failed: writing {out.name}: {full}") from None
            raise self._refused(out, report, "OpenVINO refuses the ONNX graph", exc) from None

    @staticmethod
    def _refused(out: Path, report: dict[str, Any], what: str, exc: BaseException) -> ConversionError:
        """The one-line error of a graph OpenVINO will not take (with the op OpenVINO names), its failed report
        written."""
        reason = ovrt.error_message(exc).split(": OpenVINO cannot read it: ")[-1]
        return ConversionError(record_failure(out, report, [f"{what}: {reason}"]))

    def files(self, result) -> list[Path]:
        return [result.path, result.path.with_suffix(".bin"), report_path(result.path)] if result.report else []

    def summary(self, result) -> list[str]:
        return summary(result.report, report_path(result.path)).splitlines() if result.report else []


def _report(out: Path, dtype: str, source: ModelSource, onnx_report: dict[str, Any]) -> dict[str, Any]:
    """The IR's report as it starts: the model, and the fp32 ONNX it is converted from (its verification report:
    ``passed`` false when that refused it)."""
    config = source.config
    return {
        "path": str(out),
        "format": "openvino",
        "variant": config["variant"],
        "task": config["task"],
        "arch": config["arch"],
        "dtype": dtype,
        "input_size": [source.hw[0], source.hw[1]],
        "trace_batch": TRACE_BATCH,
        "checkpoint_sha256": source.checkpoint_sha256,
        "source_onnx": {
            "sha256": onnx_report["sha256"],
            "export_time_s": onnx_report.get("export_time_s"),
            "opset": onnx_report["opset"],
            "num_nodes": onnx_report["num_nodes"],
            "parity_max_abs_err": onnx_report["parity"]["max_abs_err"],
            "passed": onnx_report["passed"],
        },
        "openvino": ovrt.version(),
    }


def _graph_failures(
    ir: Path, report: dict[str, Any], config: dict[str, Any], props: dict[str, str], dtype: str, checkpoint: str
) -> list[str]:
    """What the IR written at ``ir`` holds, into ``report`` (its ops, weights, extra math, batch dimension; an int8
    IR's FakeQuantize ops), and why it must not be run, one line each: extra math missing or not f32, a fixed batch,
    an int8 IR without FakeQuantize, a contract that does not come back whole from its ``rt_info``."""
    model = ovrt.read_onnx(ir)
    report.update(
        num_ops=len(model.get_ops()),
        op_histogram=_op_histogram(model),
        weight_types=_weight_types(model),
        extra_math=count_extra_math(model, config, float(props["eps"]) if props.get("eps") else None),
    )
    failures = list(report["extra_math"]["failures"])
    if dtype in QUANTIZED:
        report["fake_quantize_ops"] = report["op_histogram"].get("FakeQuantize", 0)
        if not report["fake_quantize_ops"]:
            failures.append("no FakeQuantize in the IR: OpenVINO dropped the int8 graph's Q/DQ pairs")
    dim = model.input(INPUT_NAME).get_partial_shape()[0]
    report["batch_dim"] = BATCH_DIM if dim.is_dynamic else dim.get_length()
    if not dim.is_dynamic:
        failures.append(f"input batch dimension is fixed ({dim.get_length()}), not dynamic")
    contract = ModelContract.from_onnx(ir)  # what serving reads: the contract must come back whole
    if contract.dtype != dtype or contract.checkpoint_sha256 != checkpoint:
        failures.append(f"rt_info contract reads dtype {contract.dtype!r}, checkpoint {contract.checkpoint_sha256!r}")
    return failures


def _int8_fidelity(
    reference: np.ndarray, output: np.ndarray, gate: float, config: dict[str, Any], source: Any, runtime: str
) -> dict[str, Any]:
    """An int8 IR's outputs against the fp32 graph's on the same held-out inputs, under the gate its Q/DQ graph
    passed (``failure``: the line refusing it, when below)."""
    fidelity = {
        **quantize.output_agreement(reference, output, config["task"]),
        "min_cosine": gate,
        "inputs": int(len(output)),
        "source": source,
        "reference": "the verified fp32 ONNX graph on ONNX Runtime",
        "runtime": runtime,
    }
    fidelity["within_gate"] = bool(fidelity["finite"] and fidelity["cosine"]["min"] >= gate)
    if not fidelity["within_gate"]:
        fidelity["failure"] = (
            f"worst output cosine to fp32 {fidelity['cosine']['min']:.4f} on {len(output)} held-out input(s) is "
            f"below the gate {gate:g} its Q/DQ graph passed"
        )
    return fidelity


def _int8_accuracy(
    run: Any, measured: dict[str, Any], config: dict[str, Any], runtime: str, accept: bool
) -> dict[str, Any]:
    """An int8 IR's own score on the test split its Q/DQ graph was scored on (``measured``: that graph's
    ``accuracy``, whose fp32 score on the same images is the reference), within the same tolerance unless the drop
    is accepted (``failure``: the line refusing it)."""
    ev = score_runs({"int8": run}, config, limit=measured.get("limit"))
    fp32_score, tol = float(measured["metrics"]["fp32"]), float(measured["tolerance"])
    drop = fp32_score - ev["metrics"]["int8"]
    accuracy = {
        **{k: v for k, v in ev.items() if k != "agreement"},
        "metrics": {"fp32": fp32_score, "int8": ev["metrics"]["int8"]},
        "fp32_from": "the fp32 graph's score on the same images (the Q/DQ graph's report)",
        "limit": measured.get("limit"),
        "drop": drop,
        "tolerance": tol,
        "within_tolerance": drop <= tol,
        "accepted_drop": bool(accept and drop > tol),
        "runtime": runtime,
    }
    if drop > tol and not accept:
        accuracy["failure"] = (
            f"{ev['metric_name']} {ev['metrics']['int8']:.2f} on OpenVINO is {drop:.2f} points below fp32's "
            f"{fp32_score:.2f} (tolerance {tol:g}); pass --accept-accuracy-drop to write it anyway"
        )
    return accuracy


def summary(report: dict[str, Any], path: Path | None = None) -> str:
    """A few lines for the terminal: the IR, its parity, the extra math per block, the verdict."""
    weights = ", ".join(f"{t} x{n}" for t, n in report["weight_types"].items()) or "none"
    head = (
        f"{report['path']}: {report['variant']} {report['task']} {report['arch']} {report['dtype']} OpenVINO IR "
        f"{report['openvino']}, {report['num_ops']} ops (weight constants {weights}), {report['file_size'] / 1e6:.2f} "
        f"MB .xml+.bin, ONNX export {report['source_onnx']['export_time_s'] or 0:.1f} s + convert "
        f"{report['convert_time_s']:.1f} s"
    )
    return summary_text(head, report, f"dynamic batch, traced at {report['trace_batch']}", path)


FORMAT = OpenVINOFormat()
