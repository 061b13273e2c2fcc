"""ONNX Runtime on the CPU, for the benchmark's looks inside it: the op profiler (the export as it is against the
``ort-cpu`` backend's tuned session, both from :meth:`attnzoo.runtime.backends.OnnxReference.profiled`), dynamic int8,
and a GEMM throughput probe against PyTorch.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.benchmarks.timing import measure_pair
from attnzoo.fileio import derived_is_current, record_derived, sha256_file, temporary_sibling
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import onnx_reference

onnx = lazy_import("onnx")
ort = lazy_import("onnxruntime")
torch = lazy_import("torch")

__all__ = ["quantize_int8", "profile_ops", "gemm_gflops"]


def quantize_int8(onnx_path: Path, out_path: Path) -> Path:
    """Dynamic int8 quantization of the MatMul/Gemm weights (activations quantized per run, u8 x s8 -> VNNI).

    The orthogonal projection (Mul/ReduceSum/Div) and every non-matmul op stay fp32. Cached by content
    (:func:`attnzoo.fileio.derived_is_current`: the source's and the copy's sha256 in ``<out>.json``). The
    export's ``value_info`` is dropped first (with it the quantizer's shape inference fails with "Inferred
    shape and existing shape differ"); ONNX shape inference recomputes it.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic  # heavy: ONNX Runtime's quantizer, rarely used

    onnx_path, out_path = Path(onnx_path), Path(out_path)
    record, source_sha = out_path.with_suffix(".json"), sha256_file(onnx_path)
    key = {"onnxruntime": ort.__version__, "quantizer": "quantize_dynamic QInt8 MatMul,Gemm"}
    if derived_is_current(record, source_sha, [out_path], key):
        return out_path
    out_path.parent.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)
    proto = onnx.load(str(onnx_path))
    del proto.graph.value_info[:]
    tmp = temporary_sibling(out_path, ".onnx")  # removed below, or after a kill by the next run
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs a pre-processing hint on the root logger
    try:
        quantize_dynamic(proto, str(tmp), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul", "Gemm"])
        os.replace(tmp, out_path)
    finally:
        root.setLevel(level)
        tmp.unlink(missing_ok=True)
    record_derived(record, source_sha, [out_path], key)
    return out_path


def _aggregate(profile_file: str, skip_runs: int) -> tuple[int, dict[str, float], list[tuple[str, str, float]]]:
    """ORT profile JSON -> (runs counted, op type -> ms per run, top nodes as (name, op, ms per run)).

    The first ``skip_runs`` runs (warm-up) are left out using the profiler's ``model_run`` events.
    """
    with open(profile_file, encoding="utf-8") as fh:
        events = json.load(fh)
    runs = sorted(
        (ev["ts"], ev["ts"] + ev["dur"])
        for ev in events
        if ev.get("cat") == "Session" and ev.get("name") == "model_run"
    )
    start = runs[skip_runs - 1][1] if 0 < skip_runs <= len(runs) else 0
    counted = max(len(runs) - skip_runs, 1)
    by_op: dict[str, float] = defaultdict(float)
    by_node: dict[tuple[str, str], float] = defaultdict(float)
    for ev in events:
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time") and ev["ts"] >= start:
            op = ev.get("args", {}).get("op_name", "?")
            by_op[op] += ev["dur"] / 1e3 / counted
            by_node[(ev["name"][: -len("_kernel_time")], op)] += ev["dur"] / 1e3 / counted
    top = sorted(((n, op, ms) for (n, op), ms in by_node.items()), key=lambda t: -t[2])[:15]
    return counted, dict(sorted(by_op.items(), key=lambda kv: -kv[1])), top


def profile_ops(sess_factory, x: np.ndarray, runs: int = 10, warmup: int = 3) -> dict[str, object]:
    """Profile ``runs`` inferences (after ``warmup``) of a session built by ``sess_factory(profile_prefix)``.

    Returns:
        ``{"runs": n, "ms_per_run": summed kernel ms, "ops": {op type: ms per run},
        "top_nodes": [[node, op, ms] ...]}``; the profiler's JSON file is deleted afterwards.
    """
    with tempfile.TemporaryDirectory() as tmp:
        sess = sess_factory(str(Path(tmp) / "ort_profile"))
        feed = {sess.get_inputs()[0].name: x}
        for _ in range(warmup + runs):
            sess.run(None, feed)
        counted, ops, top = _aggregate(sess.end_profiling(), warmup)
    return {"runs": counted, "ms_per_run": float(sum(ops.values())), "ops": ops, "top_nodes": [list(t) for t in top]}


def gemm_gflops(threads: int, m: int = 8 * 197, k: int = 192, n: int = 768, seconds: float = 0.5) -> dict[str, Any]:
    """fp32 GEMM throughput of PyTorch (``F.linear``) and ONNX Runtime (``MatMul``) on one ViT-Ti fc1 shape.

    The default shape is ``blocks.*.mlp.fc1`` at batch 8: (8 * 197, 192) x (192, 768). Returns GFLOP/s of
    the median call of each, measured alternately, so the two see the same load.
    """
    x = torch.randn(m, k)
    w = torch.randn(n, k)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])],
        "gemm",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [m, k])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [m, n])],
        [onnx.numpy_helper.from_array(w.T.contiguous().numpy(), "w")],
    )
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 20)], ir_version=10)
    sess = onnx_reference().session(proto, threads, spinning=False).session
    feed = {"x": x.numpy()}
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            t_torch, t_ort = measure_pair(
                lambda: torch.nn.functional.linear(x, w), lambda: sess.run(None, feed), seconds
            )
    finally:
        torch.set_num_threads(previous)
    flop = 2.0 * m * k * n
    return {
        "shape": [m, k, n],
        "threads": threads,
        "torch_gflops": flop / float(np.median(t_torch)) / 1e9,
        "onnxruntime_gflops": flop / float(np.median(t_ort)) / 1e9,
    }
