"""bf16 where the CPU has bf16 units: the refusal elsewhere, OpenVINO with the extra math pinned to f32 and read
back from its runtime model, PyTorch autocast with the extra scopes in fp32, the accuracy gate and serving."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from attnzoo.machine import BF16_FLAGS, bf16_problem, cpu_info

#: This machine has bf16 units (the refusal tests then do not apply; the bf16 runs do).
HAS_BF16 = bf16_problem() is None
#: Why a refusal test skips on this CPU: it checks what bf16 does on a CPU without bf16 units (refused in one line),
#: so it needs a machine that lacks them (AVX2-only, or AVX-512 without avx512_bf16/AMX); this CPU has them.
NEEDS_NO_BF16 = "needs a CPU without bf16 units (avx512_bf16, AMX), to check the refusal there; this CPU has them"


# ------------------------------------------------------------------------------------------ the CPU's bf16 units
def test_bf16_problem_names_the_missing_flags_and_accepts_each_bf16_unit():
    avx2 = {"model": "AVX2 CPU", "flags": ["sse2", "avx", "avx2", "fma", "f16c"]}
    line = bf16_problem(avx2)
    assert line is not None and "\n" not in line
    assert "AVX2 CPU" in line and "avx512_bf16" in line and "amx_bf16" in line
    arm = bf16_problem({"model": "Arm CPU", "flags": ["asimd", "sve"]})
    assert arm is not None and "no bf16" in arm and "avx512" not in arm
    for flag in BF16_FLAGS:
        assert bf16_problem({"model": "X", "flags": ["avx2", flag]}) is None
    assert bf16_problem({"model": "X", "key_flags": ["avx2", "amx_bf16"]}) is None  # a results file's cpu dict


def test_bf16_problem_reads_this_machine():
    has = bool(set(BF16_FLAGS) & set(cpu_info()["flags"]))
    assert (bf16_problem() is None) == has


# ------------------------------------------------------------------------------------------------------ OpenVINO


@pytest.fixture(scope="module")
def belief2(tmp_path_factory):
    """A micro belief2 classifier (its projection has the Divide and the Subtract that OpenVINO rewrites), its
    export and the names of its extra-math nodes."""
    import onnx
    import torch

    from attnzoo.export import export_onnx
    from attnzoo.export.quantize import extra_math_nodes
    from attnzoo.models import create_model

    torch.manual_seed(0)
    model = create_model("belief2", task="cls", arch="micro").eval()
    path = export_onnx(model, tmp_path_factory.mktemp("bf16") / "belief2.onnx")
    return model, path, extra_math_nodes(onnx.load(str(path), load_external_data=False))


def _inputs(path, n: int = 2, seed: int = 0):
    import numpy as np

    from attnzoo.runtime.contract import ModelContract

    return np.random.default_rng(seed).standard_normal(
        (n, 3, *ModelContract.from_onnx(path).input_size), dtype=np.float32
    )


def test_precision_check_lets_a_reshape_pass_the_extra_maths_bf16_input_on_but_not_its_f32_result():
    from attnzoo.targets.openvino.library import PrecisionCheckError, check_runtime_precisions, runtime_precisions

    pinned = ["blocks.0.attn.distance/Unsqueeze", "blocks.0.attn.distance/Sub"]
    qkv = ("blocks.0.attn/qkv", "FullyConnected", "bf16", "blocks.0.attn/qkv")
    unsqueeze = ("blocks.0.attn.distance/Unsqueeze", "Reshape", "bf16", "blocks.0.attn.distance/Unsqueeze")
    sub = ("blocks.0.attn.distance/Sub", "Eltwise", "f32", "blocks.0.attn.distance/Sub")
    head = ("head", "FullyConnected", "bf16", "head")
    # the matmul's bf16 output reshaped on its way into the f32 arithmetic: nothing is rounded by the reshape
    report = runtime_precisions(_fake_compiled([qkv, unsqueeze, sub, head], "bf16"), pinned)
    check_runtime_precisions(report, "bf16")
    assert report["extra_math"]["carried"] == ["blocks.0.attn.distance/Unsqueeze (Reshape, bf16)"]
    # the same reshape after the f32 arithmetic: the result went back to bf16 inside the extra math
    after = ("blocks.0.attn.distance/Unsqueeze", "Reshape", "bf16", "blocks.0.attn.distance/Unsqueeze")
    report = runtime_precisions(_fake_compiled([qkv, sub, after, head], "bf16"), pinned)
    assert report["extra_math"]["carried"] == []
    with pytest.raises(PrecisionCheckError, match=r"1 of 2 runtime nodes .*distance/Unsqueeze \(Reshape, bf16\)"):
        check_runtime_precisions(report, "bf16")


@pytest.mark.skipif(HAS_BF16, reason=NEEDS_NO_BF16)
def test_openvino_bf16_is_refused_here_in_one_line(belief2):
    from attnzoo.runtime.backends import LoadOptions, get_backend
    from attnzoo.targets.openvino.backend import OpenVINOSession

    _, path, names = belief2
    reason = get_backend("openvino").unavailable_reason("bf16")
    assert reason is not None and "\n" not in reason and "avx512_bf16" in reason and "amx_bf16" in reason
    with pytest.raises(ValueError, match="^bf16: this CPU .* no bf16 units") as exc:
        OpenVINOSession(path, precision="bf16", keep_f32=names)
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="no bf16 units"):
        get_backend("openvino").load(path, LoadOptions(dtype="bf16", keep_f32=names))


def test_pin_f32_gives_each_extra_math_op_openvinos_attribute_and_keeps_the_math(belief2):
    import numpy as np

    from attnzoo.targets.openvino.backend import OpenVINOSession
    from attnzoo.targets.openvino.library import pin_f32, read_onnx

    _, path, names = belief2
    model, pinned, missing = pin_f32(read_onnx(path), names)
    assert missing == [] and set(names) <= set(pinned)
    ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    marked = {n for n, op in ops.items() if "DisablePrecisionConversion_0" in op.get_rt_info()}
    assert marked == set(pinned)  # every extra-math op, and nothing else
    scoped = [op for n, op in ops.items() if n in marked]
    assert not [op for op in scoped if op.get_type_name() == "Subtract"]  # written as Add(a, Multiply(b, -1))
    negations = [n for n in pinned if n not in names]
    assert len(negations) == 4 and all(ops[n].get_type_name() == "Multiply" for n in negations)  # one per block
    divides = [op for op in scoped if op.get_type_name() == "Divide"]
    assert len(divides) == 4 and all("nonconvertable_divide_0" in op.get_rt_info() for op in divides)
    x = _inputs(path, 3)
    plain, pinned_run = OpenVINOSession(path, threads=1).run(x), OpenVINOSession(path, threads=1, keep_f32=names)
    np.testing.assert_allclose(pinned_run.run(x), plain, rtol=0, atol=1e-5)


def test_runtime_model_read_back_finds_every_extra_math_op_in_a_pinned_f32_kernel(belief2):
    from attnzoo.targets.openvino.backend import OpenVINOSession
    from attnzoo.targets.openvino.library import runtime_precisions

    _, path, names = belief2
    session = OpenVINOSession(path, threads=1, keep_f32=names)
    check = session.precision_check
    x = check["extra_math"]
    assert check["inference_precision"] == "f32" and x["missing"] == [] and x["not_f32"] == []
    assert x["runtime_nodes"] > 0 and x["by_precision"] == {"f32": x["runtime_nodes"]}
    assert x["unpinned"] == []  # OpenVINO's rewrites left every extra-math kernel rooted at a pinned op
    assert check["matmuls"]["by_precision"] == {"f32": sum(check["matmuls"]["by_precision"].values())}
    runtime = session.compiled.get_runtime_model().get_ordered_ops()
    computed = {n for op in runtime for n in op.get_rt_info()["originalLayersNames"].astype(str).split(",")}
    assert set(names) <= computed  # every extra-math op is computed by some kernel of the runtime model
    groups = {
        op.get_friendly_name(): set(op.get_rt_info()["originalLayersNames"].astype(str).split(",")) for op in runtime
    }
    root = next(name for name, ops in groups.items() if len(ops & set(names)) >= 2)  # a kernel of 2+ extra ops
    again = runtime_precisions(session.compiled, [n for n in session.pinned if n != root])
    assert any(u.startswith(f"{root} (") for u in again["extra_math"]["unpinned"])  # its own op unpinned: flagged
    assert session.info()["precision_check"]["extra_math_not_f32"] == []


def _fake_compiled(nodes, precision: str):
    """A compiled model whose runtime model holds ``nodes``: (name, layer type, runtime precision, original ops)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    x = ops.parameter([1, 4], np.float32, name="image")
    out = x
    for name, layer, prec, original in nodes:
        out = ops.relu(out)
        out.set_friendly_name(name)
        for key, value in (("layerType", layer), ("runtimePrecision", prec), ("originalLayersNames", original)):
            out.get_rt_info()[key] = value
    runtime = ov.Model([out], [x])

    class Compiled:
        def get_property(self, key):
            assert key == "INFERENCE_PRECISION_HINT"
            return ov.Type.bf16 if precision == "bf16" else ov.Type.f32

        def get_runtime_model(self):
            return runtime

    return Compiled()


def test_precision_check_refuses_extra_math_off_f32_matmuls_off_bf16_and_a_silent_f32():
    from attnzoo.targets.openvino.library import PrecisionCheckError, check_runtime_precisions, runtime_precisions

    pinned = ["blocks.0.attn.projection/Div", "blocks.0.attn.projection/Mul_2"]
    good = [
        ("blocks.0.attn/qkv", "FullyConnected", "bf16", "blocks.0.attn/qkv"),
        (
            "blocks.0.attn.projection/Div",
            "Eltwise",
            "f32",
            "blocks.0.attn.projection/Div,blocks.0.attn.projection/Mul_2",
        ),
        ("head", "FullyConnected", "bf16", "head"),
    ]
    report = runtime_precisions(_fake_compiled(good, "bf16"), pinned)
    check_runtime_precisions(report, "bf16")  # passes
    assert report["extra_math"]["by_precision"] == {"f32": 1} and report["matmuls"]["by_precision"] == {"bf16": 2}
    bad = [good[0], ("Power_7", "Eltwise", "bf16", "Power_7,blocks.0.attn.projection/Div"), good[2]]
    report = runtime_precisions(_fake_compiled(bad, "bf16"), pinned)
    assert report["extra_math"]["unpinned"] == ["Power_7 (Eltwise, bf16)"]
    off = r"1 of 1 runtime nodes of the extra math .* Power_7 \(Eltwise, bf16\)"
    with pytest.raises(PrecisionCheckError, match=off):
        check_runtime_precisions(report, "bf16")
    f32_fc = [good[0], good[1], ("head", "FullyConnected", "f32", "head")]
    with pytest.raises(PrecisionCheckError, match=r"do not all run at bf16 .* head \(FullyConnected, f32\)"):
        check_runtime_precisions(runtime_precisions(_fake_compiled(f32_fc, "bf16"), pinned), "bf16")
    with pytest.raises(PrecisionCheckError, match="compiled the model at f32, not bf16"):
        check_runtime_precisions(runtime_precisions(_fake_compiled(good, "f32"), pinned), "bf16")
    with pytest.raises(PrecisionCheckError, match="none of the 2 pinned ops appears"):
        check_runtime_precisions(runtime_precisions(_fake_compiled([good[0]], "bf16"), pinned), "bf16")


@pytest.mark.skipif(HAS_BF16, reason=NEEDS_NO_BF16)
def test_without_the_refusal_openvino_compiles_bf16_at_f32_here_and_the_read_back_says_so(belief2, monkeypatch):
    from attnzoo.targets.openvino import library as ov_rt
    from attnzoo.targets.openvino.backend import OpenVINOSession

    _, path, names = belief2
    monkeypatch.setattr(ov_rt, "bf16_unavailable_reason", lambda: None)
    with pytest.raises(ov_rt.PrecisionCheckError, match="compiled the model at f32, not bf16"):
        OpenVINOSession(path, threads=1, precision="bf16", keep_f32=names)


@pytest.mark.skipif(not HAS_BF16, reason="needs a CPU with bf16 units")
def test_openvino_bf16_runs_the_extra_math_at_f32_and_matches_eager_within_the_bf16_tolerance(belief2):
    import torch

    from attnzoo.runtime.backends import LoadOptions, get_backend
    from attnzoo.runtime.parity import TOLERANCES, parity_error

    model, path, names = belief2
    session = get_backend("openvino").load(path, LoadOptions(dtype="bf16", threads=1, keep_f32=names))
    check = session.info()["precision_check"]
    assert check["inference_precision"] == "bf16" and check["extra_math_not_f32"] == []
    assert set(check["matmuls"]) == {"bf16"}
    x = _inputs(path, 3)
    with torch.inference_mode():
        ref = model(torch.from_numpy(x)).numpy()
    assert parity_error(session.run(x), ref) <= TOLERANCES["bf16"]


def test_openvino_bf16_needs_the_extra_math_names_of_a_variant_with_extra_math(belief2, monkeypatch):
    from attnzoo.runtime.backends import LoadOptions, get_backend
    from attnzoo.targets.openvino import library as ov_rt

    _, path, _ = belief2
    monkeypatch.setattr(ov_rt, "bf16_unavailable_reason", lambda: None)
    with pytest.raises(ValueError, match="bf16 needs the names of the ops to keep at f32"):
        get_backend("openvino").load(path, LoadOptions(dtype="bf16"))


# ---------------------------------------------------------------------------------------------- PyTorch autocast
@pytest.mark.skipif(HAS_BF16, reason=NEEDS_NO_BF16)
@pytest.mark.parametrize("backend", ["eager", "compile"])
def test_pytorch_bf16_on_this_cpu_is_refused_in_one_line_but_not_on_a_gpu(backend):
    from attnzoo.runtime.backends import get_backend

    reason = get_backend(backend).unavailable_reason("bf16", "cpu")
    assert reason == bf16_problem() and "avx512_bf16" in reason
    assert get_backend("eager").unavailable_reason("bf16", "cuda") is None


@pytest.mark.parametrize("variant,scope", [("belief2", "projection"), ("wafe-mae", "distance")])
def test_pytorch_bf16_autocast_runs_the_extra_scopes_in_fp32_and_the_rest_in_bf16(variant, scope, monkeypatch):
    """PyTorch's bf16 kernels run on any CPU (converted to fp32 where it has no bf16 units), so the autocast path
    is checked here even where the backend refuses bf16 for speed."""
    import numpy as np
    import torch

    from attnzoo.models import create_model
    from attnzoo.runtime.parity import TOLERANCES, parity_error
    from attnzoo.targets.pytorch.eager import TorchSession

    torch.manual_seed(0)
    model = create_model(variant, task="cls", arch="micro").eval()
    scope_cls = type(model.get_submodule(f"blocks.0.attn.{scope}"))
    seen = {"scope": set(), "scope autocast": set(), "qkv": set(), "qkv autocast": set()}
    original = scope_cls.forward

    def recorded(self, *args, **kwargs):  # what the scope's own code receives
        seen["scope"].update(a.dtype for a in args if torch.is_tensor(a))
        seen["scope autocast"].add(torch.is_autocast_enabled("cpu"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(scope_cls, "forward", recorded)
    session = TorchSession(model, backend="eager", dtype="bf16", device="cpu", threads=1)

    def qkv_hook(module, args, out):
        seen["qkv"].add(out.dtype)
        seen["qkv autocast"].add(torch.is_autocast_enabled("cpu"))

    for name, module in session.net.named_modules():
        if name.endswith("attn.qkv"):
            module.register_forward_hook(qkv_hook)
    size = model.attnzoo_config["img_size"]
    x = np.random.default_rng(0).standard_normal((2, 3, size, size), dtype=np.float32)
    out = session.run(x)
    assert seen["scope"] == {torch.float32} and seen["scope autocast"] == {False}
    assert seen["qkv"] == {torch.bfloat16} and seen["qkv autocast"] == {True}
    assert "4 extra-math scope module(s) in fp32" in session.info()["autocast"]
    assert next(session.net.parameters()).dtype == torch.float32  # fp32 weights, cast per op by autocast
    monkeypatch.undo()
    with torch.inference_mode():
        ref = model(torch.from_numpy(x)).numpy()
    assert 0 < parity_error(out, ref) <= TOLERANCES["bf16"]  # bf16 did happen, within the bf16 tolerance


# ---------------------------------------------------------------------------------------------- bench-latency
@pytest.mark.slow
def test_bench_latency_bf16_rows_are_refused_here_or_run_with_the_extra_math_read_back(tmp_path, bench_args):
    import json

    from attnzoo.benchmarks.cli import main
    from attnzoo.runtime.parity import TOLERANCES

    args = bench_args(tmp_path, "belief2", "eager,openvino", "--ceiling-size", "128", "--dtypes", "fp32,bf16")
    assert main(args) == 0
    rows = {(r["backend"], r["dtype"]): r for r in json.loads((tmp_path / "results.json").read_text())["results"]}
    assert rows[("eager", "fp32")]["status"] == rows[("openvino", "fp32")]["status"] == "ok"
    for backend in ("eager", "openvino"):
        row = rows[(backend, "bf16")]
        assert row["parity_tol"] == TOLERANCES["bf16"]
        if HAS_BF16:
            assert row["status"] == "ok" and row["parity_error"] <= TOLERANCES["bf16"]
        else:
            assert row["status"] == "skipped" and "no bf16 units" in row["reason"] and "avx512_bf16" in row["reason"]
    if HAS_BF16:
        check = rows[("openvino", "bf16")]["info"]["precision_check"]
        assert check["inference_precision"] == "bf16" and check["extra_math_not_f32"] == []


@pytest.mark.skipif(HAS_BF16, reason=NEEDS_NO_BF16)
def test_a_benchmark_row_passes_openvino_the_extra_math_to_pin(belief2, tmp_path, monkeypatch):
    """Without the refusal this CPU compiles bf16 at f32, which the read-back refuses: the row got as far as
    pinning and reading back the extra math, so it passed the names (without them the load refuses earlier)."""
    import numpy as np

    from attnzoo.benchmarks.rows import load_call
    from attnzoo.targets.openvino import library as ov_rt

    model, path, _ = belief2
    monkeypatch.setattr(ov_rt, "bf16_unavailable_reason", lambda: None)
    x = _inputs(path, 1).astype(np.float32)
    with pytest.raises(ov_rt.PrecisionCheckError, match="compiled the model at f32, not bf16"):
        load_call("openvino", model, path, x, "bf16", threads=1, device="cpu", cache_dir=tmp_path)


# ------------------------------------------------------------------------------------- verified before served
def test_bf16_serves_fp32_graphs_only():
    from attnzoo.runtime.sessions import SERVED_DTYPES, serves

    assert "bf16" in SERVED_DTYPES
    assert serves("bf16", "fp32") and not serves("bf16", "fp16") and not serves("bf16", "int8")
    assert serves("fp32", "fp16") and serves("int8", "int8") and not serves("fp32", "int8")


@pytest.fixture(scope="module")
def zoo_belief2(tmp_path_factory):
    """The zoo's trained belief2 Fashion-MNIST classifier, exported and verified as the demo exports it."""
    from attnzoo import zoo
    from attnzoo.export import export_verified

    model, config = zoo.load("belief2", "cls", "fashion")
    path = tmp_path_factory.mktemp("zoo") / "belief2_cls.onnx"
    export_verified(model, path, config, batch_sizes=(1,))
    return path, config


def _names(path):
    import onnx

    from attnzoo.export.quantize import extra_math_nodes

    return extra_math_nodes(onnx.load(str(path), load_external_data=False))


@pytest.mark.slow
def test_score_puts_each_run_on_the_same_test_images(zoo_belief2):
    import numpy as np

    from attnzoo.export.quantize import evaluate_onnx
    from attnzoo.runtime.evaluate import score_runs as score
    from attnzoo.targets.openvino.backend import OpenVINOSession

    path, config = zoo_belief2
    run = OpenVINOSession(path, threads=1).run
    noisy = lambda x: run(x) + np.random.default_rng(0).normal(0, 3, (len(x), 10)).astype(np.float32)  # noqa: E731
    ev = score({"fp32": run, "again": run, "noisy": noisy}, config, limit=500)
    assert ev["n_images"] == 500 and ev["metric_name"] == "top1" and ev["split"] == "test"
    assert ev["metrics"]["again"] == ev["metrics"]["fp32"] and ev["agreement"]["again"] == 1.0
    assert ev["metrics"]["noisy"] < ev["metrics"]["fp32"] - 5 and ev["agreement"]["noisy"] < 0.9
    reference = evaluate_onnx({"fp32": path}, config, limit=500)  # ONNX Runtime on the same split
    assert abs(reference["metrics"]["fp32"] - ev["metrics"]["fp32"]) <= 0.2  # at most one image of 500 apart
    with pytest.raises(FloatingPointError):
        score({"nan": lambda x: run(x) * np.nan}, config, limit=64)
    with pytest.raises(ValueError, match="no test split"):
        score({"fp32": run}, {**config, "untrained": True}, limit=64)


class _Fake:
    """A session of the same file standing in for bf16 (this CPU has none): ``shift`` degrades its logits."""

    def __init__(self, path, names, noise: float = 0.0):
        import numpy as np

        from attnzoo.targets.openvino.backend import OpenVINOSession

        real = OpenVINOSession(path, threads=1, keep_f32=names)
        rng = np.random.default_rng(0)
        self.precision_check = real.precision_check
        self.run = lambda x: (
            real.run(x) + rng.normal(0, noise, (len(x), 10)).astype(np.float32) if noise else real.run(x)
        )


@pytest.mark.slow
def test_verify_bf16_writes_a_report_reuses_it_here_only_and_refuses_a_drop_beyond_the_gate(
    zoo_belief2, tmp_path, monkeypatch
):
    import json

    from attnzoo.targets.openvino import bf16
    from attnzoo.targets.openvino.backend import OpenVINOSession

    path, config = zoo_belief2
    names = _names(path)
    fp32 = OpenVINOSession(path, threads=1)
    monkeypatch.setattr(bf16, "_sessions", lambda p, k, t: (fp32, _Fake(p, k)))
    assert bf16.bf16_verification_problem(path, tmp_path).endswith("has not been verified at bf16 on this machine")
    report = bf16.verify_bf16(path, config, names, cache_dir=tmp_path)
    assert report["passed"] and report["accuracy"]["drop"] == 0 and report["accuracy"]["n_images"] == 10_000
    assert report["accuracy"]["gate"] == bf16.ACCURACY_GATE["cls"] and report["precision_check"]["extra_math_ops"]
    assert json.loads(bf16.report_path(path, tmp_path).read_text()) == report
    assert bf16.bf16_verification_problem(path, tmp_path) is None
    monkeypatch.setattr(bf16, "_sessions", lambda p, k, t: pytest.fail("a verified file is not scored again"))
    assert bf16.verify_bf16(path, config, names, cache_dir=tmp_path) == report
    moved = {**report, "cpu": "another CPU"}
    bf16.report_path(path, tmp_path).write_text(json.dumps(moved))
    assert "measured with another cpu (another CPU)" in bf16.bf16_verification_problem(path, tmp_path)
    monkeypatch.setattr(bf16, "_sessions", lambda p, k, t: (fp32, _Fake(p, k)))
    quick = bf16.verify_bf16(path, config, names, cache_dir=tmp_path, limit=200)  # a quick look writes nothing
    assert json.loads(bf16.report_path(path, tmp_path).read_text()) == moved and not quick["passed"]
    monkeypatch.setattr(bf16, "_sessions", lambda p, k, t: (fp32, _Fake(p, k, noise=3.0)))
    with pytest.raises(bf16.Bf16AccuracyError, match=r"bf16 top1 .* points below fp32's .* \(gate 0.25\)"):
        bf16.verify_bf16(path, config, names, cache_dir=tmp_path)
    assert "points below fp32 on the test split (gate 0.25)" in bf16.bf16_verification_problem(path, tmp_path)


@pytest.mark.skipif(HAS_BF16, reason=NEEDS_NO_BF16)
def test_bf16_serving_is_refused_here_in_one_line_before_any_work(belief2, tmp_path):
    from attnzoo import zoo
    from attnzoo.serve.demo.cli import main as demo_main
    from attnzoo.serve.loading import load_models
    from attnzoo.targets.openvino.bf16 import verify_bf16

    _, path, names = belief2
    config = zoo.load("belief2", "cls", "fashion")[1]
    with pytest.raises(ValueError, match="^bf16: this CPU .* no bf16 units"):
        verify_bf16(path, config, names, cache_dir=tmp_path)
    with pytest.raises(ValueError, match="^--dtype bf16: this CPU .* no bf16 units"):
        load_models(None, cache_dir=tmp_path, dtype="bf16")  # the zoo: refused before anything is exported
    with pytest.raises(SystemExit, match="^error: --dtype bf16: this CPU .* no bf16 units") as exc:
        demo_main(["--dtype", "bf16", "--cache-dir", str(tmp_path)])
    assert "\n" not in str(exc.value) and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="--dtype bf16 runs on OpenVINO .*, not ort-cpu"):
        load_models(path.parent, "ort-cpu", dtype="bf16")


@pytest.mark.skipif(HAS_BF16, reason=NEEDS_NO_BF16)
def test_serve_models_dtype_bf16_is_refused_here_and_needs_openvino_and_trained_models(belief2):
    from attnzoo.serve.rayserve.cli import main as serve_main
    from attnzoo.serve.rayserve.config import ServeConfig

    _, path, _ = belief2
    with pytest.raises(SystemExit, match="^error: --dtype bf16: this CPU .* no bf16 units") as exc:
        serve_main(["--dtype", "bf16", "--backend", "openvino", "--models", str(path.parent)])
    assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="dtype bf16 runs on OpenVINO .*, not ort-cpu"):
        ServeConfig(dtype="bf16").validate()
    with pytest.raises(ValueError, match="random-init models have no test set to verify bf16 on"):
        ServeConfig(dtype="bf16", backend="openvino", arch="micro").validate()


@pytest.mark.slow
def test_serve_models_selects_the_fp32_exports_for_bf16(zoo_belief2):
    from attnzoo.serve.rayserve.selection import _matching

    path, _ = zoo_belief2
    assert list(_matching(path.parent, [path.name], None, None, "bf16").files) == [path.name]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_BF16, reason="needs a CPU with bf16 units")
def test_bf16_is_served_once_verified(zoo_belief2, tmp_path):
    from attnzoo.serve.loading import load_models
    from attnzoo.targets.openvino.bf16 import bf16_verification_problem

    path, _ = zoo_belief2
    (model,) = load_models(path.parent, cache_dir=tmp_path, dtype="bf16")
    assert model.dtype == "bf16" and model.backend == "openvino"
    assert bf16_verification_problem(path, tmp_path) is None


# ------------------------------------------------------------------------------------------------ the study
@pytest.mark.slow
@pytest.mark.skipif(HAS_BF16, reason=NEEDS_NO_BF16)
def test_the_study_here_checks_the_pins_and_says_why_it_measures_no_bf16(tmp_path):
    import json

    from research.bf16 import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "--variants",
                "belief2",
                "--task",
                "cls",
                "--out",
                str(out),
                "--cache-dir",
                str(tmp_path / "c"),
                "--no-progress",
            ]
        )
        == 0
    )
    res = json.loads((out / "bf16.json").read_text())
    assert res["bf16_unavailable"] == bf16_problem() and res["speed_not_measured"] == bf16_problem()
    (row,) = res["zoo"]
    assert row["status"] == "ok" and row["compiled_at"] == "f32" and "accuracy" not in row
    x = row["extra_math"]
    assert row["extra_math_nodes"] == 32 and x["missing"] == [] and x["unpinned"] == [] and x["not_f32"] == []
    md = (out / "bf16.md").read_text()
    assert "**bf16 is refused on this CPU:** this CPU" in md and "| belief2 | cls | 32 |" in md
    assert not (out / "bf16.partial.json").exists()


def test_the_study_report_of_a_bf16_cpu_has_accuracy_speed_and_the_read_back():
    from research.bf16 import markdown

    env = {
        "cpu": {"model": "Xeon", "key_flags": ["avx2", "avx512_bf16", "amx_bf16"], "usable_cores": 2},
        "versions": {"openvino": "2026.4.1", "torch": "2.14.1"},
    }
    acc = {
        "metric_name": "top1",
        "metrics": {"fp32": 89.41, "bf16": 89.38},
        "drop": 0.03,
        "gate": 0.25,
        "agreement": {"bf16": 0.9981},
        "n_images": 10000,
    }
    zoo = [
        {
            "variant": "belief2",
            "task": "cls",
            "status": "ok",
            "extra_math_nodes": 32,
            "compiled_at": "bf16",
            "extra_math": {"by_precision": {"f32": 24}, "unpinned": []},
            "matmuls": {"bf16": 28},
            "accuracy": acc,
        }
    ]
    speed = [
        {
            "variant": "belief2",
            "threads": 1,
            "batch": 1,
            "load_1min": 0.7,
            "fp32": {"median_ms": 80.0},
            "bf16": {"median_ms": 25.0, "speedup_median": 3.2, "speedup_q1": 3.1, "speedup_q3": 3.3},
            "int8": {"median_ms": 23.0, "speedup_median": 3.5, "speedup_q1": 3.4, "speedup_q3": 3.6},
            "precision_check": {"extra_math_runtime_nodes": {"f32": 72}},
        }
    ]
    md = markdown(
        {
            "command": "python -m research.bf16 --out x",
            "environment": env,
            "bf16_unavailable": None,
            "zoo": zoo,
            "speed": speed,
            "load_start": [0.5],
            "load_end": [0.9],
            "speed_settings": {"arch": "small", "min_time": 3.0},
        }
    )
    assert "refused" not in md and "Test images per model: 10000." in md
    row = "| belief2 | cls | 32 | 24 f32 kernel(s); all pinned | 28 bf16 | top1 | 89.41 | 89.38 | 0.03 | 0.25 | 0.9981"
    assert row in md
    assert "| belief2 | 1 | 1 | 80.00 | 25.00 | 3.20 [3.10, 3.30] | 23.00 | 3.50 [3.40, 3.60] | 72 of 72 | 0.70 |" in md


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--batch-sizes", "0", "batch"),
        ("--speed-threads", "0", "thread"),
        ("--min-time", "0", "--min-time"),
        ("--variants", "nope", "nope"),
    ],
)
def test_the_study_refuses_bad_input_in_one_line_before_any_work(tmp_path, flag, value, needle):
    from research.bf16 import main

    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "out"), flag, value])
    assert exc.value.code == 2 and needle in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ light --help
@pytest.mark.parametrize("module, flag", [("research.bf16", "--speed-arch"), ("attnzoo.serve.rayserve.cli", "--help")])
def test_help_reads_the_zoo_without_torch(module, flag):
    """The study's and serve-models' --help take the zoo's default data set (attnzoo.zoo) without loading PyTorch,
    ONNX or timm."""
    code = (
        f"import sys\nfrom {module} import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'onnx', 'timm') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]  # the studies (research/) run from the repository root
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert flag in proc.stdout and proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-2000:]
