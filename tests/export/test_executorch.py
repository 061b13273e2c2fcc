"""``export-model --format executorch`` and the ``executorch`` backend: an ExecuTorch program (XNNPACK) is verified
before it is written (the variant's extra math counted in the lowered graph, inside and outside the delegates;
parity against eager at batch sizes it was not traced with), and runs through the backend registry.

Lowering a one-block micro model to XNNPACK takes 30-70 s on a 2-core CPU (each op XNNPACK does not take splits
the graph into another delegate, each lowered on its own), so the tests that lower are slow; the checks themselves
(a failed parity leaves nothing, a refused op is one line, the refusals before any work) are tested fast with the
lowering or the runtime replaced.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from attnzoo.errors import UsageError
from attnzoo.export import export_model
from attnzoo.export.errors import ExportError
from attnzoo.export.formats.base import failed_report_path, report_path
from attnzoo.fileio import sha256_file
from attnzoo.models import VARIANT_NAMES, VARIANTS, create_model
from attnzoo.report.variant import _format_summary
from attnzoo.runtime.backends import LoadOptions, get_backend
from attnzoo.runtime.contract import ModelContract
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.targets.executorch import format as executorch_format
from attnzoo.targets.executorch import program as et
from tests.export.boundary import moved, rename_scope
from tests.schemas import assert_only_verified_loads, read_back

MISSING = et.executorch_problem("fp32")
needs_executorch = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def _tiny(variant: str) -> torch.nn.Module:
    """A micro model cut to one block (the lowering's cost grows with the graph)."""
    torch.manual_seed(0)
    model = create_model(variant, "cls", "micro", num_classes=5).eval()
    model.blocks = model.blocks[:1]
    return model


def test_executorch_refuses_what_it_cannot_run_before_any_work(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="--format executorch: ExecuTorch programs are lowered at fp32, int8, not"):
        export_model("belief2", random_init=True, out=tmp_path / "m.pte", format="executorch", dtype="fp16")
    with pytest.raises(UsageError, match="names a ExecuTorch program but --format is onnx"):
        export_model("belief2", random_init=True, out=tmp_path / "m.pte", format="onnx")
    with pytest.raises(UsageError, match=r"quantizes dynamically \(--dtype int8, no calibration\); fp8 does not"):
        export_model("belief2", random_init=True, out=tmp_path / "m.pte", format="executorch", dtype="fp8")
    monkeypatch.setattr(et, "executorch_version", lambda: None)
    with pytest.raises(UsageError, match=r"ExecuTorch is not installed \(pip install 'attnzoo\[executorch\]'\)"):
        export_model("belief2", random_init=True, out=tmp_path / "m.pte", format="executorch")
    assert list(tmp_path.iterdir()) == []
    backend = get_backend("executorch")
    assert backend.unavailable_reason("bf16") == "executorch runs fp32, int8, not bf16"
    assert backend.unavailable_reason("fp32") == "ExecuTorch is not installed (pip install 'attnzoo[executorch]')"


def test_a_refused_op_is_one_line_naming_it_and_nothing_is_written(tmp_path, monkeypatch):
    if MISSING:
        monkeypatch.setattr(et, "executorch_version", lambda: "test")

    def refuse(*args, **kwargs):
        raise RuntimeError("Missing out variants: {'aten::_fft_r2c'}\nmore detail")

    monkeypatch.setattr(et, "lower_program", refuse)
    out = tmp_path / "b2.pte"
    with pytest.raises(ExportError, match=r"ExecuTorch cannot carry belief2: op aten::_fft_r2c \(RuntimeError: Mis"):
        export_model(model=_tiny("belief2"), out=out, format="executorch")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2.pte.failed.json"]
    report = read_back(failed_report_path(out), "executorch")
    assert report["passed"] is False and len(report["failures"]) == 1 and "\n" not in report["failures"][0]


@needs_executorch
def test_the_pool_is_not_replaced_under_an_open_method():
    """A loaded method keeps the pool it was loaded with: while one is open, only its size is taken."""

    class Method:  # what load_method keeps track of (weakly)
        pass

    opened = Method()
    et._OPEN_METHODS.add(opened)
    try:
        size = et.set_threads(None)
        assert et.set_threads(size) == size
        refused = rf"of {size} thread\(s\), and 1 program\(s\) .* cannot become {size + 1} "
        with pytest.raises(ValueError, match=refused):
            et.set_threads(size + 1)
        assert et.set_threads(None) == size
    finally:
        et._OPEN_METHODS.discard(opened)
    del opened


def test_threads_size_executorchs_one_threadpool():
    """``--threads`` reaches ExecuTorch: its process-wide pool is resized, ``None`` leaves it, 0 is refused."""
    before = et.set_threads(None)
    try:
        assert et.set_threads(1) == 1 and et.set_threads(None) == 1
        assert et.set_threads(2) == 2
        with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
            et.set_threads(0)
        assert "threads" in get_backend("executorch").reads
    finally:
        et.set_threads(before)


def _header(program: int, segments: tuple[int, int] = (0, 0), identifier: bytes = b"ET12") -> bytes:
    """The first 40 bytes of an ExecuTorch program as its serializer writes them: the root table's offset, the
    identifier, then the extended header (``eh00``, its length, the program's size, the segments' start and size)."""
    fields = [(60, 4), (int.from_bytes(identifier, "little"), 4), (int.from_bytes(b"eh00", "little"), 4), (32, 4)]
    fields += [(program, 8), (segments[0], 8), (segments[1], 8)]
    return b"".join(v.to_bytes(n, "little") for v, n in fields)


def _stub_runtime(monkeypatch, model, program=None) -> tuple[list[str], list[str]]:
    """Lowering replaced by a stub (that returns ``program``, the exported one, as both the exported and the lowered
    program) writing a program-shaped file, and ExecuTorch's loading spied on (a program the stub wrote runs as
    eager ``model`` does). Returns the SHA-256 of every program written and loaded."""
    if MISSING:
        monkeypatch.setattr(et, "executorch_version", lambda: "test")
    written: list[str] = []
    loaded: list[str] = []

    class Method:
        def execute(self, inputs):
            with torch.no_grad():
                return [model(inputs[0])]

    def write_program(edge, path):
        Path(path).write_bytes(_header(64) + b"\0" * 24)
        written.append(sha256_file(path))
        return 0.0

    def load_method(path, threads=None):
        loaded.append(sha256_file(path))
        assert loaded[-1] in written, f"{path} is not a program this test wrote"
        return Method()

    monkeypatch.setattr(et, "lower_program", lambda *a, **k: (program, program))
    monkeypatch.setattr(et, "write_program", write_program)
    monkeypatch.setattr(et, "load_method", load_method)
    monkeypatch.setattr(et, "set_threads", lambda threads: 1)
    return written, loaded


def test_a_program_planted_at_the_cache_name_is_lowered_again_and_never_loaded(tmp_path, monkeypatch):
    """The cache gives ExecuTorch only the program it lowered and recorded: a file planted at its name (the record
    of the program it replaced beside it, or none) is lowered again and never loaded; the recorded one is reused."""
    model = _tiny("belief2")
    written, loaded = _stub_runtime(monkeypatch, model)
    options = LoadOptions(cache_dir=tmp_path / "cache")

    def load() -> dict:
        with get_backend("executorch").load(model, options) as session:
            session.run(np.zeros((1, 3, 32, 32), np.float32))
            return session.info()

    assert load()["cached"] is False and len(written) == 1
    info = load()
    assert info["cached"] is True and len(written) == 1  # the recorded program, reused
    program = tmp_path / "cache" / "executorch" / info["program"]
    planted = tmp_path / "planted.pte"
    planted.write_bytes(np.random.default_rng(0).bytes(len(program.read_bytes())))
    shutil.copyfile(planted, program)  # planted over it, the record of the program it replaced left beside it
    assert load()["cached"] is False and len(written) == 2
    program.with_suffix(".json").unlink()
    shutil.copyfile(planted, program)  # planted, with no record at all
    assert load()["cached"] is False and len(written) == 3
    assert sha256_file(planted) not in loaded and len(loaded) == 4


def test_the_path_api_loads_only_a_program_whose_report_verified_it(tmp_path, monkeypatch):
    """``get_backend("executorch").load(path)``: the program ``export-model`` verified loads; a file without a
    report, or another file at the verified one's name, is refused in one line before ExecuTorch sees it."""
    model = _tiny("belief2")
    written, loaded = _stub_runtime(monkeypatch, model, torch.export.export(model, (torch.zeros(2, 3, 32, 32),)))
    monkeypatch.setattr(et, "graph_nodes", lambda edge: (("xnnpack", n) for n in edge.graph.nodes))
    out = tmp_path / "b2.pte"
    export_model(model=model, out=out, format="executorch", batch_sizes=(1,))
    backend = get_backend("executorch")
    with backend.load(out) as session:
        assert session.info()["program"] == str(out) and len(loaded) == 2  # the export's check, then this load
    with pytest.raises(ValueError, match=rf"^executorch: {out} is not loaded: b2.pte.json is for a fp32 model, the"):
        backend.load(out, LoadOptions(dtype="int8"))
    other = tmp_path / "other.pte"
    other.write_bytes(_header(64) + b"\1" * 24)
    assert_only_verified_loads(backend, out, other)
    assert len(loaded) == 2


def test_a_file_that_is_not_a_program_is_one_line_naming_it_and_the_process_lives(tmp_path):
    """Before ExecuTorch's runtime sees a file: random bytes (whose identifier, not UTF-8, made ExecuTorch's log
    line abort the process), a program cut short, a damaged header, each refused in one line naming the file."""
    data = bytearray(np.random.default_rng(0).bytes(4096))
    data[4:8] = b"\xaf\x9f\xcf\xff"  # what ExecuTorch prints as the identifier it found, and cannot decode
    random = tmp_path / "random.pte"
    random.write_bytes(bytes(data))
    cut = tmp_path / "cut.pte"  # a real program's header (its program 1,216 bytes, segments to 2,188), cut short
    cut.write_bytes(_header(1216, (1280, 908)) + bytes(1400))
    short = tmp_path / "short.pte"  # the program itself cut short
    short.write_bytes(_header(1216) + bytes(600))
    damaged = tmp_path / "damaged.pte"
    damaged.write_bytes(_header(1216)[:12] + (3).to_bytes(4, "little") + bytes(1200))
    empty = tmp_path / "empty.pte"
    empty.write_bytes(b"")
    for path, why in [
        (random, r"not an ExecuTorch program \(no ET12 identifier at byte 4\)"),
        (cut, r"a truncated ExecuTorch program \(its program and segments take 2,188 bytes, the file has 1,440\)"),
        (short, r"a truncated ExecuTorch program \(its program takes 1,216 bytes, the file has 640\)"),
        (damaged, r"a damaged ExecuTorch program \(its extended header says it is 3 bytes\)"),
        (empty, r"not an ExecuTorch program \(no ET12 identifier at byte 4\)"),
        (tmp_path / "missing.pte", r"cannot be read \(No such file or directory\)"),
    ]:
        with pytest.raises(ValueError, match=rf"^{path}: {why}$"):
            et.load_method(path)
    whole = tmp_path / "whole.pte"
    whole.write_bytes(_header(1216, (1280, 908)) + bytes(2148))
    assert et.program_problem(whole) is None


def test_a_cache_folder_others_can_write_is_refused_before_anything_is_lowered(tmp_path, monkeypatch):
    written, _ = _stub_runtime(monkeypatch, None)
    cache = tmp_path / "cache"
    (cache / "executorch").mkdir(parents=True)
    os.chmod(cache, 0o700)
    os.chmod(cache / "executorch", 0o777)
    with pytest.raises(ValueError, match=rf"^the executorch cache folder {cache / 'executorch'} can be written by"):
        get_backend("executorch").load(_tiny("belief2"), LoadOptions(cache_dir=cache))
    assert written == []


@needs_executorch
@pytest.mark.slow
def test_belief2_exports_as_a_verified_program_with_its_extra_math_counted_and_the_backend_runs_it(tmp_path):
    """A real lowering (one block; about a minute on 2 cores): parity at batch 1 and 3 (traced at 2), the
    projection's nodes counted in the lowered graph, the model contract beside it, the backend answers as eager."""
    model = _tiny("belief2")
    out = tmp_path / "b2.pte"
    result = export_model(model=model, out=out, format="executorch")
    report = read_back(report_path(out), "executorch")
    assert report["passed"] and out.is_file() and result.files == [out, report_path(out)]
    assert report["parity"]["batch_sizes"] == [1, 3, 8] and report["trace_batch"] == 2
    assert report["batch_dim"] == "batch"
    scope = report["extra_math"]["blocks"]["blocks.0.attn.projection"]
    assert {"mul", "div", "sub"} <= set(scope["ops"]) and scope["runs_in"].get("xnnpack", 0) > 0
    assert report["extra_math"]["nodes_per_block"]["blocks.0"] > 0
    assert ModelContract.from_props(report["metadata"]).variant == "belief2"
    data = out.read_bytes()  # the real program cut short, or its body garbled: one line naming the file each
    for name, bad in [("half", data[: len(data) // 2]), ("end", data[:-1]), ("garbled", data[:8] + data[:7:-1])]:
        path = tmp_path / f"{name}.pte"
        path.write_bytes(bad)
        with pytest.raises(ValueError, match=rf"^{path}: (a truncated ExecuTorch program|ExecuTorch cannot load)"):
            et.load_method(path)
    assert result.summary().splitlines()[-2] == "  PASSED"
    entry = _format_summary(report, tmp_path, out)  # what report-variant's executorch step keeps of it
    assert entry["passed"] and entry["file"] == "b2.pte" and entry["extra_math"]["ok"] and entry["blocks"] == []
    assert entry["blocks_not_exposed"].startswith("an ExecuTorch program returns the logits only")
    x = torch.randn(3, 3, 32, 32).numpy()
    with get_backend("executorch").load(out, LoadOptions(threads=1)) as session:
        got = session.run(x)
        assert session.info()["threads"] == 1
        with pytest.raises(ValueError, match=r"one threadpool, of 1 thread\(s\), and 1 program\(s\) loaded on it"):
            et.set_threads(2)  # would replace the pool the open program runs on
        assert abs(session.run(x) - got).max() == 0
    assert et.set_threads(2) == 2  # closed: the pool may change
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    assert abs(got - want).max() < 1e-4


def _stub_lowering(monkeypatch, model, perturb=lambda y: y) -> list[str]:
    """The XNNPACK lowering replaced by ``torch.export``'s program of ``model`` (its nodes counted as if delegated), and
    the runtime by eager ``model`` with ``perturb`` applied: what is left is the format's own checks. Returns the
    steps run after the lowering."""
    if MISSING:
        monkeypatch.setattr(et, "executorch_version", lambda: "test")
    program = torch.export.export(model, (torch.zeros(2, 3, 32, 32),))
    calls: list[str] = []

    class Method:
        def execute(self, inputs):
            with torch.no_grad():
                return [torch.from_numpy(np.asarray(perturb(model(inputs[0]).numpy())))]

    def write_program(edge, path):
        calls.append("write")
        path.write_bytes(b"stub")
        return 0.0

    monkeypatch.setattr(et, "lower_program", lambda *a, **k: (program, program))
    monkeypatch.setattr(et, "graph_nodes", lambda edge: (("xnnpack", n) for n in edge.graph.nodes))
    monkeypatch.setattr(et, "write_program", write_program)
    monkeypatch.setattr(et, "load_method", lambda path: calls.append("load") or Method())
    return calls


def test_a_program_that_differs_from_eager_fails_parity_and_is_not_written(tmp_path, monkeypatch):
    """The lowering replaced by a stub program whose runtime is eager plus an offset: the parity gate refuses it
    and the good file already at --out stays."""
    model = _tiny("belief2")
    _stub_lowering(monkeypatch, model, lambda y: y + 0.01)
    out = tmp_path / "b2.pte"
    out.write_bytes(b"a good program already there")
    with pytest.raises(ExportError, match=r"b2.pte failed verification \(batch 1 real: max abs err 0.01 > 0.0001"):
        export_model(model=model, out=out, format="executorch")
    assert out.read_bytes() == b"a good program already there"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2.pte", "b2.pte.failed.json"]  # no temporary left
    report = json.loads(failed_report_path(out).read_text())
    assert report["parity"]["batch_sizes"] == [1, 3, 8] and report["extra_math"]["ok"]
    assert report["extra_math"]["blocks"]["blocks.0.attn.projection"]["runs_in"]["xnnpack"] > 0


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_the_programs_parity_gate_writes_half_its_tolerance_and_refuses_twice_it(tmp_path, monkeypatch, dtype):
    """The program's outputs moved by half / twice the tolerance of its precision (dynamic int8: ``int8``)."""
    model = _tiny("belief2")
    for factor in (0.5, 2.0):
        _stub_lowering(monkeypatch, model, lambda y, factor=factor: moved(y, factor, dtype))
        out = tmp_path / f"{factor}.pte"
        if factor < 1:
            report = export_model(model=model, out=out, format="executorch", dtype=dtype, batch_sizes=(1,)).report
            assert report["passed"] and out.read_bytes() == b"stub"
            assert report["parity"]["tolerance"] == {f"{dtype}_x_max(1,max|logit|)": TOLERANCES[dtype]}
            continue
        with pytest.raises(ExportError, match=r"^2.0.pte failed verification \(batch 1 real: max abs err "):
            export_model(model=model, out=out, format="executorch", dtype=dtype, batch_sizes=(1,))
        assert not out.exists() and len(read_back(failed_report_path(out), "executorch")["failures"]) == 4


def test_a_program_whose_projection_scope_is_renamed_is_refused_before_it_is_written(tmp_path, monkeypatch):
    """A model whose projection is registered under another name: the math is in the program, its scope is not;
    the count refuses it before anything is serialized, and nothing is at --out."""
    model = rename_scope(_tiny("belief2"), "projection")
    calls = _stub_lowering(monkeypatch, model)
    out = tmp_path / "b2.pte"
    with pytest.raises(ExportError, match=r"^b2.pte failed verification \(blocks.0.attn.projection: no nodes of mod"):
        export_model(model=model, out=out, format="executorch")
    assert calls == [] and sorted(p.name for p in tmp_path.iterdir()) == ["b2.pte.failed.json"]
    report = read_back(failed_report_path(out), "executorch")
    assert report["extra_math"]["ok"] is False and report["extra_math"]["nodes_per_block"] == {"blocks.0": 0}
    assert report.get("parity") is None


@needs_executorch
@pytest.mark.slow  # one XNNPACK lowering (30-70 s on 2 cores)
def test_a_model_whose_projection_scope_is_renamed_is_refused_by_the_real_lowering(tmp_path):
    out = tmp_path / "b2.pte"
    with pytest.raises(ExportError, match=r"\(blocks.0.attn.projection: no nodes of module blocks.0.attn.projection"):
        export_model(model=rename_scope(_tiny("belief2"), "projection"), out=out, format="executorch")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b2.pte.failed.json"]


@needs_executorch
@pytest.mark.slow
@pytest.mark.parametrize(
    "variant",
    # belief2 above in every slow run; every variant's lowering (30-70 s each on 2 cores) forms the matrix run
    [pytest.param(v, marks=pytest.mark.matrix) for v in VARIANT_NAMES],
)
def test_every_variant_is_tried_verified_or_refused_with_its_op(variant, tmp_path):
    """Each variant (micro, one block) at fp32: either a verified program with each scope's extra math counted, or
    a refusal whose one line names the op the converter refused."""
    out = tmp_path / f"{variant}.pte"
    try:
        report = export_model(model=_tiny(variant), out=out, format="executorch").report
    except ExportError as exc:
        failed = json.loads(failed_report_path(out).read_text())
        assert failed["failures"][0].startswith(f"ExecuTorch cannot carry {variant}: op "), failed["failures"]
        assert not out.exists() and "\n" not in str(exc)
        return
    assert report["passed"] and out.is_file(), report["failures"]
    scopes = VARIANTS[variant].extra_scopes
    assert set(report["extra_math"]["blocks"]) == {f"blocks.0.attn.{s}" for s in scopes}
    assert all(sum(b["ops"].values()) > 0 for b in report["extra_math"]["blocks"].values())


@needs_executorch
@pytest.mark.slow
@pytest.mark.matrix  # a second lowering of about a minute: with the per-variant ones, not in every slow run
def test_dynamic_int8_keeps_the_extra_math_fp32_and_passes_the_int8_gate(tmp_path):
    report = export_model(model=_tiny("belief2"), out=tmp_path / "q.pte", format="executorch", dtype="int8").report
    assert report["passed"] and report["dtype"] == "int8"
    assert report["parity"]["tolerance"] == {"int8_x_max(1,max|logit|)": 0.15}
    ops = report["extra_math"]["blocks"]["blocks.0.attn.projection"]["ops"]
    assert not any("quantize" in op for op in ops)  # counted and fp32
    assert executorch_format.summary(report).splitlines()[-1] == "  PASSED"
