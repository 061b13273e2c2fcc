"""int8 of models with outlier activation channels: SmoothQuant-style migration on the fp32 ONNX graph keeps its
function and evens the channels (and touches nothing else), held-out inputs that are near-copies of calibration
inputs are told apart from unrelated ones, and the export of the pretrained-like ViT calibrated on augmented crops
of three images keeps its promise on the images themselves or refuses in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from attnzoo.export import quantize as qz
from attnzoo.export.quantize.smooth import smooth_layernorm_matmuls
from attnzoo.export.verify import failed_report_path, report_path
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
from attnzoo.runtime.backends import onnx_reference
from research.int8_fidelity.standin import augmented_crops, smooth_images


def _ln_matmul(gain: np.ndarray, extra_reader: bool = False) -> onnx.ModelProto:
    """image (N, 3, 4, 4) -> reshape (N, 16, 3)... -> LayerNormalization over 8 channels -> MatMul (8 -> 5); the
    LayerNorm's gain ``gain`` (an outlier channel when one entry is large). ``extra_reader``: its output also
    feeds an Add (not a weight MatMul)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array([-1, 6, 8], np.int64), "shape"),
        numpy_helper.from_array(gain.astype(np.float32), "gain"),
        numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.normal(0, 0.3, (8, 5)).astype(np.float32), "w"),
    ]
    nodes = [
        helper.make_node("Reshape", ["image", "shape"], ["tokens"], name="reshape"),
        helper.make_node("LayerNormalization", ["tokens", "gain", "bias"], ["normed"], name="norm", axis=-1),
        helper.make_node("MatMul", ["normed", "w"], ["mm"], name="fc"),
    ]
    out = "mm"
    if extra_reader:
        nodes.append(helper.make_node("ReduceMean", ["normed"], ["side"], name="side", keepdims=1, axes=[-1]))
        nodes.append(helper.make_node("Add", ["mm", "side"], ["logits"], name="add"))
        out = "logits"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 4, 4])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = onnx_reference().session(proto, 1).session
    return sess.run(None, {"image": x})[0]


def _channel_peaks(proto: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    probe = onnx.ModelProto()
    probe.CopyFrom(proto)
    probe.graph.output.append(helper.make_tensor_value_info("normed", TensorProto.FLOAT, None))
    return np.abs(onnx_reference().session(probe, 1).session.run(["normed"], {"image": x})[0]).reshape(-1, 8).max(0)


def test_smoothquant_migration_keeps_the_function_and_evens_the_channels():
    """A LayerNorm output with a channel 40x the others: migrated, the graph computes the same outputs, the
    ratio of the largest channel range to the median one falls to about its square root (alpha 0.5), and the
    MatMul weight's row of that channel grew by what the LayerNorm's gain lost; without an outlier, or with the
    LayerNorm excluded or read by a non-MatMul, nothing changes."""
    x = np.random.default_rng(1).standard_normal((32, 3, 4, 4)).astype(np.float32)
    gain = np.ones(8)
    gain[3] = 40.0
    proto = _ln_matmul(gain)
    before = _channel_peaks(proto, x)
    assert before.max() / np.median(before) > 20
    smoothed, report = smooth_layernorm_matmuls(proto, x)
    assert report["migrated"] == 1 and report["layernorms"]["norm"]["migrated"] is True
    np.testing.assert_allclose(_run(smoothed, x), _run(proto, x), rtol=1e-4, atol=1e-5)
    after = _channel_peaks(smoothed, x)
    assert after.max() / np.median(after) < np.sqrt(before.max() / np.median(before)) * 1.5  # alpha 0.5: halved in log
    w0 = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    w1 = {t.name: numpy_helper.to_array(t) for t in smoothed.graph.initializer}
    s = w0["gain"] / w1["gain"]
    np.testing.assert_allclose(w1["w"], w0["w"] * s[:, None], rtol=1e-5)
    assert s[3] > 5 * np.median(s)
    assert numpy_helper.to_array(proto.graph.initializer[1])[3] == 40.0  # the input graph is not modified
    for case, kwargs in (
        ("no outlier", dict(proto=_ln_matmul(np.ones(8)))),
        ("excluded", dict(proto=proto, exclude=["fc"])),
        ("read by a non-MatMul", dict(proto=_ln_matmul(gain, extra_reader=True))),
    ):
        same, rep = smooth_layernorm_matmuls(kwargs.pop("proto"), x, **kwargs)
        assert rep["migrated"] == 0, case
        assert [numpy_helper.to_array(t).tolist() for t in same.graph.initializer] == [
            numpy_helper.to_array(t).tolist()
            for t in (_ln_matmul(np.ones(8)) if case == "no outlier" else _ln_matmul(gain)).graph.initializer
        ], case


def test_near_copies_of_calibration_inputs_are_told_apart_from_unrelated_images():
    """Augmented crops of three images score as near-copies of other crops of them; unrelated images do not; the
    worst cosine is reported on each kind, and half or more near-copies warn."""
    photos = smooth_images(3, 32, seed=2)
    calibration = normalize(augmented_crops(photos, 72, seed=0), DEFAULT_MEAN, DEFAULT_STD)
    crops = normalize(augmented_crops(photos, 32, seed=1), DEFAULT_MEAN, DEFAULT_STD)
    other = normalize(smooth_images(32, 32, seed=1), DEFAULT_MEAN, DEFAULT_STD)
    assert np.mean(qz.pixel_similarity(crops, calibration) >= qz.NEAR_COPY_SIMILARITY) > 0.9
    assert qz.pixel_similarity(other, calibration).max() < qz.NEAR_COPY_SIMILARITY
    assert qz.pixel_similarity(normalize(photos, DEFAULT_MEAN, DEFAULT_STD), calibration).min() >= 0.9
    x = np.concatenate([crops, other])
    cos = np.linspace(0.95, 1.0, len(x))
    rel = qz.related_inputs(x, calibration, cos)
    assert rel["near_copies"] + rel["distinct"] == 64 and rel["distinct"] >= 32
    assert rel["worst"]["near_copies"] == pytest.approx(cos[: len(crops)][rel_mask(crops, calibration)].min())
    assert rel["worst"]["distinct"] == pytest.approx(cos[len(crops) :].min())
    assert "warning" not in qz.related_inputs(other, calibration, cos[:32])
    assert "near-copies of calibration inputs" in qz.related_inputs(crops, calibration, cos[:32])["warning"]


def rel_mask(x: np.ndarray, calibration: np.ndarray) -> np.ndarray:
    return qz.pixel_similarity(x, calibration) >= qz.NEAR_COPY_SIMILARITY


@pytest.mark.slow
def test_crops_of_three_images_keep_their_promise_on_the_images_or_refuse_in_one_line(tmp_path):
    """The user's case on the pretrained-like ViT with LayerNorm outlier channels: a .npy of 96 augmented crops of
    three images, every default of export_model(dtype="int8"). Either the written model's worst cosine to fp32 on
    the three images themselves and on unrelated images is >= 0.99, or the export is refused in one line, nothing
    written; either way the report counts the held-out near-copies and gives the worst cosine on them."""
    from attnzoo.export import ExportError, export_model
    from attnzoo.models import convert_to_belief2
    from research.int8_fidelity.standin import pretrained_like_vit

    model = convert_to_belief2(pretrained_like_vit(img_size=32, embed_dim=96, depth=4, ln_outlier=30.0))
    photos = smooth_images(3, 32, seed=2)
    crops = tmp_path / "crops.npy"
    np.save(crops, normalize(augmented_crops(photos, 96, seed=0), DEFAULT_MEAN, DEFAULT_STD))
    out = tmp_path / "vit_int8.onnx"
    try:
        with pytest.warns(Warning):
            report = export_model(model=model, out=out, dtype="int8", batch_sizes=(1,), calibration_data=crops).report
    except ExportError as exc:
        assert "\n" not in str(exc) and "not written" in str(exc) and "outlier activation channels" in str(exc)
        assert not out.exists() and not report_path(out).exists()
        report = json.loads(failed_report_path(out).read_text())
    else:
        fp32 = export_model(model=model, out=tmp_path / "fp32.onnx", batch_sizes=(1,)).path
        for x in (normalize(photos, DEFAULT_MEAN, DEFAULT_STD), normalize(smooth_images(64, 32, seed=1))):
            cos = qz.per_input_fidelity(qz.onnx_outputs(fp32, x, None), qz.onnx_outputs(out, x, None))[0]
            assert cos.min() >= 0.99
    related = report["fidelity"]["related"]
    assert related["near_copies"] >= 0.9 * report["fidelity"]["n_inputs"] and "near_copies" in related["worst"]
    assert any("near-copies of calibration inputs" in w for w in report["warnings"])
