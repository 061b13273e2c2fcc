"""Backends: what is installed, how each one runs a model on device-resident inputs, and the parity gate.

A :class:`Runner` wraps one built model: ``fn()`` is one timed inference on inputs that already sit where the
backend computes (host memory for the CPU, device memory for CUDA), ``output()`` returns the logits as
float32 NumPy for the parity check, ``memory()`` the peak memory after timing.

Backends: ``eager`` and ``compile`` (PyTorch, the same weights), ``ort-cpu`` (ONNX Runtime CPU with the tuned
settings of :mod:`attnzoo.benchmarks.ort_cpu`), ``openvino`` (OpenVINO on the CPU, the same ONNX file, through
:mod:`attnzoo.runtime.openvino`: the run's threads, latency hint, fp32 precision, batch fixed), ``ort-cuda``
and ``ort-trt`` (ONNX Runtime CUDA / TensorRT execution providers with I/O binding), ``tensorrt`` (an engine
built from the ONNX file, run from a CUDA graph). Dtypes: ``fp32``, ``fp16``, ``bf16`` and ``int8``.

int8 (CPU runtimes): static post-training quantization of the same fp32 export, calibrated on
:data:`CALIBRATION_COUNT` seeded random images (the benchmark's models are random-init: no data set), with
the variant's extra-math nodes left fp32 (:func:`attnzoo.export.quantize.extra_math_nodes`). ``ort-cpu``
runs NVIDIA ModelOpt's Q/DQ graph with the CPU placement (Q/DQ only in front of the weight MatMul/Gemm/Conv
ops; :data:`attnzoo.export.quantize.QDQ_PLACEMENTS`), written and verified by
:func:`attnzoo.export.quantize.quantize_verified`
(the ``export-model --dtype int8`` checks: Q/DQ placement, extra math fp32, finite outputs; no test-set
accuracy for a random-init model); ``openvino`` runs NNCF's own quantization of the OpenVINO model
(:func:`attnzoo.runtime.openvino.nncf_int8`, extra math in the ignored scope, checked free of FakeQuantize),
because OpenVINO gains nothing from the Q/DQ graph. Both are cached per fp32 file (its SHA-256) and then
pass the benchmark's int8 parity gate before they are timed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from attnzoo.machine import cpu_info

from attnzoo.export.quantize import CPU_QDQ_PLACEMENT
from attnzoo.runtime.parity import TOLERANCES, parity_error, tolerance_key

__all__ = ["BACKENDS", "CPU_BACKENDS", "DTYPES", "row_device", "TOLERANCES", "Runner", "unavailable_reason",
           "build_runner", "parity_error", "check_parity", "torch_device", "tensorrt_build_only", "tolerance_for",
           "CALIBRATION_COUNT", "int8_onnx", "int8_openvino"]

BACKENDS: Tuple[str, ...] = ("eager", "compile", "ort-cpu", "openvino", "ort-cuda", "ort-trt", "tensorrt")
#: Backends that run on the CPU whatever ``--device`` says (rows measured against the CPU's matmul ceiling).
CPU_BACKENDS: Tuple[str, ...] = ("ort-cpu", "openvino")
DTYPES: Tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")
_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: Calibration images of the benchmark's int8 models (seeded standard normal: the models are random-init).
CALIBRATION_COUNT = 32


@dataclass
class Runner:
    """One built model on one backend.

    Attributes:
        fn: One inference on resident inputs (the timed call).
        output: One inference returning float32 logits on the host (for the parity gate).
        cuda: Time with CUDA events (GPU backends).
        memory: ``() -> (peak MB, what was measured)``; ``None``: the caller measures host RSS.
        cuda_graph: ``fn`` replays a CUDA graph.
        info: Backend settings worth reporting (providers, optimisation level, threads ...).
    """

    fn: Callable[[], object]
    output: Callable[[], np.ndarray]
    cuda: bool = False
    memory: Optional[Callable[[], Tuple[float, str]]] = None
    cuda_graph: bool = False
    info: Dict[str, object] = field(default_factory=dict)


def torch_device(requested: str = "auto") -> torch.device:
    """``auto``: CUDA when available, else CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def _ort_providers() -> Tuple[str, ...]:
    try:
        import onnxruntime as ort
    except ImportError:
        return ()
    return tuple(ort.get_available_providers())


def unavailable_reason(backend: str, dtype: str, device: torch.device) -> Optional[str]:
    """Why ``backend`` cannot run ``dtype`` on this machine, or ``None`` when it can."""
    cuda = torch.cuda.is_available()
    if backend in ("eager", "compile"):
        if dtype == "int8":
            return "int8 is a CPU-runtime path here (ModelOpt Q/DQ for ort-cpu, NNCF for openvino); no PyTorch int8"
        if device.type == "cpu" and dtype == "fp16" and not {"avx512_fp16", "amx_fp16"} & set(
                cpu_info()["flags"]):
            return "fp16 on this CPU has no native kernels (no avx512_fp16/amx_fp16); use bf16"
        if backend == "compile":
            if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
                return "torch.compile on the CPU needs a C++ compiler (g++), none found"
            if device.type == "cuda" and importlib.util.find_spec("triton") is None:
                return "torch.compile on CUDA needs triton, not installed"
        return None
    providers = _ort_providers()
    if backend == "ort-cpu":
        if "CPUExecutionProvider" not in providers:
            return "onnxruntime is not installed"
        if dtype in ("fp16", "bf16"):
            return f"ONNX Runtime's CPU kernels are fp32 (a {dtype} graph runs as casts); int8 is the CPU fast path"
        if dtype == "int8":
            from attnzoo.export.quantize import quantize_unavailable_reason

            return quantize_unavailable_reason()
        return None
    if backend == "openvino":
        from attnzoo.runtime.openvino import unavailable_reason as openvino_reason

        reason = openvino_reason()
        if reason or dtype == "fp32":
            return reason
        if dtype == "int8":
            from attnzoo.runtime.openvino import nncf_unavailable_reason

            return nncf_unavailable_reason()
        return f"OpenVINO runs the fp32 ONNX file here at fp32 precision (no {dtype} inference-precision hint set)"
    if dtype == "int8":
        return ("int8 rows here are the CPU runtimes'; the GPU int8 engine is export-model --dtype int8 "
                "--format tensorrt")
    if backend == "tensorrt":  # without a GPU the engine is still built (tensorrt-rtx), reported "built, not run"
        if dtype == "bf16":
            return "bf16 ONNX graphs are not exported (export dtypes: fp32, fp16)"
        from attnzoo.runtime.tensorrt import unavailable_reason as trt_reason

        return trt_reason(run=False)
    if not cuda:
        return "no CUDA GPU on this machine"
    if backend == "ort-cuda":
        if "CUDAExecutionProvider" not in providers:
            return "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
        return "bf16 ONNX graphs are not exported (export dtypes: fp32, fp16)" if dtype == "bf16" else None
    if backend == "ort-trt":
        if "TensorrtExecutionProvider" not in providers:
            return "onnxruntime has no TensorrtExecutionProvider (onnxruntime-gpu with TensorRT libraries)"
        return "bf16 is not a TensorRT execution provider option" if dtype == "bf16" else None
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


def row_device(backend: str, device: torch.device) -> str:
    """Where a row computes: ``cpu`` for the CPU runtimes, the eager/compile device for PyTorch, else ``cuda``."""
    if backend in CPU_BACKENDS:
        return "cpu"
    return device.type if backend in ("eager", "compile") else "cuda"


# ---------------------------------------------------------------------------------------------- parity
def tolerance_for(backend: str, dtype: str, device: torch.device) -> str:
    """The tolerance-table key of a row: fp32 on a GPU may use TF32 (eager/compile on CUDA, ONNX Runtime CUDA);
    int8 on the CPU runtimes is static quantization of a random-init model (``int8-static``)."""
    gpu = backend in ("ort-cuda", "ort-trt") or (backend in ("eager", "compile") and device.type == "cuda")
    if dtype == "int8" and backend in CPU_BACKENDS:  # statically quantized with random calibration
        return "int8-static"
    return tolerance_key(dtype, gpu)


def check_parity(out: np.ndarray, ref: np.ndarray, key: str) -> Tuple[bool, float]:
    """(passes, error) of a backend's output against eager fp32 under ``TOLERANCES[key]`` (the runtime's
    measure: max |out - ref| / max(1, max |ref|))."""
    err = parity_error(out, ref)
    return err <= TOLERANCES[key], err


# --------------------------------------------------------------------------------------------- runners
def _torch_runner(model: nn.Module, x: torch.Tensor, dtype: str, device: torch.device,
                  compile_model: bool) -> Runner:
    """Eager or ``torch.compile`` PyTorch on a private copy of the model (so its memory is counted)."""
    tdtype = _TORCH_DTYPES[dtype]
    net = copy.deepcopy(model).to(device=device, dtype=tdtype).eval()
    xin = x.to(device=device, dtype=tdtype)
    info: Dict[str, object] = {"device": str(device)}
    graph = False
    if compile_model:
        mode = "reduce-overhead" if device.type == "cuda" else "default"  # reduce-overhead = CUDA graphs
        net = torch.compile(net, mode=mode, dynamic=False)
        info["compile_mode"] = mode
        graph = device.type == "cuda"

    @torch.inference_mode()
    def fn():
        return net(xin)

    def output() -> np.ndarray:
        return fn().float().cpu().numpy()

    cuda = device.type == "cuda"
    return Runner(fn, output, cuda=cuda, memory=_torch_cuda_memory if cuda else None, cuda_graph=graph,
                  info=info)


def _torch_cuda_memory() -> Tuple[float, str]:
    return torch.cuda.max_memory_allocated() / 2 ** 20, "torch.cuda.max_memory_allocated"


def _device_memory_used() -> Tuple[float, str]:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2 ** 20, "device memory in use (mem_get_info)"


def _calibration(config: Dict[str, object]) -> Tuple[np.ndarray, str]:
    from attnzoo.export.quantize import random_calibration

    size = int(config["img_size"])
    return (random_calibration((size, size), CALIBRATION_COUNT, seed=0),
            f"{CALIBRATION_COUNT} standard-normal images, seed 0 (random-init model: no data set)")


def _sha_tag(onnx_path: Path) -> str:
    from attnzoo.fileio import sha256_file

    return sha256_file(onnx_path)[:12]


def int8_onnx(onnx_path: Path, config: Dict[str, object], cache_dir: Path,
              placement: str = CPU_QDQ_PLACEMENT) -> Tuple[Path, Dict[str, object]]:
    """ModelOpt's int8 Q/DQ model of a verified fp32 export, by default with the CPU placement (``export-model
    --dtype int8 --qdq-placement cpu``), verified as that command does it (Q/DQ placement, extra math fp32, finite
    outputs; not scored: random-init), cached per fp32 SHA-256 and placement.

    Returns:
        ``(path, facts)``: the facts say what was verified, the quantizer and the quantized op counts.
    """
    from attnzoo.export.quantize import quantize_verified
    from attnzoo.export.verify import report_path

    out = Path(cache_dir) / "int8" / f"{onnx_path.stem}-{_sha_tag(onnx_path)}.modelopt-int8-{placement}.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(report_path(out).read_text()) if out.is_file() and report_path(out).is_file() else None
    if not (report and report.get("passed")):
        calibration, source = _calibration(config)
        report = quantize_verified(onnx_path, out, config, dtype="int8", calibration=calibration,
                                   calibration_source=source, calibration_seed=0, measure_accuracy=False,
                                   placement=placement)
    qz = report["quantization"]
    return out, {"quantizer": f"{qz['quantizer']} {qz['quantizer_version']}", "verified": report["verified"],
                 "placement": qz["options"]["placement"],
                 "quantized_ops": qz["qdq"]["quantized_ops"], "excluded_extra_math": len(qz["excluded_nodes"]),
                 "calibration": qz["calibration"]["source"], "model": out.name}


def int8_openvino(onnx_path: Path, config: Dict[str, object], cache_dir: Path) -> Tuple[Path, Dict[str, object]]:
    """NNCF's int8 OpenVINO IR of a verified fp32 export (extra math in the ignored scope, checked free of
    FakeQuantize; :func:`attnzoo.runtime.openvino.nncf_int8`), cached per fp32 SHA-256 with its report."""
    import onnx

    from attnzoo.export.quantize import extra_math_nodes
    from attnzoo.fileio import atomic_write_text
    from attnzoo.runtime.openvino import nncf_int8

    out = Path(cache_dir) / "int8" / f"{onnx_path.stem}-{_sha_tag(onnx_path)}.nncf-int8.xml"
    facts_path = out.with_suffix(".report.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file() and facts_path.is_file():
        return out, json.loads(facts_path.read_text())
    calibration, source = _calibration(config)
    extra = extra_math_nodes(onnx.load(str(onnx_path), load_external_data=False), config)
    facts = nncf_int8(onnx_path, out, calibration, ignored=extra)
    facts.update(calibration=source, excluded_extra_math=len(extra),
                 verified="NNCF model checked: FakeQuantize inserted, none feeding the extra math")
    atomic_write_text(facts_path, json.dumps(facts, indent=1) + "\n")
    return out, facts


def _ort_cpu_runner(onnx_path: Path, x: torch.Tensor, dtype: str, threads: int, cache_dir: Path,
                    config: Dict[str, object], int8_placement: str = CPU_QDQ_PLACEMENT) -> Runner:
    from attnzoo.benchmarks.ort_cpu import tuned_cpu_session

    int8: Dict[str, object] = {}
    if dtype == "int8":
        onnx_path, int8 = int8_onnx(onnx_path, config, cache_dir, int8_placement)
    sess, info = tuned_cpu_session(onnx_path, threads, cache_dir, batch=int(x.shape[0]))
    feed = {sess.get_inputs()[0].name: x.numpy()}

    def fn():
        return sess.run(None, feed)

    return Runner(fn, lambda: np.asarray(fn()[0], dtype=np.float32), info={**info, **({"int8": int8} if int8 else {})})


def _openvino_runner(onnx_path: Path, x: torch.Tensor, dtype: str, threads: int, cache_dir: Path,
                     config: Dict[str, object]) -> Runner:
    """OpenVINO on the CPU (:class:`attnzoo.runtime.openvino.OpenVINOSession`), batch fixed to ``x``'s; int8:
    NNCF's IR of the same file (:func:`int8_openvino`)."""
    from attnzoo.runtime.openvino import OpenVINOSession

    int8: Dict[str, object] = {}
    if dtype == "int8":
        onnx_path, int8 = int8_openvino(onnx_path, config, cache_dir)
    sess = OpenVINOSession(onnx_path, threads=threads, batch=int(x.shape[0]))
    xin = np.ascontiguousarray(x.numpy(), dtype=np.float32)

    def fn():
        return sess.infer(xin)

    return Runner(fn, lambda: np.array(fn(), dtype=np.float32),
                  info={**sess.info(), **({"int8": int8} if int8 else {})})


def _ort_gpu_session(onnx_path: Path, dtype: str, tensorrt_ep: bool, cache_dir: Path, graph: bool):
    from attnzoo.runtime.sessions import ort_session, session_options

    return ort_session(onnx_path, "tensorrt" if tensorrt_ep else "cuda", options=session_options(sequential=False),
                       cuda_graph=graph, fp16=dtype == "fp16",
                       cache_dir=cache_dir / "ort-trt" if tensorrt_ep else None)


def _ort_gpu_runner(onnx_path: Path, x: torch.Tensor, dtype: str, tensorrt_ep: bool, cache_dir: Path,
                    out_shape: Tuple[int, ...]) -> Runner:
    """ONNX Runtime with the CUDA or TensorRT EP; I/O bound to torch CUDA tensors.

    A CUDA graph is tried first; ONNX Runtime refuses it when some nodes (shape arithmetic) run on the CPU,
    and then the session is rebuilt without one (``cuda_graph`` False in the row).
    """
    xin = x.to("cuda").contiguous()
    yout = torch.full(out_shape, float("nan"), device="cuda", dtype=torch.float32)  # unwritten -> fails parity
    for graph in (True, False):
        try:
            sess = _ort_gpu_session(onnx_path, dtype, tensorrt_ep, cache_dir, graph)
            binding = sess.io_binding()
            binding.bind_input(sess.get_inputs()[0].name, "cuda", 0, np.float32, tuple(xin.shape), xin.data_ptr())
            binding.bind_output(sess.get_outputs()[0].name, "cuda", 0, np.float32, out_shape, yout.data_ptr())
            sess.run_with_iobinding(binding)  # with a graph: the capture run
            break
        except Exception:  # noqa: BLE001 -- the graph-less retry reports its own failure
            if not graph:
                raise

    def fn():
        sess.run_with_iobinding(binding)

    def output() -> np.ndarray:
        fn()
        torch.cuda.synchronize()
        return yout.cpu().numpy()

    return Runner(fn, output, cuda=True, memory=_device_memory_used, cuda_graph=graph,
                  info={"providers": sess.get_providers()})


def tensorrt_build_only(onnx_path: Path, batch_sizes: Sequence[int], cache_dir: Path) -> Dict[str, object]:
    """Without a GPU: the engine built ahead of time by the runtime's builder (not run), once per ONNX file,
    shape and profile (kept in ``cache_dir/tensorrt``, reused by later rows and runs); its build facts."""
    from attnzoo.runtime import tensorrt as rt

    return rt.build_cached(onnx_path, Path(cache_dir) / "tensorrt", batch_sizes=batch_sizes)


def _tensorrt_runner(onnx_path: Path, x: torch.Tensor, dtype: str, cache_dir: Path) -> Runner:
    """The runtime's engine for this batch size (built for the GPU present), captured once in a CUDA graph."""
    from attnzoo.runtime import tensorrt as rt

    built = rt.build(onnx_path, batch_sizes=(int(x.shape[0]),))
    engine = rt.Engine(built.blob, built.library)
    yout = engine.bind(x.to("cuda"))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        engine.enqueue(stream)  # TensorRT sets itself up on the first enqueue; it must precede the capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        engine.enqueue(stream)

    def output() -> np.ndarray:
        graph.replay()
        torch.cuda.synchronize()
        return yout.float().cpu().numpy()

    return Runner(graph.replay, output, cuda=True, memory=_device_memory_used, cuda_graph=True,
                  info={k: v for k, v in built.facts().items() if k in ("library", "library_version",
                                                                         "compute_capability", "build_time_s")})


def build_runner(backend: str, model: nn.Module, onnx_path: Optional[Path], x: torch.Tensor, dtype: str, *,
                 threads: int, device: torch.device, cache_dir: Path, out_shape: Tuple[int, ...],
                 int8_placement: str = CPU_QDQ_PLACEMENT) -> Runner:
    """Build ``backend`` for one model and one input batch ``x`` (float32, on the CPU).

    Args:
        backend: One of ``BACKENDS``.
        model: The PyTorch model (fp32, CPU); eager and compile run a copy of it.
        onnx_path: Its verified fp32 export (``int8`` is quantized from it) or fp16 export for GPU fp16.
        x: Input batch.
        dtype: One of ``DTYPES``.
        threads: Intra-op threads for the CPU backends.
        device: Device of eager / compile.
        cache_dir: Where optimized models and engines are written.
        out_shape: Shape of the logits (for GPU output buffers).
        int8_placement: ``ort-cpu`` int8: ModelOpt's Q/DQ placement (``cpu``, or ``tensorrt`` to compare).
    """
    if backend in ("eager", "compile"):
        return _torch_runner(model, x, dtype, device, backend == "compile")
    if onnx_path is None:
        raise ValueError(f"backend {backend} needs the exported ONNX file")
    config = dict(getattr(model, "attnzoo_config", {}) or {})
    if backend == "ort-cpu":
        return _ort_cpu_runner(onnx_path, x, dtype, threads, cache_dir, config, int8_placement)
    if backend == "openvino":
        return _openvino_runner(onnx_path, x, dtype, threads, cache_dir, config)
    if backend in ("ort-cuda", "ort-trt"):
        return _ort_gpu_runner(onnx_path, x, dtype, backend == "ort-trt", cache_dir, out_shape)
    if backend == "tensorrt":
        return _tensorrt_runner(onnx_path, x, dtype, cache_dir)
    raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
