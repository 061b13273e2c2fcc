"""The TensorRT target's report: ``<engine>.json``, an engine's build, check and (where a GPU ran it) parity and
latency (``python -m attnzoo.runtime.schemas engine`` prints its JSON Schema)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from attnzoo.runtime.schemas import JsonReport

__all__ = ["EngineReport", "engine_report_path"]


@dataclass
class EngineReport(JsonReport):
    """``<engine>.json``: a TensorRT engine's build, check and (where a GPU ran it) parity and latency; also
    ``<engine>.failed.json`` of a build that was refused (then the build facts are ``None`` when it failed before
    them).

    Attributes:
        engine, onnx: The engine written (or refused) and the verified ONNX it was built from.
        variant, task, arch, dtype, input_size: The model (from the ONNX file's contract).
        status: ``built, not run`` or ``built and run`` (``not built`` when refused before the build).
        onnx_verification: The ONNX file's verification report, and whether it is still the file it verified.
        library, library_version: The TensorRT library that built it (TensorRT-RTX or TensorRT).
        ran_on_gpu, gpu: Whether it was run, and on which GPU.
        parity: Against ONNX Runtime on the CPU, per batch (``None`` when not run).
        latency: Its median and spread at the profile's ``opt`` batch (``None`` when not run).
        network_check: The extra math found in the parsed network, every op of it a fp32 layer (and in an int8 /
            fp8 network, what reads a DequantizeLinear).
        compute_capability, build_time_s, engine_size, profile, workspace_gb, tf32, require_user_allocation,
            timing_cache: The build's facts.
        not_run_reason: Why it was built but not run.
        engine_sha256: The SHA-256 of the engine's bytes as written (``None`` in a failed report, and in a report
            written before engines were hashed): the ``tensorrt`` backend loads an engine by path only when its bytes
            match it.
        metadata: The ONNX file's metadata (the model contract).
        passed, failures: Every check that ran passed (the engine was written); why not, one line each. With
            ``status`` ``built, not run`` that is the build and the network check alone: the engine was never
            executed, so ``passed`` says nothing of its outputs (``report-variant`` counts it as built, not run).
    """

    what: ClassVar[str] = "engine report"
    #: Every fact written, ``null`` when absent (a build refused before it, an engine not run).
    omit_none: ClassVar[tuple[str, ...]] = ()

    engine: str
    onnx: str
    variant: str
    task: str
    arch: str
    dtype: str
    input_size: list[int]
    status: str
    onnx_verification: dict[str, Any]
    library: str
    library_version: str
    ran_on_gpu: bool = False
    gpu: str | None = None
    parity: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    network_check: dict[str, Any] | None = None
    compute_capability: str | None = None
    build_time_s: float | None = None
    engine_size: int | None = None
    profile: dict[str, int] | None = None
    workspace_gb: float | None = None
    tf32: bool | None = None
    require_user_allocation: bool | None = None
    timing_cache: str | None = None
    not_run_reason: str | None = None
    engine_sha256: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    passed: bool = False
    failures: list[str] = field(default_factory=list)


def engine_report_path(engine_path: str | Path) -> Path:
    """``model.engine`` -> ``model.engine.json``."""
    return Path(str(engine_path) + ".json")
