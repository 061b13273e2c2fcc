"""The TensorRT engine as a step that formats compose: ``--format tensorrt`` writes it beside the verified ONNX,
``--format triton --triton-platform tensorrt`` into the model's version folder. The formats call this step, not
each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnzoo.errors import UsageError
from attnzoo.export.formats import ExportRequest, run_step

from .options import COMPUTE_CAPABILITY, check_compute_capability
from .schema import EngineReport
from .verified import build_engine, engine_report_path, tensorrt_unavailable_reason
from .verified import summary as engine_summary

__all__ = ["EngineOutput", "build_step", "files", "summary", "check_build"]


@dataclass(frozen=True)
class EngineOutput:
    """What the engine step wrote: the engine and its report (``<engine>.json``, :func:`engine_report_path`)."""

    path: Path
    report: EngineReport


def build_step(req: ExportRequest, result: Any, engine: Path) -> None:
    """Build ``engine`` from ``result.onnx_path`` (checked, and compared with ONNX Runtime on a GPU); the engine
    and its report go into ``result.parts`` (an :class:`EngineOutput`)."""
    report = run_step(
        build_engine,
        "TensorRT build failed",
        result.onnx_path,
        engine,
        batch_sizes=req.batch_sizes,
        compute_capability=req.option(COMPUTE_CAPABILITY),
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


def check_build(req: ExportRequest, what: str) -> None:
    """Refuse an engine build that cannot work here (``what``: the flag that asked for it), before any work:
    no TensorRT library, or a target no engine of the precision can be built for."""
    reason = tensorrt_unavailable_reason(run=False)  # building needs no GPU with tensorrt-rtx
    if reason:
        raise UsageError(f"{what}: {reason}")
    check_compute_capability(req.option(COMPUTE_CAPABILITY), req.dtype)
