"""The machine's own ceiling: how fast a large matrix multiply runs here, with the run's thread count.

fp32: an ``n x n x n`` matmul in every installed library that the backends use (PyTorch ``torch.mm``, ONNX
Runtime ``MatMul``, OpenVINO ``MatMul``); the ceiling is the fastest library's median. int8: ONNX Runtime
``MatMulInteger`` (u8 x s8 -> s32, the kernel dynamic int8 quantization runs), measured when the CPU has an
int8 multiply-add instruction (AMX, AVX-512 VNNI, AVX-VNNI, AVX2's ``vpmaddubsw``, Arm's dot product) and
recorded as not measured, with the reason, otherwise. A row's fraction of the ceiling is its achieved rate
(counted FLOPs / median latency) over the ceiling of its precision; both are medians, so a loaded machine
lowers both alike.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from attnzoo.benchmarks.timing import measure
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_info
from attnzoo.runtime.backends import get_backend, onnx_reference

torch = lazy_import("torch")
onnx = lazy_import("onnx")

__all__ = ["DEFAULT_SIZE", "MAX_SIZE", "int8_isa", "matmul_ceiling", "ceiling_for", "fraction"]

#: Side of the square matmul: 2 * 2048^3 = 17.2 GFLOP, large enough for every library's blocked kernel.
DEFAULT_SIZE = 2048
#: Largest side accepted (three 8192^2 fp32 matrices: 768 MiB).
MAX_SIZE = 8192

#: int8 multiply-add instruction sets, best first (``/proc/cpuinfo`` flag -> what it is).
_INT8_ISAS = (
    ("amx_int8", "AMX int8 tiles"),
    ("avx512_vnni", "AVX-512 VNNI"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx2", "AVX2 vpmaddubsw (no VNNI)"),
    ("i8mm", "Arm i8mm"),
    ("asimddp", "Arm dot product"),
)


def int8_isa(flags: list[str]) -> str | None:
    """The best int8 multiply-add instruction set among ``flags``, described, or ``None``."""
    have = set(flags)
    return next((f"{flag}: {what}" for flag, what in _INT8_ISAS if flag in have), None)


def _onnx_matmul(path: Path, n: int, int8: bool, w: np.ndarray) -> None:
    """Write a one-node ONNX model ``y = x @ w`` (``MatMulInteger`` for int8) with ``w`` as an initializer."""
    op, x_type, y_type = (
        ("MatMulInteger", onnx.TensorProto.UINT8, onnx.TensorProto.INT32)
        if int8
        else ("MatMul", onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT)
    )
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node(op, ["x", "w"], ["y"])],
        "matmul",
        [onnx.helper.make_tensor_value_info("x", x_type, [n, n])],
        [onnx.helper.make_tensor_value_info("y", y_type, [n, n])],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8), str(path))


def _rate(fn: Callable[[], object], ops: float, seconds: float) -> dict[str, float]:
    """Median and best GFLOP/s (or GOP/s) of ``fn`` over >= 3 calls and >= ``seconds`` s, after warm-up."""
    samples = measure(fn, seconds, min_iters=3, warmup_s=0.0)
    return {
        "median_gflops": ops / float(np.median(samples)) / 1e9,
        "best_gflops": ops / min(samples) / 1e9,
        "calls": len(samples),
    }


def _fp32_libraries(n: int, threads: int, tmp: Path) -> dict[str, Callable[[], object]]:
    """The fp32 ``n x n x n`` matmul of each installed library, as a callable."""
    gen = np.random.default_rng(0)
    x = gen.standard_normal((n, n), dtype=np.float32)
    w = gen.standard_normal((n, n), dtype=np.float32)
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    fns: dict[str, Callable[[], object]] = {"torch": lambda: torch.mm(xt, wt)}
    path = tmp / "matmul_fp32.onnx"
    _onnx_matmul(path, n, False, w)
    try:
        sess = onnx_reference().session(path, threads, spinning=False).session
        fns["onnxruntime"] = lambda: sess.run(None, {"x": x})
    except ImportError:
        pass

    openvino = cast(Any, get_backend("openvino"))  # its compiled model's own infer request, on a bare matmul
    if openvino.unavailable_reason() is None:
        request = openvino.compiled(path, threads=threads).create_infer_request()
        fns["openvino"] = lambda: request.infer({0: x}, share_inputs=True, share_outputs=True)
    return fns


def matmul_ceiling(threads: int, n: int = DEFAULT_SIZE, seconds: float = 0.5, int8: bool = True) -> dict[str, Any]:
    """Measure the fp32 and int8 matmul ceilings (see the module docstring).

    Args:
        threads: Threads every library may use (the run's ``--threads``).
        n: Side of the square matrices.
        seconds: Time per library (at least 3 calls each).
        int8: Measure the int8 ceiling too.

    Returns:
        ``{"threads", "shape", "cpu", "key_flags", "fp32": {"gflops", "library", "by_library"},
        "int8": {"gops", "library", "isa", "by_library"} or {"status": "not measured", "reason"}}``.
    """
    if n < 16 or threads < 1:
        raise ValueError(f"need n >= 16 and threads >= 1, got n={n}, threads={threads}")
    cpu = cpu_info()
    ops = 2.0 * n**3
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory(prefix="attnzoo-ceiling-") as tmp:
            fp32 = {name: _rate(fn, ops, seconds) for name, fn in _fp32_libraries(n, threads, Path(tmp)).items()}
            int8_rate = (
                _int8(n, threads, ops, seconds, cpu["flags"], Path(tmp))
                if int8
                else {"status": "not measured", "reason": "not asked for"}
            )
    finally:
        torch.set_num_threads(previous)
    best = max(fp32, key=lambda k: fp32[k]["median_gflops"])
    return {
        "threads": threads,
        "shape": [n, n, n],
        "cpu": cpu["model"],
        "key_flags": cpu["key_flags"],
        "statistic": "median call; best call kept as best_gflops",
        "fp32": {"gflops": fp32[best]["median_gflops"], "library": best, "by_library": fp32},
        "int8": int8_rate,
    }


def _int8(n: int, threads: int, ops: float, seconds: float, flags: list[str], tmp: Path) -> dict[str, Any]:
    """ONNX Runtime ``MatMulInteger`` (u8 x s8), or why it was not measured."""
    isa = int8_isa(flags)
    if isa is None:
        return {
            "status": "not measured",
            "reason": "this CPU reports no int8 multiply-add instructions "
            "(no AMX, VNNI, AVX2 or Arm dot product in its flags)",
        }

    if onnx_reference().unavailable_reason() is not None:
        return {
            "status": "not measured",
            "reason": "onnxruntime is not installed (its MatMulInteger is the kernel dynamic int8 quantization runs)",
        }
    gen = np.random.default_rng(1)
    x = gen.integers(0, 128, (n, n), dtype=np.uint8)
    w = gen.integers(-64, 64, (n, n), dtype=np.int8)
    path = tmp / "matmul_int8.onnx"
    _onnx_matmul(path, n, True, w)
    try:
        sess = onnx_reference().session(path, threads, spinning=False).session
    except Exception as exc:  # an onnxruntime build without the kernel: say so
        return {"status": "not measured", "reason": f"onnxruntime MatMulInteger failed: {exc}"[:300]}
    rate = _rate(lambda: sess.run(None, {"x": x}), ops, seconds)
    return {
        "status": "measured",
        "gops": rate["median_gflops"],
        "library": "onnxruntime",
        "isa": isa,
        "by_library": {"onnxruntime": rate},
    }


def ceiling_for(ceiling: dict[str, Any] | None, backend: str, dtype: str, device: str) -> float | None:
    """The ceiling (G(FL)OP/s) a row is measured against, or ``None`` where none applies.

    CPU rows only: fp32 against the fp32 matmul, int8 (ONNX Runtime dynamic quantization) against the int8
    one. fp16/bf16 CPU rows and GPU rows have no measured ceiling here.
    """
    if not ceiling or device != "cpu":
        return None
    if dtype == "fp32":
        return ceiling["fp32"]["gflops"]
    if dtype == "int8" and ceiling["int8"].get("status") == "measured":
        return ceiling["int8"]["gops"]
    return None


def fraction(flops: float | None, median_ms: float | None, ceiling_gflops: float | None) -> dict[str, float | None]:
    """``{"achieved_gflops": flops / median, "ceiling_gflops", "ceiling_fraction": achieved / ceiling}``."""
    achieved = None
    if flops and median_ms and median_ms > 0 and math.isfinite(median_ms):
        achieved = flops / (median_ms / 1e3) / 1e9
    frac = achieved / ceiling_gflops if achieved is not None and ceiling_gflops else None
    return {"achieved_gflops": achieved, "ceiling_gflops": ceiling_gflops, "ceiling_fraction": frac}


if __name__ == "__main__":  # python -m attnzoo.benchmarks.ceiling [threads]
    import json
    import sys

    print(json.dumps(matmul_ceiling(int(sys.argv[1]) if len(sys.argv) > 1 else len(os.sched_getaffinity(0))), indent=1))
