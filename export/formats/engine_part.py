"""The TensorRT engine as a part that formats compose: ``--format tensorrt`` writes it beside the verified ONNX,
``--format triton --triton-platform tensorrt`` into the model's version folder. The formats call this part, not
each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnzoo.runtime.reports import EngineReport

from ..tensorrt import build_engine, engine_report_path
from ..tensorrt import summary as engine_summary
from .base import ExportRequest, run_step

__all__ = ["EngineOutput", "build", "files", "summary"]


@dataclass(frozen=True)
class EngineOutput:
    """What the part wrote: the engine and its report (``<engine>.json``, :func:`engine_report_path`)."""

    path: Path
    report: EngineReport


def build(req: ExportRequest, result: Any, engine: Path) -> None:
    """Build ``engine`` from ``result.onnx_path`` (checked, and compared with ONNX Runtime on a GPU); the engine
    and its report go into ``result.parts`` (an :class:`EngineOutput`)."""
    report = run_step(
        build_engine,
        "TensorRT build failed",
        result.onnx_path,
        engine,
        batch_sizes=req.batch_sizes,
        compute_capability=req.compute_capability,
    )
    result.parts.append(EngineOutput(engine, report))


def files(result: Any) -> list[Path]:
    """The engine and its report, once built."""
    built = result.part(EngineOutput)
    return [] if built is None else [built.path, engine_report_path(built.path)]


def summary(result: Any) -> list[str]:
    """The engine's lines for the terminal, once built."""
    built = result.part(EngineOutput)
    return [] if built is None else [engine_summary(built.report), f"  report: {engine_report_path(built.path)}"]
