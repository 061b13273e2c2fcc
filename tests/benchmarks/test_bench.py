"""bench-latency: statistics, the parity gate, a short end-to-end run, and errors on bad names."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from attnzoo.benchmarks import ratio_stats, summarize
from attnzoo.benchmarks.cli import main, parse_settings
from attnzoo.benchmarks.run import compile_budget_reason, run_benchmark
from attnzoo.benchmarks.tables import OVERHEAD_FIELDS, ROW_FIELDS
from attnzoo.benchmarks.timing import SETTLED_PAIRS
from attnzoo.runtime.parity import check as check_parity


def test_summarize_known_percentiles():
    samples = np.arange(1, 101) / 1e3  # 1 .. 100 ms
    s = summarize(samples, batch_size=4)
    assert s["iterations"] == 100
    assert s["min_ms"] == pytest.approx(1.0)
    assert s["max_ms"] == pytest.approx(100.0)
    assert s["median_ms"] == pytest.approx(50.5)
    assert s["mean_ms"] == pytest.approx(50.5)
    assert s["p90_ms"] == pytest.approx(90.1)  # linear interpolation: 1 + 0.90 * 99
    assert s["p95_ms"] == pytest.approx(95.05)
    assert s["p99_ms"] == pytest.approx(99.01)
    assert s["cv"] == pytest.approx(np.std(np.arange(1, 101), ddof=1) / 50.5)
    assert s["throughput_img_s"] == pytest.approx(4 / 0.0505)


def test_summarize_rejects_bad_samples():
    with pytest.raises(ValueError):
        summarize([0.01], 1)
    with pytest.raises(ValueError):
        summarize([0.01, float("nan")], 1)


def test_ratio_stats_pairs():
    r = ratio_stats([1.0, 1.0, 2.0, 2.0], [1.0, 2.0, 6.0, 8.0])  # ratios 1, 2, 3, 4
    assert r["pairs"] == 4
    assert r["ratio_median"] == pytest.approx(2.5)
    assert r["ratio_q1"] == pytest.approx(1.75)
    assert r["ratio_q3"] == pytest.approx(3.25)
    assert r["ratio_iqr"] == pytest.approx(1.5)
    with pytest.raises(ValueError):
        ratio_stats([1.0, 2.0], [1.0])


def test_a_settled_ab_run_stops_early_and_a_close_call_runs_to_min_pairs(monkeypatch):
    """A/B pairing spends its time where it can change the answer: a clear winner stops after
    ``SETTLED_PAIRS`` pairs, a tie runs every pair (``min_pairs``); without ``settled`` both run every pair."""
    from attnzoo.benchmarks import timing

    clock = iter(range(10**6))  # a fake clock: every call takes 1 s, min_time has passed after the first pair
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))
    seconds = {"fast": [1.0] * 40, "slow": [3.0] * 40, "noisy": [1.0, 3.0] * 20}
    monkeypatch.setattr(timing, "time_once", lambda fn, cuda=False: fn())
    fast, slow = (lambda: seconds["fast"].pop()), (lambda: seconds["slow"].pop())
    a, b = timing.measure_pair(fast, slow, 0.5, min_pairs=20, warmup_s=0, settled=True)
    assert len(a) == timing.SETTLED_PAIRS
    tie_a = iter([1.0, 3.0] * 20)
    tie_b = iter([3.0, 1.0] * 20)
    a, b = timing.measure_pair(lambda: next(tie_a), lambda: next(tie_b), 0.5, min_pairs=20, warmup_s=0, settled=True)
    assert len(a) == 20
    seconds.update(fast=[1.0] * 40, slow=[3.0] * 40)
    a, b = timing.measure_pair(fast, slow, 0.5, min_pairs=20, warmup_s=0)
    assert len(a) == 20
    assert timing.one_sided([1.0] * 5, [2.0] * 5) and not timing.one_sided([1.0, 2.0] * 3, [2.0, 1.0] * 3)


def test_check_parity_tolerances():
    ref = np.linspace(-2, 2, 40, dtype=np.float32).reshape(2, 20)
    assert check_parity(ref + 1e-5, ref, "fp32")[0]
    ok, err = check_parity(ref + 0.01, ref, "fp32")
    assert not ok and err == pytest.approx(0.005, rel=1e-3)
    assert check_parity(ref + 0.01, ref, "fp16")[0]  # fp16 has the looser tolerance
    assert not check_parity(np.full_like(ref, np.nan), ref, "int8")[0]
    assert not check_parity(ref[:1], ref, "fp32")[0]  # wrong shape


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, bench_args):
    out = tmp_path_factory.mktemp("bench")
    args = bench_args(
        out,
        "belief,standard",
        "eager,ort-cpu,openvino,ort-cuda",
        "--ceiling-size",
        "128",
        "--dtype",
        "fp32",
        "--profile",
        batch_sizes="1,2",
    )
    assert main(args) == 0
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.slow  # a short bench-latency run this group shares (about 35 s on 2 cores)
def test_short_run_writes_every_field(short_run):
    out, res = short_run
    for name in (
        "results.md",
        "results.csv",
        "overheads.csv",
        "latency.png",
        "overhead.png",
        "efficiency.png",
        "ort_profile.md",
    ):
        assert (out / name).stat().st_size > 0, name
    assert set(res) >= {
        "command",
        "note",
        "settings",
        "environment",
        "load_average_end",
        "results",
        "overheads",
        "ort_profile",
        "wall_time_s",
    }
    env = res["environment"]
    assert env["cpu"]["model"] and env["cpu"]["usable_cores"] >= 1 and isinstance(env["cpu"]["flags"], list)
    assert set(env["versions"]) >= {"torch", "onnxruntime", "tensorrt"} and env["versions"]["torch"]
    assert "gpu" in env and len(env["load_average"]) == 3
    assert env["gemm_gflops"]["torch_gflops"] > 0 and env["gemm_gflops"]["onnxruntime_gflops"] > 0
    ok = [r for r in res["results"] if r["status"] == "ok"]
    assert {(r["variant"], r["backend"], r["batch"]) for r in ok} == {
        (v, b, n) for v in ("standard", "belief") for b in ("eager", "ort-cpu", "openvino") for n in (1, 2)
    }
    for r in ok:
        assert set(ROW_FIELDS) <= set(r)
        assert r["iterations"] >= 10 and r["parity_error"] <= r["parity_tol"]
        assert r["min_ms"] <= r["median_ms"] <= r["p90_ms"] <= r["p95_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["throughput_img_s"] > 0 and r["cv"] >= 0 and r["peak_mem_mb"] is not None
        if r["backend"] in ("ort-cpu", "openvino"):
            assert r["speedup_vs_eager"] > 0 and r["speedup_pairs"] >= SETTLED_PAIRS  # 10 when a close call
    over = res["overheads"]
    assert {(o["variant"], o["backend"], o["batch"]) for o in over} == {
        ("belief", b, n) for b in ("eager", "ort-cpu", "openvino") for n in (1, 2)
    }
    for o in over:
        assert set(OVERHEAD_FIELDS) <= set(o) and o["pairs"] >= SETTLED_PAIRS and o["ratio_q1"] <= o["ratio_q3"]
    assert {(p["variant"], p["batch"]) for p in res["ort_profile"]} == {
        (v, n) for v in ("standard", "belief") for n in (1, 2)
    }
    assert all(p["naive"]["ops"] and p["tuned"]["ops"] for p in res["ort_profile"])


@pytest.mark.slow  # a short bench-latency run this group shares (about 35 s on 2 cores)
def test_the_run_says_where_its_time_went(short_run):
    """``phases_s``: this run's seconds by kind of work, each phase the run did present, together within the wall
    time, ``other`` the rest; results.md says it in one line."""
    out, res = short_run
    phases = res["phases_s"]
    assert {
        "ONNX export and its check",
        "load and first run: eager",
        "load and first run: ort-cpu",
        "load and first run: openvino",
        "timing",
        "A/B pairs with eager",
        "A/B pairs with standard",
        "CPU head-to-head",
        "ONNX Runtime profiles",
        "FLOP count",
        "GEMM throughput",
        "matmul ceiling",
        "other",
    } <= set(phases)
    assert all(v >= 0 for v in phases.values()) and phases["timing"] > 0
    assert sum(phases.values()) == pytest.approx(res["wall_time_s"], abs=0.5)
    assert f"Where this run's {res['wall_time_s']:.0f} s went (s): " in (out / "results.md").read_text()


@pytest.mark.slow  # a short bench-latency run this group shares (about 35 s on 2 cores)
def test_every_cpu_row_has_its_ceiling_fraction_from_the_counted_flops(short_run):
    out, res = short_run
    ceiling = res["ceiling"]
    assert ceiling["threads"] == 1 and ceiling["shape"] == [128, 128, 128]
    assert ceiling["cpu"] == res["environment"]["cpu"]["model"] and ceiling["key_flags"] is not None
    fp32 = ceiling["fp32"]["gflops"]
    assert fp32 == max(v["median_gflops"] for v in ceiling["fp32"]["by_library"].values())
    assert ceiling["fp32_end_gflops"] > 0
    ok = [r for r in res["results"] if r["status"] == "ok"]
    for r in ok:  # every backend's row of a variant uses the one count of that variant
        assert r["gflop"] == pytest.approx(res["flops"][r["variant"]]["flops_per_image"] * r["batch"] / 1e9)
        achieved = r["gflop"] / (r["median_ms"] / 1e3)
        assert r["achieved_gflops"] == pytest.approx(achieved)
        if r["backend"] != "eager" or res["settings"]["device"] == "cpu":  # eager on a GPU has no CPU ceiling
            assert r["ceiling_gflops"] == pytest.approx(fp32)
            assert r["ceiling_fraction"] == pytest.approx(achieved / fp32)
    md = (out / "results.md").read_text()
    assert "% ceiling" in md and f"fp32 {fp32:.1f} GFLOP/s" in md and res["environment"]["cpu"]["model"] in md
    fastest = {(f["variant"], f["batch"]): f for f in res["fastest_cpu"]}
    assert set(fastest) == {(v, n) for v in ("standard", "belief") for n in (1, 2)}
    for (variant, batch), f in fastest.items():
        pair = next(p for p in res["cpu_head_to_head"] if (p["variant"], p["batch"]) == (variant, batch))
        assert {pair["a"], pair["b"]} == {"ort-cpu", "openvino"}
        if {f["backend"], f["runner_up"]} == {"ort-cpu", "openvino"}:  # the two best were timed head to head
            assert f["how"] == "head-to-head pairs"
            assert f["backend"] == (pair["a"] if pair["ratio_median"] >= 1 else pair["b"])
            assert f["x_runner_up"] == pytest.approx(max(pair["ratio_median"], 1 / pair["ratio_median"]))
        else:  # eager among the two best (a loaded machine): no direct pair, the speed-ups over eager decide
            assert f["how"] == "speed-ups over eager" and "eager" in (f["backend"], f["runner_up"])


@pytest.mark.slow  # a short bench-latency run this group shares (about 35 s on 2 cores)
def test_missing_backend_is_listed_not_dropped(short_run):
    import torch

    from attnzoo.benchmarks.rows import row_unavailable_reason

    _, res = short_run
    cuda = [r for r in res["results"] if r["backend"] == "ort-cuda"]
    assert len(cuda) == 4  # 2 variants x 2 batch sizes, each with its status
    why = row_unavailable_reason("ort-cuda", "fp32", "cuda" if torch.cuda.is_available() else "cpu")
    for r in cuda:  # skipped with the reason where it cannot run, measured where it can; never "failed"
        if why:
            assert (r["status"], r["reason"]) == ("skipped", why), r
        else:
            assert r["status"] == "ok", r
    md = (short_run[0] / "results.md").read_text()
    assert "ort-cuda" in md


@pytest.fixture
def perturbed(monkeypatch):
    """``perturbed(backend, fn)``: the runner the benchmark loads for ``backend`` returns ``fn(out)`` to the parity
    gate instead of its output ``out`` (to prove the gate rejects a bad backend); its timed call is unchanged."""
    import dataclasses

    from attnzoo.benchmarks import measurement

    real = measurement.load_call

    def perturb(backend, fn):
        def load_call(name, *args, **kwargs):
            runner, info = real(name, *args, **kwargs)
            if name == backend:
                output = runner.output
                runner = dataclasses.replace(runner, output=lambda: fn(output()))
            return runner, info

        monkeypatch.setattr(measurement, "load_call", load_call)

    return perturb


@pytest.mark.slow
def test_parity_gate_rejects_perturbed_backend(tmp_path, perturbed, bench_args):
    s = parse_settings(
        bench_args(tmp_path, "standard", "eager,ort-cpu", "--ceiling-size", "64", "--no-pair-eager", min_time="0.02")
    )
    perturbed("ort-cpu", lambda out: out + 0.05 * np.abs(out).max())
    res = run_benchmark(s)
    row = next(r for r in res["results"] if r["backend"] == "ort-cpu")
    assert row["status"] == "failed" and row["reason"].startswith("parity")
    assert row["median_ms"] is None and row["iterations"] is None  # not timed
    eager = next(r for r in res["results"] if r["backend"] == "eager")
    assert eager["status"] == "ok"


@pytest.mark.parametrize(
    "flag,value,needle",
    [
        ("--backends", "eager,warp-drive", "unknown backend 'warp-drive'; valid: eager, compile, aoti, ort-cpu"),
        ("--variants", "standard,nope", "unknown variant 'nope'; valid: all, "),
        ("--dtype", "fp8", "unknown dtype 'fp8'; valid: fp32, tf32, fp16, bf16, int8"),
        ("--batch-sizes", "1,0", "--batch-sizes must be comma-separated positive integers"),
        ("--ceiling-size", "10", "--ceiling-size must be 0 or in 64..8192, got 10"),
    ],
)
def test_bad_names_give_one_clear_error(flag, value, needle):
    with pytest.raises(SystemExit) as exc:
        main([flag, value])
    assert exc.value.code == 2
    assert str(exc.value).startswith("error: ") and needle in str(exc.value)
    assert "\n" not in str(exc.value)


@pytest.mark.slow  # a whole bench-latency command (about 11 s)
def test_cli_exit_code_and_single_line():
    proc = subprocess.run(
        [sys.executable, "-m", "attnzoo.benchmarks.cli", "--backends", "foo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown backend 'foo'; valid: eager, compile, aoti, ort-cpu, ort-cuda, ort-trt, openvino, tensorrt, "
        "executorch (aliases: python -m attnzoo.runtime)"
    ]


@pytest.mark.slow  # a short bench-latency run this group shares (about 35 s on 2 cores)
def test_int8_quantization_and_confusion(short_run):
    import onnx

    from attnzoo.benchmarks.ort_cpu import quantize_int8
    from attnzoo.runtime.evaluate import evaluate_session
    from attnzoo.targets.onnxruntime.cpu import tuned_cpu_session

    out, _ = short_run
    fp32 = out / "cache" / "standard_cls_micro_32px_fp32.onnx"
    int8 = quantize_int8(fp32, out / "cache" / "q" / "standard.int8.onnx")
    ops = {n.op_type for n in onnx.load(str(int8)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    s32, _ = tuned_cpu_session(fp32, 1, out / "cache" / "q")
    s8, _ = tuned_cpu_session(int8, 1, out / "cache" / "q")
    x = np.random.default_rng(0).standard_normal((6, 3, 32, 32)).astype(np.float32)
    ref = s32.run(None, {"image": x})[0]
    out8 = s8.run(None, {"image": x})[0]
    ok, err = check_parity(out8, ref, "int8")
    assert ok and err > 0  # quantized, so not bit-identical, but within the int8 tolerance
    labels = ref.argmax(1)  # the int8 session is scored against fp32's classes
    conf = evaluate_session(lambda b: s8.run(None, {"image": b})[0], x, labels, ref.shape[1], "cls", batch_size=4)
    want = np.zeros((ref.shape[1], ref.shape[1]), np.int64)
    np.add.at(want, (labels, out8.argmax(1)), 1)  # true (fp32's class) x predicted (int8's), counted by hand
    assert np.array_equal(conf, want) and conf.sum() == 6


@pytest.mark.slow
def test_timing_failure_is_a_failed_row_not_a_crash(tmp_path, monkeypatch, bench_args):
    from attnzoo.benchmarks import measurement

    calls = []
    real_measure = measurement.measure

    def flaky_measure(fn, *args, **kwargs):
        calls.append(fn)
        if len(calls) > 1:  # eager (first) is timed; the next backend's timing raises
            raise RuntimeError("device lost\nsecond line")
        return real_measure(fn, *args, **kwargs)

    monkeypatch.setattr(measurement, "measure", flaky_measure)
    s = parse_settings(
        bench_args(tmp_path, "standard", "eager,ort-cpu", "--ceiling-size", "64", "--no-pair-eager", min_time="0.02")
    )
    res = run_benchmark(s)
    row = next(r for r in res["results"] if r["backend"] == "ort-cpu")
    assert row["status"] == "failed" and row["reason"].startswith("timing:") and "device lost" in row["reason"]
    assert "second line" not in row["reason"]
    assert row["median_ms"] is None
    assert next(r for r in res["results"] if r["backend"] == "eager")["status"] == "ok"


# ------------------------------------------------------------------ the default scope, engine reuse
def test_no_flags_is_a_representative_default_that_says_what_it_leaves_out():
    from attnzoo.benchmarks.cli import build_only_backends
    from attnzoo.benchmarks.tables import scope_line
    from attnzoo.models import VARIANT_NAMES
    from attnzoo.runtime.backends import backend_names

    s = parse_settings([])
    assert s.variants == ["standard", "belief2", "wafe-mae"]  # the cheapest and the two dearest cost families
    # every backend that runs here; an engine no GPU here runs is not built in the default table, and it says so
    build_only = build_only_backends(backend_names())
    assert list(s.backends) == [b for b in backend_names() if b not in build_only] and s.min_time == 0.5
    assert s.batch_sizes == [1]
    if build_only:
        assert any(x.startswith(f"{', '.join(build_only)} engine builds (no GPU") for x in s.scope["left_out"])
    assert list(parse_settings(["--all"]).backends) == list(backend_names())
    left = s.scope["left_out"]
    assert left[0].startswith(f"{len(VARIANT_NAMES) - 3} of {len(VARIANT_NAMES)} variants (belief, ")
    assert "horizontal-vertical" in left[0] and "30 s of torch.compile instead of 600" in left
    assert "batch 8, 32" in left and "--all" in scope_line(s.scope) and "--variants all" in scope_line(s.scope)
    full = parse_settings(["--all"])
    assert full.variants == list(VARIANT_NAMES) and full.batch_sizes == [1, 8, 32] and full.min_time == 3.0
    assert full.compile_budget == 600.0 and full.scope["left_out"] == []
    mixed = parse_settings(["--all", "--batch-sizes", "1", "--variants", "belief"])  # a flag given wins
    assert mixed.variants == ["belief"] and mixed.batch_sizes == [1] and mixed.min_time == 3.0
    assert "batch 8, 32" in mixed.scope["left_out"] and "Scope: this run leaves out" in scope_line(mixed.scope)


@pytest.mark.slow  # a short bench-latency run this group shares (about 35 s on 2 cores)
def test_results_say_the_scope(short_run):
    out, res = short_run
    assert res["interrupted"] is None
    # the estimate printed at the start is kept beside the wall time it estimated
    assert isinstance(res["estimate_s"], float) and 0 < res["estimate_s"]
    assert res["estimate_load"]["slowdown"] >= 1.0 and res["estimate_load"]["cpus"] >= 1  # the load it assumed
    assert "batch 8, 32" in res["settings"]["scope"]["left_out"]
    assert "Scope: this run leaves out" in (out / "results.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="with a GPU the engine runs (rebuilt per batch)")
def test_an_engine_that_cannot_run_is_built_once_and_reused(tmp_path, bench_args):
    def run(out):  # another --out each time: the same one would keep the rows instead (resume)
        s = parse_settings(
            bench_args(
                tmp_path / out,
                "standard",
                "eager,tensorrt",
                "--ceiling-size",
                "0",
                "--no-pair-eager",
                cache_dir=tmp_path / "cache",
                batch_sizes="1,2",
                min_time="0.02",
            )
        )
        return [r for r in run_benchmark(s)["results"] if r["backend"] == "tensorrt"]

    first, second = run("one"), run("two")
    assert [r["status"] for r in first + second] == ["built"] * 4
    assert [r["info"]["cached"] for r in first] == [False, True]  # one engine for batch 1-2, built once
    assert [r["info"]["cached"] for r in second] == [True, True]  # and kept for the next run
    assert "reused from the engine cache" in second[0]["reason"]
    assert len({r["info"]["engine"] for r in first + second}) == 1
    assert first[0]["info"]["profile"] == {"min": 1, "opt": 2, "max": 2}
    engines = list((tmp_path / "cache" / "tensorrt").glob("*.engine"))
    assert len(engines) == 1 and engines[0].stat().st_size == first[0]["info"]["engine_size"]


# ------------------------------------------------------------------ GPU precision: TF32 asked for by name
def test_fp32_is_ieee_fp32_everywhere_and_tf32_is_its_own_precision():
    from attnzoo.benchmarks.rows import tolerance_for
    from attnzoo.runtime.backends import DTYPES, get_backend
    from attnzoo.runtime.parity import TOLERANCES, tolerance_key

    assert "tf32" in DTYPES and tolerance_key("tf32") == "tf32"
    for backend in ("eager", "compile", "ort-cuda", "tensorrt"):  # a GPU fp32 row is held to the fp32 tolerance
        assert tolerance_for(backend, "fp32", "cuda") == "fp32"
        assert tolerance_for(backend, "tf32", "cuda") == "tf32"
    assert TOLERANCES["fp32"] < TOLERANCES["tf32"] < TOLERANCES["fp16"]
    assert get_backend("eager").unavailable_reason("tf32", "cpu").startswith("tf32 is a GPU tensor-core mode")
    assert parse_settings(["--dtypes", "fp32,tf32,fp16"]).dtypes == ["fp32", "tf32", "fp16"]


def test_fp32_math_sets_both_torch_switches_and_restores_them():
    import torch

    from attnzoo.runtime.device import fp32_math

    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    with fp32_math(True):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    with fp32_math(False):  # PyTorch's own cuDNN default is TF32: off must be set, not assumed
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.backends.cudnn.allow_tf32 is False
        assert torch.backends.cudnn.conv.fp32_precision != "tf32"
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == before


def test_a_torch_session_on_a_gpu_runs_every_call_in_its_own_fp32_math():
    """The switches are process-wide; each session's call sets its own (a tf32 row next to an fp32 eager partner in
    an A B A B run must not leak TF32 into it). Checked on the CPU by giving the session a CUDA device name after
    loading it."""
    import torch

    from attnzoo.runtime.backends import LoadOptions, get_backend

    class Probe(torch.nn.Module):
        seen = []

        def forward(self, x):
            Probe.seen.append(torch.backends.cuda.matmul.fp32_precision)
            return x

    for dtype, want in (("tf32", "tf32"), ("fp32", "ieee")):
        session = get_backend("eager").load(Probe(), LoadOptions(dtype="fp32", device="cpu"))
        session.tf32, session.device = dtype == "tf32", torch.device("cuda")
        session._forward(torch.zeros(1))
        assert Probe.seen[-1] == want
    assert torch.backends.cuda.matmul.fp32_precision != "tf32"  # restored after the call


def test_onnx_runtime_gpu_providers_say_their_precision(monkeypatch):
    """CUDA EP: use_tf32 set either way (ONNX Runtime's default is on). TensorRT EP: no precision flag (a flag turns
    strong typing off); its fp32 rows are refused because TensorRT's TF32 cannot be cleared through it."""
    from attnzoo.runtime.backends import get_backend
    from attnzoo.targets.onnxruntime import gpu, sessions

    monkeypatch.setattr(
        sessions,
        "available_providers",
        lambda: ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"),
    )
    assert sessions.providers_for("cuda") == [("CUDAExecutionProvider", {"use_tf32": "0", "enable_cuda_graph": "0"})]
    assert sessions.providers_for("cuda", tf32=True)[0][1]["use_tf32"] == "1"
    trt, cuda = sessions.providers_for("tensorrt-ep", tf32=False)
    assert not {"trt_fp16_enable", "trt_int8_enable", "trt_bf16_enable"} & set(trt[1])
    assert cuda == ("CUDAExecutionProvider", {"use_tf32": "0"})
    monkeypatch.setattr(gpu, "available_providers", sessions.available_providers)
    monkeypatch.setattr(gpu, "cuda_available", lambda: True)
    assert "TF32" in get_backend("ort-trt").unavailable_reason("fp32", "cuda")
    assert get_backend("ort-trt").unavailable_reason("fp16", "cuda") is None


@pytest.fixture
def twin():
    """A second PyTorch backend, ``twin``, registered for one test: a backend whose precisions eager also runs."""
    import attnzoo.runtime.backends as reg
    from attnzoo.targets.pytorch.eager import TorchBackend

    backend = reg.register_backend(
        TorchBackend("twin", "eager under another name", takes="module", device="torch", dtypes=("fp32", "fp16"))
    )
    yield backend
    del reg._REGISTRY["twin"]


def test_parity_gate_rejects_a_perturbed_backend_fast(twin, tmp_path, perturbed, bench_args):
    """The parity gate in the default run (the ONNX Runtime version is a slow test): a backend whose output is off
    by 5 % of its largest logit is a failed row with the parity reason, never timed, while eager is measured."""
    s = parse_settings(
        bench_args(tmp_path, "standard", "eager,twin", "--ceiling-size", "0", "--no-pair-eager", min_time="0.02")
    )
    perturbed("twin", lambda out: out + 0.05 * np.abs(out).max())
    rows = {r["backend"]: r for r in run_benchmark(s)["results"]}
    bad = rows["twin"]
    assert bad["status"] == "failed" and bad["reason"].startswith("parity: max|out-ref|/max(1, max|ref|) = ")
    assert bad["parity_error"] > bad["parity_tol"] and bad["median_ms"] is None and bad["iterations"] is None
    assert rows["eager"]["status"] == "ok" and rows["eager"]["median_ms"] > 0


def test_rows_are_paired_with_eager_at_their_own_precision(twin, tmp_path, monkeypatch, bench_args):
    """An fp16 row's x eager and its A/B pairs are against eager fp16 (a precision change is not a backend's
    speed-up); its ratio to eager fp32 is kept beside them; eager fp16 itself is paired with eager fp32."""
    import attnzoo.targets.pytorch.eager as eager_mod
    from attnzoo.benchmarks.tables import markdown

    monkeypatch.setattr(eager_mod, "torch_dtype_problem", lambda dtype, device: None)  # fp16 on this CPU, slowly
    s = parse_settings(bench_args(tmp_path, "standard", "eager,twin", "--ceiling-size", "0", "--dtypes", "fp32,fp16"))
    res = run_benchmark(s)
    rows = {(r["backend"], r["dtype"]): r for r in res["results"]}
    assert {k: r["status"] for k, r in rows.items()} == {k: "ok" for k in rows} and len(rows) == 4
    assert [(r["backend"], r["dtype"]) for r in res["results"]][:2] == [("eager", "fp32"), ("eager", "fp16")]
    want = {
        ("eager", "fp32"): "eager fp32",
        ("eager", "fp16"): "eager fp32",
        ("twin", "fp32"): "eager fp32",
        ("twin", "fp16"): "eager fp16",
    }
    assert {k: r["baseline"] for k, r in rows.items()} == want
    median = {k: r["median_ms"] for k, r in rows.items()}
    for key, row in rows.items():
        assert row["speedup_vs_eager"] == pytest.approx(median[("eager", row["baseline"].split()[1])] / median[key])
        assert row["speedup_vs_eager_fp32"] == pytest.approx(median[("eager", "fp32")] / median[key])
        assert key == ("eager", "fp32") or row["speedup_pairs"] >= SETTLED_PAIRS  # an A B A B run against that baseline
    assert "| standard | twin | fp16 | 1 |" in markdown(res) and "| eager fp16 |" in markdown(res)


def test_gpu_memory_is_the_sessions_own_from_a_clean_baseline(monkeypatch):
    """A session's memory is measured from a baseline taken when it is loaded, after a collection and PyTorch's
    cache emptied: what earlier sessions still hold (A/B partners) and cached blocks are not counted. Checked with
    a simulated device."""
    import torch

    from attnzoo.runtime.device import DeviceMemory

    mib = 2**20
    dev = {"allocated": 500 * mib, "peak": 900 * mib, "cached": 300 * mib, "other": 1000 * mib, "calls": []}

    def empty_cache():
        dev["calls"].append("empty_cache")
        dev["cached"] = 0

    def reset_peak():
        dev["calls"].append("reset_peak")
        dev["peak"] = dev["allocated"]

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset_peak)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: dev["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: dev["peak"])
    monkeypatch.setattr(
        torch.cuda,
        "mem_get_info",
        lambda: (80_000 * mib - dev["allocated"] - dev["cached"] - dev["other"], 80_000 * mib),
    )
    memory = DeviceMemory()  # 500 MB of an earlier session's weights stay allocated
    assert dev["calls"] == ["empty_cache", "reset_peak"]
    dev["allocated"] += 120 * mib  # this session: 120 MB of weights, a 200 MB peak while it runs
    dev["peak"] = dev["allocated"] + 80 * mib
    dev["other"] += 64 * mib  # and 64 MB its runtime took outside PyTorch
    assert memory.torch_peak()[0] == pytest.approx(200)
    assert memory.device_used()[0] == pytest.approx(120 + 64)
    assert "before the session was loaded" in memory.device_used()[1]


# ------------------------------------------------------------------ rows on disk as they finish; one output set
BENCH = [
    "--arch",
    "micro",
    "--variants",
    "standard,belief,exclusive",
    "--backends",
    "eager",
    "--batch-sizes",
    "1,2",
    "--min-time",
    "0.1",
    "--threads",
    "1",
    "--ceiling-size",
    "0",
    "--no-progress",
]


def _rows_in(log):
    return [
        json.loads(line)["row"]
        for line in log.read_bytes().splitlines(keepends=True)
        if line.endswith(b"\n") and json.loads(line)["kind"] == "row"
    ]


@pytest.mark.slow
def test_a_killed_run_keeps_its_rows_and_the_same_command_measures_only_the_rest(tmp_path):
    """SIGKILL (no handler runs) in the middle of a real bench-latency: the rows it finished are on disk; the same
    command again keeps them as they were, measures the rest, and writes results covering both; another setting
    with the same --out is refused in one line before anything is measured."""
    import signal
    import time

    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = [sys.executable, "-m", "attnzoo.benchmarks.cli", *BENCH, "--out", str(out), "--cache-dir", str(cache)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = out / "rows.jsonl"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and sum(r["status"] == "ok" for r in _rows_in(log)) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    kept = {(r["variant"], r["backend"], r["batch"]): r for r in _rows_in(log) if r["status"] == "ok"}
    assert 2 <= len(kept) < 6 and not (out / "results.json").exists()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming: {len(kept)} finished row(s) kept" in done.stdout
    result = json.loads((out / "results.json").read_text())
    rows = {(r["variant"], r["backend"], r["batch"]): r for r in result["results"]}
    assert set(rows) == {(v, "eager", n) for v in ("standard", "belief", "exclusive") for n in (1, 2)}
    assert all(r["status"] == "ok" for r in rows.values())
    for key, row in kept.items():  # kept as measured, not measured again
        assert rows[key]["median_ms"] == row["median_ms"] and rows[key]["iterations"] == row["iterations"]
    assert len(_rows_in(log)) == 6 and result["row_log"]["rows_from_earlier_runs"] == len(kept)
    assert {(o["variant"], o["backend"], o["batch"]) for o in result["overheads"]} == {  # standard reloaded as partner
        (v, "eager", n) for v in ("belief", "exclusive") for n in (1, 2)
    }
    other = argv[3:]
    other[other.index("0.1")] = "0.2"
    with pytest.raises(SystemExit) as refused:
        main(other)
    assert refused.value.code == 1 and str(refused.value) == (
        f"error: {log} holds rows measured with other settings (differing: min_time_s); use another --out, or "
        "delete rows.jsonl to measure from the start"
    )


KEY = {"task": "cls", "arch": "micro"}
ASKS = {"variants": ["standard", "belief"], "combos": [["eager", "fp32"]], "batch_sizes": [1, 2]}


def _ok_row(variant="standard", batch=1, median=2.0):
    """A finished row as the benchmark writes it: every field, statistics in order, throughput = batch / mean."""
    row = dict.fromkeys(ROW_FIELDS)
    row.update(
        variant=variant,
        task="cls",
        arch="micro",
        backend="eager",
        dtype="fp32",
        batch=batch,
        status="ok",
        reason="",
        parity_error=0.0,
        parity_tol=1e-4,
        iterations=10,
        min_ms=median - 0.5,
        median_ms=median,
        mean_ms=median,
        p90_ms=median + 0.2,
        p95_ms=median + 0.3,
        p99_ms=median + 0.4,
        max_ms=median + 0.5,
        cv=0.1,
        throughput_img_s=batch * 1e3 / median,
        device="cpu",
        info={},
    )
    return row


def _log_with_rows(path, n=3):
    """A row log of one run with ``n`` finished rows; returns its lines (bytes, newline included)."""
    from attnzoo.benchmarks.rowlog import RowLog

    log = RowLog(path, KEY, ASKS, {"command": "bench-latency"})
    for i in range(n):
        log.append({"kind": "row", "row": _ok_row(["standard", "belief"][i % 2], 1 + i // 2), "overhead": None})
    log.close()
    return path.read_bytes().splitlines(keepends=True)


def _reopen(path):
    from attnzoo.benchmarks.rowlog import RowLog

    return RowLog(path, KEY, ASKS, {"command": "bench-latency"})


def test_a_torn_last_line_is_dropped_and_cut_off(tmp_path):
    """The one line a kill can leave: the last one, without its newline. It is dropped and cut off, the run says
    so (``torn``), and every whole line stays."""
    path = tmp_path / "rows.jsonl"
    lines = _log_with_rows(path)
    with open(path, "ab") as f:
        f.write(b'{"kind": "row", "row": {"sta')  # a kill in the middle of a write
    again = _reopen(path)
    again.close()
    assert again.torn == len(b'{"kind": "row", "row": {"sta')
    assert [r["kind"] for r in again.records] == ["run", "row", "row", "row", "run"]
    assert path.read_bytes().splitlines(keepends=True)[:4] == lines


@pytest.mark.parametrize("bad", [b"not json at all\n", b"[1, 2, 3]\n", b"\n"])
def test_a_bad_line_in_the_middle_is_refused_and_nothing_is_deleted(tmp_path, bad):
    """A line that is not a record, between finished rows: refused with the file and line, the file left byte for
    byte as it was (the rows after the bad line were deleted and measured again)."""
    from attnzoo.benchmarks.rowlog import RowLog

    path = tmp_path / "rows.jsonl"
    lines = _log_with_rows(path)
    path.write_bytes(b"".join(lines[:2] + [bad] + lines[2:]))
    before = path.read_bytes()
    with pytest.raises(ValueError) as info:
        RowLog(path, KEY, ASKS, {})
    assert str(info.value).startswith(f"{path} line 3: ") and "nothing was changed" in str(info.value)
    assert path.read_bytes() == before


def test_bench_latency_refuses_a_bad_row_log_in_one_line_before_measuring(tmp_path, capsys, monkeypatch):
    """Through the command: exit 1, one line naming the file and line, nothing measured, nothing deleted."""
    import attnzoo.benchmarks.run as run_mod

    def never(*args, **kwargs):
        raise AssertionError("measured although the row log should have been refused")

    monkeypatch.setattr(run_mod, "_Bench", never)
    out = tmp_path / "out"
    out.mkdir()
    path = out / "rows.jsonl"
    lines = _log_with_rows(path)
    path.write_bytes(lines[0] + b"{oops\n" + b"".join(lines[1:]))
    before = path.read_bytes()
    with pytest.raises(SystemExit) as info:
        main([*BENCH, "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 1 and len(err) == 1 and err[0].startswith(f"error: {path} line 2: not JSON")
    assert path.read_bytes() == before and not (out / "results.json").exists()


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda r: r["row"].pop("status"), "no row.status"),  # a partial row (was KeyError: 'status')
        (lambda r: r["row"].update(median_ms=float("nan")), "NaN is not a number JSON allows"),
        (lambda r: r["row"].update(median_ms=-3.0), "row.median_ms is -3.0"),
        (lambda r: r["row"].update(median_ms=1e6), "latencies are not 0 < min_ms <= median_ms"),  # a forged median
        (lambda r: r["row"].update(throughput_img_s=1e9), "throughput_img_s 1e+09 is not batch / mean_ms"),
        (lambda r: r["row"].update(batch=64), "a row for belief eager fp32 batch 64, which no run line before"),
        (lambda r: r["row"].update(variant="wafe-mae"), "a row for wafe-mae eager fp32 batch 1, which no run line"),
        (lambda r: r["row"].update(variant="<script>"), 'row.variant is "<script>"'),
        (lambda r: r["row"].update(arch="base"), 'row.arch is "base"; it must be "micro", the run\'s'),
        (lambda r: r.update(kind="hack"), 'kind is "hack"'),
    ],
)
def test_rows_are_read_back_only_when_valid_and_asked_for(tmp_path, change, needle):
    """Every row read back becomes a result: one with a field missing, NaN, out of range, statistics out of order,
    for a variant, batch or model no run asked for, or a name that is not a name, is refused, naming the file and
    line; nothing changes in the file."""
    path = tmp_path / "rows.jsonl"
    lines = _log_with_rows(path)
    record = json.loads(lines[2])
    change(record)
    path.write_bytes(b"".join([*lines[:2], (json.dumps(record) + "\n").encode(), *lines[3:]]))
    before = path.read_bytes()
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))} line 3: .*{re.escape(needle)}"):
        _reopen(path)
    assert path.read_bytes() == before


def test_a_huge_line_or_file_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    """A line over the bound is refused after reading at most the bound plus one byte (a 300 MB line was read
    whole); so is a file over its bound, from its size."""
    import attnzoo.benchmarks.rowlog as rowlog

    path = tmp_path / "rows.jsonl"
    lines = _log_with_rows(path)
    monkeypatch.setattr(rowlog, "MAX_LINE_BYTES", 4096)
    path.write_bytes(b"".join([*lines[:2], b'{"kind": "row", "pad": "' + b"x" * 100_000 + b'"}\n', *lines[2:]]))
    reads = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def readline(self, limit=-1):
            line = self.f.readline(limit)
            reads.append(len(line))
            return line

    monkeypatch.setattr(rowlog, "open", lambda p, mode="r": Counting(real_open(p, mode)), raising=False)
    with pytest.raises(ValueError, match=r"line 3: longer than"):
        _reopen(path)
    assert max(reads) == 4097
    monkeypatch.setattr(rowlog, "MAX_LOG_BYTES", 1000)
    with pytest.raises(ValueError, match=r"is [\d,]+ bytes, over the 1,000 a row log can be"):
        _reopen(path)


def test_an_earlier_runs_rows_are_kept_but_only_as_that_run_asked(tmp_path):
    """Another invocation with other --variants adds its rows (its run line says what it asked for): both runs'
    rows are read back; a run line with another key is refused."""
    from attnzoo.benchmarks.rowlog import RowLog

    path = tmp_path / "rows.jsonl"
    _log_with_rows(path)
    wider = {**ASKS, "variants": ["standard", "wafe-mae"]}
    log = RowLog(path, KEY, wider, {})
    log.append({"kind": "row", "row": _ok_row("wafe-mae"), "overhead": None})
    log.close()
    assert [r["row"]["variant"] for r in _reopen(path).of("row")] == ["standard", "belief", "standard", "wafe-mae"]
    with open(path, "a") as f:  # after the run lines of the two runs and the reopening: line 8
        f.write(json.dumps({"kind": "run", "key": {**KEY, "arch": "tiny"}, "asks": ASKS}) + "\n")
    with pytest.raises(ValueError, match="line 8: a run line with another key"):
        _reopen(path)


def test_names_and_reasons_are_escaped_in_the_markdown():
    """A name or reason from the row log is text in results.md, never markup."""
    from attnzoo.benchmarks.tables import markdown

    ok = _ok_row("<script>alert(1)</script>")
    bad = {**_ok_row(), "status": "failed", "reason": "<img src=x onerror=alert(1)> | x"}
    result = {
        "settings": {"task": "cls", "arch": "micro", "threads": 1},
        "command": "bench-latency",
        "note": "",
        "environment": {"cpu": {"model": "cpu", "usable_cores": 1, "flags": []}, "load_average": None},
        "results": [ok, bad],
        "overheads": [],
    }
    md = markdown(result)
    assert "<script>" not in md and "<img" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md and "&lt;img src=x onerror=alert(1)&gt; \\| x" in md


def test_results_are_written_as_one_set(tmp_path, monkeypatch):
    """Out of disk while writing the charts: the results already there stay as they were (no new results.md next to
    an old latency.png), nothing half-written is left, and the error names the file; a smaller new set removes the
    files of the old one it does not have."""
    import errno

    import attnzoo.benchmarks.tables as report

    s = parse_settings(
        [
            *BENCH[: BENCH.index("--variants")],
            "--variants",
            "standard",
            "--backends",
            "eager",
            "--batch-sizes",
            "1",
            "--min-time",
            "0.05",
            "--threads",
            "1",
            "--ceiling-size",
            "0",
            "--no-progress",
            "--out",
            str(tmp_path),
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    result = run_benchmark(s)
    report.write_outputs(result, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in report.OUTPUTS.values()}
    assert {"results.md", "results.json", "latency.png"} <= set(before)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report, "plot_latency", full)
    changed = {**result, "command": "another command"}
    with pytest.raises(OSError, match="could not write latency.png of the results .*left as they were"):
        report.write_outputs(changed, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name in report.OUTPUTS.values()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".results-")]
    monkeypatch.undo()
    files = report.write_outputs({**changed, "results": [], "overheads": []}, tmp_path)
    assert "latency_png" not in files and not (tmp_path / "latency.png").exists()
    assert "another command" in (tmp_path / "results.md").read_text()


def test_a_second_sigterm_waits_for_the_results_of_the_first(tmp_path, monkeypatch):
    """SIGTERM stops the jobs; a second one during the work that follows (closing sessions, the statistics) used to
    end the command before results.json was written. Now it waits until the rows measured are written."""
    import signal

    from attnzoo.benchmarks import run as bench_run

    real_variant, real_speedups = bench_run._Bench.variant, bench_run.speedups

    def variant_then_sigterm(self, *args, **kwargs):
        real_variant(self, *args, **kwargs)
        signal.raise_signal(signal.SIGTERM)  # the first: stops the jobs once this row is measured

    def second_sigterm(rows):
        signal.raise_signal(signal.SIGTERM)  # the second, while the measured rows are being put together
        return real_speedups(rows)

    monkeypatch.setattr(bench_run._Bench, "variant", variant_then_sigterm)
    monkeypatch.setattr(bench_run, "speedups", second_sigterm)
    out = tmp_path / "out"
    args = ["--arch", "micro", "--variants", "standard", "--backends", "eager", "--dtype", "fp32"]
    args += ["--batch-sizes", "1", "--min-time", "0.01", "--threads", "1", "--ceiling-size", "0", "--no-progress"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert info.value.code == 143
    result = json.loads((out / "results.json").read_text())
    assert result["interrupted"]["signal"] == "SIGTERM" and [r["variant"] for r in result["results"]] == ["standard"]


def test_a_compile_that_would_pass_the_budget_is_not_started():
    """The budget is a limit: after a 28 s compile, a 30 s budget has no room for another (the bare run's first
    compile took 28 s on a 2-core EPYC; the AOTInductor one it then started ran 38 s more)."""
    assert compile_budget_reason(0.0, 0, 30.0) is None  # the first compile always starts
    assert compile_budget_reason(0.0, 0, 0.0) == "--compile-budget 0 s allows no compile"
    assert compile_budget_reason(12.0, 1, 30.0) is None  # 12 + 12 fits
    assert compile_budget_reason(28.3, 1, 30.0) == (
        "--compile-budget 30 s: 1 compile(s) took 28 s, 28 s each on this machine; another would pass it"
    )
    assert compile_budget_reason(40.0, 2, 30.0) is not None  # spent already


@pytest.mark.slow  # two micro exports, one of them in a child process (about 25 s on 2 cores)
def test_the_exports_are_made_ahead_two_at_a_time_and_the_rows_reuse_them(tmp_path, monkeypatch):
    """Before any row is timed, the ONNX files the rows will read are exported, every other one by a child
    process; the file the child made is the one this process's model would export (its fingerprint matches, so
    the row's own export reuses it after checking it again), and no child is left."""
    import multiprocessing

    from attnzoo.benchmarks import run as run_mod
    from attnzoo.export import export_verified

    s = parse_settings(
        ["--arch", "micro", "--variants", "belief2", "--backends", "eager,ort-cpu", "--batch-sizes", "1"]
        + ["--threads", "1", "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    )
    monkeypatch.setattr(run_mod, "usable_cores", lambda: 2)  # a machine where the child is started
    bench = run_mod._Bench(s)
    bench.export_ahead(["standard", "belief2"])
    assert bench.phases["ONNX export and its check"] > 0 and multiprocessing.active_children() == []
    made = sorted(p.name for p in (tmp_path / "cache").glob("*.onnx"))
    assert made == ["belief2_cls_micro_32px_fp32.onnx", "standard_cls_micro_32px_fp32.onnx"]
    model = run_mod.bench_model(s, "belief2")  # the child's job: the second of the two
    cfg = model.attnzoo_config
    report = export_verified(
        model,
        tmp_path / "cache" / made[0],
        cfg,
        input_hw=(cfg["img_size"], cfg["img_size"]),
        batch_sizes=(1,),
        threads=1,
        reuse=True,
    )
    assert report["reused"] is True and report["passed"]


def test_the_estimates_load_arithmetic():
    """Other work's share of the load average (this process's own CPU time taken out) and the slowdown it causes
    to a run's threads, each runnable thread getting an equal share of the cores."""
    from attnzoo.machine import load_slowdown, others_load

    assert others_load(4.0, own_cpu_s=12.0, threads=2) == pytest.approx(3.8)  # 12 s of CPU in the minute: 0.2
    assert others_load(4.0, own_cpu_s=600.0, threads=2) == pytest.approx(2.0)  # at most its 2 threads
    assert others_load(0.1, own_cpu_s=30.0, threads=2) == 0.0  # never below 0
    assert load_slowdown(3.8, cores=2, threads=2) == pytest.approx(2.9)  # (3.8 + 2) threads on 2 cores
    assert load_slowdown(1.0, cores=2, threads=1) == 1.0  # one thread beside one: a core each
    assert load_slowdown(0.0, cores=2, threads=4) == 1.0  # its own oversubscription is in what it measures
    assert load_slowdown(4.0, cores=2, threads=4) == pytest.approx(2.0)  # 8 runnable threads for its 4's share


def test_the_opening_estimate_counts_the_load_it_reads(monkeypatch):
    """The exports' fixed (quiet-machine) seconds grow by the slowdown, the forward passes' (from the ceiling,
    measured under the load) and the compile budget do not; the line says what load it assumed, or that the
    system reports none, and the run records it beside ``estimate_s``."""
    from attnzoo.benchmarks import estimate
    from attnzoo.benchmarks.run import Settings

    class Plan:  # one ONNX row and one eager row per variant
        def todo(self, variant, batch):
            return [("ort-cpu", "fp32"), ("eager", "fp32")]

    s = Settings(variants=["standard", "belief2"], backends=["ort-cpu", "eager"], dtypes=["fp32"], batch_sizes=[1])
    ceiling = {"fp32": {"gflops": 100.0}}
    quiet = estimate.estimate_seconds(s, Plan(), ["standard", "belief2"], ceiling)
    loaded = estimate.estimate_seconds(s, Plan(), ["standard", "belief2"], ceiling, slowdown=2.9)
    assert loaded - quiet == pytest.approx(2 * estimate.EXPORT_FIXED_S * 1.9)  # two variants' exports, 1.9x more
    assert estimate.estimate_seconds(s, Plan(), ["standard"], None, slowdown=2.9) is None  # no ceiling, no estimate

    monkeypatch.setattr(estimate, "load_1min", lambda: 4.0)
    monkeypatch.setattr(estimate.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(estimate.time, "process_time", lambda: 12.0)
    load = estimate.estimate_load(threads=2)
    assert load == {"load_1min": 4.0, "others": 3.8, "cpus": 2, "slowdown": pytest.approx(2.9)}
    line = estimate.estimate_line(400.0, 18, load)
    assert line.startswith("estimate: about 7 min for 18 row(s) at the load 3.8 beside this run on 2 CPUs (")
    assert "2.9x a quiet machine's" in line and line.endswith("a load that changes moves it")
    monkeypatch.setattr(estimate.time, "process_time", lambda: 60.0)
    monkeypatch.setattr(estimate, "load_1min", lambda: 1.0)  # all of it this run's own
    quiet_load = estimate.estimate_load(threads=2)
    assert quiet_load["others"] == 0.0 and quiet_load["slowdown"] == 1.0
    assert "at the load 0.0 beside this run on 2 CPUs; more load makes it longer" in estimate.estimate_line(
        134.0, 18, quiet_load
    )
    monkeypatch.setattr(estimate, "load_1min", lambda: None)
    assert estimate.estimate_load(threads=2) is None
    assert "this system reports no load average" in estimate.estimate_line(134.0, 18, None)
