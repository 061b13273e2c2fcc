"""The backend registry: one name each, aliases that resolve, a listing that says what runs here, one
``load(model, LoadOptions)`` for every backend (an option a backend does not read is refused), sessions that close
(and are context managers), and a new backend that is one class -- registered, it is listed, timed by bench-latency
(its sessions closed) and served by the demo's loader, with no edit anywhere else."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from attnzoo.runtime import backends as reg
from attnzoo.runtime.backends import Backend, LoadOptions, Session, backend_names, canonical_backend, get_backend
from attnzoo.runtime.targets import targets


def test_every_backend_has_one_name_and_its_aliases_resolve():
    names = backend_names()
    assert names == tuple(b.name for t in targets() for b in t.backends)  # every target's, in listing order
    for b in reg.backends():
        assert canonical_backend(b.name) == b.name
        assert all(canonical_backend(a) == b.name for a in b.aliases)
        assert b.takes in ("module", "onnx") and b.device in ("cpu", "cuda", "torch") and b.dtypes
    # the spellings the commands used before the registry
    assert [canonical_backend(n) for n in ("onnxruntime", "pytorch", "trt")] == ["ort-cpu", "eager", "tensorrt"]


def test_an_unknown_name_lists_the_valid_ones():
    valid = re.escape(", ".join(backend_names()))
    with pytest.raises(ValueError, match=rf"^unknown backend 'nope'; valid: {valid} \(aliases: pytorch=eager"):
        get_backend("nope")


def test_a_name_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="backend name 'onnxruntime' is taken \\(by ort-cpu\\)"):
        reg.register_backend(Backend("mine", "a clash", aliases=("onnxruntime",)))
    assert "mine" not in backend_names()


def test_the_listing_says_what_runs_here_and_why_not():
    out = subprocess.run(
        [sys.executable, "-m", "attnzoo.runtime", "--device", "cpu"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    targets, lines = (part.splitlines() for part in out.stdout.split("\n\n"))
    assert targets[0].startswith("| target | what | backends |") and "| `pytorch` |" in targets[2]
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
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [w],
    )
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save(
        helper.make_model(graph),
        str(folder / "model.onnx"),
        save_as_external_data=True,
        location="w.bin",
        size_threshold=0,
    )
    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    next(e for e in proto.graph.initializer[0].external_data if e.key == "location").value = "../outside.bin"
    (tmp_path / "outside.bin").write_bytes((folder / "w.bin").read_bytes())
    onnx.save(proto, str(folder / "model.onnx"))
    with pytest.raises(ValueError) as info:
        get_backend("openvino").load(folder / "model.onnx", LoadOptions())
    message = str(info.value)
    assert message.startswith("model.onnx: OpenVINO cannot read it: ") and "outside the base directory" in message
    assert "core.cpp" not in message


# ------------------------------------------------------------------------------------ the load contract
def _tiny_onnx(path: Path) -> Path:
    """A 2x2-pixel "classifier" with the contract's input and output names: logits = flatten(image) @ w."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from attnzoo.runtime.contract import INPUT_NAME, OUTPUT_NAME

    w = numpy_helper.from_array(np.arange(36, dtype=np.float32).reshape(12, 3) / 36, "w")
    graph = helper.make_graph(
        [helper.make_node("Flatten", [INPUT_NAME], ["flat"]), helper.make_node("MatMul", ["flat", "w"], [OUTPUT_NAME])],
        "tiny",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", 3, 2, 2])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", 3])],
        [w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_load_options_are_typed_and_a_setting_a_backend_does_not_read_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown dtype 'fp64'; valid: fp32, tf32, fp16, bf16, int8"):
        LoadOptions(dtype="fp64")
    for b in reg.backends():  # every backend says which settings it reads, all of them real ones
        assert set(b.reads) <= {f for f in LoadOptions.__dataclass_fields__ if f != "dtype"}, b.name
    # refused before the model is touched (the file does not exist), naming what it does read
    with pytest.raises(ValueError, match=r"ort-cuda does not read the load option\(s\) threads \(it reads: dtype\)"):
        get_backend("ort-cuda").load(tmp_path / "absent.onnx", LoadOptions(threads=2))
    with pytest.raises(ValueError, match=r"eager does not read the load option\(s\) batch_sizes, keep_f32"):
        get_backend("eager").load(None, LoadOptions(batch_sizes=(1, 8), keep_f32=("n",)))
    # a caller with the run's settings gives each backend the ones it reads
    ort = get_backend("ort-cpu").options(dtype="int8", threads=2, batch=4, device="cuda", keep_f32=["n"])
    assert ort == LoadOptions(dtype="int8", threads=2, batch=4)
    assert get_backend("openvino").options(keep_f32=["n"], batch_sizes=[1, 8]).keep_f32 == ("n",)
    assert get_backend("tensorrt").options(batch_sizes=[1, 8], threads=2).batch_sizes == (1, 8)
    with pytest.raises(TypeError, match="unknown load option\\(s\\) thread; valid: "):
        get_backend("ort-cpu").options(thread=2)


def test_sessions_close_once_and_are_context_managers(tmp_path):
    import torch

    path = _tiny_onnx(tmp_path / "tiny.onnx")
    x = np.random.default_rng(0).standard_normal((2, 3, 2, 2), dtype=np.float32)
    want = x.reshape(2, 12) @ (np.arange(36, dtype=np.float32).reshape(12, 3) / 36)
    ort = get_backend("ort-cpu")
    with ort.load(path, LoadOptions(threads=1)) as session:
        call = session.call(x)
        assert np.allclose(session.run(x), want, atol=1e-5) and call.session is session
    assert session.closed and session.session is None  # the InferenceSession is dropped
    with pytest.raises(AttributeError):  # the released InferenceSession is gone
        session.run(x)
    session.close()  # twice is once
    ov = get_backend("openvino")
    session = ov.load(path, LoadOptions(threads=1, batch=2))
    call = session.call(x)
    assert np.allclose(call.output(), want, atol=1e-4)
    call.close()  # a call closes the session it runs on
    assert session.closed and session.session is None
    for use in (session.run, lambda _: call.fn(), lambda _: session.info()):  # a closed session says so
        with pytest.raises(RuntimeError, match="openvino session is closed"):
            use(x)
    net = torch.nn.Flatten()
    with get_backend("eager").load(net, LoadOptions(threads=1)) as session:
        assert np.array_equal(session.run(x), x.reshape(2, 12))
    assert session.closed and session.net is None


def test_backend_facts_replace_name_checks():
    """The facts callers act on are the backends' own (no caller outside the registry branches on a name)."""
    facts = {b.name: (b.builds_engine, b.jit_compiles, b.int8_model, b.serving_batch) for b in reg.backends()}
    assert facts["tensorrt"][0] and not any(f[0] for n, f in facts.items() if n != "tensorrt")
    assert facts["compile"][1] and not facts["eager"][1]
    assert {n: f[2] for n, f in facts.items() if f[2]} == {"ort-cpu": "qdq", "openvino": "nncf"}
    assert {n: f[3] for n, f in facts.items() if f[3]} == {"openvino": 1}
    assert all("int8" in b.dtypes for b in reg.backends() if b.int8_model)
    assert reg.ONNX_REFERENCE in [b.name for b in reg.cpu_runtimes()]
    assert [b.name for b in reg.backends() if b.is_reference] == [reg.reference_backend()] == ["eager"]
    with pytest.raises(ValueError, match="mine cannot be the reference backend: eager is"):
        reg.register_backend(Backend("mine", "a second reference", is_reference=True))
    assert "mine" not in backend_names()


# ------------------------------------------------------------------------------------ a made-up backend
class _DoubleSession(Session):
    """Runs the ONNX file with ONNX Runtime on the CPU, then halves twice the doubled logits: the same answer."""

    opened: list = []

    def __init__(self, path: Path, options: LoadOptions) -> None:
        reference = get_backend("ort-cpu")
        self.inner = reference.load(path, reference.options(threads=options.threads))
        self.backend, self.fixed_size = "made-up", True
        _DoubleSession.opened.append(self)

    def run(self, x: np.ndarray) -> np.ndarray:
        return (self.inner.run(x) * 2.0) / 2.0

    def release(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class _MadeUp(Backend):
    def open(self, model, options: LoadOptions) -> _DoubleSession:
        return _DoubleSession(Path(model), options)


@pytest.fixture
def made_up():
    backend = reg.register_backend(
        _MadeUp(
            "made-up",
            "a test backend",
            aliases=("mu",),
            takes="onnx",
            device="cpu",
            dtypes=("fp32",),
            reads=("threads",),
        )
    )
    _DoubleSession.opened.clear()
    yield backend
    del reg._REGISTRY["made-up"], reg._ALIASES["mu"]


def test_a_new_backend_loads_through_the_one_contract(made_up, tmp_path):
    """One class: ``load`` checks its options, a session closes through the contract, and the CPU-runtime choice
    and the server's check against the reference take it as they take the built-in ones."""
    from attnzoo.runtime.backends import check_against_reference
    from attnzoo.runtime.choice import fastest_cpu_runtime

    path = _tiny_onnx(tmp_path / "tiny.onnx")
    with pytest.raises(ValueError, match=r"made-up does not read the load option\(s\) batch"):
        made_up.load(path, LoadOptions(batch=1))
    with get_backend("mu").load(path, LoadOptions(threads=1)) as session:
        contract = SimpleNamespace(input_size=(2, 2), dtype="fp32")  # what the check reads of an export's contract
        check_against_reference(session, path, contract, threads=1)
    assert session.closed and session.inner.closed
    choice = fastest_cpu_runtime(
        {"made-up": lambda p: made_up.load(p, made_up.options(threads=1, batch=1))}, [(path, (2, 2))], seconds=0.01
    )
    assert choice.runtime == "made-up" and not choice.failed
    assert len(_DoubleSession.opened) == 2 and all(s.closed for s in _DoubleSession.opened)  # timed, then closed


@pytest.mark.slow
def test_a_new_backend_is_one_class(made_up, tmp_path, bench_args):
    """Registered, it is listed, bench-latency times it (parity-gated, named by its alias, its sessions closed when
    the run is done with them) and the demo's loader serves a verified export with it."""
    import json

    from attnzoo.benchmarks.cli import main as bench
    from attnzoo.export import export_verified
    from attnzoo.models import create_model
    from attnzoo.runtime.__main__ import backends_table
    from attnzoo.serve.loading import load_onnx_dir

    assert "| `made-up` | `mu` |" in backends_table(device="cpu")
    out = tmp_path / "bench"
    assert (
        bench(
            bench_args(
                out, "standard,belief2", "eager,mu", "--ceiling-size", "0", "--no-pair-eager", cache_dir=tmp_path / "c"
            )
        )
        == 0
    )
    rows = json.loads((out / "results.json").read_text())["results"]
    mine = [r for r in rows if r["backend"] == "made-up"]
    assert [r["variant"] for r in mine] == ["standard", "belief2"]
    assert all(r["status"] == "ok" and r["parity_error"] < 1e-5 and r["median_ms"] > 0 for r in mine)
    assert len(_DoubleSession.opened) == 2 and all(s.closed for s in _DoubleSession.opened)

    model = create_model("standard", "cls", "micro", num_classes=3).eval()
    config = {**model.attnzoo_config, "class_names": ["a", "b", "c"]}
    (tmp_path / "m").mkdir()
    export_verified(model, tmp_path / "m" / "standard.onnx", config, batch_sizes=(1,))
    served = load_onnx_dir(tmp_path / "m", "made-up", threads=1)
    assert [m.backend for m in served] == ["made-up"]
    x = np.zeros((1, 3, 32, 32), np.float32)
    with get_backend("ort-cpu").load(tmp_path / "m" / "standard.onnx", LoadOptions()) as reference:
        assert np.allclose(served[0].run(x), reference.run(x))


def test_torch_compile_says_nothing_of_a_cuda_runtime_on_a_machine_without_a_gpu(tmp_path, monkeypatch, caplog):
    """torch logs "No CUDA runtime is found, using CUDA_HOME=..." when torch.compile looks for its toolchain and a
    CUDA_HOME exists; without a GPU that is noise, and the compile backend silences it (with a GPU nothing fires)."""
    import logging

    from torch.utils import cpp_extension

    from attnzoo.targets.pytorch.eager import quiet_cuda_home

    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    logger = logging.getLogger("torch.utils.cpp_extension")
    monkeypatch.setattr(logger, "level", logger.level)  # restored after the test
    quiet_cuda_home()
    caplog.clear()  # importing cpp_extension above may have logged it already (CUDA_HOME is found at import)
    with caplog.at_level(logging.WARNING):
        cpp_extension._find_cuda_home()
    assert not [r for r in caplog.records if "No CUDA runtime" in r.getMessage()]
