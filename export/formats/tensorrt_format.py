"""``--format tensorrt``: a TensorRT engine built from the verified ONNX, which is written beside it, with the
engine's report (:mod:`attnzoo.export.tensorrt`)."""

from __future__ import annotations

from pathlib import Path

from attnzoo.errors import UsageError
from attnzoo.runtime.tensorrt import gpu_available

from ..tensorrt import tensorrt_unavailable_reason
from . import engine_part
from .base import ExportFormat, ExportRequest, Step

__all__ = ["TensorRTFormat", "FORMAT"]


class TensorRTFormat(ExportFormat):
    """``model.engine`` (or ``.plan``) and its report ``model.engine.json``, the ONNX as ``model.onnx``."""

    name = "tensorrt"
    title = "TensorRT engine"
    suffixes = (".engine", ".plan")
    builds_engine = True

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
        return [("tensorrt", lambda req, result: engine_part.build(req, result, result.path))]

    def files(self, result) -> list[Path]:
        return engine_part.files(result)

    def summary(self, result) -> list[str]:
        return engine_part.summary(result)


FORMAT = TensorRTFormat()
