"""The gates' branches that no exported built-in model reaches, each pinned at its boundary on a graph, an IR or a
network made for it: a scope that declares no op counts (wafe-mae's ``distance``, and any plugin variant's), an op
of a scope computing in a type that is neither fp32 nor 16-bit, an fp16 graph whose Softmax computes in fp16, a
file without attnzoo metadata, an fp32 classifier whose top-1 changes within the tolerance, and the TensorRT
network check's ops of a variant's own kinds. Each case comes with its twin on the other side of the gate, so that
a check that refuses everything fails here too (``.ci/mutation-check`` runs these against the gates' mutants)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from attnzoo.export import ExtraMathCheckError, check_extra_math, verify
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.targets.tensorrt import check_network_precision

DISTANCE = "blocks.0.attn.distance"  # wafe-mae's extra scope: no op counts declared, at least one op computes
KEY_NORM = "blocks.0.attn.key_norm"  # wafe-mse's: two Mul and one ReduceSum
MAE = {"variant": "wafe-mae", "task": "cls"}
MSE = {"variant": "wafe-mse", "task": "cls"}


#: The constant inputs an op of :func:`_chain` takes beside the value it reads.
_CONSTANTS = {"Unsqueeze": helper.make_tensor("axes", TensorProto.INT64, [1], [0])}


def _chain(ops: list[tuple[str, str]], elem: int = TensorProto.FLOAT, props: dict[str, str] | None = None):
    """A graph computing ``ops`` (``(op type, node name)``) one after another from its input ``x`` (binary ops read
    the previous value twice), then a ReLU outside every extra scope; an input of ``elem`` other than fp32 is cast to
    fp32 (outside the scopes) before the ReLU."""
    nodes, prev = [], "x"
    for i, (op, name) in enumerate(ops):
        attrs = {"to": elem} if op == "Cast" else {}
        inputs = [prev, prev] if op in ("Mul", "Sub", "Add", "Div", "Max") else [prev]
        inputs += [_CONSTANTS[op].name] if op in _CONSTANTS else []
        nodes.append(helper.make_node(op, inputs, [f"v{i}"], name=name, **attrs))
        prev = f"v{i}"
    if elem != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [prev], ["f"], name="head/Cast", to=TensorProto.FLOAT))
        prev = "f"
    nodes.append(helper.make_node("Relu", [prev], ["out"], name="head/Relu"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, [2, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [])],
        [t for op, t in _CONSTANTS.items() if any(o == op for o, _ in ops)],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for key, value in (props or {}).items():
        proto.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(proto)
    return proto


COMPUTING = [("Sub", f"{DISTANCE}/Sub"), ("Abs", f"{DISTANCE}/Abs"), ("ReduceSum", f"{DISTANCE}/ReduceSum")]
DATA_ONLY_ONNX = [("Cast", f"{DISTANCE}/Cast"), ("Identity", f"{DISTANCE}/Identity")]
KEY_NORM_OPS = [("Mul", f"{KEY_NORM}/Mul"), ("Mul", f"{KEY_NORM}/Mul_1"), ("ReduceSum", f"{KEY_NORM}/ReduceSum")]


# ------------------------------------------------------------------------------------------------ the ONNX count
def test_a_scope_without_declared_counts_passes_with_one_computing_op():
    result = check_extra_math(_chain(COMPUTING), MAE, "fp32")
    assert result["ok"] and result["failures"] == [] and result["nodes_per_block"] == {"blocks.0": 3}


def test_a_scope_without_declared_counts_that_only_moves_data_is_refused():
    result = check_extra_math(_chain(DATA_ONLY_ONNX), MAE, "fp32")
    assert result["failures"] == [f"{DISTANCE}: only Cast, Identity node(s), no op computes anything"]


def test_declared_ops_computing_in_float64_are_refused_and_in_fp32_pass():
    assert check_extra_math(_chain(KEY_NORM_OPS), MSE, "fp32")["ok"]
    result = check_extra_math(_chain(KEY_NORM_OPS, TensorProto.DOUBLE), MSE, "fp32")
    assert result["failures"] == [f"{KEY_NORM}: {name} does not compute in fp32" for _, name in KEY_NORM_OPS]


def _softmax(fp32_inside: bool):
    """An fp16 graph's Softmax, computing in fp32 between two casts or in fp16."""
    ops = [("Cast", "a/Cast"), ("Softmax", "blocks.0.attn/Softmax")]
    proto = _chain(ops if fp32_inside else ops[1:], TensorProto.FLOAT16)
    if fp32_inside:  # into fp32 for the Softmax (the chain's first Cast is to its input type: made fp32 here)
        proto.graph.node[0].attribute[0].i = TensorProto.FLOAT
    return proto


def test_an_fp16_graphs_softmax_must_compute_in_fp32():
    standard = {"variant": "standard", "task": "cls"}
    assert check_extra_math(_softmax(fp32_inside=True), standard, "fp16")["ok"]
    result = check_extra_math(_softmax(fp32_inside=False), standard, "fp16")
    assert result["failures"] == ["blocks.0.attn/Softmax: Softmax does not compute in fp32"]
    assert check_extra_math(_softmax(fp32_inside=False), standard, "fp32")["ok"]  # an fp32 graph's rule is not this


def test_the_config_is_read_from_the_metadata_and_a_graph_without_it_is_refused():
    props = {"attnzoo.config": json.dumps(MAE), "dtype": "fp32"}
    assert check_extra_math(_chain(COMPUTING, props=props))["ok"]
    assert not check_extra_math(_chain(DATA_ONLY_ONNX, props=props))["ok"]
    with pytest.raises(ExtraMathCheckError, match=r"^the graph has no attnzoo.config metadata; pass config=$"):
        check_extra_math(_chain(COMPUTING))


# ------------------------------------------------------------------------------------------ the OpenVINO IR count
@pytest.fixture
def openvino_count(tmp_path):
    """The OpenVINO target's own count (:func:`attnzoo.targets.openvino.checks.count_extra_math`) of an IR converted
    from a graph: ``count(proto, config)``."""
    from attnzoo.targets.openvino import checks, library

    if library.unavailable_reason() is not None:
        pytest.skip(str(library.unavailable_reason()))

    def count(proto, config):
        path = tmp_path / "g.onnx"
        onnx.save(proto, str(path))
        return checks.count_extra_math(library.read_onnx(path), config)

    return count


def test_an_ir_scope_without_declared_counts_passes_with_one_computing_op(openvino_count):
    result = openvino_count(_chain(COMPUTING), MAE)
    assert result["ok"] and result["blocks"][DISTANCE]["ops"] == {"Sub": 1, "Abs": 1, "ReduceSum": 1}


def test_an_ir_scope_without_declared_counts_that_only_moves_data_is_refused(openvino_count):
    ops = [("Transpose", f"{DISTANCE}/Transpose"), ("Unsqueeze", f"{DISTANCE}/Unsqueeze")]
    result = openvino_count(_chain(ops), MAE)
    assert result["failures"] == [f"{DISTANCE}: only Transpose, Unsqueeze op(s), no op computes anything"]


# ------------------------------------------------------------------------------------------------ parity's top-1
class _Logits(torch.nn.Module):
    """A classifier answering the same logits for every image."""

    def __init__(self, logits: list[float]) -> None:
        super().__init__()
        self.register_buffer("logits", torch.tensor([logits]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(len(x), -1)


@pytest.mark.parametrize("task", ["cls", "seg"])
def test_an_fp32_classifier_whose_top1_changes_within_the_tolerance_fails_parity(task):
    """Two logits a quarter of the fp32 tolerance apart, swapped by the exported model: the error is within the
    tolerance, but an fp32 model's top-1 must agree everywhere (a classifier's: a segmenter's per-pixel top-1 is
    not this rule)."""
    gap = TOLERANCES["fp32"] / 4
    model = _Logits([0.5, 0.5 + gap, 0.0])
    swapped = np.array([[0.5 + gap, 0.5, 0.0]], np.float32)
    config = {"task": task}
    same = verify.parity_vs_eager(
        model, lambda x: np.repeat(model.logits.numpy(), len(x), 0), config, (8, 8), [1], "fp32"
    )
    assert same["passed"]
    result = verify.parity_vs_eager(model, lambda x: np.repeat(swapped, len(x), 0), config, (8, 8), [1], "fp32")
    assert max(r[k]["max_abs_err"] for r in result["per_batch"] for k in ("real", "random")) < TOLERANCES["fp32"]
    if task == "cls":
        assert result["failures"] == [f"batch 1 {k}: top-1 differs on 100.0% of inputs" for k in ("real", "random")]
    else:
        assert result["passed"]


# ------------------------------------------------------------------------------------- the TensorRT network check
def _network(layers: list[tuple[str, str, list[str]]]) -> SimpleNamespace:
    """A parsed network as TensorRT's Python API shows it: ``(name, layer type, output dtypes)`` per layer."""

    def layer(name, kind, outputs):
        return SimpleNamespace(
            name=name,
            type=SimpleNamespace(name=kind),
            num_outputs=len(outputs),
            get_output=lambda j: SimpleNamespace(dtype=SimpleNamespace(name=outputs[j])),
        )

    made = [layer(*x) for x in layers]
    return SimpleNamespace(num_layers=len(made), get_layer=made.__getitem__)


#: A variant's own scope in ONNX: a cast into it, a Max of its own kind, shape arithmetic, an op the parser folded.
OWN_OPS = {
    f"{DISTANCE}/Cast": "Cast",
    f"{DISTANCE}/Max": "Max",
    f"{DISTANCE}/Shape": "Shape",
    f"{DISTANCE}/Unsqueeze": "Unsqueeze",
}


@pytest.mark.parametrize("max_output", ["FLOAT", "HALF"])
def test_a_networks_op_of_a_variants_own_kind_must_compute_in_fp32(max_output):
    """Only the Max is a float layer of its own kind here: it counts, and passes in fp32 only; the cast (16-bit, at
    the scope's edge), the integer shape layer and the op no layer kept are not counted either way."""
    network = _network(
        [
            (f"{DISTANCE}/Cast", "CAST", ["HALF"]),
            (f"{DISTANCE}/Max", "ELEMENTWISE", [max_output]),
            (f"{DISTANCE}/Shape", "SHAPE", ["INT64"]),
        ]
    )
    result = check_network_precision(network, {DISTANCE: list(OWN_OPS)}, OWN_OPS)
    if max_output == "FLOAT":
        assert result["ok"] and result["blocks"][DISTANCE] == {"layers": 1, "fp32": 1}
    else:
        assert result["failures"] == [f"{DISTANCE}: {DISTANCE}/Max computes in HALF, not FLOAT (fp32)"]
        assert result["blocks"][DISTANCE] == {"layers": 1, "fp32": 0}
    assert result["layers"] == 3
