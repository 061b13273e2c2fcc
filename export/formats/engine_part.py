"""The TensorRT engine as a part that formats compose: ``--format tensorrt`` writes it beside the verified ONNX,
``--format triton --triton-platform tensorrt`` into the model's version folder. The formats call this part, not
each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..tensorrt import build_engine, engine_report_path
from ..tensorrt import summary as engine_summary
from .base import ExportRequest, run_step

__all__ = ["build", "files", "summary"]


def build(req: ExportRequest, result: Any, engine: Path) -> None:
    """Build ``engine`` from ``result.onnx_path`` (checked, and compared with ONNX Runtime on a GPU); the engine
    and its report go into ``result``."""
    result.engine_path = engine
    result.engine_report = run_step(
        build_engine,
        "TensorRT build failed",
        result.onnx_path,
        engine,
        batch_sizes=req.batch_sizes,
        compute_capability=req.compute_capability,
    )


def files(result: Any) -> list[Path]:
    """The engine and its report, once built."""
    if result.engine_path is None:
        return []
    return [result.engine_path, engine_report_path(result.engine_path)]


def summary(result: Any) -> list[str]:
    """The engine's lines for the terminal, once built."""
    if result.engine_report is None:
        return []
    return [engine_summary(result.engine_report), f"  report: {engine_report_path(result.engine_path)}"]
