"""Cached derived files (ONNX Runtime's saved optimized graph, the dynamic-int8 copy, TensorRT engines) are
trusted by content, and the folders of caches whose files hold code are the user's alone."""

import os
import stat
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from attnzoo.fileio import cache_subdir, derived_facts, derived_is_current, private_dir, record_derived, sha256_file
from attnzoo.runtime.backends import onnx_reference
from attnzoo.targets.onnxruntime.cpu import tuned_cpu_session


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


def test_the_untuned_session_saves_its_optimized_graph_where_asked(tmp_path):
    """``onnx_reference().session(..., optimized_path=)`` (the fusion audit's view of ONNX Runtime's graph work) saves
    the graph it runs, which answers as the source does; without it nothing is written."""
    src = _matmul_model(tmp_path / "m.onnx", 2.0, extra=2)
    saved = tmp_path / "optimized.onnx"
    with onnx_reference().session(src, 1, spinning=False, optimized_path=saved) as session:
        assert np.array_equal(_run(session.session), np.full((2, 8), 2.0, np.float32))
        assert session.info()["tuned"] is False
    assert saved.is_file() and onnx.load(str(saved)).graph.node
    with onnx_reference().session(src.read_bytes(), 1) as session:
        assert np.array_equal(_run(session.session), np.full((2, 8), 2.0, np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "optimized.onnx"]


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


def test_a_record_keeps_its_facts_and_reads_its_key_as_written(tmp_path):
    src, out, record = tmp_path / "src", tmp_path / "out", tmp_path / "out.json"
    src.write_bytes(b"source")
    out.write_bytes(b"product")
    key = {"hw": (32, 32), "path": tmp_path}  # a tuple and a path: JSON keeps a list and a string
    record_derived(record, "abc", [out], key, facts={"took_s": 1.5})
    assert derived_facts(record, "abc", [out], key) == {"took_s": 1.5}
    assert derived_is_current(record, "abc", [out], key)
    assert derived_facts(record, "abd", [out], key) is None


def test_a_cache_folder_is_made_the_users_alone(tmp_path):
    folder = private_dir(tmp_path / "a" / "cache")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    sub = cache_subdir(tmp_path / "b", "aoti")
    assert sub == tmp_path / "b" / "aoti"
    assert {stat.S_IMODE(p.stat().st_mode) for p in (sub, sub.parent)} == {0o700}
    (tmp_path / "shared").mkdir(mode=0o755)
    os.chmod(tmp_path / "shared", 0o755)  # readable by others, writable by no one else: still the user's alone
    assert private_dir(tmp_path / "shared") == tmp_path / "shared"


@pytest.mark.parametrize(("mode", "who"), [(0o777, "its group and others"), (0o775, "its group"), (0o757, "others")])
def test_a_cache_folder_others_can_write_is_refused_in_one_line(tmp_path, mode, who):
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, mode)
    line = rf"^the cache folder {root} can be written by {who} \(mode 0{mode:o}\): .*chmod 700 {root}"
    with pytest.raises(ValueError, match=line):
        private_dir(root)
    with pytest.raises(ValueError, match=line):
        cache_subdir(root, "aoti")
    assert not (root / "aoti").exists()  # refused before anything is made in it
    os.chmod(root, 0o700)
    (root / "aoti").mkdir()
    os.chmod(root / "aoti", 0o777)  # the sub-folder counts as much as the root
    with pytest.raises(ValueError, match=rf"^the aoti cache folder {root / 'aoti'} can be written by its group and"):
        cache_subdir(root, "aoti")


def test_a_cache_folder_another_user_owns_is_refused_in_one_line(tmp_path, monkeypatch):
    root = private_dir(tmp_path / "cache")
    me = root.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)  # the folder is now another user's than the caller's
    with pytest.raises(ValueError, match=rf"^the cache folder {root} is owned by another user \(uid {me}; you are"):
        cache_subdir(root, "executorch")
    link = tmp_path / "link"
    monkeypatch.undo()
    link.symlink_to(root)
    assert private_dir(link) == link  # the user's own link to the user's own folder


def _fake_engine_build(monkeypatch):
    """TensorRT's build replaced by one that returns fixed bytes: what is left is the cache's own logic."""
    from attnzoo.targets.tensorrt import builder

    lib = builder.Library(name="tensorrt_rtx", module=None, version="test", ahead_of_time=True)
    builds: list[str] = []

    def build(path, **kw):
        builds.append(str(path))
        return builder.Built(b"engine built here", lib, "SM89", 0.1, {"min": 1, "opt": 1, "max": 1}, (1, 3, 8, 8), 1)

    monkeypatch.setattr(builder, "build", build)
    return lib, builds


def test_a_tensorrt_engine_planted_at_its_cache_name_is_built_again(tmp_path, monkeypatch):
    """An engine can carry code: one that is not the file the cache recorded (planted at the name, same size, or
    left with no record) is built again, never handed to TensorRT; the recorded one is reused."""
    from attnzoo.targets.tensorrt import build_cached

    lib, builds = _fake_engine_build(monkeypatch)
    src = _matmul_model(tmp_path / "m.onnx", 1.0)
    cache = tmp_path / "cache" / "tensorrt"
    first = build_cached(src, cache, library=lib, compute_capability="SM89", batch_sizes=(1,))
    engine = Path(first["engine"])
    assert not first["cached"] and engine.read_bytes() == b"engine built here" and len(builds) == 1
    again = build_cached(src, cache, library=lib, compute_capability="SM89", batch_sizes=(1,))
    assert again["cached"] and again["engine"] == str(engine) and len(builds) == 1  # the recorded one, reused
    engine.write_bytes(b"planted".ljust(len(b"engine built here"), b"!"))  # the recorded one's size
    assert not build_cached(src, cache, library=lib, compute_capability="SM89", batch_sizes=(1,))["cached"]
    assert engine.read_bytes() == b"engine built here" and len(builds) == 2
    Path(f"{engine}.json").unlink()  # an engine with no record
    assert not build_cached(src, cache, library=lib, compute_capability="SM89", batch_sizes=(1,))["cached"]
    assert len(builds) == 3
    os.chmod(cache, 0o777)
    with pytest.raises(ValueError, match=rf"^the TensorRT engine cache folder {cache} can be written by its group"):
        build_cached(src, cache, library=lib, compute_capability="SM89", batch_sizes=(1,))
    assert len(builds) == 3
