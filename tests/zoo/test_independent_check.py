"""evaluation/independent_check.py: the zoo's acceptance check written without the package.

Its pieces are checked against hand-computed answers and against the package on the same images: the two IDX
readers agree, its mIoU matches a hand count, its scenes have masks exactly where garment pixels are, and its
export + preprocessing + plain onnxruntime path reproduces the zoo's recorded subset accuracy.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from attnzoo.data import fashion as fm
from attnzoo.training.zoo import SUBSET_N

ROOT = Path(__file__).resolve().parents[2]
SUBSET = Path(__file__).parents[1] / "data" / "fashion-mnist"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("independent_check", ROOT / "evaluation" / "independent_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_its_idx_reader_agrees_with_the_package(check):
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        np.testing.assert_array_equal(check.read_idx(SUBSET / name), fm.read_idx(SUBSET / name))


def test_miou_by_hand(check):
    true = np.array([[0, 0, 1, 1], [0, 0, 2, 2]])
    pred = np.array([[0, 1, 1, 1], [0, 0, 2, 0]])
    # class 0: inter 3, union 5; class 1: inter 2, union 3; class 2: inter 1, union 2; class 3 absent
    assert check.miou(true, pred, 4) == pytest.approx(100 * (3 / 5 + 2 / 3 + 1 / 2) / 3)


def test_scenes_have_masks_exactly_on_garment_pixels(check):
    images = check.read_idx(SUBSET / "t10k-images-idx3-ubyte.gz")
    labels = check.read_idx(SUBSET / "t10k-labels-idx1-ubyte.gz")
    scenes, masks = check.compose(images, labels, 50)
    assert scenes.shape == masks.shape == (50, 48, 48)
    np.testing.assert_array_equal(masks > 0, scenes > 24)
    assert masks.max() <= 10 and all(1 <= len(np.unique(m[m > 0])) <= 4 for m in masks)
    again, _ = check.compose(images, labels, 50)
    np.testing.assert_array_equal(scenes, again)  # seeded: the same scenes on every run


def test_its_scene_options_native_garments_and_per_scene_caps(check):
    images = check.read_idx(SUBSET / "t10k-images-idx3-ubyte.gz")
    labels = check.read_idx(SUBSET / "t10k-labels-idx1-ubyte.gz")
    scenes, masks = check.compose(images, labels, 30, size=56, garment_px=(28, 28), max_overlap=(0.0, 1.0))
    assert scenes.shape == masks.shape == (30, 56, 56)
    np.testing.assert_array_equal(masks > 0, scenes > 24)
    # the default call still draws the README's scenes (no extra draw for a single cap)
    np.testing.assert_array_equal(
        check.compose(images, labels, 5)[1],
        check.compose(images, labels, 5, max_overlap=0.15, fraction=(0.35, 0.60))[1],
    )
    true, pred = np.array([[0, 1], [2, 2]]), np.array([[0, 1], [1, 2]])
    iou = check.per_class_iou(check.confusion(true, pred, 4))
    assert iou[0] == 100 and iou[1] == 50 and iou[2] == 50 and np.isnan(iou[3])


@pytest.mark.slow
def test_export_and_plain_onnxruntime_reproduce_the_zoo_subset_metric(check, tmp_path):
    """export-model (a subprocess) + the ONNX metadata's preprocessing + plain onnxruntime on the first
    SUBSET_N official test images gives the top-1 the zoo recorded for them."""
    entry = next(
        e
        for e in json.loads((ROOT / "zoo" / "manifest.json").read_text())["models"]
        if (e["variant"], e["task"], e["data"]) == ("standard", "cls", "fashion")
    )
    onnx_path = tmp_path / "standard.onnx"
    check.export("standard", ROOT / "zoo" / entry["file"], onnx_path)
    images = check.read_idx(SUBSET / "t10k-images-idx3-ubyte.gz")[:SUBSET_N]
    labels = check.read_idx(SUBSET / "t10k-labels-idx1-ubyte.gz")[:SUBSET_N]
    top1 = 100.0 * float((check.run_onnx(onnx_path, images).argmax(1) == labels).mean())
    assert entry["subset_n"] == SUBSET_N
    assert top1 == pytest.approx(entry["subset_metric"], abs=1e-9)


def test_its_extra_math_check_finds_a_dequantized_input_through_layout_ops(check, tmp_path):
    """A hand-made graph: a projection Mul reads a DequantizeLinear through a Transpose (found), another reads
    the fp32 tensor (not found), and a MatMul outside any scope reading the DequantizeLinear is not counted."""
    import onnx
    from onnx import TensorProto, helper

    one = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])
    zero = helper.make_tensor("z", TensorProto.INT8, [], [0])
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
        helper.make_node("Transpose", ["xd"], ["xt"], name="blocks.0.attn/Transpose", perm=[1, 0]),
        helper.make_node("Mul", ["xt", "xt"], ["a"], name="blocks.0.attn.projection/Mul"),
        helper.make_node("Mul", ["x", "x"], ["b"], name="blocks.0.attn.projection/Mul_1"),
        helper.make_node("MatMul", ["xd", "xt"], ["c"], name="blocks.0.mlp.fc1/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abc"],
        initializer=[one, zero],
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert check.extra_math_quantized(path) == (2, ["blocks.0.attn.projection/Mul"])
