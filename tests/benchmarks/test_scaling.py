"""The scaling benchmark (python -m attnzoo.benchmarks.scaling): families, fits, the cost model, skips, bad input, and a
real (quick) run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from timm.layers import Attention
from torch import nn

from attnzoo.benchmarks import scaling
from attnzoo.benchmarks.scaling import FAMILIES, cost_model, fit_exponent, main, parse_settings, plan, run_scaling
from attnzoo.models import BUILTIN_VARIANTS, register_variant
from attnzoo.runtime.backends import get_backend


def test_every_variant_is_in_exactly_one_family():
    members = [v for family in FAMILIES.values() for v in family]
    assert sorted(members) == sorted(BUILTIN_VARIANTS)


class OutLinearAttention(Attention):
    """timm's Attention followed by one more D x D matrix (no bias): 2 D^2 more FLOPs per token."""

    def __init__(self, dim, num_heads=8, **kwargs):
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.post = nn.Linear(dim, dim, bias=False)

    def forward(self, x, attn_mask=None, is_causal=False):
        return self.post(super().forward(x, attn_mask=attn_mask))


@pytest.mark.slow  # a timed sweep of two variants (about 12 s)
def test_a_plugin_variant_is_timed_and_modelled_beside_standard(tmp_path, registry_restored, micro_sweep):
    register_variant("tp-out-linear", OutLinearAttention, paper="Test paper, https://example.org", aliases=("tp-ol",))
    register_variant("tp-out-std", OutLinearAttention, paper="Test paper, https://example.org", cost_family="standard")
    # its own family by default, or the one its registration names
    assert scaling.family_of("tp-out-linear") == scaling.family_of("tp-ol") == "tp-out-linear"
    assert scaling.family_of("tp-out-std") == "standard"
    assert scaling.families()["standard"] == (*FAMILIES["standard"], "tp-out-std")
    with pytest.raises(ValueError, match="no-such-variant"):
        scaling.family_of("no-such-variant")
    s = micro_sweep(["standard", "tp-out-linear"], ["eager"])
    result = run_scaling(s)
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"standard", "tp-out-linear"}
    assert rows["tp-out-linear"]["status"] == "ok" and rows["tp-out-linear"]["family"] == "tp-out-linear"
    assert rows["tp-out-linear"]["median_ms"] > 0
    assert rows["tp-out-linear"]["matrix_gflop"] > rows["standard"]["matrix_gflop"]
    assert result["families"]["tp-out-linear"] == ["tp-out-linear"]
    model = {c["variant"]: c for c in result["cost_model"]}
    assert set(model) == {*FAMILIES["standard"], "tp-out-std", "tp-out-linear"}
    # standard's 24 D^2 per token, plus the extra D x D matrix; the attention core unchanged
    assert model["tp-out-linear"]["matrix_linear_D2"] == pytest.approx(26)
    assert model["tp-out-linear"]["matrix_quadratic_D"] == pytest.approx(4)
    assert {f["family"] for f in result["fits"]} == {"standard", "tp-out-linear"}


def test_fit_exponent_recovers_a_power_law():
    x = np.array([197, 577, 1025, 4097])
    assert fit_exponent(x, 3e-6 * x**2) == pytest.approx(2.0)
    assert fit_exponent(x, 5 * x**1.3) == pytest.approx(1.3)
    assert fit_exponent([197], [1.0]) is None and fit_exponent([2, 2], [1.0, 2.0]) is None


@pytest.mark.parametrize(
    "variant,linear,quadratic,vector",
    [
        ("standard", 24, 4, 0),  # qkv 6 D^2 + proj 2 D^2 + MLP 16 D^2 per token; Q K^T and A V: 2 D + 2 D per pair
        ("mabvit-glu", 26, 4, 0),  # + the value gate W^b (2 D^2)
        ("wafe-mae", 24, 2, 3),  # Q K^T replaced by |q - k| summed: 3 vector ops per channel and pair
    ],
)
def test_cost_model_matches_the_architecture(variant, linear, quadratic, vector):
    c = cost_model(variant, "tiny")
    assert c["matrix_linear_D2"] == pytest.approx(linear)
    assert c["matrix_quadratic_D"] == pytest.approx(quadratic)
    assert c["vector_quadratic_D"] == pytest.approx(vector)


def _quick(tmp_path, *extra):
    return parse_settings(
        ["--quick", "--out", str(tmp_path), "--cache-dir", str(tmp_path / "cache"), "--no-progress", *extra]
    )


def test_quick_defaults_and_plan(tmp_path):
    s = _quick(tmp_path, "--sizes", "32,48")
    assert s.arch == "micro" and s.sizes == [32, 48] and s.seg_sizes == [32, 64] and s.min_time == 0.05
    jobs = plan(s)
    assert list(jobs) == [("cls", 32), ("cls", 48), ("seg", 32), ("seg", 64)]
    assert jobs[("cls", 32)]["batches"] == [1, 4]
    assert jobs[("cls", 32)]["sweeps"] == {1: ["tokens", "batch"], 4: ["batch"]}


@pytest.mark.slow
def test_eager_run_writes_rows_fits_and_plot(tmp_path):
    s = _quick(tmp_path, "--variants", "standard", "--backends", "eager", "--seg-sizes", "32")
    result = run_scaling(s)
    files = scaling.write_outputs(result, tmp_path)
    rows = result["rows"]
    assert len(rows) == 2 + 1 + 1  # cls 32 b1, cls 32 b4, cls 64 b1, seg 32 b1
    assert all(r["status"] == "ok" and r["median_ms"] > 0 and r["peak_mb"] is not None for r in rows)
    r = next(r for r in rows if (r["variant"], r["task"], r["img_size"], r["batch"]) == ("standard", "cls", 32, 4))
    assert r["tokens"] == 65 and r["per_image_ms"] == pytest.approx(r["median_ms"] / 4)
    fit = next(f for f in result["fits"] if f["sweep"] == "tokens")
    assert fit["points"] == 2 and fit["latency_exponent"] is not None and fit["work_exponent"] > 1
    assert files["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = files["markdown"].read_text()
    assert result["environment"]["cpu"]["model"] in md and "Cost model" in md
    assert json.loads(files["json"].read_text())["settings"]["arch"] == "micro"
    assert [c["variant"] for c in result["cost_model"]] == list(FAMILIES["standard"])
    assert main(["--render", str(files["json"]), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "scaling.md").read_text() == md


def test_crossover_tokens():
    # standard: 24 N D^2 = 4 N^2 D at N = 6 D
    assert scaling.crossover_tokens(cost_model("standard", "small")) == pytest.approx(6 * 384)


@pytest.mark.slow  # a timed sweep on every ONNX backend (about 11 s)
def test_every_onnx_backend_gets_the_export_not_only_onnx_runtime(tmp_path, micro_sweep):
    """OpenVINO alone (no ort-cpu in the run) still gets the verified export, so its rows are measured."""
    reason = get_backend("openvino").unavailable_reason("fp32")
    if reason:
        pytest.skip(reason)
    s = micro_sweep(["standard"], ["openvino"])
    (row,) = run_scaling(s)["rows"]
    assert (row["backend"], row["status"]) == ("openvino", "ok") and row["median_ms"] > 0
    assert row["parity_error"] <= 1e-4
    assert (s.cache_dir / "standard_cls_micro_32px_fp32.onnx").is_file()


@pytest.mark.slow  # about 20 s on 2 cores: a bench-latency run and a sweep
def test_a_sweep_beside_bench_latency_reuses_its_verified_export(tmp_path, monkeypatch, micro_sweep):
    """The same seeded model at the same size in a shared cache is exported once (report-variant runs the sweep
    beside its latency rows); a size the cache does not hold is exported."""
    from attnzoo.benchmarks import run as bench_run
    from attnzoo.export import verify

    cache = tmp_path / "cache"
    bench_run.run_benchmark(
        bench_run.Settings(
            variants=["standard"],
            backends=["ort-cpu"],
            dtypes=["fp32"],
            batch_sizes=[1],
            arch="micro",
            min_time=0.01,
            out=tmp_path / "bench",
            cache_dir=cache,
            progress=False,
            pair_eager=False,
            ceiling_size=0,
        )
    )
    assert (cache / "standard_cls_micro_32px_fp32.onnx").is_file()
    exports = []
    real = verify.export_onnx
    monkeypatch.setattr(verify, "export_onnx", lambda *a, **k: exports.append(a[1]) or real(*a, **k))
    s = micro_sweep(["standard"], ["ort-cpu"], sizes=(32, 64), out=tmp_path / "sweep", cache_dir=cache)
    rows = run_scaling(s)["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert len(exports) == 1  # 64 px only; the 32 px file bench-latency verified is kept


@pytest.mark.slow  # a timed sweep to its limits (about 11 s)
def test_memory_and_time_limits_skip_with_a_reason(tmp_path, monkeypatch):
    import attnzoo.limits as limits

    s = _quick(
        tmp_path,
        "--variants",
        "standard",
        "--backends",
        "eager",
        "--seg-sizes",
        "",
        "--batch-sizes",
        "",
        "--max-call-s",
        "1e-9",
    )
    result = run_scaling(s)
    small, large = result["rows"]
    assert small["status"] == "ok"
    assert large["status"] == "skipped" and "predicted" in large["reason"] and "--max-call-s" in large["reason"]
    monkeypatch.setattr(limits, "available_memory", lambda: 1024)
    result = run_scaling(
        _quick(tmp_path, "--variants", "standard", "--backends", "eager", "--seg-sizes", "", "--batch-sizes", "")
    )
    assert all(r["status"] == "skipped" and "needs about" in r["reason"] for r in result["rows"])


@pytest.mark.slow
def test_an_export_whose_eager_check_would_exceed_the_limit_is_not_made(tmp_path):
    s = _quick(tmp_path, "--variants", "standard", "--seg-sizes", "", "--batch-sizes", "", "--max-call-s", "1e-9")
    ort = [r for r in run_scaling(s)["rows"] if r["backend"] == "ort-cpu"]
    assert [r["img_size"] for r in ort] == [32, 64] and ort[0]["status"] == "ok"  # nothing measured before it
    assert ort[1]["status"] == "skipped" and "export not verified" in ort[1]["reason"]
    assert not (s.cache_dir / "standard_cls_micro_64px_fp32.onnx").exists()


@pytest.mark.slow
@pytest.mark.matrix  # eight verified exports (3 to 4 minutes on 2 cores); the default run's ORT test and the eager run
def test_quick_run_with_onnx_runtime(tmp_path):
    """The --quick pipeline end to end: verified exports, parity-gated ORT rows, fits for both backends."""
    result = run_scaling(_quick(tmp_path, "--variants", "standard,wafe-mae"))
    ort = [r for r in result["rows"] if r["backend"] == "ort-cpu"]
    assert ort and all(r["status"] == "ok" and r["parity_error"] <= 1e-4 for r in ort)
    assert {(f["sweep"], f["backend"]) for f in result["fits"]} == {
        (sw, b) for sw in ("tokens", "seg", "batch") for b in ("eager", "ort-cpu")
    }


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--variants", "nope"], "unknown variant 'nope'; valid: all,"),
        (["--backends", "ort-cuda"], "unknown backend 'ort-cuda'; valid: eager, compile, aoti, ort-cpu"),
        (["--sizes", "230"], "230 px is not a multiple of the small patch size 16"),
        (["--sizes", "4096"], "must be an integer in 1..2048"),
        (["--batch-sizes", "0"], "out of range"),
        (["--sizes", "", "--seg-sizes", "", "--batch-sizes", ""], "nothing to measure"),
        (["--min-iters", "1"], "--min-iters must be >= 2"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path)])
    assert exc.value.code == 2 and needle in str(exc.value) and "\n" not in str(exc.value)
