"""``--format openvino``: an OpenVINO IR (``model.xml`` + ``model.bin``) converted from the verified ONNX, what the
``openvino`` backend (``bench-latency --backends openvino``) and its :class:`~.backend.OpenVINOSession` read natively.

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
  ``<blocks>.N.attn.<scope>/...`` are counted (:func:`.checks.count_extra_math`) with the op counts a scope declares
  (the projection's ``Multiply`` x3, ``ReduceSum`` x2, ``Add`` of eps, ``Divide``, ``Subtract``), each computing in f32,
  none reading a FakeQuantize;
- the batch dimension must stay dynamic, and the IR must run in the ``openvino`` backend and match eager fp32
  PyTorch on real and random inputs at the requested batch sizes and
  :data:`attnzoo.export.verify.EXTRA_BATCH_SIZES` (the ONNX was traced at batch 2), under the tolerance of its
  precision (:data:`attnzoo.runtime.parity.TOLERANCES`: ``fp32``, ``fp16``); an int8 IR, the gates above
  (:mod:`.checks` holds the graph's checks and the int8 gates).

Only an IR that passes is renamed to ``--out`` (its ``.bin`` first, the ``.xml`` last), with its report
``<out>.json``; one that fails, or that OpenVINO refuses to read or compile (the op and OpenVINO's reason in one
line), leaves ``--out`` as it was and writes ``<out>.failed.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from attnzoo.errors import UsageError, first_line
from attnzoo.export import quantize, verify
from attnzoo.export.divergence import DIVERGENCE_INPUTS, divergence_vs_onnx, not_exposed
from attnzoo.export.errors import DiskFullError, ExportError, ExportWarning
from attnzoo.export.formats.base import (
    ExportFormat,
    ExportRequest,
    ModelSource,
    keep_report,
    record_failure,
    report_path,
    run_step,
    summary_text,
)
from attnzoo.export.verify import VerificationError, checked_batch_sizes
from attnzoo.fileio import no_space_problem, sha256_file, temporary_folder
from attnzoo.runtime.backends import get_backend
from attnzoo.runtime.contract import metadata_props
from attnzoo.runtime.evaluate import EVAL_BATCH
from attnzoo.runtime.precision import QUANTIZED, get_precision
from attnzoo.runtime.sessions import IR_SUFFIX

from . import library as ovrt  # patched there by tests
from .backend import tensor_values
from .checks import ONNX_TO_OV, _graph_failures, _int8_accuracy, _int8_fidelity, count_extra_math

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
#: The batch the ONNX is traced at (:func:`attnzoo.export.onnx_export.export_onnx`), never verified.
TRACE_BATCH = 2


class ConversionError(VerificationError):
    """OpenVINO refused the graph (an op its ONNX front end or its CPU plugin does not take)."""


class OpenVINOFormat(ExportFormat):
    """``model.xml`` + ``model.bin``, an OpenVINO IR verified against eager PyTorch, and its report
    ``model.xml.json``."""

    name = "openvino"
    title = "OpenVINO IR"
    suffixes = (IR_SUFFIX,)
    from_model = True
    in_variant_report = "quick"

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
