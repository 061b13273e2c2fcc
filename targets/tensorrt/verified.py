"""TensorRT engines from a verified ONNX file, with a report beside every engine.

The work is done by :mod:`attnzoo.targets.tensorrt` (the one builder, shared with ``bench-latency`` and the
demo). This module adds what ``export-model --format tensorrt`` promises:

0. only an ONNX file whose verification report (``<model>.report.json``, written by the export's checks) is
   beside it, says it passed and names this file's SHA-256 is built: anything else is refused in one line and
   nothing is written (:func:`onnx_verification_error`);
1. the ONNX is parsed into a strongly typed network, and before building, every projection op of every block
   (and, in an fp16 graph, every LayerNorm and softmax) is checked to be a layer computing in fp32;
2. the engine is built: for the GPU present (``CURRENT``), or without a GPU ahead of time with TensorRT-RTX for
   ``compute_capability`` (default ``SM89``);
3. with a GPU, the engine runs and is compared with ONNX Runtime (CPU) on the same inputs, under the one
   tolerance table, and timed; without one the report says ``"built, not run"``;
4. the engine is written atomically, and only when every check passed, then its report ``<engine>.json``; a failed
   build writes ``<engine>.failed.json`` instead and leaves a good engine already there, and its report, untouched.
   Ctrl-C during the build (:mod:`attnzoo.targets.tensorrt`) writes nothing; during the writes, both are
   written, then it is acted on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from attnzoo.export.check import check_extra_math
from attnzoo.export.errors import ExportError
from attnzoo.export.verify import report_path
from attnzoo.fileio import atomic_write_bytes, atomic_write_text, sha256_file
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.contract import ModelContract
from attnzoo.runtime.parity import compare
from attnzoo.runtime.precision import get_precision
from attnzoo.signals import signals_deferred

from . import builder, library
from .backend import TENSORRT
from .options import compute_capability_error
from .schema import EngineReport, engine_report_path

__all__ = [
    "tensorrt_unavailable_reason",
    "build_engine",
    "engine_report_path",
    "failed_engine_report_path",
    "network_check",
    "dequantized_layers",
    "EngineBuildError",
    "onnx_verification_error",
    "STATUS_BUILT",
    "STATUS_RUN",
]

STATUS_BUILT = "built, not run"
STATUS_RUN = "built and run"


def tensorrt_unavailable_reason(run: bool = False) -> str | None:
    """Why engines cannot be built (``run``: built and run) here; ``None`` when they can."""
    return library.unavailable_reason(run=run)


def failed_engine_report_path(engine_path: str | Path) -> Path:
    """``model.engine`` -> ``model.engine.failed.json``: the report of a build that failed, kept apart so that a
    good engine already there keeps its own report."""
    return Path(str(engine_path) + ".failed.json")


#: Layer types that move values without computing on them (followed from a DEQUANTIZE layer to its readers).
_LAYOUT_LAYERS = ("SHUFFLE", "SQUEEZE", "UNSQUEEZE")


def dequantized_layers(network: Any, layer_types: Sequence[str] = ("MATRIX_MULTIPLY", "CONVOLUTION")) -> dict[str, Any]:
    """Layers of ``layer_types`` that read a ``DEQUANTIZE`` layer's output (directly or through shuffles): the
    ones TensorRT runs quantized in an explicitly quantized (Q/DQ) network.

    Returns:
        ``{"quantize_layers", "dequantize_layers", "fed_by_dequantize": {type: [layer names]},
        "not_fed": {type: [layer names]}}``.
    """
    producer: dict[str, Any] = {}
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    for layer in layers:
        for j in range(layer.num_outputs):
            producer[layer.get_output(j).name] = layer

    def from_dq(tensor: Any) -> bool:
        p = producer.get(tensor.name) if tensor is not None else None
        while p is not None and p.type.name in _LAYOUT_LAYERS:
            src = p.get_input(0)
            p = producer.get(src.name) if src is not None else None
        return p is not None and p.type.name == "DEQUANTIZE"

    fed: dict[str, list[str]] = {t: [] for t in layer_types}
    not_fed: dict[str, list[str]] = {t: [] for t in layer_types}
    counts: Counter = Counter(layer.type.name for layer in layers)
    for layer in layers:
        kind = layer.type.name
        if kind in fed:
            inputs = [layer.get_input(j) for j in range(layer.num_inputs)]
            (fed if any(from_dq(t) for t in inputs) else not_fed)[kind].append(layer.name)
    return {
        "quantize_layers": counts["QUANTIZE"],
        "dequantize_layers": counts["DEQUANTIZE"],
        "fed_by_dequantize": fed,
        "not_fed": not_fed,
    }


def network_check(parsed: builder.ParsedNetwork, onnx_path: str | Path, contract: ModelContract) -> dict[str, Any]:
    """Projection ops of every block (and, in fp16, LayerNorm/softmax) present in the network and fp32.

    Read from the parsed ``INetworkDefinition`` before building. Blocks are the ones the ONNX extra-math
    checker found (which itself fails when one is missing).
    """
    proto = onnx.load(str(onnx_path), load_external_data=False)
    onnx_check = check_extra_math(proto, contract.config, contract.dtype)
    scopes = {scope: found["nodes"] for scope, found in onnx_check["blocks"].items()}
    op_types = {n.name: n.op_type for n in proto.graph.node}
    precision = get_precision(contract.dtype)
    if precision.fp32_ops:
        scopes[f"fp32 ops of the {precision.name} graph"] = [
            n.name for n in proto.graph.node if n.op_type in precision.fp32_ops
        ]
    result = builder.check_network_precision(parsed.network, scopes, op_types)
    if not onnx_check["ok"]:
        result["failures"] = [f"ONNX: {f}" for f in onnx_check["failures"]] + result["failures"]
        result["ok"] = False
    result["extra_math_scopes"] = len(onnx_check["blocks"])  # extra-math scopes checked, all blocks
    result["extra_scopes"] = sorted({scope.split(".attn.", 1)[1] for scope in onnx_check["blocks"]})
    if precision.quantized:
        _quantized_check(parsed, contract, scopes, result)
    return result


def _quantized_check(
    parsed: builder.ParsedNetwork, contract: ModelContract, scopes: dict[str, list[str]], result: dict[str, Any]
) -> None:
    """A Q/DQ network: which MatMuls/convolutions read a DEQUANTIZE layer (some must), and, unless the export
    quantized the extra math on purpose, that no extra-math layer does."""
    q = dequantized_layers(
        parsed.network, ("MATRIX_MULTIPLY", "CONVOLUTION", *sorted(set(builder._LAYER_OF_OP.values())))
    )
    meta = json.loads(contract.props.get("quantization") or "{}")
    extra = {name for names in scopes.values() for name in names}
    in_extra = sorted(extra.intersection(name for names in q["fed_by_dequantize"].values() for name in names))
    result["quantized"] = {
        "quantize_layers": q["quantize_layers"],
        "dequantize_layers": q["dequantize_layers"],
        "matmuls_fed_by_dequantize": q["fed_by_dequantize"]["MATRIX_MULTIPLY"],
        "matmuls_not_quantized": q["not_fed"]["MATRIX_MULTIPLY"],
        "convolutions_fed_by_dequantize": len(q["fed_by_dequantize"]["CONVOLUTION"]),
        "extra_math_layers_fed_by_dequantize": in_extra,
        "extra_math_quantized_on_purpose": bool(meta.get("quantize_extra_math")),
    }
    if not q["fed_by_dequantize"]["MATRIX_MULTIPLY"] and not q["fed_by_dequantize"]["CONVOLUTION"]:
        result["failures"].append(f"{contract.dtype} network: no MatMul or convolution reads a DequantizeLinear")
    if in_extra and not meta.get("quantize_extra_math"):
        result["failures"].append(f"{len(in_extra)} extra-math layer(s) read a DequantizeLinear, e.g. {in_extra[0]}")
    result["ok"] = not result["failures"]


class EngineBuildError(ExportError):
    """An engine failed its network check, build or parity check; it was not saved (its failed report was)."""


def _onnx_verification(onnx_path: Path) -> dict[str, Any]:
    """What the ONNX verification (``<model>.report.json``) found, and whether the file is still the one it
    verified (``error``: why not, else ``None``)."""
    sha = sha256_file(onnx_path)
    rp = report_path(onnx_path)
    how = "export it with export-model (or attnzoo.export.export_model), which verifies it and writes the report"
    try:
        rep = json.loads(rp.read_text())
    except FileNotFoundError:
        return {
            "report": None,
            "verified": False,
            "onnx_sha256": sha,
            "error": f"{onnx_path.name} has no verification report ({rp.name} beside it); {how}",
        }
    except (OSError, ValueError) as exc:
        return {
            "report": str(rp),
            "verified": False,
            "onnx_sha256": sha,
            "error": f"{rp.name} is unreadable ({type(exc).__name__}); {how}",
        }
    rep = rep if isinstance(rep, dict) else {}
    error = None
    if not rep.get("passed"):
        error = f"{rp.name} says {onnx_path.name} failed its verification; fix the export first"
    elif rep.get("sha256") != sha:
        error = (
            f"{onnx_path.name} is not the file {rp.name} verified (SHA-256 {sha[:12]}..., the report's "
            f"{str(rep.get('sha256'))[:12]}...); {how}"
        )
    parity = rep.get("parity") or rep.get("fp32_source", {}).get("report", {}).get("parity") or {}
    return {
        "report": str(rp),
        "verified": error is None,
        "error": error,
        "onnx_sha256": sha,
        "passed": rep.get("passed"),
        "max_abs_err_vs_eager": parity.get("max_abs_err"),
        "dtype": rep.get("dtype"),
        "batch_sizes": parity.get("batch_sizes"),
    }


def onnx_verification_error(onnx_path: str | Path) -> str | None:
    """Why an engine must not be built from ``onnx_path`` (one line), or ``None``: its verification report is
    missing, unreadable, failed, or verified another file (SHA-256)."""
    return _onnx_verification(Path(onnx_path))["error"]


def build_engine(
    onnx_path: str | Path,
    engine_path: str | Path,
    *,
    batch_sizes: Sequence[int] = (1, 8),
    compute_capability: str | None = None,
    workspace_gb: float = 2.0,
    timing_cache: str | Path | None = None,
    seed: int = 0,
    run: bool | None = None,
) -> EngineReport:
    """Check, build, (run and compare,) then save an engine; returns the report (also ``<engine>.json``).

    Args:
        onnx_path: ONNX file written by :func:`attnzoo.export.export_verified`.
        engine_path: Output ``.engine`` file (written only when every check passes).
        batch_sizes: The profile spans min..max of these; ``opt`` is their median.
        compute_capability: See :func:`attnzoo.targets.tensorrt.build` (default: the GPU, else ``SM89``).
        workspace_gb: Workspace memory-pool limit.
        timing_cache: Timing-cache file (TensorRT proper; default beside the engine); TensorRT-RTX has none.
        seed: Seed of the random check inputs.
        run: Run and compare the engine (default: when a GPU is present and the engine targets it).

    Raises:
        attnzoo.targets.tensorrt.TensorRTUnavailable: no usable TensorRT library.
        ValueError: the ONNX file is not verified (no report beside it, a failed one, or one of another file:
            nothing is written), a bad compute capability / batch sizes, or the file is not an attnzoo export.
        EngineBuildError: network-check or parity failure (the failed report says which).
        TensorRTError: parse or build failure.
    """
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    verification = _onnx_verification(onnx_path)
    if verification["error"]:
        raise ValueError(f"no engine built: {verification['error']}")
    contract = ModelContract.from_onnx(onnx_path)
    error = compute_capability_error(get_precision(contract.dtype), compute_capability)
    if error:
        raise ValueError(error)
    lib = library.load_library()
    parsed = builder.parse_onnx(onnx_path, lib)
    net = network_check(parsed, onnx_path, contract)
    report = EngineReport(
        engine=str(engine_path),
        onnx=str(onnx_path),
        variant=contract.variant,
        task=contract.task,
        arch=contract.arch,
        dtype=contract.dtype,
        input_size=list(contract.input_size),
        status="not built",
        onnx_verification=verification,
        library=lib.name,
        library_version=lib.version,
        network_check=net,
        metadata=dict(contract.props),
    )
    failures = [f"network: {f}" for f in net["failures"]]
    if not failures:
        options = {
            "batch_sizes": batch_sizes,
            "input_hw": contract.input_size,
            "compute_capability": compute_capability,
            "workspace_gb": workspace_gb,
            "parsed": parsed,
            "timing_cache": timing_cache or engine_path.parent / "tensorrt_timing.cache",
        }
        built, report = _build(onnx_path, engine_path, report, options)
        failures += _run_if_asked(built, contract, onnx_path, seed, report, run)
    report.passed, report.failures = not failures, failures
    if failures:
        atomic_write_text(failed_engine_report_path(engine_path), report.to_json())
        raise EngineBuildError(
            f"{'; '.join(failures[:3])}; engine not saved (see {failed_engine_report_path(engine_path)})"
        )
    report.engine_sha256 = hashlib.sha256(built.blob).hexdigest()  # what a load by path checks its bytes against
    with signals_deferred():  # the engine and its report are written together (a signal is raised after both)
        atomic_write_bytes(engine_path, built.blob)
        atomic_write_text(engine_report_path(engine_path), report.to_json())
        failed_engine_report_path(engine_path).unlink(missing_ok=True)  # a stale failure describes nothing now
    return report


def _build(
    onnx_path: Path, engine_path: Path, report: EngineReport, options: dict[str, Any]
) -> tuple[builder.Built, EngineReport]:
    """The engine built with ``options`` (:func:`attnzoo.targets.tensorrt.build`) and ``report`` with its facts;
    a build failure writes the failed report and raises."""
    try:
        built = builder.build(onnx_path, **options)
    except library.TensorRTError as exc:
        report.failures = [f"build: {exc}"]
        atomic_write_text(failed_engine_report_path(engine_path), report.to_json())
        raise
    return built, dataclasses.replace(report, **built.facts())


def _run_if_asked(
    built: builder.Built, contract: ModelContract, onnx_path: Path, seed: int, report: EngineReport, run: bool | None
) -> list[str]:
    """Run and compare the engine when asked (default: a GPU is present and the engine targets it); the report's
    status says whether it ran, and why not. Returns the parity failures."""
    gpu = library.gpu_available()
    failures = []
    if (gpu and built.compute_capability == "CURRENT") if run is None else run:
        failures = _run_and_compare(built, contract, onnx_path, seed, report)
    report.status = STATUS_RUN if report.ran_on_gpu else STATUS_BUILT
    if not report.ran_on_gpu:
        report.not_run_reason = (
            "no GPU on this machine: the engine was built ahead of time for "
            f"{built.compute_capability} and never executed; parity and latency not "
            "measured"
            if not gpu
            else f"built for {built.compute_capability}, not for the GPU present (CURRENT); not executed here"
        )
    return failures


def _run_and_compare(
    built: builder.Built, contract: ModelContract, onnx_path: Path, seed: int, report: EngineReport
) -> list:
    """Run the engine on the profile's smallest and largest batch; compare with ONNX Runtime CPU; time it. Both
    sessions are closed after it."""
    precision = get_precision(contract.dtype)
    reference: Path | bytes = onnx_path
    if precision.ort_simulated:  # ONNX Runtime's CPU provider cannot run the graph itself: its exact simulation
        reference = precision.ort_graph(onnx.load(str(onnx_path))).SerializeToString()
    with TENSORRT.open_built(built) as engine, onnx_reference().session(reference) as session:
        # a Q/DQ engine against ONNX Runtime's Q/DQ graph: kernels may round differently (the precision's parity key)
        tol_dtype = precision.parity_key
        rng = np.random.default_rng(seed)
        failures, rows = [], []
        for batch in sorted({built.profile["min"], built.profile["max"]}):
            x = rng.standard_normal(contract.input_shape(batch)).astype(np.float32)
            ref = session.run(x)
            c = compare(engine.run(x), ref, tol_dtype)  # TF32 is off in the engine: fp32 is compared as fp32
            rows.append({"batch": batch, **c})
            if not c["passed"]:
                failures.append(
                    f"parity: batch {batch}: error {c['error']:.3g} > {c['tolerance']:g} "
                    f"(x max(1, max|logit|)) against ONNX Runtime"
                )
        x = rng.standard_normal(contract.input_shape(built.profile["opt"])).astype(np.float32)
        report.ran_on_gpu, report.gpu = True, torch.cuda.get_device_name(0)
        report.parity = {"reference": "onnxruntime CPUExecutionProvider", "per_batch": rows, "passed": not failures}
        report.latency = engine.latency_ms(x)
        return failures


def summary(report: EngineReport) -> str:
    """Lines for the terminal: what was built, for what, and whether it ran."""
    net = report.network_check or {}
    kept = get_precision(report.dtype).fp32_ops
    also = f" (and {'/'.join(kept)})" if kept else ""
    lines = [
        f"{report.engine}: {report.library} {report.library_version} engine for "
        f"{report.compute_capability}, profile {report.profile}, built in {report.build_time_s or 0:.1f} s, "
        f"{(report.engine_size or 0) / 1e6:.2f} MB",
        f"  network check: {net.get('extra_math_scopes')} extra-math scope(s) "
        f"({', '.join(net.get('extra_scopes', [])) or 'none'} in every block), every "
        f"op of them a fp32 layer{also}",
    ]
    quantized = net.get("quantized")
    if quantized:
        n_mm = len(quantized["matmuls_fed_by_dequantize"])
        lines.append(
            f"  {report.dtype} Q/DQ: {n_mm} MatMul(s) and {quantized['convolutions_fed_by_dequantize']} "
            f"convolution(s) read a DequantizeLinear; not quantized: "
            f"{', '.join(quantized['matmuls_not_quantized']) or 'none'}; extra-math layers reading one: "
            f"{len(quantized['extra_math_layers_fed_by_dequantize'])}"
        )
    if report.ran_on_gpu and report.parity and report.latency:
        worst = max(r["error"] for r in report.parity["per_batch"])
        lines.append(
            f"  ran on {report.gpu}: parity vs ONNX Runtime {worst:.2e}, latency "
            f"{report.latency['median_ms']:.3f} ms at batch {report.latency['batch']}"
        )
    else:
        lines.append(f"  BUILT, NOT RUN: {report.not_run_reason}")
    return "\n".join(lines)


__all__.append("summary")
