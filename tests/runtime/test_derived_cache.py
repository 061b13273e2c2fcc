"""Cached derived files (ONNX Runtime's saved optimized graph, the dynamic-int8 copy) are trusted by content."""

import os
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from attnzoo.fileio import derived_is_current, record_derived, sha256_file
from attnzoo.runtime.backends.ort_cpu import tuned_cpu_session


def _matmul_model(path, scale: float, extra: int = 0):
    """x (2, 8) @ W * scale, with ``extra`` more identity MatMuls (an equivalent but slower graph)."""
    w = numpy_helper.from_array((np.eye(8, dtype=np.float32) * scale), "w")
    eye = numpy_helper.from_array(np.eye(8, dtype=np.float32), "eye")
    nodes, last = [helper.make_node("MatMul", ["x", "w"], ["y0"])], "y0"
    for i in range(extra):
        nodes.append(helper.make_node("MatMul", [last, "eye"], [f"y{i + 1}"]))
        last = f"y{i + 1}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        initializer=[w, eye],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _run(sess) -> np.ndarray:
    return sess.run(None, {"x": np.ones((2, 8), np.float32)})[0]


def test_swapped_optimized_graph_is_made_again(tmp_path):
    src = _matmul_model(tmp_path / "m.onnx", 1.0)
    cache = tmp_path / "cache"
    sess, info = tuned_cpu_session(src, 1, cache)
    assert np.allclose(_run(sess), 1.0) and info["optimized_model"] == "m.ort.onnx"
    cached = cache / "m.ort.onnx"
    # another graph dropped in the cached file's place, newer than the source: used before, made again now
    _matmul_model(cached, 3.0, extra=12)
    later = time.time() + 100
    os.utime(cached, (later, later))
    sess, _ = tuned_cpu_session(src, 1, cache)
    assert np.allclose(_run(sess), 1.0)
    assert len(onnx.load(str(cached)).graph.node) < 12


def test_edited_source_is_converted_again(tmp_path):
    src = _matmul_model(tmp_path / "m.onnx", 1.0)
    cache = tmp_path / "cache"
    tuned_cpu_session(src, 1, cache)
    _matmul_model(src, 2.0)
    old = time.time() - 1000  # older than the cached file: a modification time says nothing changed
    os.utime(src, (old, old))
    sess, _ = tuned_cpu_session(src, 1, cache)
    assert np.allclose(_run(sess), 2.0)


@pytest.mark.parametrize("change", ["product", "source", "key", "record"])
def test_derived_record(tmp_path, change):
    src, out, record = tmp_path / "src", tmp_path / "out", tmp_path / "out.json"
    src.write_bytes(b"source")
    out.write_bytes(b"product")
    record_derived(record, sha256_file(src), [out], {"v": 1})
    assert derived_is_current(record, sha256_file(src), [out], {"v": 1})
    key = {"v": 1}
    if change == "product":
        out.write_bytes(b"another product")
    elif change == "source":
        src.write_bytes(b"another source")
    elif change == "key":
        key = {"v": 2}
    else:
        record.write_text("{not json")
    assert not derived_is_current(record, sha256_file(src), [out], key)


def test_swapped_int8_copy_is_made_again(tmp_path):
    from attnzoo.benchmarks.ort_cpu import quantize_int8

    src = _matmul_model(tmp_path / "m.onnx", 1.0)
    out = quantize_int8(src, tmp_path / "q" / "m.int8.onnx")
    assert "MatMulInteger" in {n.op_type for n in onnx.load(str(out)).graph.node}
    _matmul_model(out, 1.0, extra=12)  # an fp32 graph in the int8 copy's place, newer than the source
    assert quantize_int8(src, out) == out
    assert "MatMulInteger" in {n.op_type for n in onnx.load(str(out)).graph.node}
