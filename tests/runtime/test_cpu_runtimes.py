"""The CPU performance picture: the machine's matmul ceiling, counted FLOPs against an explicit ViT formula,
the fraction of the ceiling, OpenVINO's parity with eager, and the measured choice of CPU runtime."""

from __future__ import annotations

import math
import time

import pytest
import torch

from attnzoo.benchmarks.ceiling import ceiling_for, fraction, int8_isa, matmul_ceiling
from attnzoo.benchmarks.flops import CDIST_FLOPS_PER_TERM, count_flops
from attnzoo.machine import KEY_FLAGS, cpu_info, cpu_summary
from attnzoo.models import create_model
from attnzoo.runtime.choice import fastest_cpu_runtime
from attnzoo.runtime.parity import TOLERANCES, parity_error


def test_ceiling_is_a_positive_finite_rate_with_the_cpu_flags():
    c = matmul_ceiling(threads=1, n=128, seconds=0.05)
    assert c["threads"] == 1 and c["shape"] == [128, 128, 128]
    assert set(c["fp32"]["by_library"]) >= {"torch", "onnxruntime", "openvino"}
    for rate in c["fp32"]["by_library"].values():
        assert math.isfinite(rate["median_gflops"]) and rate["median_gflops"] > 0 and rate["calls"] >= 3
        assert rate["best_gflops"] >= rate["median_gflops"]
    assert c["fp32"]["gflops"] == max(r["median_gflops"] for r in c["fp32"]["by_library"].values())
    cpu = cpu_info()
    assert c["cpu"] == cpu["model"] and c["key_flags"] == [f for f in KEY_FLAGS if f in cpu["flags"]]
    if int8_isa(cpu["flags"]):
        assert c["int8"]["status"] == "measured" and math.isfinite(c["int8"]["gops"]) and c["int8"]["gops"] > 0
    else:
        assert c["int8"]["status"] == "not measured" and c["int8"]["reason"]


def test_int8_isa_names_the_best_instruction_set_present():
    assert int8_isa(["sse2", "avx2", "avx512_vnni", "avx_vnni"]).startswith("avx512_vnni")
    assert int8_isa(["avx2", "fma"]) == "avx2: AVX2 vpmaddubsw (no VNNI)"
    assert int8_isa(["amx_int8", "avx512_vnni"]).startswith("amx_int8")
    assert int8_isa(["sse2", "sse4_2"]) is None


def test_cpu_summary_names_present_and_absent_fast_paths():
    assert (
        cpu_summary({"model": "X", "key_flags": ["avx", "avx2", "fma", "f16c"]})
        == "X (avx, avx2, fma, f16c; no avx512f, avx512_vnni, avx_vnni, amx_int8)"
    )
    assert (
        cpu_summary({"model": "Y", "key_flags": ["avx2", "avx512f", "avx512_vnni"]})
        == "Y (avx2, avx512f, avx512_vnni; no avx_vnni, amx_int8)"
    )


def _vit_flops(img: int, patch: int, dim: int, depth: int, mlp: int, classes: int, attention_terms: int) -> int:
    """FLOPs of a ViT written from its architecture: 2 per multiply-add; ``attention_terms`` = FLOPs of the
    scores and the weighted sum of one block."""
    patches = (img // patch) ** 2
    n = patches + 1  # the class token
    stem = 2 * patches * dim * (3 * patch * patch)
    block = 2 * n * dim * 3 * dim + 2 * n * dim * dim + 2 * n * dim * mlp + 2 * n * mlp * dim + attention_terms
    return stem + depth * block + 2 * dim * classes


def test_flops_of_standard_vit_tiny_match_the_explicit_formula():
    model = create_model("standard", task="cls", arch="tiny").eval()
    img, patch, dim, depth, heads, mlp, classes = 224, 16, 192, 12, 3, 768, 1000  # ViT-Ti
    assert (
        model.patch_embed.img_size[0],
        model.patch_embed.patch_size[0],
        model.embed_dim,
        len(model.blocks),
        model.blocks[0].attn.num_heads,
        model.blocks[0].mlp.fc1.out_features,
        model.num_classes,
    ) == (img, patch, dim, depth, heads, mlp, classes)
    n = (img // patch) ** 2 + 1
    expected = _vit_flops(img, patch, dim, depth, mlp, classes, attention_terms=2 * 2 * n * n * dim)  # QK^T, PV
    counted = count_flops(model, img)
    assert counted["flops_per_image"] == expected  # 2,507,389,440 (about 1.25 GMAC)
    attention = sum(v for k, v in counted["by_op"].items() if "scaled_dot_product" in k)
    assert attention == depth * 4 * n * n * dim


def test_flops_of_wafe_mae_count_the_pairwise_l1_terms():
    model = create_model("wafe-mae", task="cls", arch="micro").eval()
    img, patch, dim, depth, heads, mlp, classes = 32, 4, 64, 4, 2, 256, 1000
    assert (model.embed_dim, len(model.blocks), model.blocks[0].attn.num_heads) == (dim, depth, heads)
    n = (img // patch) ** 2 + 1
    scores = CDIST_FLOPS_PER_TERM * heads * n * n * (dim // heads)  # |q_i - k_j| summed over d, per head
    weighted = 2 * n * n * dim  # P V
    assert count_flops(model, img)["flops_per_image"] == _vit_flops(
        img, patch, dim, depth, mlp, classes, scores + weighted
    )


def test_fraction_is_achieved_over_ceiling():
    f = fraction(flops=2e9, median_ms=10.0, ceiling_gflops=400.0)  # 2 GFLOP in 10 ms = 200 GFLOP/s
    assert f == {"achieved_gflops": pytest.approx(200.0), "ceiling_gflops": 400.0, "ceiling_fraction": 0.5}
    assert fraction(2e9, None, 400.0)["ceiling_fraction"] is None
    assert fraction(2e9, 10.0, None) == {
        "achieved_gflops": pytest.approx(200.0),
        "ceiling_gflops": None,
        "ceiling_fraction": None,
    }
    c = {"fp32": {"gflops": 90.0}, "int8": {"status": "measured", "gops": 300.0}}
    assert ceiling_for(c, "openvino", "fp32", "cpu") == 90.0 and ceiling_for(c, "ort-cpu", "int8", "cpu") == 300.0
    assert ceiling_for(c, "eager", "fp32", "cuda") is None and ceiling_for(c, "eager", "bf16", "cpu") is None
    assert ceiling_for({**c, "int8": {"status": "not measured"}}, "ort-cpu", "int8", "cpu") is None


@pytest.fixture(scope="module")
def micro_onnx(tmp_path_factory):
    from attnzoo.export import export_onnx

    torch.manual_seed(0)
    model = create_model("belief2", task="cls", arch="micro").eval()
    return model, export_onnx(model, tmp_path_factory.mktemp("ov") / "belief2.onnx")


@pytest.mark.parametrize("batch,fixed", [(1, 1), (3, None), (3, 1)])
def test_openvino_matches_eager_within_the_fp32_tolerance(micro_onnx, batch, fixed):
    from attnzoo.targets.openvino.backend import OpenVINOSession

    model, path = micro_onnx
    x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(batch))
    with torch.inference_mode():
        ref = model(x).numpy()
    session = OpenVINOSession(path, threads=1, batch=fixed)  # fixed batch 1 takes a batch of 3 image by image
    out = session.run(x.numpy())
    assert out.shape == ref.shape and parity_error(out, ref) <= TOLERANCES["fp32"]
    info = session.info()
    assert info["inference_num_threads"] == 1 and info["inference_precision_hint"] == "f32"
    assert info["performance_hint"] == "LATENCY" and info["enable_cpu_pinning"] is False


def test_openvino_check_against_onnxruntime_refuses_a_wrong_output(micro_onnx, monkeypatch):
    from attnzoo.runtime.backends import LoadOptions, check_against_reference, get_backend
    from attnzoo.targets.openvino.backend import OpenVINOSession

    _, path = micro_onnx
    session = get_backend("openvino").load(path, LoadOptions(threads=1, batch=1))
    check_against_reference(session, path, threads=1)  # the same file: within the fp32 tolerance
    real = OpenVINOSession.run
    monkeypatch.setattr(OpenVINOSession, "run", lambda self, x: real(self, x) + 0.01)
    with pytest.raises(ValueError, match=r"belief2.onnx: openvino differs from ONNX Runtime by .* \(tolerance"):
        check_against_reference(session, path, threads=1)


def _sleeper(seconds: float):
    return lambda path: lambda x: time.sleep(seconds)


def _broken(path):
    raise RuntimeError("no such device\nmore")


def test_fastest_cpu_runtime_is_measured_and_a_failing_runtime_cannot_win(tmp_path):
    probes = [(tmp_path / "a.onnx", (8, 8)), (tmp_path / "b.onnx", (8, 8))]
    choice = fastest_cpu_runtime({"slow": _sleeper(0.004), "fast": _sleeper(0.0005)}, probes, seconds=0.05, cpu="Z")
    assert choice.runtime == "fast" and set(choice.median_ms) == {"a.onnx", "b.onnx"}
    assert all(m["slow"] > m["fast"] for m in choice.median_ms.values())
    assert choice.reason.startswith("fast, ") and "faster than slow on this CPU (Z)" in choice.reason
    choice = fastest_cpu_runtime({"broken": _broken, "slow": _sleeper(0.002)}, probes, seconds=0.02)
    assert choice.runtime == "slow" and choice.failed == {"broken": "RuntimeError: no such device"}
    assert "the only CPU runtime that ran" in choice.reason
    nothing = fastest_cpu_runtime({"broken": _broken}, probes, seconds=0.02)
    assert nothing.runtime == "broken" and "nothing measured" in nothing.reason


_RELEASED_OUT_OF_ORDER = """
import gc, signal, sys, time
from attnzoo.targets.openvino.backend import compile_onnx
first, second = compile_onnx(sys.argv[1]), compile_onnx(sys.argv[1])  # each from its own ov.Core
del first; gc.collect()
del second; gc.collect()  # OpenVINO's CPU plugin puts back the first one's alternate stack, unmapped by now

def raised_by():
    signal.raise_signal(signal.SIGTERM)  # handled in this thread, on its alternate stack if the handler asks
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pass
    raise SystemExit("no exception")
"""


def test_a_signal_after_openvino_released_its_models_out_of_order_still_raises(micro_onnx):
    """OpenVINO's CPU plugin leaves the thread on an unmapped alternate signal stack when two compiled models are
    released in the order they were made; a handler on that stack ends the process with SIGSEGV (the control:
    ``signal.signal``). The package's handlers (``attnzoo.signals``) run on the thread's stack and still raise."""
    import subprocess
    import sys

    def run(tail: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", _RELEASED_OUT_OF_ORDER + tail, str(micro_onnx[1])],
            capture_output=True,
            text=True,
            timeout=300,
        )

    control = run("signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))\nraised_by()\n")
    if control.returncode != -11:
        pytest.skip(f"this OpenVINO leaves no unmapped alternate stack behind (control exit {control.returncode})")
    done = run(
        "from attnzoo.signals import Terminated, signals_raise\n"
        "with signals_raise():\n    try:\n        raised_by()\n    except Terminated:\n        print('ok')\n"
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])
