"""TensorRT: ONNX -> parsed network -> engine, for every variant, task and dtype, on any machine.

TensorRT-RTX (``tensorrt-rtx``, in ``attnzoo[dev]``) builds engines ahead of time without a GPU, so the build
tests run everywhere and fail (not skip) when no TensorRT library is installed. Only the tests that *run* an
engine need a GPU; they are also marked ``gpu`` and skip with that reason.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest
import torch

from attnzoo.export import export_onnx
from attnzoo.export.cli import main as export_main
from attnzoo.models import ARCHS, PROJECTION_OPS, VARIANT_NAMES, VARIANTS, create_model
from attnzoo.runtime import ModelContract, compare
from attnzoo.targets import tensorrt as rt
from attnzoo.targets.tensorrt import engine as engine_loader
from attnzoo.targets.tensorrt.schema import EngineReport
from attnzoo.targets.tensorrt.verified import STATUS_BUILT, STATUS_RUN, build_engine, engine_report_path, network_check
from tests.tiers import marks as tier_marks

pytestmark = pytest.mark.tensorrt

DEPTH = ARCHS["micro"]["depth"]
SEG_HW = (24, 40)
GPU = rt.gpu_available()
#: Built in the default run: none (an engine build takes 10-20 s on 2 cores; the default suite keeps the checks
#: around the builds); every variant, task and precision with -m slow.
FAST: set[tuple[str, str, str]] = set()
#: CI's slow run: the projection (belief2) and the pairwise-L1 distances (wafe-mae), the two kinds of extra math, at
#: each task, and one build of each of tests/tiers.py's set, the tasks and precisions spread over them (every
#: variant's four builds: the matrix run).
SLOW = {
    ("belief2", "cls", "fp32"),
    ("wafe-mae", "cls", "fp32"),
    ("belief2", "seg", "fp16"),
    ("wafe-mae", "seg", "fp32"),
    ("standard", "seg", "fp16"),
    ("belief-star", "cls", "fp16"),
    ("mabvit-glu", "seg", "fp32"),
    ("wafe-mse", "cls", "fp16"),
    ("anti-wafe-mae", "seg", "fp16"),
    ("horizontal-vertical", "cls", "fp32"),
}


@pytest.fixture(scope="module")
def lib():
    """The TensorRT library; its absence is a failure: attnzoo[dev] installs tensorrt-rtx."""
    try:
        return rt.load_library()
    except rt.TensorRTUnavailable as exc:
        pytest.fail(f"no TensorRT library: {exc}")


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    root = tmp_path_factory.mktemp("trt-onnx")
    cache = {}

    def get(variant, task="cls", dtype="fp32"):
        key = (variant, task, dtype)
        if key not in cache:
            torch.manual_seed(0)
            model = create_model(variant, task, "micro", num_classes=5).eval()
            hw = SEG_HW if task == "seg" else (model.attnzoo_config["img_size"],) * 2
            cache[key] = export_onnx(
                model, root / f"{variant}_{task}_{dtype}.onnx", config=model.attnzoo_config, dtype=dtype, input_hw=hw
            )
        return cache[key]

    return get


@pytest.fixture(scope="module")
def verified_onnx(tmp_path_factory):
    """A micro classifier exported and verified (its report beside it), as export-model writes it."""
    from attnzoo.export import export_verified

    root = tmp_path_factory.mktemp("trt-verified")
    cache = {}

    def get(variant, dtype="fp32"):
        if (variant, dtype) not in cache:
            torch.manual_seed(0)
            model = create_model(variant, "cls", "micro", num_classes=5).eval()
            path = root / f"{variant}_{dtype}.onnx"
            export_verified(model, path, model.attnzoo_config, dtype=dtype, batch_sizes=(1, 8))
            cache[(variant, dtype)] = path
        return cache[(variant, dtype)]

    return get


def _matrix():
    out = []
    for variant in VARIANT_NAMES:
        for task in ("cls", "seg"):
            for dtype in ("fp32", "fp16"):
                case = (variant, task, dtype)
                marks = [] if case in FAST else tier_marks(variant, slow=(variant,) if case in SLOW else ())
                out.append(pytest.param(variant, task, dtype, marks=marks, id=f"{variant}-{task}-{dtype}"))
    return out


@pytest.mark.parametrize("variant,task,dtype", _matrix())
def test_onnx_parses_projection_is_fp32_and_engine_builds(lib, onnx_file, variant, task, dtype):
    path = onnx_file(variant, task, dtype)
    parsed = rt.parse_onnx(path, lib)
    contract = ModelContract.from_onnx(path)
    check = network_check(parsed, path, contract)
    assert check["ok"], check["failures"]
    prefix = "encoder.blocks" if task == "seg" else "blocks"
    scopes = {f"{prefix}.{i}.attn.{m}" for i in range(DEPTH) for m in VARIANTS[variant].extra_scopes}
    assert set(check["blocks"]) - {"fp32 ops of the fp16 graph"} == scopes
    for scope in scopes:  # every computing op a layer, each fp32: a projection's Mul x3, ReduceSum x2, Add, Div, Sub
        required = VARIANTS[variant].required_ops(scope.split(".attn.")[1])
        found = check["blocks"][scope]
        assert found["layers"] == found["fp32"] >= max(1, sum(required.values())), (scope, found)
        assert found["layers"] == 8 or required != PROJECTION_OPS, (scope, found)
    if dtype == "fp16":  # the rest of the graph really is fp16 (else the check above proves nothing)
        assert "HALF" in {o for layer in rt.network_layers(parsed.network) for o in layer["outputs"]}
        fp32 = check["blocks"]["fp32 ops of the fp16 graph"]
        assert fp32["layers"] == fp32["fp32"] >= 2 * DEPTH  # LayerNorm and softmax of every block
    built = rt.build(path, batch_sizes=(1, 4), input_hw=contract.input_size, compute_capability="SM89", parsed=parsed)
    assert len(built.blob) > 100_000 and built.build_time_s > 0
    assert built.compute_capability == "SM89" and built.profile == {"min": 1, "opt": 4, "max": 4}


@pytest.mark.slow
def test_segmenter_at_its_training_size_builds(lib, tmp_path):
    """At the training size timm would keep an identity, antialiased Resize of the position embedding, which
    TensorRT cannot parse; the export drops it (the size is fixed) and the engine builds."""
    torch.manual_seed(0)
    model = create_model("belief2", "seg", "micro-conv", num_classes=5, img_size=48).eval()
    path = export_onnx(model, tmp_path / "seg48.onnx", input_hw=(48, 48))
    resizes = [n for n in onnx.load(str(path)).graph.node if n.op_type == "Resize"]
    assert all(onnx.helper.get_attribute_value(a) == 0 for n in resizes for a in n.attribute if a.name == "antialias")
    built = rt.build(path, batch_sizes=(1, 2), input_hw=(48, 48), compute_capability="SM89")
    assert len(built.blob) > 100_000


class _KeepConfig:
    """The parsed network's builder, keeping the builder config the build made (to read its flags after)."""

    def __init__(self, builder) -> None:
        self.builder, self.config = builder, None

    def create_builder_config(self):
        self.config = self.builder.create_builder_config()
        return self.config

    def __getattr__(self, name):
        return getattr(self.builder, name)


@pytest.mark.slow
def test_tf32_is_set_either_way_and_is_part_of_the_engine_key(lib, onnx_file, tmp_path):
    """TensorRT turns TF32 on by default: an fp32 engine must clear it, a tf32 one set it, and the two are
    different engines in the cache."""
    path = onnx_file("standard")
    for tf32 in (False, True):
        parsed = rt.parse_onnx(path, lib)
        parsed.builder = keep = _KeepConfig(parsed.builder)
        built = rt.build(path, batch_sizes=(1,), compute_capability="SM89", parsed=parsed, tf32=tf32)
        assert keep.config.get_flag(lib.module.BuilderFlag.TF32) is tf32 and built.facts()["tf32"] is tf32
        # TensorRT-RTX: engines that can be captured into a CUDA graph (no run-time allocation)
        assert keep.config.get_flag(lib.module.BuilderFlag.REQUIRE_USER_ALLOCATION)
        assert built.facts()["require_user_allocation"] is True
    fp32, tf32 = (rt.build_cached(path, tmp_path, batch_sizes=(1,), tf32=t) for t in (False, True))
    assert fp32["engine"] != tf32["engine"] and "_tf32_" in tf32["engine"] and not fp32["cached"]
    assert (fp32["tf32"], tf32["tf32"]) == (False, True)


def test_compute_capabilities_are_the_installed_enum_and_the_runnable_ones_a_subset(lib):
    enum = [n for n in lib.module.ComputeCapability.__members__ if n != "NONE"]
    assert sorted(rt.COMPUTE_CAPABILITIES) == sorted(enum)
    assert set(rt.RTX_RUNS_ON) < set(rt.COMPUTE_CAPABILITIES) and "SM80" not in rt.RTX_RUNS_ON
    assert sorted(rt.RTX_RUNS_ON.values()) == [(7, 5), (8, 6), (8, 9), (12, 0), (12, 1)]


def test_install_hint_names_tensorrt_for_the_cuda_major_of_torch(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert "pip install 'tensorrt-cu13>=10'" in rt.install_hint() and "tensorrt-cu12" not in rt.install_hint()
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert "pip install 'tensorrt-cu12>=10'" in rt.install_hint()


@pytest.mark.slow  # builds a TensorRT engine (about 7 s)
def test_tensorrt_rtx_engines_are_refused_on_a_gpu_they_do_not_run_on(lib, onnx_file, monkeypatch):
    """An H100 (9.0) is not in TensorRT-RTX's support matrix: one line naming the GPU and what to install,
    before anything is built or deserialized; an RTX 4090 (8.9) is."""
    if lib.name != "tensorrt_rtx":
        pytest.skip("the refusal is TensorRT-RTX's")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    for module in (rt.library, rt.builder, engine_loader):  # patched where each looks it up
        monkeypatch.setattr(module, "gpu_available", lambda: True)
    monkeypatch.setattr(rt.library, "gpu_description", lambda: ("NVIDIA H100 80GB HBM3", (9, 0)))
    line = rt.run_problem(lib)
    assert line.startswith(f"{lib.describe()} does not run on NVIDIA H100 80GB HBM3 (compute capability 9.0)")
    assert "7.5, 8.6, 8.9, 12.0, 12.1" in line and line.endswith("pip install 'tensorrt-cu13>=10'")
    assert "\n" not in line and rt.unavailable_reason(run=True) == line and rt.unavailable_reason() is None
    with pytest.raises(ValueError, match="does not run on NVIDIA H100"):
        rt.build(onnx_file("standard"), compute_capability="CURRENT")
    with pytest.raises(rt.TensorRTUnavailable, match="does not run on NVIDIA H100"):
        engine_loader.Engine(b"not an engine")
    assert rt.build(onnx_file("standard"), batch_sizes=(1,), compute_capability="SM89").compute_capability == "SM89"
    monkeypatch.setattr(rt.library, "gpu_description", lambda: ("NVIDIA GeForce RTX 4090", (8, 9)))
    assert rt.run_problem(lib) is None


def test_set_input_shape_is_checked():
    """TensorRT answers False (it does not raise) to a shape outside the profile; the engine says so."""

    class Context:
        def set_input_shape(self, name, shape):
            return shape[0] <= 8

    class Engine:
        def get_tensor_profile_shape(self, name, profile):
            return [(1, 3, 32, 32), (4, 3, 32, 32), (8, 3, 32, 32)]

    engine_loader.set_input_shape(Context(), Engine(), "image", (8, 3, 32, 32))
    with pytest.raises(
        rt.TensorRTError,
        match=r"does not take image of shape \(9, 3, 32, 32\): its profile "
        r"\(min / opt / max\) is \(1, 3, 32, 32\) / \(4, 3, 32, 32\)",
    ):
        engine_loader.set_input_shape(Context(), Engine(), "image", (9, 3, 32, 32))


@pytest.mark.slow  # parses and checks TensorRT networks (about 11 s)
def test_network_check_catches_a_missing_or_fp16_projection_op(lib, onnx_file):
    path = onnx_file("exclusive", "cls", "fp16")
    parsed = rt.parse_onnx(path, lib)
    proto = onnx.load(str(path))
    ops = {n.name: n.op_type for n in proto.graph.node}
    half = [
        layer["name"]
        for layer in rt.network_layers(parsed.network)
        if layer["type"] == "ELEMENTWISE" and layer["outputs"] == ["HALF"] and ops.get(layer["name"]) == "Add"
    ]
    assert half, "an fp16 graph has fp16 residual Adds"
    result = rt.check_network_precision(parsed.network, {"blocks.0.attn.head_projection": [half[0]]}, ops)
    assert not result["ok"] and "computes in HALF, not FLOAT" in result["failures"][0]
    missing = "blocks.0.attn.head_projection/Div_99"
    result = rt.check_network_precision(parsed.network, {"blocks.0.attn.head_projection": [missing]}, {missing: "Div"})
    assert not result["ok"] and "is not a layer of the TensorRT network" in result["failures"][0]


def test_broken_onnx_gets_a_clear_error(lib, tmp_path, onnx_file):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(rt.TensorRTParseError, match=r"cannot parse broken\.onnx: .*"):
        rt.parse_onnx(bad, lib)
    proto = onnx.load(str(onnx_file("standard")))  # a valid file whose graph uses an op TensorRT cannot have
    node = proto.graph.node[len(proto.graph.node) // 2]
    node.op_type, node.domain = "NoSuchOp", "attnzoo.fake"
    proto.opset_import.append(onnx.helper.make_opsetid("attnzoo.fake", 1))
    odd = tmp_path / "odd.onnx"
    onnx.save(proto, str(odd))
    with pytest.raises(rt.TensorRTParseError, match=r"cannot parse odd\.onnx: .*NoSuchOp"):
        rt.parse_onnx(odd, lib)


def test_library_choice_and_compute_capability_errors(lib, onnx_file, monkeypatch):
    with pytest.raises(ValueError, match="unknown TensorRT library 'nope'; valid: tensorrt, tensorrt_rtx"):
        rt.load_library("nope")
    with pytest.raises(ValueError, match="unknown compute capability 'SM90'; valid: SM75, SM80"):
        rt.build(onnx_file("standard"), compute_capability="SM90")
    if not GPU:
        with pytest.raises(ValueError, match="CURRENT needs a GPU"):
            rt.build(onnx_file("standard"), compute_capability="CURRENT")
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", None)  # TensorRT proper not importable
    monkeypatch.setenv(rt.LIBRARY_ENV, "tensorrt")
    with pytest.raises(rt.TensorRTUnavailable, match="pip install tensorrt-rtx"):
        rt.load_library()


@pytest.mark.slow  # builds a TensorRT engine (about 11 s on 2 cores)
def test_export_model_builds_an_engine_and_says_what_ran(lib, tmp_path, capsys):
    out = tmp_path / "b2.engine"
    assert (
        export_main(
            [
                "--variant",
                "belief2",
                "--random-init",
                "--format",
                "tensorrt",
                "--out",
                str(out),
                "--batch-sizes",
                "1,2",
                "--compute-capability",
                "sm86" if not GPU else "current",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    report = json.loads(engine_report_path(out).read_text())
    assert out.stat().st_size == report["engine_size"] > 0
    assert (tmp_path / "b2.onnx").is_file() and (tmp_path / "b2.report.json").is_file()
    assert report["library"] == lib.name and report["library_version"] == lib.version
    assert report["compute_capability"] == ("CURRENT" if GPU else "SM86") and report["build_time_s"] > 0
    assert report["onnx_verification"]["verified"] is True and report["passed"] is True
    assert report["network_check"]["extra_math_scopes"] == DEPTH
    assert report["ran_on_gpu"] is GPU and report["status"] == (STATUS_RUN if GPU else STATUS_BUILT)
    if GPU:
        assert report["parity"]["passed"] and report["latency"]["median_ms"] > 0
    else:
        assert report["parity"] is None and report["latency"] is None
        assert "BUILT, NOT RUN" in text and "SM86" in text


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--compute-capability", "SM99", "--format", "tensorrt"], "invalid choice: 'SM99'"),
        (["--compute-capability", "SM89"], "error: --compute-capability applies to --format tensorrt only"),
    ],
)
def test_export_model_compute_capability_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        export_main(["--variant", "belief2", "--random-init", *argv])
    assert info.value.code == 2  # a bad command line (docs/errors.md)
    assert message in (str(info.value) + capsys.readouterr().err)


@pytest.mark.slow  # builds TensorRT engines (about 12 s)
def test_only_a_verified_onnx_becomes_an_engine(lib, onnx_file, verified_onnx, tmp_path):
    """No report beside the file, a failed report, or a report of another file (edited after verification): refused
    in one line before parsing, and nothing written."""
    import shutil

    from attnzoo.export.verify import report_path
    from attnzoo.targets.tensorrt.verified import failed_engine_report_path, onnx_verification_error

    good = verified_onnx("belief2")
    assert onnx_verification_error(good) is None
    bare = onnx_file("belief2")  # exported, never verified
    failed = tmp_path / "failed.onnx"
    shutil.copyfile(good, failed)
    report_path(failed).write_text(json.dumps({**json.loads(report_path(good).read_text()), "passed": False}))
    edited = tmp_path / "edited.onnx"
    proto = onnx.load(str(good))
    proto.doc_string += " (edited)"
    onnx.save(proto, str(edited))
    shutil.copyfile(report_path(good), report_path(edited))
    for path, reason in (
        (bare, "has no verification report"),
        (failed, "failed its verification"),
        (edited, "is not the file edited.report.json verified"),
    ):
        engine = tmp_path / f"{path.stem}.engine"
        with pytest.raises(ValueError, match=f"^no engine built: .*{reason}") as info:
            build_engine(path, engine, batch_sizes=(1, 2), compute_capability="SM89")
        assert "\n" not in str(info.value)
        assert not engine.exists() and not engine_report_path(engine).exists()
        assert not failed_engine_report_path(engine).exists()
    report = build_engine(good, tmp_path / "good.engine", batch_sizes=(1, 2), compute_capability="SM89")
    assert report.passed and report.onnx_verification["verified"] is True
    assert report.onnx_verification["onnx_sha256"] == json.loads(report_path(good).read_text())["sha256"]
    # the report file is the returned report, read back through its schema byte for byte
    text = engine_report_path(tmp_path / "good.engine").read_text()
    assert EngineReport.from_json(text) == report and report.to_json() == text
    assert report.status == STATUS_BUILT and report.engine_size and report.compute_capability == "SM89"
    assert report.engine_sha256 == hashlib.sha256((tmp_path / "good.engine").read_bytes()).hexdigest()


@pytest.mark.slow  # builds a TensorRT engine from a verified export (about 12 s on 2 cores)
def test_failed_build_keeps_the_good_engine_and_its_report(lib, verified_onnx, tmp_path, monkeypatch):
    import attnzoo.targets.tensorrt.verified as etrt

    real = rt.check_network_precision

    def broken(network, scopes, op_types):
        result = real(network, scopes, op_types)
        return {**result, "ok": False, "failures": ["blocks.0.attn.projection: Div computes in HALF"]}

    engine = tmp_path / "m.engine"
    build_engine(verified_onnx("belief2"), engine)  # a good engine and its report
    good, good_report = engine.read_bytes(), engine_report_path(engine).read_text()
    monkeypatch.setattr(etrt.builder, "check_network_precision", broken)
    with pytest.raises(etrt.EngineBuildError, match="network: .*engine not saved"):
        build_engine(verified_onnx("belief2"), engine)
    assert engine.read_bytes() == good and engine_report_path(engine).read_text() == good_report
    assert json.loads(etrt.failed_engine_report_path(engine).read_text())["passed"] is False


@pytest.mark.slow
def test_bench_tensorrt_rows_say_built_not_run(lib, tmp_path, bench_args):
    from attnzoo.benchmarks.cli import parse_settings
    from attnzoo.benchmarks.run import run_benchmark

    s = parse_settings(bench_args(tmp_path, "belief", "eager,tensorrt", "--no-pair-eager", min_time="0.02"))
    rows = [r for r in run_benchmark(s)["results"] if r["backend"] == "tensorrt"]
    assert {r["variant"] for r in rows} == {"standard", "belief"}
    for r in rows:
        if GPU:
            assert r["status"] == "ok", r["reason"]
        else:
            assert r["status"] == "built" and r["reason"].startswith("built, not run (no GPU)"), r
            assert r["build_s"] > 0 and r["info"]["compute_capability"] == rt.DEFAULT_COMPUTE_CAPABILITY


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="running a TensorRT engine needs an NVIDIA GPU; none is visible")
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_engine_runs_and_matches_onnxruntime(lib, verified_onnx, tmp_path, dtype):
    from attnzoo.runtime.backends import onnx_reference

    path = verified_onnx("belief2", dtype)
    report = build_engine(path, tmp_path / "e.engine", batch_sizes=(1, 4, 8))
    assert report.ran_on_gpu and report.parity and report.parity["passed"], report.failures
    engine = engine_loader.Engine(tmp_path / "e.engine")
    assert engine.stream.cuda_stream != torch.cuda.default_stream().cuda_stream  # its own, not the legacy default
    x = np.random.default_rng(1).standard_normal((3, 3, 32, 32)).astype(np.float32)
    ref = onnx_reference().session(path).session.run(None, {"image": x})[0]
    assert compare(engine.run(x), ref, dtype)["passed"]
    with pytest.raises(rt.TensorRTError, match="does not take image of shape"):
        engine.run(np.zeros((9, 3, 32, 32), np.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="running a TensorRT engine needs an NVIDIA GPU; none is visible")
def test_the_benchmark_session_captures_a_graph_on_the_engines_stream(verified_onnx, tmp_path):
    from attnzoo.runtime.backends import LoadOptions, get_backend

    if rt.unavailable_reason(run=True):
        pytest.skip(rt.unavailable_reason(run=True))
    session = get_backend("tensorrt").load(verified_onnx("standard"), LoadOptions(batch=2, cache_dir=tmp_path))
    call = session.call(np.zeros((2, 3, 32, 32), np.float32))
    info = session.info()
    assert call.cuda_graph == (info["cuda_graph"] == "captured") and np.isfinite(call.output()).all()
    if session.engine.library.name == "tensorrt_rtx":
        assert call.cuda_graph and info["kernel_specialization"] == "EAGER" and info["require_user_allocation"]
        assert list((tmp_path / "tensorrt").glob("runtime_*.cache"))  # compiled kernels kept for the next run


# ------------------------------------------------------------------------- Ctrl-C during a build
def _interrupt_during_build(argv, marker: str, delay_s: float = 1.5, limit_s: float = 15.0):
    """Run a command, send SIGINT ``delay_s`` after ``marker`` (the progress bar naming the TensorRT step)
    shows on stderr; return (exit status, seconds from SIGINT to exit, stderr)."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    chunks, seen = [], threading.Event()

    def read() -> None:
        for chunk in iter(lambda: os.read(proc.stderr.fileno(), 4096), b""):
            chunks.append(chunk)
            if marker.encode() in b"".join(chunks[-4:]):
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    try:
        assert seen.wait(240), f"{marker!r} never shown: {b''.join(chunks).decode(errors='replace')[-2000:]}"
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        sent = time.perf_counter()
        rc = proc.wait(timeout=limit_s)
        took = time.perf_counter() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    return rc, took, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_ctrl_c_during_export_model_build_exits_130_and_writes_no_engine(lib, tmp_path):
    """TensorRT catches an exception raised in its logger callback and finishes the build, so a Ctrl-C must reach
    the build another way; no engine may be written. ViT-Ti: a build of a few seconds here."""
    out = tmp_path / "t.engine"
    rc, took, err = _interrupt_during_build(
        [
            "attnzoo.export.cli",
            "--variant",
            "standard",
            "--arch",
            "tiny",
            "--random-init",
            "--format",
            "tensorrt",
            "--batch-sizes",
            "1,8",
            "--out",
            str(out),
        ],
        marker="tensorrt]",
    )
    assert rc == 130 and took < 15, (rc, took, err[-2000:])
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C)"
    assert "Exception caught" not in err and "Traceback" not in err
    # the verified ONNX (written before the build) stays; no engine, no engine report, no temporary file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.onnx", "t.report.json"]


@pytest.mark.slow
def test_ctrl_c_during_bench_latency_build_exits_130_and_keeps_the_rows(lib, tmp_path):
    cache = tmp_path / "cache"
    rc, took, err = _interrupt_during_build(
        [
            "attnzoo.benchmarks.cli",
            "--arch",
            "tiny",
            "--variants",
            "standard",
            "--backends",
            "eager,tensorrt",
            "--batch-sizes",
            "1,8",
            "--min-time",
            "0.2",
            "--threads",
            "1",
            "--ceiling-size",
            "0",
            "--no-pair-eager",
            "--out",
            str(tmp_path / "out"),
            "--cache-dir",
            str(cache),
        ],
        marker="standard tensorrt fp32 b1",
    )
    assert rc == 130 and took < 15, (rc, took, err[-2000:])
    assert err.strip().splitlines()[-1] == "interrupted (Ctrl-C)"
    assert "Exception caught" not in err and "Traceback" not in err
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["interrupted"]["signal"] == "SIGINT"
    assert result["interrupted"]["during"] == "standard tensorrt fp32 b1"
    rows = result["results"]
    assert [(r["backend"], r["batch"], r["status"]) for r in rows] == [("eager", 1, "ok")]  # measured, kept
    assert rows[0]["median_ms"] > 0 and result["interrupted"]["rows_kept"] == 1
    assert (
        "Interrupted: stopped by Ctrl-C (SIGINT) during standard tensorrt fp32 b1"
        in (tmp_path / "out" / "results.md").read_text()
    )
    engines = cache / "tensorrt"
    assert not engines.exists() or not any(engines.iterdir())  # no engine, whole or half-written


def _isolated(code: str) -> None:
    """Run ``code`` in a fresh interpreter. A signal sent to the test process itself segfaulted full default runs
    twice (in whichever of these tests sent the first one, after earlier tests had run native libraries in the same
    process: Ray, TensorRT), and a build cancelled in-process may leave native threads behind."""
    import subprocess
    import sys
    import textwrap

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), (
        done.returncode,
        done.stdout[-2000:],
        done.stderr[-2000:],
    )


@pytest.mark.slow  # starts a TensorRT build (about 6 s)
def test_the_progress_monitor_cancels_the_build(onnx_file):
    """What a signal triggers: the monitor (a C callback: it never raises) answers False, TensorRT stops."""
    path = onnx_file("standard")
    _isolated(f"""
        from attnzoo.targets import tensorrt as rt
        from attnzoo.targets.tensorrt import builder

        def cancel_first(fn, cancel):
            cancel()
            return fn()

        parsed = rt.parse_onnx({str(path)!r}, rt.load_library())
        builder.run_in_worker = cancel_first  # where build() looks it up
        try:
            rt.build({str(path)!r}, parsed=parsed)
            raise SystemExit("the build was not cancelled")
        except rt.TensorRTError as exc:
            assert "failed to build" in str(exc), exc
        assert any("BuildCanceled" in e for e in parsed.logger.errors), parsed.logger.errors
        print("ok")
    """)
