"""The backend registry: one name each, aliases that resolve, a listing that says what runs here, and a new backend
that is one class -- registered, it is listed, timed by bench-latency and served by the demo's loader."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from attnzoo.runtime import backends as reg
from attnzoo.runtime.backends import Backend, Session, backend_names, canonical_backend, get_backend


def test_every_backend_has_one_name_and_its_aliases_resolve():
    names = backend_names()
    assert names == ("eager", "compile", "ort-cpu", "openvino", "ort-cuda", "ort-trt", "tensorrt")
    for b in reg.backends():
        assert canonical_backend(b.name) == b.name
        assert all(canonical_backend(a) == b.name for a in b.aliases)
        assert b.takes in ("module", "onnx") and b.device in ("cpu", "cuda", "torch") and b.dtypes
    # the spellings the commands used before the registry
    assert [canonical_backend(n) for n in ("onnxruntime", "pytorch", "trt")] == ["ort-cpu", "eager", "tensorrt"]


def test_an_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; valid: eager, compile, ort-cpu, openvino, "
                                         r"ort-cuda, ort-trt, tensorrt \(aliases: pytorch=eager"):
        get_backend("nope")


def test_a_name_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="backend name 'onnxruntime' is taken \\(by ort-cpu\\)"):
        reg.register_backend(Backend("mine", "a clash", aliases=("onnxruntime",)))
    assert "mine" not in backend_names()


def test_the_listing_says_what_runs_here_and_why_not():
    out = subprocess.run([sys.executable, "-m", "attnzoo.runtime", "--device", "cpu"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("| backend | aliases |") and len(lines) == 2 + len(backend_names())
    row = {ln.split("|")[1].strip(" `"): ln for ln in lines[2:]}
    assert set(row) == set(backend_names())
    assert "| yes |" in row["ort-cpu"] and "`onnxruntime`" in row["ort-cpu"]
    import torch

    if not torch.cuda.is_available():
        assert "no: no CUDA GPU on this machine" in row["ort-cuda"]


def test_unavailable_reasons_are_one_line_per_precision():
    assert get_backend("eager").unavailable_reason("int8").startswith("int8 is a CPU-runtime path")
    assert get_backend("ort-cpu").unavailable_reason("fp16").startswith("ONNX Runtime's CPU kernels are fp32")
    for b in reg.backends():
        for dtype in reg.DTYPES:
            reason = b.unavailable_reason(dtype, "cpu")
            assert reason is None or (reason and "\n" not in reason), (b.name, dtype, reason)


def test_openvino_names_the_file_and_the_reason_it_cannot_read_it(tmp_path):
    """OpenVINO's own message starts with a source location; the refusal says which file and why."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    assert get_backend("openvino").unavailable_reason() is None  # a base dependency: its absence is a failure
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(helper.make_model(graph), str(folder / "model.onnx"), save_as_external_data=True, location="w.bin",
              size_threshold=0)
    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    next(e for e in proto.graph.initializer[0].external_data if e.key == "location").value = "../outside.bin"
    (tmp_path / "outside.bin").write_bytes((folder / "w.bin").read_bytes())
    onnx.save(proto, str(folder / "model.onnx"))
    with pytest.raises(ValueError) as info:
        get_backend("openvino").load(folder / "model.onnx")
    message = str(info.value)
    assert message.startswith("model.onnx: OpenVINO cannot read it: ") and "outside the base directory" in message
    assert "core.cpp" not in message


# ------------------------------------------------------------------------------------ a made-up backend
class _DoubleSession(Session):
    """Runs the ONNX file with ONNX Runtime on the CPU, then halves twice the doubled logits: the same answer."""

    def __init__(self, path: Path) -> None:
        self.inner = get_backend("ort-cpu").load(path)
        self.backend, self.fixed_size = "made-up", True

    def run(self, x: np.ndarray) -> np.ndarray:
        return (self.inner.run(x) * 2.0) / 2.0


@dataclass(frozen=True)
class _MadeUp(Backend):
    def load(self, model, *, dtype="fp32", threads=None, batch=None, device="cpu", cache_dir=None):
        return _DoubleSession(Path(model))


@pytest.fixture
def made_up():
    backend = reg.register_backend(_MadeUp("made-up", "a test backend", aliases=("mu",), takes="onnx",
                                           device="cpu", dtypes=("fp32",)))
    yield backend
    del reg._REGISTRY["made-up"], reg._ALIASES["mu"]


@pytest.mark.slow
def test_a_new_backend_is_one_class(made_up, tmp_path):
    """Registered, it is listed, bench-latency times it (parity-gated, named by its alias) and the demo's loader
    serves a verified export with it."""
    import json

    from attnzoo.benchmarks.cli import main as bench
    from attnzoo.export import export_verified
    from attnzoo.models import create_model
    from attnzoo.runtime.__main__ import backends_table
    from attnzoo.serve.loading import load_onnx_dir

    assert "| `made-up` | `mu` |" in backends_table(device="cpu")
    out = tmp_path / "bench"
    assert bench(["--arch", "micro", "--variants", "standard", "--backends", "eager,mu", "--batch-sizes", "1",
                  "--min-time", "0.05", "--threads", "1", "--out", str(out), "--cache-dir", str(tmp_path / "c"),
                  "--no-progress", "--no-pair-eager", "--ceiling-size", "0"]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    mine = next(r for r in rows if r["backend"] == "made-up")
    assert mine["status"] == "ok" and mine["parity_error"] < 1e-5 and mine["median_ms"] > 0

    model = create_model("standard", "cls", "micro", num_classes=3).eval()
    config = {**model.attnzoo_config, "class_names": ["a", "b", "c"]}
    (tmp_path / "m").mkdir()
    export_verified(model, tmp_path / "m" / "standard.onnx", config, batch_sizes=(1,))
    served = load_onnx_dir(tmp_path / "m", "made-up", threads=1)
    assert [m.backend for m in served] == ["made-up"]
    x = np.zeros((1, 3, 32, 32), np.float32)
    assert np.allclose(served[0].run(x), get_backend("ort-cpu").load(tmp_path / "m" / "standard.onnx").run(x))
