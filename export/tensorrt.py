"""TensorRT engines from a verified ONNX file (TensorRT 10 and 11 Python API).

Strongly typed network (precision comes from the graph: an fp16 export gives fp16 layers with fp32
LayerNorm, softmax and projection), ``OnnxParser``, one optimization profile over the batch dimension
(min/opt/max from the requested batch sizes), a workspace memory-pool limit and a timing cache on disk. The
engine is run once and compared with ONNX Runtime before it is saved.

Needs the ``tensorrt`` package (NVIDIA's wheels: ``pip install tensorrt-cu12``) and an NVIDIA GPU; without
them every entry point raises :class:`TensorRTUnavailable` naming the install command. Device buffers are
torch CUDA tensors, so no pycuda / cuda-python is needed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

import numpy as np
import torch

from attnzoo.fileio import atomic_write_bytes

from .onnx_export import INPUT_NAME, OUTPUT_NAME, make_session, metadata_props

__all__ = ["INSTALL_HINT", "TensorRTUnavailable", "tensorrt_unavailable_reason", "build_engine", "run_engine",
           "load_engine", "engine_report_path", "profile_batches"]

INSTALL_HINT = "pip install 'tensorrt-cu12>=10' (NVIDIA's wheels; needs an NVIDIA GPU and driver)"
#: fp32 engine vs ONNX Runtime (TF32 is disabled for fp32 engines); fp16: relative to max |logit|.
TRT_FP32_ATOL = 1e-3
TRT_FP16_RTOL = 1e-2


class TensorRTUnavailable(RuntimeError):
    """TensorRT or a CUDA GPU is missing."""


def tensorrt_unavailable_reason() -> Optional[str]:
    """Why engines cannot be built here (``None`` when they can)."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return f"the tensorrt Python package is not installed; install it with: {INSTALL_HINT}"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False); TensorRT engines need an NVIDIA GPU"
    return None


def _require():
    reason = tensorrt_unavailable_reason()
    if reason:
        raise TensorRTUnavailable(reason)
    import tensorrt as trt

    return trt


def engine_report_path(engine_path: Union[str, Path]) -> Path:
    """``model.engine`` -> ``model.engine.json`` (build report + the ONNX metadata)."""
    return Path(str(engine_path) + ".json")


def profile_batches(batch_sizes: Sequence[int]) -> tuple:
    """(min, opt, max) batch of the optimization profile: opt is the median requested size."""
    sizes = sorted(set(int(b) for b in batch_sizes))
    return sizes[0], sizes[len(sizes) // 2], sizes[-1]


def _build(trt, onnx_path: Path, hw: Sequence[int], batch_sizes: Sequence[int], workspace_bytes: int,
           timing_cache: Path, fp32: bool) -> bytes:
    """Parse the ONNX into a strongly typed network and build a serialized engine."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)  # always on in TensorRT 11
    network = builder.create_network(0 if flag is None else 1 << int(flag))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    if fp32 and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # compare fp32 with fp32, not TF32 matmuls
    cache = config.create_timing_cache(timing_cache.read_bytes() if timing_cache.is_file() else b"")
    config.set_timing_cache(cache, False)
    lo, opt, hi = profile_batches(batch_sizes)
    profile = builder.create_optimization_profile()
    profile.set_shape(INPUT_NAME, (lo, 3, *hw), (opt, 3, *hw), (hi, 3, *hw))
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"TensorRT failed to build an engine from {onnx_path} (see the log above)")
    atomic_write_bytes(timing_cache, bytes(config.get_timing_cache().serialize()))
    return bytes(serialized)


def load_engine(data: Union[bytes, str, Path]):
    """Deserialize an engine (bytes or a file)."""
    trt = _require()
    blob = data if isinstance(data, (bytes, bytearray)) else Path(data).read_bytes()
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(blob)
    if engine is None:
        raise RuntimeError("TensorRT could not deserialize the engine (built by another TensorRT version?)")
    return engine


def run_engine(engine, x: np.ndarray, context=None) -> np.ndarray:
    """Run ``engine`` on one float32 NCHW batch (torch CUDA tensors as device buffers)."""
    trt = _require()
    context = context or engine.create_execution_context()
    dtype_in = torch.from_numpy(np.zeros(0, trt.nptype(engine.get_tensor_dtype(INPUT_NAME)))).dtype
    dtype_out = torch.from_numpy(np.zeros(0, trt.nptype(engine.get_tensor_dtype(OUTPUT_NAME)))).dtype
    inp = torch.from_numpy(np.ascontiguousarray(x)).to("cuda", dtype_in)
    context.set_input_shape(INPUT_NAME, tuple(inp.shape))
    out = torch.empty(tuple(context.get_tensor_shape(OUTPUT_NAME)), dtype=dtype_out, device="cuda")
    context.set_tensor_address(INPUT_NAME, inp.data_ptr())
    context.set_tensor_address(OUTPUT_NAME, out.data_ptr())
    stream = torch.cuda.current_stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("TensorRT execution failed")
    stream.synchronize()
    return out.float().cpu().numpy()


def build_engine(onnx_path: Union[str, Path], engine_path: Union[str, Path], *, batch_sizes: Sequence[int] = (1, 8),
                 workspace_gb: float = 2.0, timing_cache: Optional[Union[str, Path]] = None,
                 seed: int = 0) -> Dict[str, Any]:
    """Build an engine from a verified ONNX file, check it against ONNX Runtime, then save it.

    Args:
        onnx_path: ONNX file written by :func:`attnzoo.export.export_verified`.
        engine_path: Output ``.engine`` file (written only when the check passes).
        batch_sizes: The profile spans min..max of these; ``opt`` is their median.
        workspace_gb: Workspace memory-pool limit.
        timing_cache: Timing-cache file (read if present, updated after the build); default beside the engine.
        seed: Seed of the random check inputs.

    Returns:
        The report, also written to ``<engine>.json`` with the ONNX metadata.

    Raises:
        TensorRTUnavailable: no tensorrt package or no GPU.
        RuntimeError: parse/build failure or a mismatch with ONNX Runtime.
    """
    trt = _require()
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    props = metadata_props(onnx_path)
    hw = json.loads(props["input_size"])
    dtype = props.get("dtype", "fp32")
    cache = Path(timing_cache) if timing_cache else engine_path.parent / "tensorrt_timing.cache"
    start = time.perf_counter()
    blob = _build(trt, onnx_path, hw, batch_sizes, int(workspace_gb * (1 << 30)), cache, dtype == "fp32")
    build_s = time.perf_counter() - start
    engine = load_engine(blob)
    x = np.random.default_rng(seed).standard_normal((max(batch_sizes), 3, *hw)).astype(np.float32)
    ref = make_session(onnx_path, providers=["CPUExecutionProvider"]).run(None, {INPUT_NAME: x})[0]
    out = run_engine(engine, x)
    err = float(np.abs(out.astype(np.float64) - ref).max())
    tol = TRT_FP32_ATOL if dtype == "fp32" else TRT_FP16_RTOL * max(1.0, float(np.abs(ref).max()))
    report = {"engine": str(engine_path), "onnx": str(onnx_path), "tensorrt": trt.__version__,
              "gpu": torch.cuda.get_device_name(0), "dtype": dtype, "input_size": hw,
              "profile": dict(zip(("min", "opt", "max"), profile_batches(batch_sizes))), "workspace_gb": workspace_gb,
              "build_time_s": round(build_s, 2), "timing_cache": str(cache), "check_batch": int(x.shape[0]),
              "max_abs_err_vs_onnxruntime": err, "tolerance": tol, "passed": bool(np.isfinite(out).all()
                                                                                  and err <= tol),
              "engine_size": len(blob), "metadata": props}
    from attnzoo.fileio import atomic_write_text

    atomic_write_text(engine_report_path(engine_path), json.dumps(report, indent=2) + "\n")
    if not report["passed"]:
        raise RuntimeError(f"TensorRT engine differs from ONNX Runtime: max abs err {err:.3g} > {tol:.3g}; "
                           f"engine not saved (see {engine_report_path(engine_path)})")
    atomic_write_bytes(engine_path, blob)
    return report
