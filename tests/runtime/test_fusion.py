"""The fusion audit: each runtime's own executed or optimized graph says whether a block's attention core (scores'
matrix product, softmax, values' matrix product) runs as one kernel."""

from __future__ import annotations

import types

import onnx
import pytest
import torch
from onnx import helper

from attnzoo.export.onnx_export import export_onnx
from attnzoo.models import create_model
from attnzoo.runtime.fusion import (
    AttentionCore,
    _ort_attention,
    attention_cores,
    audit,
    markdown,
    onnxruntime_fusion,
    openvino_fusion,
    runtime_label,
)

DEPTH = 4  # the micro ViT's blocks


def _export(tmp_path, name: str, variant: str, forward=None, opset: int = 20):
    torch.manual_seed(0)
    model = create_model(variant, "cls", "micro", num_classes=10).eval()
    if forward is not None:
        for block in model.blocks:
            block.attn.forward = types.MethodType(forward, block.attn)
    return export_onnx(model, tmp_path / f"{name}.onnx", config=model.attnzoo_config, opset=opset)


def _cumsum_scores(self, x, attn_mask=None, is_causal=False):
    """A made-up variant: the dot-product scores summed along the keys, which no attention pattern matches."""
    b, n, _ = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    scores = torch.cumsum((q * self.scale) @ k.transpose(-2, -1), dim=-1)
    return self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, -1))


@pytest.fixture(scope="module")  # six exports, about 40 s on 2 cores: the tests that use them are slow
def exports(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fusion")
    return {
        "standard": _export(tmp, "standard", "standard"),
        "made-up": _export(tmp, "made-up", "standard", _cumsum_scores),
        "wafe-mae": _export(tmp, "wafe-mae", "wafe-mae"),
        # opset 23: each dot-product core one standard Attention op (wafe-mse's key-norm bias as its mask)
        "standard-23": _export(tmp, "standard-23", "standard", opset=23),
        "wafe-mse-23": _export(tmp, "wafe-mse-23", "wafe-mse", opset=23),
        "made-up-23": _export(tmp, "made-up-23", "standard", _cumsum_scores, opset=23),
    }


@pytest.mark.slow
def test_cores_are_found_from_each_blocks_softmax_with_both_matrix_products(exports):
    cores = attention_cores(exports["standard"])
    assert [c.block for c in cores] == [f"blocks.{i}" for i in range(DEPTH)]
    assert all(c.dot_product and c.scores.startswith(f"{c.block}.attn/MatMul") and c.values for c in cores)
    made_up = attention_cores(exports["made-up"])
    assert len(made_up) == DEPTH and not any(c.dot_product for c in made_up)
    assert all("CumSum" in c.producer for c in made_up)
    mae = attention_cores(exports["wafe-mae"])  # L1 distances: no matrix product makes the scores
    assert len(mae) == DEPTH and not any(c.dot_product for c in mae) and all(c.values for c in mae)


@pytest.mark.slow
def test_openvino_runs_standard_attention_fused_and_a_core_that_breaks_the_pattern_unfused(exports):
    std = openvino_fusion(exports["standard"])
    assert std["inspected"] and std["cores"] == std["fused"] == DEPTH
    assert all("Subgraph" in c["kernel"] for c in std["per_core"])  # read from OpenVINO's runtime model
    for name in ("made-up", "wafe-mae"):
        r = openvino_fusion(exports[name])
        assert r["cores"] == DEPTH and r["fused"] == 0 and not any(c["kernel"] for c in r["per_core"])


@pytest.mark.slow
def test_onnxruntime_verdicts_come_from_its_optimized_graphs(exports):
    for optimizer in (False, True):
        r = onnxruntime_fusion(exports["made-up"], transformer_optimizer=optimizer)
        assert r["inspected"] and r["cores"] == DEPTH and r["fused"] == 0
    r = onnxruntime_fusion(exports["standard"])
    assert r["fused"] == sum(r["attention_ops"].values())  # one attention op per fused core, no more


def test_an_attention_op_that_replaced_a_softmax_counts_that_core_as_fused():
    cores = [
        AttentionCore(
            f"blocks.{i}", f"blocks.{i}.attn/Softmax", f"blocks.{i}.attn/MatMul", f"blocks.{i}.attn/MatMul_1", []
        )
        for i in range(2)
    ]
    graph = helper.make_graph(
        [
            helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], name="Attention_0", domain="com.microsoft"),
            helper.make_node("Softmax", ["s"], ["p"], name="blocks.1.attn/Softmax"),
        ],
        "g",
        [],
        [],
    )
    fused = _ort_attention(graph, cores)
    assert fused == {
        "blocks.0.attn/Softmax": "Attention_0 (com.microsoft.MultiHeadAttention)",
        "blocks.1.attn/Softmax": None,
    }


@pytest.mark.slow
def test_audit_says_plainly_what_it_could_not_inspect(exports):
    result = audit(exports["standard"])
    trt = next(r for r in result["runtimes"] if r["runtime"] == "tensorrt")
    if not torch.cuda.is_available():
        assert not trt["inspected"] and trt["fused"] is None and "GPU" in trt["reason"]
    table = markdown(result)
    assert f"| OpenVINO | {DEPTH} of {DEPTH} |" in table and "| TensorRT | not inspected |" in table
    assert "Inspected: OpenVINO, ONNX Runtime, ONNX Runtime transformer optimizer; not inspected: TensorRT (" in table
    assert "fused: one kernel of the runtime's own" in table  # the one definition, on every table


@pytest.mark.slow
def test_an_opset_23_export_carries_each_core_as_one_attention_op_that_both_runtimes_keep_whole(exports):
    for name in ("standard-23", "wafe-mse-23"):
        ops = [n for n in onnx.load(str(exports[name])).graph.node]
        assert not any(n.op_type == "Softmax" for n in ops)  # the softmax is inside the op
        cores = attention_cores(exports[name])
        assert [c.block for c in cores] == [f"blocks.{i}" for i in range(DEPTH)]
        assert all(c.op == f"{c.block}.attn/Attention" and c.dot_product for c in cores)
        for optimizer in (False, True):
            r = onnxruntime_fusion(exports[name], transformer_optimizer=optimizer)
            assert r["fused"] == r["cores"] == DEPTH
            # opt_level 0 never splits an exported Attention op: the optimizer's count is the file's, and says so
            assert r.get("as_exported") == (DEPTH if optimizer else None)
            assert ("the export's count" in runtime_label(r)) == optimizer
            assert all(c["kernel"] == f"{c['block']}.attn/Attention (ai.onnx.Attention)" for c in r["per_core"])
        ov = openvino_fusion(exports[name])  # OpenVINO's runtime model: one Subgraph per core, no MatMul / Softmax
        assert ov["fused"] == ov["cores"] == DEPTH and all("Subgraph" in c["kernel"] for c in ov["per_core"])
    # scores that no attention op computes stay a Softmax between matrix products at opset 23 too: not fused
    made_up = audit(exports["made-up-23"])
    assert not any(c["dot_product"] for c in made_up["cores"]) and len(made_up["cores"]) == DEPTH
    assert all(r["fused"] == 0 for r in made_up["runtimes"] if r["inspected"])


def test_a_standard_attention_op_is_kept_whole_in_either_spelling_of_the_standard_domain():
    """ONNX's standard domain is ``""`` or ``"ai.onnx"``: an Attention op kept under either is the core, fused."""
    cores = [AttentionCore("blocks.0", "blocks.0.attn/Attention", None, None, [], None, op="blocks.0.attn/Attention")]
    for domain in ("", "ai.onnx"):
        node = helper.make_node("Attention", ["q", "k", "v"], ["o"], name="blocks.0.attn/Attention", domain=domain)
        assert _ort_attention(helper.make_graph([node], "g", [], []), cores) == {
            "blocks.0.attn/Attention": "blocks.0.attn/Attention (ai.onnx.Attention)"
        }


def test_a_standard_attention_op_the_runtime_decomposed_is_not_fused():
    cores = [
        AttentionCore(
            f"blocks.{i}", f"blocks.{i}.attn/Attention", None, None, [], None, op=f"blocks.{i}.attn/Attention"
        )
        for i in range(2)
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Attention", ["q", "k", "v"], ["o"], name="blocks.0.attn/Attention"),
            helper.make_node("Softmax", ["s"], ["p"], name="blocks.1.attn/Attention/Softmax"),
        ],
        "g",
        [],
        [],
    )
    fused = _ort_attention(graph, cores)
    assert fused == {
        "blocks.0.attn/Attention": "blocks.0.attn/Attention (ai.onnx.Attention)",
        "blocks.1.attn/Attention": None,
    }


def test_a_masked_core_exported_at_opset_23_runs_on_onnx_runtime_and_stays_fused(tmp_path):
    """wafe-mse's per-key bias is the op's mask; the exporter writes it (batch, heads, 1, keys), which ONNX Runtime's
    CPU kernel refuses, so the export expands it to the full score shape: verified (run in ONNX Runtime at batch
    1, 3, 8 against eager) and still one Attention op per block."""
    from attnzoo.export import export_verified

    torch.manual_seed(0)
    model = create_model("wafe-mse", "cls", "micro", num_classes=10).eval()
    path = tmp_path / "wafe-mse-23.onnx"
    report = export_verified(model, path, model.attnzoo_config, opset=23, batch_sizes=(1, 8))
    assert report["passed"] and report["extra_math"]["ok"]
    graph = onnx.load(str(path)).graph
    made = {o: n for n in graph.node for o in n.output}
    ops = [n for n in graph.node if n.op_type == "Attention"]
    assert len(ops) == DEPTH and all(made[n.input[3]].op_type == "Expand" for n in ops)
    assert onnxruntime_fusion(path)["fused"] == DEPTH


def _core_graph(path, blocks: int) -> None:
    """An ONNX file of ``blocks`` attention cores named as an export names them (scores' MatMul, Softmax, values'
    MatMul per block): what the audit reads besides the runtime's own graph."""
    nodes, x = [], "x"
    for i in range(blocks):
        p = f"blocks.{i}.attn/"
        nodes += [
            helper.make_node("MatMul", [x, "k"], [f"s{i}"], name=p + "MatMul"),
            helper.make_node("Softmax", [f"s{i}"], [f"a{i}"], name=p + "Softmax", axis=-1),
            helper.make_node("MatMul", [f"a{i}", "v"], [f"o{i}"], name=p + "MatMul_1"),
        ]
        x = f"o{i}"
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4, 4]) for n in ("x", "k", "v", x)]
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", io[:3], io[3:])), str(path))


class _Kernel:
    """One executed kernel of OpenVINO's runtime model: its name, layer type and the ONNX ops it computes."""

    class _Info(str):
        def astype(self, kind):
            return str(self)

    def __init__(self, name: str, layer: str, ops: list[str]) -> None:
        self.name, self.rt = name, {"layerType": self._Info(layer), "originalLayersNames": self._Info(",".join(ops))}

    def get_rt_info(self):
        return self.rt

    def get_friendly_name(self):
        return self.name

    def get_type_name(self):
        return "ExecutionNode"


def test_a_core_is_fused_when_one_kernel_computes_all_three_of_its_ops_and_not_when_it_computes_two(
    tmp_path, monkeypatch
):
    """OpenVINO's count at its boundary: block 0's three ops in one kernel (with another op beside them: still one
    kernel) is fused; block 1's softmax and values' product in one kernel, its scores' product in another, is not;
    the count is one of two."""
    from attnzoo.runtime import fusion

    path = tmp_path / "cores.onnx"
    _core_graph(path, 2)
    kernels = [
        _Kernel("k0", "Subgraph", ["blocks.0.attn/MatMul", "blocks.0.attn/Softmax", "blocks.0.attn/MatMul_1", "x"]),
        _Kernel("k1", "MatMul", ["blocks.1.attn/MatMul"]),
        _Kernel("k2", "Subgraph", ["blocks.1.attn/Softmax", "blocks.1.attn/MatMul_1"]),
    ]
    compiled = types.SimpleNamespace(get_runtime_model=lambda: types.SimpleNamespace(get_ordered_ops=lambda: kernels))
    monkeypatch.setattr(fusion, "_openvino_compiled", lambda path, threads=1: compiled)
    result = openvino_fusion(path)
    assert (result["cores"], result["fused"]) == (2, 1) and result["inspected"]
    assert [(c["block"], c["fused"], c["kernel"]) for c in result["per_core"]] == [
        ("blocks.0", True, "k0 (Subgraph)"),
        ("blocks.1", False, None),
    ]
    kernels[1:] = [
        _Kernel("k1", "Subgraph", ["blocks.1.attn/MatMul", "blocks.1.attn/Softmax", "blocks.1.attn/MatMul_1"])
    ]
    assert openvino_fusion(path)["fused"] == 2


def test_onnx_runtime_counts_no_more_fused_cores_than_attention_ops_that_replaced_them():
    """Both softmaxes gone but one attention op in the optimized graph: one core fused, not two; a softmax still
    there is never fused, whatever ops there are."""
    cores = [
        AttentionCore(f"blocks.{i}", f"blocks.{i}.attn/Softmax", f"blocks.{i}.attn/MatMul", f"b{i}/MatMul_1", [])
        for i in range(2)
    ]
    one = helper.make_node("Attention", ["q"], ["o"], name="Attention_0", domain="com.microsoft")
    fused = _ort_attention(helper.make_graph([one], "g", [], []), cores)
    assert fused == {"blocks.0.attn/Softmax": "Attention_0 (com.microsoft.Attention)", "blocks.1.attn/Softmax": None}
    kept = helper.make_node("Softmax", ["s"], ["p"], name="blocks.0.attn/Softmax")
    two = [one, helper.make_node("MultiHeadAttention", ["q"], ["o2"], name="Attention_1", domain="com.microsoft")]
    fused = _ort_attention(helper.make_graph([kept, *two], "g", [], []), cores)
    assert fused == {"blocks.0.attn/Softmax": None, "blocks.1.attn/Softmax": "Attention_0 (com.microsoft.Attention)"}
