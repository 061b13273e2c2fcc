"""Tests of attnzoo.export: ONNX export, the extra-math checker, verification, fp16, the CLI, TensorRT."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from attnzoo.export import (
    assert_extra_math,
    check_extra_math,
    export_verified,
    make_session,
    read_metadata,
    report_path,
)
from attnzoo.export import verify as verify_mod
from attnzoo.export.check import ExtraMathCheckError
from attnzoo.export.cli import main
from attnzoo.export.divergence import block_output_names, divergence_vs_eager, divergence_vs_onnx
from attnzoo.fileio import sha256_file
from attnzoo.models import ARCHS, BUILTIN_VARIANTS, PROJECTION_OPS, VARIANT_NAMES, VARIANTS, create_model
from attnzoo.models.checkpoint import read_config, save_checkpoint
from attnzoo.runtime.contract import BATCH_DIM, metadata_props
from attnzoo.runtime.parity import TOLERANCES
from tests.schemas import read_back
from tests.tiers import per_variant

DEPTH = ARCHS["micro"]["depth"]
SEG_HW = (24, 40)  # non-square, not the training size
CONTRACT_KEYS = {
    "attnzoo.config",
    "variant",
    "task",
    "arch",
    "options",
    "class_names",
    "input_size",
    "mean",
    "std",
    "eps",
    "attnzoo_version",
    "checkpoint_sha256",
    "dtype",
}
# The extra-math sub-modules of the built-ins (the papers' extra math) and the ops each must export, written out
# here so that the registry's extra_scopes are checked against them: the orthogonal projections, MSE's key-norm
# term and MAE's pairwise L1 distances (the blocked export: maxima and the channel-sum MatMul).
PROJ = {"Mul": 3, "ReduceSum": 2, "Add": 1, "Div": 1, "Sub": 1}
KEY_NORM = {"Mul": 2, "ReduceSum": 1}
MAE_DISTANCE = {"Max": 1, "MatMul": 1, "Sub": 2}
PROJECTION_MODULES = {
    "belief": {"projection": PROJ},
    "belief-star": {"projection": PROJ, "head_projection": PROJ},
    "exclusive": {"head_projection": PROJ},
    "belief2": {"projection": PROJ},
}
EXTRA_MODULES = {
    **PROJECTION_MODULES,
    "wafe-mse": {"key_norm": KEY_NORM},
    "anti-wafe-mse": {"key_norm": KEY_NORM},
    "wafe-mae": {"distance": MAE_DISTANCE},
    "anti-wafe-mae": {"distance": MAE_DISTANCE},
}
PROJECTION_VARIANTS = tuple(PROJECTION_MODULES)
# The fast set: one variant per export path; CI's slow run adds one of each kind of math (tests/tiers.py), the matrix
# run (-m matrix) every other variant. belief2 carries the projection
# (and its extra weights), anti-wafe-mse guards the fused-MSE path (a negative sdpa scale once exported as
# sqrt(scale) = NaN), wafe-mae the blocked pairwise-L1 export (attnzoo.models.wafe.pairwise_l1).
FAST_CLS = ("standard", "belief2", "anti-wafe-mse", "wafe-mae")
FAST_SEG = ("belief2",)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Cache of verified exports: (variant, task, dtype) -> (model, path, report)."""
    root = tmp_path_factory.mktemp("exports")
    cache = {}

    def get(variant, task="cls", dtype="fp32"):
        key = (variant, task, dtype)
        if key not in cache:
            torch.manual_seed(0)
            model = create_model(variant, task, "micro", num_classes=5)
            path = root / f"{variant}_{task}_{dtype}.onnx"
            report = export_verified(
                model,
                path,
                model.attnzoo_config,
                dtype=dtype,
                batch_sizes=(1,),
                input_hw=SEG_HW if task == "seg" else None,
            )
            cache[key] = (model, path, report)
        return cache[key]

    return get


def test_builtin_extra_scopes_are_the_papers_extra_math():
    assert {n: VARIANTS[n].extra_scopes for n in BUILTIN_VARIANTS if VARIANTS[n].extra_scopes} == {
        n: tuple(m) for n, m in EXTRA_MODULES.items()
    }
    for name, modules in PROJECTION_MODULES.items():
        assert all(dict(VARIANTS[name].required_ops(m)) == PROJ for m in modules)
    assert dict(PROJECTION_OPS) == PROJ
    assert all(dict(VARIANTS[n].required_ops("key_norm")) == KEY_NORM for n in ("wafe-mse", "anti-wafe-mse"))


def _extra_modules(variant):
    """The extra-math scopes an export of ``variant`` must keep and their op counts: the papers' (the table above)
    for a built-in variant, the ones a plugin declares for its own."""
    spec = VARIANTS[variant]
    if spec.builtin:
        return EXTRA_MODULES.get(variant, {})
    return {scope: dict(spec.required_ops(scope)) for scope in spec.extra_scopes}


def _assert_extra_math_found(report, variant, task):
    proj = report["extra_math"]
    assert proj["ok"], proj["failures"]
    prefix = "encoder.blocks" if task == "seg" else "blocks"
    modules = _extra_modules(variant)
    expected = {f"{prefix}.{i}.attn.{m}" for i in range(DEPTH) for m in modules}
    assert set(proj["blocks"]) == expected
    for scope, found in proj["blocks"].items():
        for op, need in modules[scope.split(".attn.")[1]].items():
            assert found["ops"].get(op, 0) >= need, (scope, op)
        assert all(name.startswith(scope + "/") for name in found["nodes"])


@pytest.mark.parametrize("variant", per_variant(VARIANT_NAMES, FAST_CLS))
def test_export_cls_parity_and_projection(exported, variant):
    model, path, report = exported(variant)
    assert path.is_file() and report["passed"], report["failures"]
    for row in report["parity"]["per_batch"]:
        for kind in ("real", "random"):
            assert row[kind]["max_abs_err"] <= 1e-4
            assert row[kind]["top1_agree"] == 1.0
    assert report["parity"]["batch_sizes"] == [1, 3]  # 2 is the traced size; neither of these was
    _assert_extra_math_found(report, variant, "cls")
    assert CONTRACT_KEYS <= set(metadata_props(path))
    saved = read_back(report_path(path), "verification")
    assert saved["sha256"] == sha256_file(path) and saved["opset"] == 20 and saved["op_histogram"]


@pytest.mark.parametrize("variant", per_variant(VARIANT_NAMES, FAST_SEG))
def test_export_seg_non_square(exported, variant):
    model, path, report = exported(variant, "seg")
    assert report["passed"], report["failures"]
    assert report["input_size"] == list(SEG_HW)
    _assert_extra_math_found(report, variant, "seg")
    x = np.random.default_rng(1).standard_normal((2, 3, *SEG_HW)).astype(np.float32)
    out = make_session(path).run(None, {"image": x})[0]
    assert out.shape == (2, 5, *SEG_HW)


@pytest.mark.parametrize("variant", ["wafe-mae", "anti-wafe-mae"])
def test_mae_export_is_blocked_and_verified(exported, variant):
    """The MAE export computes 2 sum max(q, k) per head and block of queries (no Abs, no (B, M, N, N, d)
    tensor), verified against eager's cdist at batch sizes other than the traced one."""
    from attnzoo.models.wafe import mae_block

    model, path, report = exported(variant)
    assert report["passed"], report["failures"]
    assert report["parity"]["batch_sizes"] == [1, 3]
    arch = ARCHS["micro"]
    tokens = (32 // arch["patch_size"]) ** 2 + 1
    blocks = -(-tokens // mae_block(tokens))
    ops = report["op_histogram"]
    assert "Abs" not in ops and "ReduceL1" not in ops
    assert ops["Max"] == DEPTH * arch["num_heads"] * blocks
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto)
    inferred = onnx.shape_inference.infer_shapes(proto).graph.value_info
    per_image = [
        int(np.prod([dim.dim_value for dim in v.type.tensor_type.shape.dim[1:]]))
        for v in inferred
        if all(dim.dim_value > 0 for dim in v.type.tensor_type.shape.dim[1:])
    ]
    head_width = arch["embed_dim"] // arch["num_heads"]
    slab = mae_block(tokens) * head_width * tokens  # (block, d, N) maxima of one head
    assert max(per_image) == max(arch["num_heads"] * tokens * tokens, slab)  # never the pairwise tensor
    assert len(per_image) > 0.9 * len(inferred)  # shapes known, so the bound above means something
    assert max(per_image) < arch["num_heads"] * tokens * tokens * head_width
    assert all(n.name.startswith("blocks.") for n in proto.graph.node if n.op_type == "Max")


def test_metadata_contract(exported):
    model, path, _ = exported("belief2")
    props = metadata_props(path)
    config = read_metadata(path)
    assert config["variant"] == props["variant"] == "belief2"
    assert json.loads(props["input_size"]) == [32, 32]
    assert float(props["eps"]) == config["options"]["eps"]
    assert json.loads(props["class_names"]) == config["class_names"] and len(config["class_names"]) == 5
    assert props["dtype"] == "fp32"
    assert metadata_props(exported("standard")[1])["eps"] == ""


def test_node_names_carry_module_path(exported):
    proto = onnx.load(str(exported("belief2")[1]))
    names = [n.name for n in proto.graph.node]
    assert len(names) == len(set(names))
    assert "blocks.3.attn.projection/Div" in names
    assert any(n.startswith("blocks.0.attn/") and n.endswith("Softmax") for n in names)


def test_dynamic_batch_is_dynamic(exported):
    model, path, _ = exported("belief")
    proto = onnx.load(str(path))
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == BATCH_DIM
    session = make_session(path)
    assert session.get_inputs()[0].shape[0] == BATCH_DIM
    for batch in (5, 16):  # neither traced nor verified during the export
        x = torch.randn(batch, 3, 32, 32)
        out = session.run(None, {"image": x.numpy()})[0]
        with torch.no_grad():
            ref = model(x).numpy()
        assert out.shape == (batch, 5)
        assert np.abs(out - ref).max() <= 1e-4


def _bypass(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """Remove node ``name``; its consumers read its first non-constant input instead."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    node = next(n for n in proto.graph.node if n.name == name)
    src = node.input[0]
    proto.graph.node.remove(node)
    for other in proto.graph.node:
        other.input[:] = [src if i == node.output[0] else i for i in other.input]
    return proto


@pytest.mark.parametrize("op", ["ReduceSum_1", "Add", "Div", "Mul_2", "Sub"])
def test_checker_fails_when_a_projection_op_is_removed(exported, op):
    proto = onnx.load(str(exported("belief2")[1]))
    assert check_extra_math(proto)["ok"]
    broken = _bypass(proto, f"blocks.2.attn.projection/{op}")
    result = check_extra_math(broken)
    assert not result["ok"]
    assert all(f.startswith("blocks.2.attn.projection") for f in result["failures"])
    with pytest.raises(ExtraMathCheckError, match="blocks.2.attn.projection"):
        assert_extra_math(broken)


def test_checker_fails_without_the_projection_scope(exported):
    proto = onnx.load(str(exported("exclusive")[1]))
    for node in proto.graph.node:  # an exporter that lost the module names
        node.name = node.name.replace("head_projection", "anonymous")
    result = check_extra_math(proto)
    assert not result["ok"] and len(result["failures"]) == DEPTH


def test_fp16_graph_keeps_fp32_islands(exported):
    model, path, report = exported("belief-star", "cls", "fp16")
    assert report["passed"], report["failures"]
    assert report["parity"]["max_abs_err"] <= TOLERANCES["fp16"] * max(
        1.0, max(r["real"]["max_abs_logit"] for r in report["parity"]["per_batch"])
    )
    proto = onnx.load(str(path))
    assert metadata_props(path)["dtype"] == "fp16"
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in proto.graph.initializer)
    casts = [n.name for n in proto.graph.node if n.op_type == "Cast"]
    for i in range(DEPTH):
        assert any(c.startswith(f"blocks.{i}.attn.projection/") for c in casts)
        assert any(c.startswith(f"blocks.{i}.norm1/") for c in casts)
        assert f"blocks.{i}.attn/Softmax_cast_in" in casts
    assert proto.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    _assert_extra_math_found(report, "belief-star", "cls")  # includes: every projection op computes in fp32
    blocks = report["divergence"]["blocks"]  # fp16 block outputs against eager fp32, within fp16's tolerance
    assert len(blocks) == DEPTH and all(0 < b["rel_err"] <= TOLERANCES["fp16"] for b in blocks)
    assert report["divergence"]["first_diverging_block"] is None


# ------------------------------------------------------------------------------------------------ where it diverges
def _scaled(path: Path, node: str, factor: float) -> onnx.ModelProto:
    """The graph at ``path`` with the weight initializer that node ``node`` reads multiplied by ``factor``."""
    proto = onnx.load(str(path))
    inits = {t.name: t for t in proto.graph.initializer}
    weight = next(inits[i] for n in proto.graph.node if n.name == node for i in n.input if i in inits)
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(factor), weight.name))
    return proto


def test_a_good_exports_block_errors_are_small_and_finite(exported):
    _, path, report = exported("standard")
    d = report["divergence"]
    assert [b["block"] for b in d["blocks"]] == list(range(DEPTH)) and d["inputs"] == 2  # batch 1: real, random
    assert all(np.isfinite(b["max_abs_err"]) and b["rel_err"] <= 1e-5 and b["cosine"] > 1 - 1e-9 for b in d["blocks"])
    assert d["first_diverging_block"] is None and d["worst_op"] is None
    assert verify_mod.summary(report).splitlines()[-1].startswith("  PASSED (worst block ")
    proto = onnx.load(str(path))  # one tensor per block, read from the scopes: each block's last residual Add
    producer = {o: n.name for n in proto.graph.node for o in n.output}
    assert [producer[t] for t in block_output_names(proto)] == [f"blocks.{i}/Add_1" for i in range(DEPTH)]


def test_a_perturbed_block_is_named_as_the_first_diverging_block(exported, tmp_path):
    """Block 1's attention projection scaled by 1.5 in a copy of a verified export: verification fails, and its
    report names block 1 as the first block over the tolerance and the projection as the op that adds the error."""
    model, path, _ = exported("standard")
    onnx.save(_scaled(path, "blocks.1.attn.proj/MatMul", 1.5), str(tmp_path / "bad.onnx"))
    out = tmp_path / "m.onnx"
    with pytest.raises(verify_mod.VerificationError, match="failed verification"):
        verify_mod.adopt_verified(model, tmp_path / "bad.onnx", out, model.attnzoo_config, checkpoint_sha256="")
    report = json.loads(verify_mod.failed_report_path(out).read_text())
    d = report["divergence"]
    assert d["first_diverging_block"] == 1
    assert d["blocks"][0]["rel_err"] <= 1e-5 < TOLERANCES["fp32"] < d["blocks"][1]["rel_err"]
    assert d["worst_op"]["scope"] == "blocks.1.attn.proj" and d["worst_op"]["node"].startswith("blocks.1.attn.proj/")
    assert all(op["scope"].startswith("blocks.1.") for op in d["ops"]) and len(d["ops"]) >= 5
    verdict = verify_mod.verdict_lines(report, "cpu", "dynamic")[-1]
    assert verdict.startswith("  FAILED: ") and "; first diverging block blocks.1 (rel err " in verdict
    assert verdict.endswith(f"worst op {d['worst_op']['node']}")


def test_a_segmenters_blocks_are_its_encoders(exported):
    model, path, report = exported("belief2", "seg")
    assert report["divergence"]["prefix"] == "encoder.blocks" and len(report["divergence"]["blocks"]) == DEPTH
    x = verify_mod.divergence_inputs(model.attnzoo_config, SEG_HW)
    bad = _scaled(path, "encoder.blocks.2.attn.proj/MatMul", 1.5)
    d = divergence_vs_eager(model, bad, model.attnzoo_config, x, "fp32")
    assert d["first_diverging_block"] == 2 and d["worst_op"]["scope"] == "encoder.blocks.2.attn.proj"


def test_a_quantized_graph_is_compared_with_the_fp32_graph_tensor_by_tensor(exported):
    """The int8 / fp8 comparison (against the fp32 graph, every node output of the first block below the cosine
    gate), on a graph whose block 3 projection is scaled: the projection's MatMul itself is the worst op."""
    model, path, _ = exported("standard")
    x = verify_mod.divergence_inputs(model.attnzoo_config, (32, 32))
    good = onnx.load(str(path))
    same = divergence_vs_onnx(good, good, model.attnzoo_config, x, min_cosine=1 - 1e-9)
    assert same["first_diverging_block"] is None and all(b["max_abs_err"] == 0 for b in same["blocks"])
    d = divergence_vs_onnx(
        _scaled(path, "blocks.3.attn.proj/MatMul", 1.5), good, model.attnzoo_config, x, min_cosine=1 - 1e-9
    )
    assert d["first_diverging_block"] == 3 and d["worst_op"]["node"] == "blocks.3.attn.proj/MatMul"
    assert d["worst_op"]["rel_l2"] == pytest.approx(0.5, rel=1e-4)


def test_failed_verification_leaves_no_model(tmp_path, monkeypatch):
    monkeypatch.setitem(TOLERANCES, "fp32", -1.0)  # no export can pass
    model = create_model("belief", "cls", "micro", num_classes=3)
    out = tmp_path / "m.onnx"
    with pytest.raises(verify_mod.VerificationError, match="failed verification"):
        export_verified(model, out, model.attnzoo_config, batch_sizes=(1,))
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["m.failed.report.json"]
    assert read_back(tmp_path / "m.failed.report.json", "verification")["passed"] is False


@pytest.mark.slow  # four verified exports (about 30 s)
def test_reuse_keeps_only_a_file_verified_for_the_same_weights(tmp_path, monkeypatch):
    """``reuse=True`` skips the export only where the report passed for the same fingerprint and the file is
    the one it verified; other weights, a changed file or ``reuse=False`` export again."""
    exports = []
    real = verify_mod.export_onnx
    monkeypatch.setattr(verify_mod, "export_onnx", lambda *a, **k: exports.append(1) or real(*a, **k))
    torch.manual_seed(0)
    model = create_model("belief", "cls", "micro", num_classes=3)
    out = tmp_path / "m.onnx"
    first = export_verified(model, out, model.attnzoo_config, batch_sizes=(1,), reuse=True)
    assert len(exports) == 1 and "reused" not in first and first["fingerprint"]
    again = export_verified(model, out, model.attnzoo_config, batch_sizes=(1,), reuse=True)
    assert len(exports) == 1 and again["reused"] is True and again["sha256"] == sha256_file(out)
    export_verified(model, out, model.attnzoo_config, batch_sizes=(1,))  # reuse=False: always exports
    assert len(exports) == 2

    torch.manual_seed(1)
    other = create_model("belief", "cls", "micro", num_classes=3)  # same config, other weights
    assert not export_verified(other, out, other.attnzoo_config, batch_sizes=(1,), reuse=True).get("reused")
    assert len(exports) == 3
    out.write_bytes(out.read_bytes() + b"\0")  # the file is no longer the one its report verified
    assert not export_verified(other, out, other.attnzoo_config, batch_sizes=(1,), reuse=True).get("reused")
    assert len(exports) == 4

    import sys

    args = dict(opset=20, dtype="fp32", input_hw=None, batch_sizes=(1,))
    before = verify_mod.export_fingerprint(other, other.attnzoo_config, **args)
    source = Path(sys.modules[type(other.blocks[0].attn).__module__].__file__)
    edited = tmp_path / source.name
    edited.write_text(source.read_text() + "\n# an edit\n")
    monkeypatch.setattr(sys.modules[type(other.blocks[0].attn).__module__], "__file__", str(edited))
    assert verify_mod.export_fingerprint(other, other.attnzoo_config, **args) != before  # edited source: new model


@pytest.mark.slow  # three verified exports (about 15 s)
def test_reuse_re_derives_the_report_instead_of_trusting_it(tmp_path, monkeypatch):
    """A file swapped in for a cached export, with its report's sha256 rewritten to match, is not reused: its
    parity with the eager model (and its graph facts) are re-derived, and it is exported again."""
    exports = []
    real = verify_mod.export_onnx
    monkeypatch.setattr(verify_mod, "export_onnx", lambda *a, **k: exports.append(1) or real(*a, **k))
    model = create_model("belief", "cls", "micro", num_classes=3)
    out = tmp_path / "m.onnx"
    export_verified(model, out, model.attnzoo_config, batch_sizes=(1,), reuse=True)
    proto = onnx.load(str(out))
    head = next(t for t in proto.graph.initializer if "head" in t.name and len(t.dims) == 2)
    head.CopyFrom(onnx.numpy_helper.from_array(-onnx.numpy_helper.to_array(head), head.name))  # other classes
    onnx.save(proto, str(out))
    report = json.loads(report_path(out).read_text())
    report_path(out).write_text(json.dumps({**report, "sha256": sha256_file(out)}))  # the report made to vouch
    again = export_verified(model, out, model.attnzoo_config, batch_sizes=(1,), reuse=True)
    assert len(exports) == 2 and not again.get("reused") and again["sha256"] == sha256_file(out)
    assert again["sha256"] == report["sha256"]  # the export is deterministic: the file is the one verified first


# ----------------------------------------------------------------------------------------------------- CLI


def _cli_error(args, code: int) -> str:
    """The one error line of ``export-model args``, which must exit with ``code`` (docs/errors.md: 2 for a bad
    command line, 1 for a bad input file or a failure)."""
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == code, str(info.value)
    return str(info.value)


def _never(*args, **kwargs):
    raise AssertionError("work started although the input should have been refused up front")


def test_an_int8_accuracy_drop_beyond_the_tolerance_is_refused(tmp_path, random_int8):
    """The int8 accuracy gate in the default run (the zoo model's version is a slow test): a micro model scored
    on 32 ``shapes`` test images against a tolerance it cannot meet is refused, the model and report already at
    the path stay as they were, and the failed report says by how much."""
    from attnzoo.data.datasets import SHAPES_CLASSES
    from attnzoo.export import quantize as qz
    from attnzoo.export.verify import failed_report_path

    torch.manual_seed(0)
    model = create_model("standard", "cls", "micro", num_classes=len(SHAPES_CLASSES)).eval()
    config = {**model.attnzoo_config, "data": "shapes", "class_names": list(SHAPES_CLASSES)}
    fp32 = tmp_path / "m.onnx"
    export_verified(model, fp32, config, batch_sizes=(1,), threads=1)
    out = tmp_path / "m_int8.onnx"
    out.write_bytes(b"a good model already there")
    report_path(out).write_text("its report")
    with pytest.raises(qz.AccuracyDropError, match="points below fp32"):
        random_int8(
            fp32,
            out,
            config,
            16,
            eval_limit=32,
            tolerance=-100.0,
            placement="cpu",
            held_out=qz.random_calibration((32, 32), 8, seed=1),
            min_cosine=0.0,
            threads=1,
            measure_accuracy=True,
        )
    assert out.read_bytes() == b"a good model already there" and report_path(out).read_text() == "its report"
    failed = json.loads(failed_report_path(out).read_text())
    drop = failed["accuracy"]["drop"]
    assert failed["passed"] is False and failed["accuracy"]["n_images"] == 32
    assert drop == pytest.approx(failed["accuracy"]["metrics"]["fp32"] - failed["accuracy"]["metrics"]["int8"])
    assert f"is {drop:.2f} points below fp32" in failed["failures"][0]


def test_calibration_images_are_refused_at_the_packages_limit_naming_what_was_skipped(tmp_path, monkeypatch, capsys):
    """export-model --dtype int8 --calibration-data DIR: a 20,000 x 20,000 PNG is refused at the package's 40 MP
    limit (it cited Pillow's 178,956,970 pixels) with exit 1, a bad input file in docs/errors.md (it exited 2); a
    folder whose images are behind a symlinked folder names that folder and why it was skipped."""
    from PIL import Image

    from attnzoo.export import quantize as qz
    from tests.core.test_bad_input import _png_header_only

    monkeypatch.setattr(verify_mod, "export_verified", _never)
    monkeypatch.setattr(qz, "quantize_verified", _never)
    photos = tmp_path / "photos"
    photos.mkdir()
    _png_header_only(photos / "huge.png", 20000, 20000)
    Image.new("RGB", (8, 8)).save(photos / "small.png")
    argv = ["--variant", "belief2", "--random-init", "--dtype", "int8", "--out", str(tmp_path / "out" / "m.onnx")]
    line = _cli_error([*argv, "--calibration-data", str(photos)], 1)
    assert line == (
        f"error: --calibration-data {photos / 'huge.png'}: refused a decompression bomb: image is 400 MP, "
        "over the 40 MP limit; downscale it first"
    )
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "real").symlink_to(photos, target_is_directory=True)
    (linked / "notes.txt").write_text("not an image")
    line = _cli_error([*argv, "--calibration-data", str(linked)], 1)
    assert line.startswith(f"error: --calibration-data {linked}: no images (.png, ") and line.endswith(
        "in it; skipped 1 symlinked folder(s), not followed: real and 1 file(s) of other types"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    capsys.readouterr()


@pytest.mark.slow
def test_cli_exports_a_checkpoint(tmp_path, capsys):
    model = create_model("belief2", "cls", "micro", num_classes=3)
    ckpt = tmp_path / "b2.safetensors"
    save_checkpoint(model, ckpt, class_names=["a", "b", "c"])
    out = tmp_path / "out" / "b2.onnx"
    assert main(["--variant", "belief2", "--checkpoint", str(ckpt), "--out", str(out), "--batch-sizes", "1"]) == 0
    props = metadata_props(out)
    assert props["checkpoint_sha256"] == sha256_file(ckpt)
    assert json.loads(props["class_names"]) == ["a", "b", "c"]
    assert "PASSED" in capsys.readouterr().out
    assert sorted(p.name for p in out.parent.iterdir()) == ["b2.onnx", "b2.report.json"]


def test_cli_takes_the_variant_from_the_checkpoint(tmp_path, capsys):
    """--checkpoint alone: variant, task and arch come from its config; a contradicting --variant (or --arch) is
    a usage error naming both, before anything is written."""
    ckpt = tmp_path / "run.safetensors"
    save_checkpoint(create_model("belief", "cls", "micro", num_classes=3), ckpt, class_names="abc")
    out = tmp_path / "out" / "m.onnx"
    assert main(["--checkpoint", str(ckpt), "--out", str(out), "--batch-sizes", "1"]) == 0
    assert metadata_props(out)["variant"] == "belief" and "PASSED" in capsys.readouterr().out
    for flag, value in (("--variant", "belief2"), ("--arch", "tiny")):
        with pytest.raises(SystemExit) as info:
            main(["--checkpoint", str(ckpt), flag, value, "--out", str(tmp_path / "x.onnx")])
        assert info.value.code == 2
        line = capsys.readouterr().err.strip()
        assert line.startswith(f"error: {flag} {value} contradicts checkpoint run.safetensors")
        assert f"'{value}'" in line and ("'belief'" if flag == "--variant" else "'micro'") in line
    assert not (tmp_path / "x.onnx").exists()
    with pytest.raises(SystemExit) as info:  # nothing names the model
        main(["--out", str(tmp_path / "x.onnx")])
    assert info.value.code == 2 and "--variant is required" in capsys.readouterr().err


@pytest.mark.slow
def test_export_model_is_the_library_call_behind_the_cli(tmp_path):
    """export_model() writes what export-model writes and returns the paths and reports; bad arguments raise one
    UsageError (a ValueError) before any work."""
    from attnzoo.errors import UsageError
    from attnzoo.export import ExportResult, ExportWarning, export_model

    out = tmp_path / "b2.onnx"
    with pytest.warns(ExportWarning, match="UNTRAINED belief2"):
        result = export_model("belief2", random_init=True, out=out, batch_sizes=(1,))
    assert isinstance(result, ExportResult) and result.path == result.onnx_path == out
    assert result.format == "onnx" and result.dtype == "fp32" and result.report["passed"]
    assert result.files == [out, report_path(out)] and all(f.is_file() for f in result.files)
    assert json.loads(report_path(out).read_text())["sha256"] == sha256_file(out) == result.report["sha256"]
    assert "PASSED" in result.summary() and result.warnings and "UNTRAINED" in result.warnings[0]
    # a model object (e.g. a converted timm ViT): its own config, no checkpoint
    model = create_model("belief", "cls", "micro", num_classes=4)
    result = export_model(model=model, out=tmp_path / "obj.onnx", batch_sizes=(1,))
    assert result.report["passed"] and metadata_props(result.path)["variant"] == "belief"
    bad = [
        dict(),
        dict(variant="nope", random_init=True),
        dict(variant="belief2", random_init=True, dtype="int9"),
        dict(variant="belief2", random_init=True, opset=9),
        dict(variant="belief2", random_init=True, format="x"),
        dict(variant="belief2", random_init=True, batch_sizes=(0,)),
        dict(variant="belief2", model=model),
        dict(variant="belief2", random_init=True, eval_limit=5),
    ]
    for kwargs in bad:
        with pytest.raises(UsageError) as info:
            export_model(**{"out": tmp_path / "bad" / "m.onnx", **kwargs})
        assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
    assert not (tmp_path / "bad").exists()


def test_out_says_when_it_replaces_a_file_and_replaces_a_link_not_its_target(exported, tmp_path, monkeypatch):
    """An existing ``--out`` is replaced only by a file that passed, and the summary says so in one line; a symbolic
    link there is replaced by the new file, and the file it pointed to is left as it was (never written through)."""
    from attnzoo.export import export_model
    from attnzoo.fileio import atomic_write_bytes

    model, path, report = exported("standard")
    verified = path.read_bytes()

    def again(model, path, *args, **kwargs):  # the fixture's verified file, written as the export writes it
        atomic_write_bytes(path, verified)
        return report

    monkeypatch.setattr(verify_mod, "export_verified", again)
    out = tmp_path / "m.onnx"
    first = export_model(model=model, out=out, batch_sizes=(1,))
    assert first.replaced == [] and "replaced" not in first.summary()
    second = export_model(model=model, out=out, batch_sizes=(1,))
    assert second.replaced == [f"replaced: the file that was at {out}"]
    assert second.summary().splitlines()[-1] == second.replaced[0]
    kept = tmp_path / "kept.onnx"
    kept.write_bytes(b"another model, not to be touched")
    out.unlink()
    out.symlink_to(kept.name)
    third = export_model(model=model, out=out, batch_sizes=(1,))
    assert third.replaced == [f"replaced: the symbolic link {out} (to kept.onnx, left as it was) by the new file"]
    assert not out.is_symlink() and sha256_file(out) == third.report["sha256"]
    assert kept.read_bytes() == b"another model, not to be touched"


def test_cli_bad_inputs(tmp_path, monkeypatch):
    from attnzoo import zoo

    assert "valid variants: " in _cli_error(["--variant", "nope", "--random-init"], 2)
    assert "supported: 18" in _cli_error(["--variant", "belief", "--random-init", "--opset", "9"], 2)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert "cannot create the output folder" in _cli_error(
        ["--variant", "belief", "--random-init", "--out", str(blocker / "sub" / "m.onnx")], 1
    )
    assert "exclude each other" in _cli_error(["--variant", "belief", "--random-init", "--checkpoint", str(blocker)], 2)
    assert "positive integers" in _cli_error(["--variant", "belief", "--random-init", "--batch-sizes", "0,x"], 2)

    def no_zoo(*args, **kwargs):
        raise ValueError("the zoo has no 'cls' model of 'belief'")

    monkeypatch.setattr(zoo, "checkpoint_path", no_zoo)
    assert "--random-init" in _cli_error(["--variant", "belief"], 1)
    assert list(tmp_path.iterdir()) == [blocker]


def test_cli_unknown_arch_and_task_list_choices(capsys):
    for args in (["--arch", "huge"], ["--task", "det"]):
        with pytest.raises(SystemExit) as info:
            main(["--variant", "belief", "--random-init", *args])
        assert info.value.code == 2
        assert "choose from" in capsys.readouterr().err


class _Evil:
    """A pickle that would create a file when unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_cli_refuses_pickles_and_mismatched_checkpoints(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"head.weight": _Evil(marker)}))
    msg = _cli_error(["--variant", "belief", "--checkpoint", str(evil), "--out", str(tmp_path / "e.onnx")], 1)
    assert "refused to load" in msg and not marker.exists()

    standard = create_model("standard", "cls", "micro", num_classes=3)
    plain = tmp_path / "standard_state.pt"
    torch.save(standard.state_dict(), plain)
    msg = _cli_error(["--variant", "belief2", "--checkpoint", str(plain), "--out", str(tmp_path / "p.onnx")], 1)
    assert "missing keys" in msg and "proj_p" in msg

    ckpt = tmp_path / "belief.safetensors"
    save_checkpoint(create_model("belief", "cls", "micro", num_classes=3), ckpt, class_names="abc")
    msg = _cli_error(["--variant", "belief2", "--checkpoint", str(ckpt), "--out", str(tmp_path / "c.onnx")], 2)
    assert "'belief'" in msg and "'belief2'" in msg
    assert not list(tmp_path.glob("*.onnx"))


def test_a_checkpoint_json_edited_after_it_was_written_is_refused(tmp_path):
    """The class names (and the rest of the model's config) are stored in the checkpoint, which its sha256 covers;
    a JSON beside it that says otherwise (reversed class names) was exported as PASSED under that sha256."""
    ckpt = tmp_path / "belief.safetensors"
    save_checkpoint(create_model("belief", "cls", "micro", num_classes=3), ckpt, class_names="abc")
    side = ckpt.with_suffix(".json")
    side.write_text(json.dumps({**json.loads(side.read_text()), "class_names": ["c", "b", "a"]}))
    msg = _cli_error(["--checkpoint", str(ckpt), "--out", str(tmp_path / "c.onnx"), "--batch-sizes", "1"], 1)
    assert msg == (
        f"error: {side}: its class_names differ from the config stored in belief.safetensors (which the checkpoint's "
        "sha256 covers); the JSON was edited after the checkpoint was written: restore it or delete it"
    )
    assert not list(tmp_path.glob("*.onnx"))
    side.write_text(json.dumps({**json.loads(side.read_text()), "class_names": ["a", "b", "c"], "note": "mine"}))
    assert read_config(ckpt)["note"] == "mine"  # the training record beside the config stays the JSON's


def test_cli_help_lists_variants_and_archs(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    assert all(v in text for v in BUILTIN_VARIANTS) and all(a in text for a in ARCHS)


@pytest.mark.slow
def test_export_seg_mask_decoder(tmp_path):
    model = create_model("belief-star", "seg", "micro", num_classes=4, decoder="mask")
    report = export_verified(model, tmp_path / "mask.onnx", model.attnzoo_config, batch_sizes=(1,), input_hw=SEG_HW)
    assert report["passed"], report["failures"]
    _assert_extra_math_found(report, "belief-star", "seg")


# --------------------------------------------------------------------------- export formats as parts
#: A made-up format, written as the one file a new format is: the verified ONNX and its report in a tar archive.
TAR_FORMAT = '''
"""``--format tar``: the verified ONNX and its report in one tar archive."""

import tarfile

from attnzoo.export.formats import ExportFormat
from attnzoo.export.verify import report_path


class TarFormat(ExportFormat):
    name, title, suffixes = "tar", "tar archive", (".tar",)

    def steps(self, req):
        return [("tar", self.write)]

    def write(self, req, result):
        with tarfile.open(result.path, "w") as tar:
            for path in (result.onnx_path, report_path(result.onnx_path)):
                tar.add(path, arcname=path.name)

    def files(self, result):
        return [result.path]

    def summary(self, result):
        with tarfile.open(result.path) as tar:
            return [f"{result.path}: tar archive of {', '.join(tar.getnames())}"]


FORMAT = TarFormat()
'''


@pytest.fixture
def tar_format(tmp_path, monkeypatch):
    """:data:`TAR_FORMAT` as a file of the formats package (its search path extended to a temporary folder),
    found the way the built-in formats are."""
    import sys

    from attnzoo.export import formats

    folder = tmp_path / "formats"
    folder.mkdir()
    (folder / "tar_format.py").write_text(TAR_FORMAT)
    monkeypatch.setattr(formats, "__path__", [*formats.__path__, str(folder)])
    monkeypatch.setattr(formats, "_REGISTRY", {})
    monkeypatch.delitem(sys.modules, "attnzoo.export.formats.tar_format", raising=False)
    yield formats.get_format("tar")
    sys.modules.pop("attnzoo.export.formats.tar_format", None)


def test_the_builtin_formats_are_parts():
    from attnzoo.export.formats import ExportFormat, formats, get_format, register_format
    from attnzoo.export.pipeline import FORMATS, SUFFIXES
    from attnzoo.runtime.targets import targets

    # the verified ONNX (the export layer's own) and every target's, in name order
    assert FORMATS == tuple(formats()) == tuple(sorted({"onnx", *(name for t in targets() for name in t.formats)}))
    assert SUFFIXES == {name: part.suffixes for name, part in formats().items()}
    assert SUFFIXES["onnx"] == (".onnx",) and SUFFIXES["tensorrt"] == (".engine", ".plan")
    assert all(isinstance(part, ExportFormat) for part in formats().values())
    with pytest.raises(ValueError, match=f"^unknown format 'zip'; valid: {', '.join(FORMATS)}$"):
        get_format("zip")
    with pytest.raises(ValueError, match="already registered"):
        register_format(get_format("onnx"))


def test_a_new_format_is_one_file_checked_before_any_work(tar_format, tmp_path, monkeypatch):
    """The made-up format is found, inferred from its suffix, listed among the valid formats, and its checks (here
    the base's) refuse what it cannot take before anything is loaded."""
    from attnzoo.errors import UsageError
    from attnzoo.export import export_model
    from attnzoo.export.formats import formats
    from attnzoo.export.pipeline import output_format

    assert "tar" in formats() and list(formats()) == sorted(formats())  # found among the others, in name order
    assert output_format(None, tmp_path / "m.tar") == "tar" and output_format("tar", None) == "tar"
    with pytest.raises(UsageError, match=r"\(ONNX\) or \.xml \(OpenVINO IR\) or \.tar \(tar archive\) or \.engine \("):
        output_format(None, tmp_path / "m.zip")
    with pytest.raises(UsageError, match="names a tar archive but --format is onnx; use --out .*m.onnx"):
        output_format("onnx", tmp_path / "m.tar")

    def never(*args, **kwargs):
        raise AssertionError("the export ran")

    monkeypatch.setattr(verify_mod, "export_verified", never)
    with pytest.raises(UsageError, match="--compute-capability applies to --format tensorrt only"):
        export_model("belief2", random_init=True, out=tmp_path / "m.tar", compute_capability="SM89")
    assert list(tmp_path.glob("m.*")) == []


@pytest.mark.slow
def test_the_pipeline_runs_a_new_format_writes_its_file_and_summary(tar_format, tmp_path):
    import tarfile

    from attnzoo.export import ExportWarning, export_model

    out = tmp_path / "b2.tar"
    with pytest.warns(ExportWarning, match="UNTRAINED"):
        result = export_model("belief2", random_init=True, out=out, batch_sizes=(1,))
    onnx_path = tmp_path / "b2.onnx"
    assert result.format == "tar" and result.path == out and result.onnx_path == onnx_path
    assert result.files == [onnx_path, report_path(onnx_path), out] and all(f.is_file() for f in result.files)
    with tarfile.open(out) as tar:
        assert tar.getnames() == ["b2.onnx", "b2.report.json"]
        assert tar.extractfile("b2.onnx").read() == onnx_path.read_bytes()
    lines = result.summary().splitlines()
    assert any(line.startswith("  PASSED (worst block ") for line in lines)  # the ONNX's verdict, then the part's
    assert lines[-1] == f"{out}: tar archive of b2.onnx, b2.report.json"


@pytest.mark.slow  # two micro exports with their verification: ~15 s on a loaded 2-core machine
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_mae_loop_export_holds_a_tile_never_a_heads_scores(tmp_path, dtype):
    """mae_impl="loop" (auto's ONNX form for long sequences, here forced at micro size): the fused core is one Loop
    per block in the distance scope, the graph holds no head's N x N scores outside it, and the file verifies
    against eager (ONNX Runtime) and runs on OpenVINO where it is installed."""
    torch.manual_seed(0)
    model = create_model("anti-wafe-mae", "cls", "micro", num_classes=5, mae_impl="loop")
    path = tmp_path / f"loop_{dtype}.onnx"
    report = export_verified(model, path, model.attnzoo_config, dtype=dtype, batch_sizes=(1,))
    assert report["passed"], report["failures"]
    found = report["extra_math"]
    assert found["ok"] and set(found["blocks"]) == {f"blocks.{i}.attn.distance" for i in range(DEPTH)}
    assert all(scope["ops"].get("Loop") == 1 for scope in found["blocks"].values())  # counted in the scope
    proto = onnx.load(str(path))
    loops = [n.name for n in proto.graph.node if n.op_type == "Loop"]
    assert loops == [f"blocks.{i}.attn.distance/Loop" for i in range(DEPTH)]
    arch = ARCHS["micro"]
    tokens = (32 // arch["patch_size"]) ** 2 + 1
    inferred = onnx.shape_inference.infer_shapes(proto).graph.value_info
    shapes = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred]
    assert len(shapes) > 50 and any(tokens in s for s in shapes)  # shapes known, so the next line means something
    assert not [s for s in shapes if s.count(tokens) >= 2]  # no (..., N, N) scores: they live inside the loop
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    with torch.no_grad():
        want = model.eval()(torch.from_numpy(x)).numpy()
    from attnzoo.runtime.backends import get_backend

    openvino = get_backend("openvino")
    if openvino.unavailable_reason("fp32", "cpu") is None:
        got = openvino.compiled(path, 1)([x])[0]
        assert np.abs(got - want).max() < (1e-4 if dtype == "fp32" else 5e-2)
