"""FLOP/byte counter against formulas written from the ViT architecture; the roofline bound and its command."""

from __future__ import annotations

import json

import pytest
import torch

from attnzoo.benchmarks.cli import main
from attnzoo.benchmarks.flops import count_forward, count_variant, meta_model, stored_elements
from attnzoo.benchmarks.roofline import GPUS, PRECISIONS, WIDTH, against_results, bound, gpu_key, resolve_gpus
from attnzoo.models import ARCHS


def vit_counts(arch: str, batch: int, classes: int = 1000):
    """ViT classifier cost from its architecture (not from any counter).

    FLOPs (2 per multiply-add): patchify conv 2 P (3 p^2) D; per block qkv 2 N D 3D, Q K^T and A V 2 N^2 D each,
    proj 2 N D^2, MLP 2 x 2 N D H; head 2 D K. Elements under the fused-kernel model: each matrix op reads its
    operands and writes its result once (weights and biases counted apart).
    """
    a = ARCHS[arch]
    D, L, p, S = a["embed_dim"], a["depth"], a["patch_size"], a["img_size"]
    H = int(D * a["mlp_ratio"])
    P = (S // p) ** 2
    N = P + 1  # class token
    B, K = batch, classes
    flops = B * (
        2 * P * 3 * p * p * D
        + L * (2 * N * D * 3 * D + 2 * 2 * N * N * D + 2 * N * D * D + 2 * 2 * N * D * H)
        + 2 * D * K
    )
    weights = (3 * p * p * D + D) + L * ((3 * D * D + 3 * D) + (D * D + D) + (D * H + H) + (H * D + D)) + (D * K + K)
    per_block = (N * D + 3 * N * D) + (3 * N * D + N * D) + (N * D + N * D) + (N * D + N * H) + (N * H + N * D)
    activations = B * (3 * S * S + P * D + L * per_block + D + K)
    return flops, weights, activations


@pytest.mark.parametrize("arch,batch", [("tiny", 1), ("tiny", 3), ("micro", 2)])
def test_vit_count_matches_the_architecture_formula(arch, batch):
    flops, weights, activations = vit_counts(arch, batch)
    c = count_variant("standard", arch=arch, batch=batch)
    assert c.matrix_flops == flops
    assert c.vector_ops == 0
    assert c.weight_elements == weights
    assert c.activation_elements == activations
    if arch == "tiny" and batch == 1:
        assert abs(flops / 1e9 - 2.507) < 1e-3  # ViT-Ti/16 at 224 px: the usual 1.25 GMAC


def test_cpu_count_equals_meta_count_and_includes_attention():
    """On a real CPU run the SDPA kernel (missing from torch's FlopCounterMode registry) is counted too."""
    torch.manual_seed(0)
    from attnzoo.models import create_model

    model = create_model("standard", arch="micro").eval()
    c_cpu = count_forward(model, torch.randn(2, 3, 32, 32))
    c_meta = count_variant("standard", arch="micro", batch=2)
    assert c_cpu.to_dict() == c_meta.to_dict()
    assert c_cpu.ops["aten.scaled_dot_product_attention"]["flops"] > 0


def test_mae_distance_is_counted_as_vector_ops():
    a = ARCHS["tiny"]
    D, L, N = a["embed_dim"], a["depth"], (a["img_size"] // a["patch_size"]) ** 2 + 1
    std, mae = count_variant("standard", arch="tiny"), count_variant("wafe-mae", arch="tiny")
    assert mae.vector_ops == L * 3 * N * N * D  # |q - k| summed over d, every head: sub, abs, add
    assert std.matrix_flops - mae.matrix_flops == L * 2 * N * N * D  # Q K^T is no matmul in MAE


def test_stored_elements_ignores_broadcast_dimensions():
    x = torch.zeros(4, 1, 5).expand(4, 3, 5)
    assert stored_elements(x) == 20 and x.numel() == 60


def test_bound_is_the_max_of_compute_and_memory_time():
    gpu = GPUS["h100-sxm"]
    peak, bw = gpu.tensor_tflops["fp16"] * 1e12, gpu.dram_gb_s * 1e9
    compute_heavy = bound(1e12, 0, 1e6, gpu, "fp16")
    assert compute_heavy["bound_s"] == pytest.approx(max(1e12 / peak, 1e6 / bw)) == pytest.approx(1e12 / peak)
    assert compute_heavy["limited_by"] == "compute"
    memory_heavy = bound(1e9, 0, 1e9, gpu, "fp16")
    assert memory_heavy["bound_s"] == pytest.approx(1e9 / bw) and memory_heavy["limited_by"] == "memory"
    assert memory_heavy["intensity"] == pytest.approx(1.0)
    fp32 = bound(1e12, 0, 1.0, gpu, "fp32")  # CUDA cores, not tensor cores
    assert fp32["bound_s"] == pytest.approx(1e12 / (gpu.fp32_tflops * 1e12))
    vector = bound(0, 1e12, 1.0, gpu, "bf16")  # vector ops at the 16-bit CUDA-core rate
    assert vector["bound_s"] == pytest.approx(1e12 / (gpu.fp16_vector_tflops * 1e12))
    assert bound(1e9, 0, 1e6, GPUS["a100"], "fp8")["bound_s"] is None  # Ampere has no FP8 tensor cores


def test_peak_table_is_dense_and_ordered():
    for gpu in GPUS.values():
        t = gpu.tensor_tflops
        assert gpu.fp32_tflops < t["tf32"] < t["fp16"] == t["bf16"] < t["int8"]
        assert t["fp8"] is None or t["fp8"] == t["int8"]
        assert gpu.fp16_vector_tflops > gpu.fp32_tflops
    assert GPUS["h200"].tensor_tflops == GPUS["h100-sxm"].tensor_tflops  # same GH100, faster memory
    assert GPUS["h200"].dram_gb_s > GPUS["h100-sxm"].dram_gb_s


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_gpu_key_from_device_name(name, key):
    assert gpu_key(name) == key


def test_resolve_gpus():
    assert resolve_gpus("h100,a100") == ["h100-sxm", "a100"]
    assert resolve_gpus("all") == list(GPUS)
    with pytest.raises(ValueError, match="valid: all, auto, h100-sxm"):
        resolve_gpus("b200")


def test_roofline_command_writes_tables(tmp_path, capsys):
    assert (
        main(
            [
                "--roofline",
                "h100,a100",
                "--arch",
                "micro",
                "--variants",
                "standard,wafe-mae",
                "--batch-sizes",
                "1,4",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "NVIDIA H100 SXM5" in printed and "NVIDIA A100 SXM4" in printed
    data = json.loads((tmp_path / "roofline.json").read_text())
    assert len(data["rows"]) == 2 * 2 * len(PRECISIONS) * 2  # variants x batches x precisions x GPUs
    flops, weights, activations = vit_counts("micro", 4)
    row = next(
        r
        for r in data["rows"]
        if (r["variant"], r["batch"], r["gpu"], r["precision"]) == ("standard", 4, "h100-sxm", "bf16")
    )
    assert row["matrix_flops"] == flops
    assert row["bytes"] == (weights + activations) * WIDTH["bf16"]
    gpu = GPUS["h100-sxm"]
    assert row["bound_s"] == pytest.approx(
        max(flops / (gpu.tensor_tflops["bf16"] * 1e12), row["bytes"] / (gpu.dram_gb_s * 1e9))
    )
    assert (tmp_path / "roofline.md").read_text().count("## NVIDIA") == 2


def test_roofline_reads_a_gpu_run_as_a_fraction(tmp_path):
    from attnzoo.benchmarks.roofline import roofline

    result = roofline(["standard"], "cls", "micro", [1], ["h100-sxm"])
    results = {
        "environment": {"gpu": {"name": "NVIDIA H100 80GB HBM3"}},
        "settings": {"arch": "micro", "task": "cls", "device": "cuda"},
        "results": [
            {
                "variant": "standard",
                "backend": "tensorrt",
                "dtype": "fp16",
                "batch": 1,
                "status": "ok",
                "median_ms": 0.5,
            },
            {
                "variant": "standard",
                "backend": "ort-cpu",
                "dtype": "fp32",
                "batch": 1,
                "status": "ok",
                "median_ms": 3.0,
            },
        ],
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    rows = against_results(result, path)
    assert [r["backend"] for r in rows] == ["tensorrt"]  # the CPU row is not a GPU run
    want = next(r for r in result["rows"] if r["precision"] == "fp16")["bound_s"]
    assert rows[0]["fraction"] == pytest.approx(want / 0.5e-3)
    results["environment"]["gpu"]["name"] = "NVIDIA A100-SXM4-80GB"
    path.write_text(json.dumps(results))
    with pytest.raises(ValueError, match="covers h100-sxm"):
        against_results(result, path)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--roofline", "b200"], "unknown GPU 'b200'"),
        (["--against", "x.json"], "--against needs --roofline"),
        (["--roofline", "h100", "--against", "/nonexistent.json"], "no such file"),
    ],
)
def test_roofline_bad_input(argv, needle, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2 and needle in str(exc.value)


def test_meta_model_has_no_storage():
    m = meta_model("belief2", arch="tiny")
    assert all(p.device.type == "meta" for p in m.parameters())


def test_parity_measure_is_exact_when_computed_block_by_block(monkeypatch):
    """The runtime's parity error, computed in float64 blocks (memory), equals the whole-array formula."""
    import numpy as np

    from attnzoo.runtime import parity

    rng = np.random.default_rng(0)
    ref = (rng.standard_normal((3, 5, 7, 11)) * 4).astype(np.float32)
    out = ref + rng.standard_normal(ref.shape).astype(np.float32) * 1e-3
    want = np.abs(out.astype(np.float64) - ref).max() / max(1.0, np.abs(ref.astype(np.float64)).max())
    monkeypatch.setattr(parity, "_BLOCK", 97)  # many blocks, the last one partial
    c = parity.compare(out, ref, "fp32")
    assert parity.parity_error(out, ref) == c["error"] == pytest.approx(want, rel=1e-12)
    assert c["mean_abs_err"] == pytest.approx(np.abs(out.astype(np.float64) - ref).mean(), rel=1e-9)
    bad = out.copy()
    bad[2, 4, 6, 10] = np.nan  # in the last block
    assert parity.parity_error(bad, ref) == float("inf") and not parity.compare(bad, ref, "fp32")["passed"]
    assert parity.parity_error(out[:2], ref) == float("inf")
