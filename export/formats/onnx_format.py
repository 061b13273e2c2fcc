"""``--format onnx``: the verified ONNX file itself (:mod:`attnzoo.export.onnx_export`, checked by
:mod:`attnzoo.export.verify`); nothing is written after it."""

from __future__ import annotations

from pathlib import Path

from .base import ExportFormat, ExportRequest

__all__ = ["OnnxFormat", "FORMAT"]


class OnnxFormat(ExportFormat):
    """The output is the verified ``.onnx`` file and its report."""

    name = "onnx"
    title = "ONNX"
    suffixes = (".onnx",)

    def onnx_path(self, req: ExportRequest, out: Path) -> Path:
        return out


FORMAT = OnnxFormat()
