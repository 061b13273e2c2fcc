"""``export-model --format aoti`` and the ``aoti`` backend: an AOTInductor package is verified before it is written
(the variant's extra math counted in the exported program, parity against eager at batch sizes it was not traced
with), and runs through the backend registry.

Compiling a package takes about a minute per model on a 2-core CPU, so the tests that compile are slow; the checks
themselves (the extra-math count, the parity gate, nothing half-written) are tested fast with the compile replaced.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from attnzoo.errors import UsageError
from attnzoo.export import export_model
from attnzoo.export.errors import ExportError
from attnzoo.export.formats.base import failed_report_path, report_path
from attnzoo.export.formats.program import count_extra_math
from attnzoo.fileio import sha256_file
from attnzoo.models import VARIANT_NAMES, VARIANTS, create_model
from attnzoo.runtime.backends import LoadOptions, get_backend
from attnzoo.targets.aoti import package as aoti
from tests.export.boundary import moved, rename_scope
from tests.schemas import assert_only_verified_loads, read_back


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


@pytest.mark.parametrize(
    "forward,passes",
    [
        (lambda h, v: (h * 1.0, v), True),  # one op that computes: the least a scope may hold
        (lambda h, v: (h.view(h.shape), v.view(v.shape)), False),  # views only: no math
    ],
    ids=["one-computing-op", "views-only"],
)
def test_one_computing_op_in_a_scope_is_enough_and_views_only_are_refused(tmp_path, monkeypatch, forward, passes):
    calls, stub = _no_compile(monkeypatch)
    stub.model = model = _tiny("belief2")
    model.blocks[0].attn.projection.forward = forward
    out = tmp_path / "b2.pt2"
    if passes:
        report = export_model(model=model, out=out, format="aoti").report
        assert report["passed"] and calls == ["compile", "load"]
        assert report["extra_math"]["blocks"]["blocks.0.attn.projection"]["ops"] == {"mul": 1}
        return
    line = "blocks.0.attn.projection: only view node(s), no op computes anything"
    with pytest.raises(ExportError, match=rf"^b2.pt2 failed verification \({re.escape(line)}\); see "):
        export_model(model=model, out=out, format="aoti")
    assert calls == [] and sorted(p.name for p in tmp_path.iterdir()) == ["b2.pt2.failed.json"]
    assert read_back(failed_report_path(out), "aoti")["failures"] == [line]


def test_a_model_whose_projection_scope_is_renamed_is_refused_before_the_compile(tmp_path, monkeypatch):
    calls, stub = _no_compile(monkeypatch)
    stub.model = model = rename_scope(_tiny("belief2"), "projection")
    out = tmp_path / "b2.pt2"
    with pytest.raises(ExportError, match=r"\(blocks.0.attn.projection: no nodes of module blocks.0.attn.projection "):
        export_model(model=model, out=out, format="aoti")
    assert calls == [] and sorted(p.name for p in tmp_path.iterdir()) == ["b2.pt2.failed.json"]


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_the_packages_parity_gate_writes_half_its_tolerance_and_refuses_twice_it(tmp_path, monkeypatch, factor):
    calls, stub = _no_compile(monkeypatch, perturb=lambda y: torch.from_numpy(moved(y.numpy(), factor, "fp32")))
    stub.model = model = _tiny("belief2")
    out = tmp_path / "b2.pt2"
    if factor < 1:
        assert export_model(model=model, out=out, format="aoti", batch_sizes=(1,)).report["passed"] and out.is_file()
        return
    with pytest.raises(ExportError, match=r"^b2.pt2 failed verification \(batch 1 real: max abs err "):
        export_model(model=model, out=out, format="aoti", batch_sizes=(1,))
    assert calls == ["compile", "load"] and sorted(p.name for p in tmp_path.iterdir()) == ["b2.pt2.failed.json"]


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


def _package(path: Path, so: bytes) -> Path:
    """A zip laid out as AOTInductor lays out a package, with ``so`` as the model's compiled wrapper."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("package/archive_format", "pt2")
        archive.writestr("package/archive_version", "0")
        archive.writestr("package/data/aotinductor/model/model.wrapper.so", so)
        archive.writestr("package/data/aotinductor/model/model.wrapper_metadata.json", '{"AOTI_DEVICE_KEY": "cpu"}')
    return path


def _planted(tmp_path: Path) -> tuple[Path, Path]:
    """``(package, marker)``: a package whose shared object's constructor writes ``marker`` as soon as anything
    loads it (built with the C compiler here)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("the planted package's shared object is built with a C compiler (gcc); none found")
    marker, source, so = tmp_path / "marker", tmp_path / "planted.c", tmp_path / "planted.so"
    source.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void planted(void) {\n"
        '    FILE *f = fopen(MARKER, "w");\n'
        '    if (f) { fputs("ran", f); fclose(f); }\n'
        "}\n"
    )
    cmd = [cc, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(so), str(source)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return _package(tmp_path / "planted.pt2", so.read_bytes()), marker


def _stub_compile(monkeypatch, model) -> tuple[list[str], list[str]]:
    """The AOTInductor compile replaced by one that writes a package-shaped zip holding no code, and AOTInductor's
    own loader spied on: a package the stub wrote runs as eager ``model`` does, any other file goes on to the real
    loader (where a planted package's code runs). Returns the SHA-256 of every package compiled and loaded."""
    compiled: list[str] = []
    loaded: list[str] = []
    real = torch._inductor.aoti_load_package

    def compile_package(program, path, metadata=None):
        _package(path, b"compiled here, no code")
        compiled.append(sha256_file(path))
        return 0.0

    def aoti_load_package(path):
        loaded.append(sha256_file(path))
        if loaded[-1] not in compiled:
            return real(path)
        return lambda x: model(x.float())

    monkeypatch.setattr(aoti, "compile_package", compile_package)
    monkeypatch.setattr(torch._inductor, "aoti_load_package", aoti_load_package)
    return compiled, loaded


def test_a_package_planted_at_the_cache_name_runs_no_code_and_is_compiled_again(tmp_path, monkeypatch):
    """The cache hands AOTInductor only the package it compiled and recorded: a package planted at its name (with
    the record of the one it replaced beside it, or none) is compiled again, never opened; the recorded one is
    reused. The planted package is live: opened, it runs its code."""
    planted, marker = _planted(tmp_path)
    model = _tiny("belief2")
    compiled, loaded = _stub_compile(monkeypatch, model)
    monkeypatch.setattr(aoti, "export_program", lambda *a, **k: "the exported program")
    options = LoadOptions(cache_dir=tmp_path / "cache")
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)

    def load() -> tuple[np.ndarray, dict]:
        with get_backend("aoti").load(model, options) as session:
            return session.run(x), session.info()

    _, info = load()
    assert info["cached"] is False and len(compiled) == 1
    _, info = load()
    assert info["cached"] is True and len(compiled) == 1  # the recorded package, reused
    package = tmp_path / "cache" / "aoti" / info["package"]
    shutil.copyfile(planted, package)  # planted over it, the record of the package it replaced left beside it
    _, info = load()
    assert info["cached"] is False and len(compiled) == 2
    package.with_suffix(".json").unlink()
    shutil.copyfile(planted, package)  # planted, with no record at all
    got, info = load()
    assert info["cached"] is False and len(compiled) == 3
    assert not marker.exists() and sha256_file(planted) not in loaded and set(loaded) <= set(compiled)
    with torch.no_grad():
        assert np.allclose(got, model(torch.from_numpy(x)).numpy())
    with pytest.raises(RuntimeError):  # the control: AOTInductor's loader runs a package's code as it opens it
        aoti.load_package(planted)
    assert marker.read_text() == "ran"


def test_the_path_api_loads_only_a_package_whose_report_verified_it(tmp_path, monkeypatch):
    """``get_backend("aoti").load(path)``: the package ``export-model`` verified loads; a file without a report, or
    another file at the verified one's name, is refused in one line before AOTInductor sees it."""
    planted, marker = _planted(tmp_path)
    model = _tiny("wafe-mae")
    compiled, loaded = _stub_compile(monkeypatch, model)
    out = tmp_path / "w.pt2"
    export_model(model=model, out=out, format="aoti", batch_sizes=(1,))
    backend = get_backend("aoti")
    with backend.load(out) as session:
        assert session.info()["package"] == str(out)
    assert_only_verified_loads(backend, out, planted)
    assert not marker.exists() and sha256_file(planted) not in loaded


def test_a_file_that_is_not_a_package_is_refused_naming_it_before_aotinductor_opens_it(tmp_path, monkeypatch):
    opened: list[str] = []
    monkeypatch.setattr(torch._inductor, "aoti_load_package", opened.append)
    good = _package(tmp_path / "good.pt2", b"\0" * 4096)
    random = tmp_path / "random.pt2"
    random.write_bytes(np.random.default_rng(0).bytes(4096))
    cut = tmp_path / "cut.pt2"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    damaged = tmp_path / "damaged.pt2"
    data = bytearray(good.read_bytes())
    data[data.index(b"\0" * 4096) + 100] = 1  # one byte of the shared object changed: its CRC fails
    damaged.write_bytes(bytes(data))
    other = tmp_path / "other.pt2"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("package/data/aotinductor/model/model.wrapper.so", b"")
    for path, why in [
        (random, r"not a zip archive, or a truncated one"),
        (cut, r"not a zip archive, or a truncated one"),
        (damaged, r"a damaged archive \(member package/data/aotinductor/model/model.wrapper.so fails its CRC\)"),
        (other, r"a zip archive that does not say it is a pt2 package \(archive_format\)"),
    ]:
        with pytest.raises(ValueError, match=rf"^{path} is not an AOTInductor package: {why}") as refused:
            aoti.load_package(path)
        assert "\n" not in str(refused.value)
    assert opened == []
    aoti.load_package(good)
    assert opened == [str(good)]


def test_a_cache_folder_others_can_write_is_refused_before_anything_is_compiled(tmp_path, monkeypatch):
    compiled, _ = _stub_compile(monkeypatch, None)
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    with pytest.raises(ValueError, match=rf"^the cache folder {cache} can be written by its group and others"):
        get_backend("aoti").load(_tiny("belief2"), LoadOptions(cache_dir=cache))
    assert compiled == [] and not (cache / "aoti").exists()


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
