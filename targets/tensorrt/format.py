"""``--format tensorrt``: a TensorRT engine built from the verified ONNX, which is written beside it, with the
engine's report (:mod:`.verified`); the engine is the step :mod:`.engine_step`, which Triton's folder composes too."""

from __future__ import annotations

from pathlib import Path

from attnzoo.export.formats import ExportFormat, ExportRequest, Step

from . import engine_step
from .options import COMPUTE_CAPABILITY

__all__ = ["TensorRTFormat", "FORMAT"]


class TensorRTFormat(ExportFormat):
    """``model.engine`` (or ``.plan``) and its report ``model.engine.json``, the ONNX as ``model.onnx``."""

    name = "tensorrt"
    title = "TensorRT engine"
    suffixes = (".engine", ".plan")
    builds_engine = True
    options = (COMPUTE_CAPABILITY,)

    def check(self, req: ExportRequest) -> None:
        engine_step.check_build(req, "--format tensorrt")

    def mismatch(self, out: Path, implied: ExportFormat) -> str:
        return (
            f"with --format tensorrt, --out names the engine file (e.g. {out.with_suffix('.engine')}); the "
            "verified ONNX is written beside it"
        )

    def steps(self, req: ExportRequest) -> list[Step]:
        return [("tensorrt", lambda req, result: engine_step.build_step(req, result, result.path))]

    def files(self, result) -> list[Path]:
        return engine_step.files(result)

    def summary(self, result) -> list[str]:
        return engine_step.summary(result)


FORMAT = TensorRTFormat()
