"""``--format tensorrt``: a TensorRT engine built from the verified ONNX, which is written beside it, with the
engine's report (:mod:`attnzoo.export.tensorrt`)."""

from __future__ import annotations

from pathlib import Path

from attnzoo.errors import UsageError
from attnzoo.runtime.tensorrt import gpu_available

from ..tensorrt import build_engine, engine_report_path, tensorrt_unavailable_reason
from ..tensorrt import summary as engine_summary
from .base import ExportFormat, ExportRequest, Step, run_step

__all__ = ["TensorRTFormat", "FORMAT"]


class TensorRTFormat(ExportFormat):
    """``model.engine`` (or ``.plan``) and its report ``model.engine.json``, the ONNX as ``model.onnx``."""

    name = "tensorrt"
    title = "TensorRT engine"
    suffixes = (".engine", ".plan")

    def check(self, req: ExportRequest) -> None:
        reason = tensorrt_unavailable_reason(run=False)  # building needs no GPU with tensorrt-rtx
        if reason:
            raise UsageError(f"--format tensorrt: {reason}")
        if req.compute_capability == "CURRENT" and not gpu_available():
            raise UsageError(
                "--compute-capability CURRENT needs a GPU and none is visible; name one to build ahead "
                "of time (e.g. SM89)"
            )

    def mismatch(self, out: Path, implied: ExportFormat) -> str:
        return (
            f"with --format tensorrt, --out names the engine file (e.g. {out.with_suffix('.engine')}); the "
            "verified ONNX is written beside it"
        )

    def steps(self, req: ExportRequest) -> list[Step]:
        return [("tensorrt", lambda req, result: self.build(req, result, result.path))]

    def build(self, req: ExportRequest, result, engine: Path) -> None:
        """Build ``engine`` from ``result.onnx_path`` (checked, and compared with ONNX Runtime on a GPU); the
        engine and its report go into ``result``."""
        result.engine_path = engine
        result.engine_report = run_step(
            build_engine,
            "TensorRT build failed",
            result.onnx_path,
            engine,
            batch_sizes=req.batch_sizes,
            compute_capability=req.compute_capability,
        )

    def files(self, result) -> list[Path]:
        if result.engine_path is None:
            return []
        return [result.engine_path, engine_report_path(result.engine_path)]

    def summary(self, result) -> list[str]:
        if result.engine_report is None:
            return []
        return [engine_summary(result.engine_report), f"  report: {engine_report_path(result.engine_path)}"]


FORMAT = TensorRTFormat()
