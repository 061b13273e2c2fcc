"""``export-model --format aoti`` and the ``aoti`` backend: an AOTInductor package is verified before it is written
(the variant's extra math counted in the exported program, parity against eager at batch sizes it was not traced
with), and runs through the backend registry.

Compiling a package takes about a minute per model on a 2-core CPU, so the tests that compile are slow; the checks
themselves (the extra-math count, the parity gate, nothing half-written) are tested fast with the compile replaced.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnzoo.errors import UsageError
from attnzoo.export import export_model
from attnzoo.export.errors import ExportError
from attnzoo.export.formats.base import failed_report_path, report_path
from attnzoo.export.formats.program_part import count_extra_math
from attnzoo.models import VARIANT_NAMES, VARIANTS, create_model
from attnzoo.runtime import aoti
from attnzoo.runtime.backends import get_backend
from tests.schemas import read_back


def _tiny(variant: str) -> torch.nn.Module:
    """A micro model cut to one block (the compile's cost grows with the graph)."""
    torch.manual_seed(0)
    model = create_model(variant, "cls", "micro", num_classes=5).eval()
    model.blocks = model.blocks[:1]
    return model


def _no_compile(monkeypatch, perturb=None) -> tuple[list[str], object]:
    """Replace the AOTInductor compile with a stub package and its loader with the eager model (plus ``perturb``):
    what is left is the format's own checks. Returns the calls made."""
    calls: list[str] = []

    def compile_package(program, path, metadata=None):
        calls.append("compile")
        path.write_bytes(b"stub package")
        return 0.0

    def load_package(path):
        calls.append("load")
        model = compile_package.model

        def run(x):
            with torch.no_grad():
                y = model(x.float())
            return y if perturb is None else perturb(y)

        return run

    monkeypatch.setattr(aoti, "compile_package", compile_package)
    monkeypatch.setattr(aoti, "load_package", load_package)
    return calls, compile_package


def test_the_exported_program_holds_each_blocks_extra_math_and_a_removed_scope_fails():
    model = _tiny("belief-star")
    program = aoti.export_program(model, (32, 32))
    found = count_extra_math(program, model.attnzoo_config)
    assert found["ok"] and found["depth"] == 1, found["failures"]
    assert set(found["blocks"]) == {"blocks.0.attn.projection", "blocks.0.attn.head_projection"}
    assert all(sum(b["ops"].values()) >= 5 for b in found["blocks"].values())  # the projection's ops, at least
    assert {"mul", "div", "sub"} <= set(found["blocks"]["blocks.0.attn.projection"]["ops"])

    model.blocks[0].attn.projection.forward = lambda h, v: (h, v)  # the projection's math removed
    found = count_extra_math(aoti.export_program(model, (32, 32)), model.attnzoo_config)
    assert not found["ok"]
    assert found["failures"] == [
        "blocks.0.attn.projection: no nodes of module blocks.0.attn.projection in the exported program (variant "
        "'belief-star' declares extra scope 'projection'; its ops are missing, folded away or renamed)"
    ]
    assert sum(found["blocks"]["blocks.0.attn.head_projection"]["ops"].values()) >= 5  # the other scope is still there


def test_a_variant_without_its_extra_math_is_refused_before_the_compile_and_nothing_is_written(tmp_path, monkeypatch):
    calls, stub = _no_compile(monkeypatch)
    model = _tiny("belief2")
    stub.model = model
    model.blocks[0].attn.projection.forward = lambda h, v: (h, v)
    out = tmp_path / "b2.pt2"
    with pytest.raises(ExportError, match=r"b2.pt2 failed verification \(blocks.0.attn.projection: no nodes"):
        export_model(model=model, out=out, format="aoti")
    assert calls == []  # refused before anything was compiled
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2.pt2.failed.json"]
    report = read_back(failed_report_path(out), "aoti")
    assert report["passed"] is False and report["extra_math"]["depth"] == 1


def test_a_package_that_differs_from_eager_fails_parity_and_is_not_written(tmp_path, monkeypatch):
    calls, stub = _no_compile(monkeypatch, perturb=lambda y: y + 0.01)
    stub.model = model = _tiny("belief2")
    out = tmp_path / "b2.pt2"
    out.write_bytes(b"a good package already there")
    with pytest.raises(ExportError, match=r"b2.pt2 failed verification \(batch 1 real: max abs err 0.01 > 0.0001"):
        export_model(model=model, out=out, format="aoti")
    assert calls == ["compile", "load"]
    assert out.read_bytes() == b"a good package already there"  # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2.pt2", "b2.pt2.failed.json"]  # no temporary left
    report = json.loads(failed_report_path(out).read_text())
    assert report["parity"]["batch_sizes"] == [1, 3, 8] and aoti.TRACE_BATCH not in report["parity"]["batch_sizes"]
    assert report["extra_math"]["ok"]


def test_a_package_that_matches_is_written_with_its_report_and_one_verdict(tmp_path, monkeypatch):
    calls, stub = _no_compile(monkeypatch)
    stub.model = model = _tiny("wafe-mae")
    result = export_model(model=model, out=tmp_path / "w.pt2", format="aoti", batch_sizes=(1, 4))
    assert calls == ["compile", "load"] and result.onnx_path is None
    assert result.files == [tmp_path / "w.pt2", report_path(tmp_path / "w.pt2")]
    assert (tmp_path / "w.pt2").read_bytes() == b"stub package"
    report = read_back(report_path(tmp_path / "w.pt2"), "aoti")
    assert report["passed"] and report["parity"]["batch_sizes"] == [1, 3, 4] and report["batch_dim"] == "batch"
    lines = result.summary().splitlines()
    assert lines[0].startswith(f"{tmp_path / 'w.pt2'}: wafe-mae cls micro fp32 AOTInductor package for cpu")
    assert "extra-math nodes per block: blocks.0=" in lines[2] and lines[3] == "  PASSED"
    # the package returns the logits only: the report says its block outputs are not exposed, with no figures
    assert report["divergence"]["blocks"] == [] and "compiled away" in report["divergence"]["not_exposed"]


def test_aoti_refuses_what_it_cannot_compile_here_before_any_work(tmp_path):
    with pytest.raises(UsageError, match="--format aoti --dtype fp16 compiles for a CUDA GPU and none is visible"):
        export_model("belief2", random_init=True, out=tmp_path / "m.pt2", format="aoti", dtype="fp16")
    with pytest.raises(UsageError, match="names a PyTorch AOTInductor package but --format is onnx"):
        export_model("belief2", random_init=True, out=tmp_path / "m.pt2", format="onnx")
    assert list(tmp_path.iterdir()) == []
    backend = get_backend("aoti")
    assert backend.unavailable_reason("fp16", "cpu") == "AOTInductor packages for cpu are compiled at fp32, not fp16"
    assert backend.unavailable_reason("bf16", "cpu") == "aoti runs fp32, fp16, not bf16"


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant",
    # belief2 in every slow run; the other variants' compiles (about a minute each on 2 cores) form the matrix run
    [v if v == "belief2" else pytest.param(v, marks=pytest.mark.matrix) for v in VARIANT_NAMES],
)
def test_every_variant_exports_as_a_verified_aoti_package_that_the_backend_runs(variant, tmp_path):
    """Each of the 15 variants (micro, one block) compiled for the CPU, verified and written; the backend loads the
    package and answers as eager does."""
    model = _tiny(variant)
    out = tmp_path / f"{variant}.pt2"
    result = export_model(model=model, out=out, format="aoti")
    report = result.report
    assert report["passed"] and out.is_file() and report["device"] == "cpu", report["failures"]
    assert result.summary().splitlines()[-2] == "  PASSED"
    scopes = VARIANTS[variant].extra_scopes
    assert set(report["extra_math"]["blocks"]) == {f"blocks.0.attn.{s}" for s in scopes}
    assert all(sum(b["ops"].values()) > 0 for b in report["extra_math"]["blocks"].values())
    assert report["parity"]["batch_sizes"] == [1, 3, 8] and report["compile_time_s"] > 0
    x = np.random.default_rng(0).standard_normal((5, 3, 32, 32)).astype(np.float32)
    with get_backend("aoti").load(out) as session:
        got = session.run(x)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))


@pytest.mark.slow
@pytest.mark.matrix  # two more compiles (a minute or more on 2 cores); CI's slow run compiles belief2 above
@pytest.mark.timeout(1800)  # two AOTInductor compiles of the micro model: minutes on a loaded 2-core machine
def test_bench_latency_times_aoti_rows_from_one_package_per_variant(tmp_path):
    """``bench-latency --backends aoti``: each row parity-checked and timed, paired with eager and with standard; the
    package compiled for the first batch size serves the next from the cache."""
    from attnzoo.benchmarks.cli import main

    out = tmp_path / "bench"
    args = ["--arch", "micro", "--variants", "belief2", "--backends", "eager,aoti", "--dtypes", "fp32"]
    args += ["--batch-sizes", "1,2", "--min-time", "0.02", "--threads", "1", "--ceiling-size", "0", "--no-progress"]
    args += ["--compile-budget", "3600"]
    assert main([*args, "--out", str(out), "--cache-dir", str(tmp_path / "cache")]) == 0
    result = json.loads((out / "results.json").read_text())
    rows = {(r["variant"], r["batch"]): r for r in result["results"] if r["backend"] == "aoti"}
    assert set(rows) == {(v, n) for v in ("standard", "belief2") for n in (1, 2)}
    for (_, batch), r in rows.items():
        assert r["status"] == "ok" and r["parity_error"] <= r["parity_tol"] == 1e-4, r["reason"]
        assert r["speedup_pair_median"] is not None and r["info"]["cached"] is (batch == 2)
    assert any(o["backend"] == "aoti" and o["variant"] == "belief2" for o in result["overheads"])
    assert len(list((tmp_path / "cache" / "aoti").glob("*.pt2"))) == 2  # one package per variant


def test_a_mae_package_compiles_the_tiled_l1_core_not_the_python_op():
    """wafe-mae's exported program for AOTInductor holds the tiled core as ordinary ops (Inductor compiles them
    into the package) in the distance scope: no call of the Python op attnzoo::l1_attention, no cdist."""
    model = _tiny("wafe-mae")
    program = aoti.export_program(model, (32, 32))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert not any("attnzoo" in t or "cdist" in t for t in targets), targets
    assert {"aten.abs.default", "aten._softmax.default"} <= targets or {
        "aten.abs.default",
        "aten.softmax.int",
    } <= targets
    found = count_extra_math(program, model.attnzoo_config)
    assert found["ok"] and "abs" in found["blocks"]["blocks.0.attn.distance"]["ops"], found


_LOAD_IN_A_FRESH_PROCESS = """
import sys, torch
if sys.argv[2] == "import":
    import attnzoo.models  # registers attnzoo::l1_attention
runner = torch._inductor.aoti_load_package(sys.argv[1])
x = torch.load(sys.argv[3])
torch.save(runner(x), sys.argv[4])
"""


@pytest.mark.slow  # one AOTInductor compile: a minute or more on a loaded 2-core machine
def test_a_package_calling_the_fused_op_loads_where_attnzoo_is_imported_only(tmp_path):
    """mae_impl="fused" exported: the package calls the Python op through AOTInductor's proxy executor; it runs in a
    fresh process that imported attnzoo.models (matching eager), and one that did not is refused in one line."""
    import subprocess
    import sys
    from pathlib import Path

    model = _tiny("wafe-mae")
    program = aoti.export_program(model, (32, 32), mae_impl="fused")
    assert any(str(n.target) == "attnzoo.l1_attention.default" for n in program.graph.nodes)
    package = tmp_path / "fused.pt2"
    aoti.compile_package(program, package)
    x = torch.randn(3, 3, 32, 32)
    torch.save(x, tmp_path / "x.pt")
    root = str(Path(__file__).resolve().parents[2])
    for mode in ("import", "bare"):
        proc = subprocess.run(
            [sys.executable, "-c", _LOAD_IN_A_FRESH_PROCESS, str(package), mode, str(tmp_path / "x.pt"),
             str(tmp_path / f"{mode}.pt")],
            cwd=root, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if mode == "import":
            assert proc.returncode == 0, proc.stderr[-2000:]
            with torch.no_grad():
                np.testing.assert_allclose(torch.load(tmp_path / "import.pt").numpy(), model(x).numpy(), atol=1e-5)
        else:
            assert proc.returncode != 0
            assert "Could not find schema for attnzoo::l1_attention" in proc.stderr
