"""Any timm ViT -> Belief2 (Belief2 paper, Prop. 1), and its export with the model's own input contract.

The reference is the source timm model itself: the converted model must compute its function in fp32 to
~1e-6. Weights are re-drawn at unit scale (timm's init is 0.02-scale and LayerScale 1e-5, which would hide
the attention branch), and each test also shows the branch matters: zeroing ``W^p`` moves the logits by O(1).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from timm.layers import Attention as TimmAttention
from timm.models.vision_transformer import ParallelScalingBlock, ResPostBlock, VisionTransformer

from attnzoo.export.check import check_extra_math
from attnzoo.export.onnx_export import config_hw, export_onnx
from attnzoo.export.verify import verify_onnx
from attnzoo.models import Belief2Attention, attention_class, convert_to_belief2, create_model
from attnzoo.models.factory import TIMM_DEFAULT_ARCH
from attnzoo.runtime.contract import metadata_props
from attnzoo.runtime.parity import TOLERANCES

#: fp32 agreement demanded by Prop. 1 (measured 3e-7 to 1e-6 on these models, logits of magnitude 1-3).
PROP1_ATOL = 5e-6

#: Small random-init timm ViTs: patch size, width, depth, heads, LayerScale, class/register tokens, pooling.
SHAPES: dict[str, dict[str, Any]] = {
    "p14-layerscale-reg4": dict(
        img_size=28, patch_size=14, embed_dim=48, depth=3, num_heads=3, init_values=1e-5, reg_tokens=4
    ),
    "p4-noclass-avg-nonsquare": dict(
        img_size=(32, 48), patch_size=4, embed_dim=64, depth=2, num_heads=4, class_token=False, global_pool="avg"
    ),
    "p8-qknorm-respost-map": dict(
        img_size=40,
        patch_size=8,
        embed_dim=32,
        depth=3,
        num_heads=2,
        qk_norm=True,
        qkv_bias=False,
        block_fn=ResPostBlock,
        global_pool="map",
    ),
}


def _rerandomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Unit-scale weights: matrices ~ N(0, 1/fan_in), norm and LayerScale gains ~ 1 + N(0, 0.25), biases
    ~ N(0, 0.25)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() >= 2:
                p.copy_(noise / p[0].numel() ** 0.5)
            else:
                gain = name.endswith(("norm1.weight", "norm2.weight", "norm.weight", "gamma"))
                p.copy_(noise * 0.5 + (1.0 if gain else 0.0))
    return model.eval()


def _timm_vit(name: str) -> VisionTransformer:
    torch.manual_seed(0)
    return _rerandomize(VisionTransformer(num_classes=7, **SHAPES[name]))


def _dinov2_like() -> VisionTransformer:
    """timm's own ``vit_small_patch14_reg4_dinov2`` recipe (patch 14, LayerScale, 4 registers), shrunk."""
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_small_patch14_reg4_dinov2",
        pretrained=False,
        img_size=28,
        depth=2,
        embed_dim=48,
        num_heads=3,
        num_classes=5,
    )
    return _rerandomize(model)


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


@pytest.mark.parametrize("name", [*SHAPES, "dinov2-like"])
def test_prop1_timm_vit_same_function(name):
    src = _dinov2_like() if name == "dinov2-like" else _timm_vit(name)
    b2 = convert_to_belief2(src)
    x = torch.randn(4, 3, *config_hw(b2.attnzoo_config), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = src(x), b2(x)
        assert want.abs().max() > 0.5  # the logits are not vanishingly small
        assert _max_err(got, want) <= PROP1_ATOL
        for blk in b2.blocks:  # the same check fails once W^p no longer equals W
            blk.attn.proj_p.weight.zero_()
        assert _max_err(b2(x), want) > 1e-2
    assert all(type(blk.attn) is TimmAttention for blk in src.blocks)  # the source is left as it was


def test_converted_model_structure_and_config():
    src = _timm_vit("p14-layerscale-reg4")
    b2 = convert_to_belief2(src)
    assert all(
        isinstance(blk.attn, Belief2Attention) and blk.attn.phi_name == "identity" and not blk.attn.zz
        for blk in b2.blocks
    )
    attn, ref = b2.blocks[1].attn, src.blocks[1].attn
    assert torch.equal(attn.proj_p.weight, ref.proj.weight) and not attn.proj_p.bias.any()
    assert torch.equal(attn.qkv.weight, ref.qkv.weight) and attn.qkv.weight is not ref.qkv.weight
    cfg = b2.attnzoo_config
    assert (cfg["variant"], cfg["task"], cfg["arch"], cfg["num_classes"], cfg["img_size"]) == (
        "belief2",
        "cls",
        TIMM_DEFAULT_ARCH,
        7,
        28,
    )
    assert cfg["options"] == {"phi": "identity", "zz": False, "eps": attn.projection.eps, "param_matched": False}
    # no pretrained_cfg: timm's documented default normalisation
    assert cfg["mean"] == pytest.approx(IMAGENET_DEFAULT_MEAN) and cfg["std"] == pytest.approx(IMAGENET_DEFAULT_STD)
    assert cfg["timm"] == {
        "class": "VisionTransformer",
        "patch_size": [14, 14],
        "embed_dim": 48,
        "depth": 3,
        "num_heads": 3,
        "class_token": True,
        "reg_tokens": 4,
        "layer_scale": True,
        "global_pool": "token",
    }
    assert not b2.training


def _export_and_check(model: torch.nn.Module, path) -> dict[str, str]:
    """``export_onnx`` with no config; the extra-math check (block count from the graph) and parity pass."""
    export_onnx(model, path)
    props = metadata_props(path)
    check = check_extra_math(path)
    assert check["ok"], check["failures"]
    assert check["depth"] == len(model.blocks)
    parity = verify_onnx(
        model, path, model.attnzoo_config, batch_sizes=(2,), input_hw=tuple(json.loads(props["input_size"]))
    )
    assert parity["passed"], parity["failures"]
    assert parity["max_abs_err"] <= TOLERANCES["fp32"]
    return props


@pytest.mark.slow
def test_export_uses_the_models_own_mean_std_and_input_size(tmp_path):
    """A timm model with a pretrained_cfg (CLIP normalisation) and a non-square bare one."""
    torch.manual_seed(0)
    clip = timm.create_model(
        "vit_base_patch16_clip_224", pretrained=False, img_size=32, depth=3, embed_dim=64, num_heads=2, num_classes=5
    )
    props = _export_and_check(convert_to_belief2(_rerandomize(clip)), tmp_path / "clip.onnx")
    assert json.loads(props["mean"]) == pytest.approx(OPENAI_CLIP_MEAN)
    assert json.loads(props["std"]) == pytest.approx(OPENAI_CLIP_STD)
    assert json.loads(props["input_size"]) == [32, 32]
    assert (props["variant"], props["arch"]) == ("belief2", "vit_base_patch16_clip_224")
    assert json.loads(props["options"])["phi"] == "identity"
    props = _export_and_check(convert_to_belief2(_timm_vit("p4-noclass-avg-nonsquare")), tmp_path / "wide.onnx")
    assert json.loads(props["input_size"]) == [32, 48]
    assert json.loads(props["mean"]) == pytest.approx(IMAGENET_DEFAULT_MEAN)


def test_export_patch14_layerscale_registers(tmp_path):
    _export_and_check(convert_to_belief2(_dinov2_like()), tmp_path / "dinov2.onnx")


def test_check_extra_math_counts_blocks_from_the_graph(tmp_path):
    import onnx

    b2 = convert_to_belief2(_timm_vit("p14-layerscale-reg4"))  # depth 3: in no ARCHS table
    path = export_onnx(b2, tmp_path / "m.onnx")
    proto = onnx.load(str(path))
    for node in proto.graph.node:  # hide the middle block's projection
        if node.name.startswith("blocks.1.attn.projection/"):
            node.name = node.name.replace("blocks.1.attn.projection/", "blocks.1.attn.elsewhere/")
    result = check_extra_math(proto)
    assert result["depth"] == 3
    assert not result["ok"] and any(f.startswith("blocks.1.attn.projection: no nodes") for f in result["failures"])


# ------------------------------------------------------------------------------------------------ refusals
def test_refuses_non_standard_attention():
    vit = VisionTransformer(
        img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2, attn_layer=attention_class("belief-star")
    )
    with pytest.raises(ValueError, match=r"blocks\.0\.attn is a .*not standard attention"):
        convert_to_belief2(vit)


def test_accepts_attnzoo_standard_attention_in_a_timm_vit():
    torch.manual_seed(0)
    vit = _rerandomize(
        VisionTransformer(
            img_size=16,
            patch_size=8,
            embed_dim=32,
            depth=2,
            num_heads=2,
            attn_layer=attention_class("standard"),
            num_classes=3,
        )
    )
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert _max_err(convert_to_belief2(vit)(x), vit(x)) <= PROP1_ATOL


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(scale_attn_norm=True), "scale_norm"),
        (dict(block_fn=ParallelScalingBlock), "ParallelScalingBlock"),
    ],
)
def test_refuses_what_prop1_does_not_cover(kwargs, match):
    vit = VisionTransformer(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2, **kwargs)
    with pytest.raises(ValueError, match=match):
        convert_to_belief2(vit)


def test_refuses_other_modules_and_stray_keywords():
    with pytest.raises(ValueError, match="timm VisionTransformer"):
        convert_to_belief2(torch.nn.Linear(3, 3))
    with pytest.raises(ValueError, match="only for a state dict"):
        convert_to_belief2(create_model("standard", num_classes=3), arch="tiny")


def test_forward_memory_estimate_reads_the_converted_vits_own_shape():
    """The memory check before an export takes patch size, width, heads and prefix tokens from the timm ViT
    (a converted model's arch is its timm name, not an attnzoo arch)."""
    from attnzoo.models.memory import forward_bytes

    config = convert_to_belief2(_timm_vit("p14-layerscale-reg4")).attnzoo_config
    tokens, dim, heads = (28 // 14) ** 2 + 1 + 4, 48, 3  # 2 x 2 patches, a class token and 4 registers
    per_image = 2 * heads * tokens**2 + 20 * tokens * dim + 3 * 28 * 28  # scores, token tensors, input
    assert forward_bytes(config, (28, 28), 2) == 4 * per_image * 2
