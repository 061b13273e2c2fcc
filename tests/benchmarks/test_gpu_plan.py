"""The GPU plan (benchmarks/gpu_plan.py): its parts cover what it promises, and every part runs on the CPU with a
tiny model from a source tree that was not installed, with only what the plan needs (torch, timm, onnx)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnzoo.benchmarks import gpu_plan as plan
from attnzoo.models import VARIANT_NAMES

ROOT = Path(__file__).resolve().parents[2]
#: What the plan must run without: every package beyond torch, triton, timm, onnx and onnxruntime.
ABSENT = (
    "gradio",
    "ray",
    "openvino",
    "tensorrt",
    "tensorrt_rtx",
    "modelopt",
    "matplotlib",
    "sklearn",
    "onnxscript",
    "nncf",
    "polygraphy",
    "onnx_graphsurgeon",
)


def test_the_parts_cover_every_variant_precision_and_batch_within_the_time_limit(tmp_path):
    rows = {}
    for part in plan.PARTS:
        s = plan.part_settings(part, tmp_path)
        assert s.variants[0] == "standard" and s.min_time == plan.MIN_TIME and s.ceiling_size == 0
        assert s.time_limit == plan.TIME_LIMIT < 600 and s.compile_budget > 600  # no compile row left for budget
        for v in s.variants:
            for b in s.backends:
                for d in s.dtypes:
                    for n in s.batch_sizes:
                        rows.setdefault((Path(s.out).name, v, b, d, n), part)
    for model, spec in plan.MODELS.items():
        for v in VARIANT_NAMES:
            for n in spec["batch_sizes"]:
                for d in plan.EAGER_DTYPES:
                    assert (model, v, "eager", d, n) in rows, (model, v, d, n)
                for d in plan.COMPILE_DTYPES:
                    assert (model, v, "compile", d, n) in rows, (model, v, d, n)
    assert plan.MODELS["vit-s-224"]["batch_sizes"] == (1, 8, 64, 256)
    assert (plan.MODELS["segmenter-512"]["task"], plan.MODELS["segmenter-512"]["img_size"]) == ("seg", 512)
    assert all(any(k[2] == b for k in rows) for b in plan.NOT_THERE)
    assert list(plan.PARTS)[:4] == ["headline", "eager-a", "eager-b", "seg-eager"]  # eager before the other compiles
    with pytest.raises(ValueError, match="unknown part 'nope'; valid: headline, eager-a, eager-b"):
        plan.part_settings("nope", tmp_path)


def test_the_headline_is_every_variant_at_fp16_eager_compiled_and_ahead_of_time(tmp_path):
    s = plan.part_settings("headline", tmp_path)
    assert s.variants == list(VARIANT_NAMES) and s.batch_sizes == [1, 64] and s.dtypes == ["fp16"]
    assert (s.task, s.arch, s.img_size) == ("cls", "small", 224) and s.backends == ["eager", "compile", "aoti"]
    assert s.dynamic_batch and s.out == tmp_path / "headline-vit-s-224" and s.time_limit == plan.TIME_LIMIT
    assert plan.HEADLINE_STAGES == (("eager",), ("eager", "compile"), ("eager", "compile", "aoti"))
    assert not plan.part_settings("compile-1", tmp_path).dynamic_batch  # the older parts compile per batch
    assert plan.part_settings("headline", tmp_path, dtypes=["fp32"], backends=("eager",)).backends == ["eager"]
    assert "python benchmarks/gpu_plan.py --part headline --out results/gpu-h100" in plan.__doc__


def test_a_parts_recorded_command_carries_the_flags_it_ran_with(tmp_path):
    """A part run with ``--time-limit 46`` (or any other flag) records it: the command reruns the same part."""
    argv = ["--part", "eager-b", "--time-limit", "46", "--part=compile-1", "--out", "results/gpu-h100"]
    flags = plan._other_flags(argv)
    assert flags == ["--time-limit", "46", "--out", "results/gpu-h100"]
    s = plan.part_settings("eager-b", tmp_path, flags=flags)
    assert s.command == "python benchmarks/gpu_plan.py --part eager-b --time-limit 46 --out results/gpu-h100"


def test_the_headline_table_shows_each_backend_its_overhead_and_why_a_row_did_not_run():
    def row(v, b, n, ms, status="ok", reason="", x=None):
        return {
            "variant": v,
            "backend": b,
            "dtype": "fp16",
            "batch": n,
            "status": status,
            "reason": reason,
            "median_ms": ms,
            "speedup_pair_median": x,
            "speedup_vs_eager": None,
        }

    ref = {**row("standard", "eager", 1, 9.0), "dtype": "fp32"}
    result = {
        "results": [
            ref,
            row("standard", "eager", 1, 5.0),
            row("standard", "compile", 1, 2.0, x=2.5),
            row("standard", "aoti", 1, None, "failed", "build/run: RuntimeError: no | pipes"),
            row("belief2", "eager", 1, 7.5),
            row("belief2", "compile", 1, 2.4, x=3.1),
        ],
        "overheads": [
            {"variant": "belief2", "backend": b, "dtype": "fp16", "batch": 1, "ratio_median": r}
            for b, r in (("eager", 1.5), ("compile", 1.2))
        ],
    }
    lines = plan.headline_table(result).splitlines()
    assert lines[0] == (
        "| variant | batch | eager fp16 ms | eager x standard | compile fp16 ms | compile x standard "
        "| aoti fp16 ms | aoti x standard | compile x eager | aoti x eager |"
    )
    assert lines[2] == (
        "| `standard` | 1 | 5.00 | 1 | 2.00 | 1 | failed: build/run: RuntimeError: no / pipes | - | 2.50 | - |"
    )
    assert lines[3] == "| `belief2` | 1 | 7.50 | 1.50 | 2.40 | 1.20 | not run | - | 3.10 | - |"
    assert plan.headline_table({"results": []}) == "| variant | batch |\n|---|---|\n"  # stopped before any row


def test_gpu_rows_get_their_roofline_fraction():
    """The bound of the row's own precision on the GPU named (the one peak table), over its median."""
    from attnzoo.benchmarks.flops import count_variant
    from attnzoo.benchmarks.roofline import GPUS, WIDTH, bound
    from attnzoo.benchmarks.run import roofline_fractions

    rows = [
        {"variant": "standard", "batch": 8, "dtype": d, "device": dev, "status": "ok", "median_ms": 2.0}
        for d, dev in (("fp32", "cuda"), ("tf32", "cuda"), ("bf16", "cuda"), ("fp32", "cpu"))
    ]
    roofline_fractions(rows, "NVIDIA H100 80GB HBM3", "cls", "small", 224)
    c = count_variant("standard", "cls", "small", 224, batch=8)
    for r in rows[:3]:
        want = bound(c.matrix_flops, c.vector_ops, c.bytes(WIDTH[r["dtype"]]), GPUS["h100-sxm"], r["dtype"])["bound_s"]
        assert r["roofline_us"] == pytest.approx(want * 1e6) and r["roofline_fraction"] == pytest.approx(want / 2e-3)
    assert rows[0]["roofline_us"] > rows[1]["roofline_us"] > rows[2]["roofline_us"]  # CUDA cores, TF32, bf16
    assert "roofline_us" not in rows[3]  # a CPU row has no GPU roof
    unknown = [{k: v for k, v in rows[0].items() if not k.startswith("roofline")}]
    roofline_fractions(unknown, "NVIDIA GeForce RTX 4090", "cls", "small", 224)  # not in the table: left empty
    assert unknown[0].get("roofline_fraction") is None


DRIVER = textwrap.dedent("""
    import importlib.util, os, runpy, sys
    from importlib.machinery import PathFinder

    ABSENT = set(sys.argv[1].split(","))

    class Hiding(PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            return None if name.split(".")[0] in ABSENT else PathFinder.find_spec(name, path, target)

    # a bare GPU machine: no editable install of attnzoo, none of the packages the plan runs without, and the
    # checkout not on the path (as `python benchmarks/gpu_plan.py` starts; from it attnzoo/'s links would resolve)
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    sys.meta_path[:] = [Hiding if f is PathFinder else f for f in sys.meta_path
                        if not getattr(f, "__module__", "").startswith("__editable__")]
    assert importlib.util.find_spec("attnzoo") is None  # a bare tree: what bootstrap() then maps
    sys.argv = ["benchmarks/gpu_plan.py", *sys.argv[2:]]
    try:
        runpy.run_path("benchmarks/gpu_plan.py", run_name="__main__")
    finally:
        print("imported:", sorted(m for m in sys.modules if m.split(".")[0] in ABSENT))
""")


def _plan(*argv: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, ",".join(ABSENT), *argv], cwd=ROOT, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported: []" in done.stdout
    return done


@pytest.mark.slow
def test_every_part_runs_from_the_source_tree_with_a_tiny_model(tmp_path):
    """All parts, in order, with a micro ViT on the CPU: eager fp32 rows measured and parity-checked, the GPU-only
    precisions and backends listed with their reasons, results per model, a part stopped by its time limit and
    resumed, and the results copied to the --copy-to folder."""
    out, copy = tmp_path / "out", tmp_path / "copy"
    tiny = [
        "--arch",
        "micro",
        "--img-size",
        "32",
        "--batch-sizes",
        "1,2",
        "--variants",
        "standard,belief",
        "--min-time",
        "0.02",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    first = _plan("--part", "eager-a", "--time-limit", "0.001", *tiny)
    assert "part eager-a not finished: stopped at --time-limit 0.001 s" in first.stdout
    parts = [arg for part in plan.PARTS for arg in ("--part", part)]
    done = _plan(*parts, *tiny, "--copy-to", str(copy))
    assert "not finished" not in done.stdout
    for model in plan.MODELS:
        result = json.loads((out / model / "results.json").read_text())
        assert (copy / "out" / model / "results.json").read_text() == (out / model / "results.json").read_text()
        assert result["settings"]["img_size"] == 32 and result["settings"]["arch"] == "micro"
        rows = {(r["variant"], r["backend"], r["dtype"], r["batch"]): r for r in result["results"]}
        for v in ("standard", "belief"):
            for n in (1, 2):
                eager = rows[(v, "eager", "fp32", n)]
                assert eager["status"] == "ok" and eager["parity_error"] <= eager["parity_tol"] == 1e-4
                assert rows[(v, "eager", "tf32", n)]["reason"].startswith("tf32 is a GPU tensor-core mode")
                assert (v, "compile", "bf16", n) in rows
        assert {(o["variant"], o["backend"], o["dtype"]) for o in result["overheads"]} >= {("belief", "eager", "fp32")}
    vit_rows = json.loads((out / "vit-s-224" / "results.json").read_text())["results"]
    vit = {(r["backend"], r["dtype"]): r for r in vit_rows}
    assert vit[("tensorrt", "fp32")]["status"] == "skipped"  # TensorRT hidden (ABSENT): a skipped row
    assert vit[("tensorrt", "fp32")]["reason"].startswith("no TensorRT library is installed")
    assert vit[("ort-cuda", "fp32")]["status"] == "skipped" and vit[("ort-cuda", "fp32")]["reason"]
    again = _plan("--part", "eager-a", *tiny)  # nothing left: every row kept
    assert "resuming:" in again.stdout and "; 0 to measure" in again.stdout
    assert "eager-a  vit-s-224" in again.stdout and "rows done" in again.stdout


@pytest.mark.slow
@pytest.mark.timeout(2400)  # four torch.compile graphs and two AOTInductor packages of the micro model
def test_the_headline_runs_its_stages_resumes_and_renders(tmp_path, capsys, monkeypatch):
    """The headline with a micro ViT at fp32 on the CPU (AOTInductor compiles fp32 there): a run stopped by its time
    limit keeps what it measured, the same command measures the rest -- eager, then torch.compile compiled once
    per variant for both batch sizes, then AOTInductor from one package per variant -- every row parity-checked
    and paired with standard; headline.md and, with --render, the pictures."""
    monkeypatch.setenv("ATTNZOO_CACHE", str(tmp_path / "cache"))  # the compiled packages stay in the test's folder
    out = tmp_path / "out"
    tiny = [
        "--arch",
        "micro",
        "--img-size",
        "32",
        "--batch-sizes",
        "1,2",
        "--variants",
        "belief2",
        "--dtypes",
        "fp32",
        "--min-time",
        "0.02",
        "--device",
        "cpu",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    assert plan.main(["--part", "headline", "--time-limit", "0.001", *tiny]) == 0
    assert "part headline not finished: stopped at --time-limit 0.001 s" in capsys.readouterr().out
    folder = out / "headline-vit-s-224"
    assert json.loads((folder / "results.json").read_text())["interrupted"]["signal"] is None
    assert plan.main(["--part", "headline", *tiny]) == 0
    done = capsys.readouterr().out
    assert "not finished" not in done and "resuming:" in done
    result = json.loads((folder / "results.json").read_text())
    assert result["settings"]["dynamic_batch"] is True
    rows = {(r["variant"], r["backend"], r["batch"]): r for r in result["results"] if r["dtype"] == "fp32"}
    for v in ("standard", "belief2"):
        for b in ("eager", "compile", "aoti"):
            for n in (1, 2):
                r = rows[(v, b, n)]
                assert r["status"] == "ok" and r["parity_error"] <= r["parity_tol"] == 1e-4, (v, b, n, r["reason"])
        assert rows[(v, "compile", 1)]["info"]["batch"] == "dynamic"
        assert rows[(v, "compile", 2)]["info"]["compiled_copy"] == "shared (compiled by an earlier session)"
        assert rows[(v, "aoti", 2)]["info"]["cached"] is True  # the package compiled for batch 1 runs batch 2
    assert {(o["backend"], o["batch"]) for o in result["overheads"] if o["variant"] == "belief2"} >= {
        (b, n) for b in ("eager", "compile", "aoti") for n in (1, 2)
    }
    table = (folder / "headline.md").read_text()
    assert "| `belief2` | 2 |" in table and "aoti x standard" in table
    (folder / "overhead.png").unlink()  # as a GPU machine without matplotlib leaves it
    (folder / "headline.md").unlink()
    assert plan.render(out) == [folder] and (folder / "overhead.png").is_file()  # drawn again from the results
    assert (folder / "headline.md").read_text() == table
