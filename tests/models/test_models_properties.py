"""Properties of the variants and models: orthogonality, Prop. 1, numerics, parameter counts, timm fit."""

import pytest
import timm
import torch
from timm.layers import Attention as TimmAttention

from attnzoo.models import (
    ARCHS,
    VARIANT_NAMES,
    VARIANTS,
    Belief2Attention,
    Segmenter,
    StandardAttention,
    attention_class,
    convert_to_belief2,
    count_params,
    create_attention,
    create_model,
    load_timm_state_dict,
    mlp_hidden,
)
from tests.tiers import per_variant

D, M, N, B = 32, 4, 9, 3
#: The variants whose extra math is an orthogonal projection.
PROJECTION_VARIANTS = ("belief", "belief-star", "exclusive", "belief2")


def _capture(module):
    """Record (inputs, outputs) of a sub-module's forward calls."""
    calls = []
    module.register_forward_hook(lambda mod, inp, out: calls.append((inp, out)))
    return calls


# ----------------------------------------------------------------------------- orthogonality
def test_belief_delta_orthogonal_to_v_per_token():
    attn = create_attention("belief", D, M).eval()
    calls = _capture(attn.projection)
    attn(torch.randn(B, N, D))
    (mh, v), (delta, parallel) = calls[0]
    assert delta.shape == (B, N, D)
    cos = (delta * v).sum(-1) / (delta.norm(dim=-1) * v.norm(dim=-1))
    assert cos.abs().max() < 1e-5
    torch.testing.assert_close(delta + parallel, mh)
    assert (delta.norm(dim=-1) <= mh.norm(dim=-1) + 1e-6).all()  # BeliefFormer eq. 11


@pytest.mark.parametrize("name", ["belief-star", "exclusive"])
def test_per_head_delta_orthogonal_to_v_m(name):
    attn = create_attention(name, D, M).eval()
    calls = _capture(attn.head_projection)
    attn(torch.randn(B, N, D))
    (h, v), (delta_s, _) = calls[0]
    assert delta_s.shape == (B, M, N, D // M)  # one projection per head m and token i
    cos = (delta_s * v).sum(-1) / (delta_s.norm(dim=-1) * v.norm(dim=-1))
    assert cos.abs().max() < 1e-5


# ----------------------------------------------------------------------------- Prop. 1
def test_prop1_module_level():
    """phi = identity, no ZZ^T, W^p = W (bias once) -> exactly standard attention."""
    torch.manual_seed(0)
    std = create_attention("standard", D, M, qkv_bias=True).eval()
    b2 = create_attention("belief2", D, M, qkv_bias=True, phi="identity", zz=False).eval()
    b2.load_state_dict(std.state_dict(), strict=False)
    with torch.no_grad():
        b2.proj_p.weight.copy_(std.proj.weight)
        b2.proj_p.bias.zero_()
    x = torch.randn(B, N, D)
    with torch.no_grad():
        torch.testing.assert_close(b2(x), std(x), rtol=0, atol=1e-5)


def test_prop1_whole_model_from_timm_state_dict():
    """A timm ViT-Ti state dict -> attnzoo standard and belief2 (converted) reproduce timm's logits."""
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10).eval()
    sd = ref.state_dict()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        want = ref(x)
        std = create_model("standard", arch="tiny", num_classes=10).eval()
        assert load_timm_state_dict(std, sd) == []
        torch.testing.assert_close(std(x), want, rtol=0, atol=1e-5)
        b2 = convert_to_belief2(sd, arch="tiny", num_classes=10)
        assert b2.attnzoo_config["options"]["phi"] == "identity" and not b2.attnzoo_config["options"]["zz"]
        torch.testing.assert_close(b2(x), want, rtol=0, atol=1e-4)


def test_prop1_converts_a_standard_segmenter():
    torch.manual_seed(0)
    std = create_model("standard", task="seg", num_classes=5, decoder="mask").eval()
    b2 = convert_to_belief2(std)
    x = torch.randn(1, 3, 32, 40)
    with torch.no_grad():
        torch.testing.assert_close(b2(x), std(x), rtol=0, atol=1e-5)


def test_convert_rejects_non_standard_model():
    with pytest.raises(ValueError, match="standard"):
        convert_to_belief2(create_model("belief", num_classes=3))


# ----------------------------------------------------------------------------- timm fit
def test_standard_equals_timm_attention():
    torch.manual_seed(0)
    ours = StandardAttention(D, M, qkv_bias=True).eval()
    theirs = TimmAttention(D, M, qkv_bias=True).eval()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(B, N, D)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x))


EXTRA_KEYS = {
    "standard": set(),
    "belief": set(),
    "exclusive": set(),
    "mabvit-gelu": set(),
    "anti-wafe-dot": set(),
    "wafe-mse": set(),
    "anti-wafe-mse": set(),
    "wafe-mae": set(),
    "anti-wafe-mae": set(),
    "belief-star": {"proj_s"},
    "belief2": {"proj_p", "z"},
    "mabvit-glu": {"v_gate"},
    "horizontal": {"head_a1", "head_a2", "head_b"},
    "vertical": {"chan_u1", "chan_u2", "chan_u"},
    "horizontal-vertical": {"head_a1", "head_a2", "head_b", "chan_u1", "chan_u2", "chan_u"},
}


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_timm_checkpoint_loads_and_extras_are_reported(name):
    sd = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        num_classes=10,
        img_size=32,
        patch_size=4,
        embed_dim=64,
        depth=4,
        num_heads=2,
    ).state_dict()
    model = create_model(name, num_classes=10)
    missing = load_timm_state_dict(model, sd)
    declared = set(VARIANTS[name].extra_weights)  # what the registry found by probing the layer
    assert {k.split(".")[3] for k in missing} == (EXTRA_KEYS[name] if VARIANTS[name].builtin else declared) == declared
    assert all(k.startswith("blocks.") and ".attn." in k for k in missing)


def test_timm_checkpoint_shape_mismatch_is_named():
    sd = create_model("standard", num_classes=10).state_dict()
    with pytest.raises(ValueError, match=r"shape mismatches: blocks\.0\.mlp\.fc1\.bias: \(256,\) vs \(192,\)"):
        load_timm_state_dict(create_model("mabvit-glu", num_classes=10, pr=True), sd)
    with pytest.raises(ValueError, match="unexpected keys: bogus"):
        load_timm_state_dict(create_model("standard", num_classes=10), {**sd, "bogus": torch.zeros(1)})


def test_variant_is_a_timm_attn_layer():
    cls = attention_class("belief2", phi="silu")
    vit = timm.models.VisionTransformer(
        img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4, attn_layer=cls
    )
    assert isinstance(vit.blocks[0].attn, Belief2Attention) and vit.blocks[0].attn.phi_name == "silu"
    assert vit(torch.randn(1, 3, 32, 32)).shape == (1, 4)


# ----------------------------------------------------------------------------- numerics
def _zero_values(attn):
    """Zero the value projection: every V row becomes 0."""
    with torch.no_grad():
        attn.qkv.weight[2 * attn.attn_dim :].zero_()
        if attn.qkv.bias is not None:
            attn.qkv.bias[2 * attn.attn_dim :].zero_()


@pytest.mark.parametrize("name", PROJECTION_VARIANTS)
def test_zero_value_rows_give_finite_outputs(name):
    torch.manual_seed(0)
    attn = create_attention(name, D, M, qkv_bias=False).eval()
    x = torch.randn(B, N, D)
    x[:, 2] = 0.0  # no bias: this token's V row is exactly zero, <V, V> = 0
    with torch.no_grad():
        out = attn(x)
        assert torch.isfinite(out).all()
        _zero_values(attn)  # every V row zero
        out = attn(x)
    assert torch.isfinite(out).all()
    if name == "belief":  # MH = 0 and alpha = 0 -> the update is proj's bias
        torch.testing.assert_close(out, attn.proj.bias.expand_as(out))


@pytest.mark.parametrize("name", PROJECTION_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_forward_with_overflowing_inner_products_is_finite(name, dtype):
    torch.manual_seed(0)
    attn = create_attention(name, D, M).eval()
    with torch.no_grad():
        attn.qkv.weight[2 * attn.attn_dim :].mul_(250.0)  # |V| ~ 100s: sum(V*V) exceeds fp16's 65504
    attn = attn.to(dtype)
    x = torch.randn(B, N, D, dtype=dtype)
    with torch.no_grad():
        v = attn.project_qkv(x)[2]
        if dtype == torch.float16:  # the naive 16-bit inner product really overflows
            assert torch.isinf((v * v).sum(-1)).any()
        out = attn(x)
    assert out.dtype == dtype and torch.isfinite(out).all()


def test_horizontal_weights_sum_to_one_over_heads():
    attn = create_attention("horizontal", D, M).eval()
    x = torch.randn(B, N, D)
    q, k, v = attn.project_qkv(x)
    h = attn.scores_attention(x, q, k, v, None, False)
    w = attn.head_weights(x, h)
    assert w.shape == (B, M, N, 1) and (w >= 0).all()
    torch.testing.assert_close(w.sum(dim=1), torch.ones(B, N, 1))


def test_vertical_gates_in_open_unit_interval():
    attn = create_attention("vertical", D, M).eval()
    x = torch.randn(B, N, D) * 3
    gate = attn.channel_gate(x, attn.proj(x))
    assert gate.shape == (B, N, D) and ((gate > 0) & (gate < 1)).all()


# ----------------------------------------------------------------------------- parameter counts
@pytest.mark.parametrize("arch", ["micro", "tiny"])
def test_parameter_counts(arch):
    a = ARCHS[arch]
    dim, depth = a["embed_dim"], a["depth"]
    n = {
        name: count_params(create_model(name, arch=arch, num_classes=10, **opts))
        for name, opts in [
            ("standard", {}),
            ("belief", {}),
            ("belief-star", {}),
            ("mabvit-glu", {}),
            ("mabvit-gelu", {}),
            ("belief2", {"param_matched": True}),
        ]
    }
    n["glu-pr"] = count_params(create_model("mabvit-glu", arch=arch, num_classes=10, pr=True))
    n["gelu-pr"] = count_params(create_model("mabvit-gelu", arch=arch, num_classes=10, pr=True))
    assert n["belief"] == n["standard"] == n["mabvit-gelu"]
    assert n["belief-star"] == n["standard"] + depth * (dim * dim + dim)
    assert abs(n["belief2"] - n["standard"]) / n["standard"] < 0.01
    # each hidden unit costs 2D + 1 parameters; Belief2 adds W^p (D x D + bias) and W^Z (D x D)
    assert mlp_hidden("belief2", arch, param_matched=True) == 4 * dim - round((2 * dim * dim + dim) / (2 * dim + 1))
    assert mlp_hidden("belief2", arch, param_matched=True, zz=False) == 4 * dim - round(
        (dim * dim + dim) / (2 * dim + 1)
    )
    assert n["glu-pr"] < n["standard"] < n["mabvit-glu"]
    assert n["gelu-pr"] < n["standard"]


# ----------------------------------------------------------------------------- every variant builds and trains
def _forward_backward(name, arch, cls_size, seg_size, seg_hw):
    torch.manual_seed(0)
    cls = create_model(name, task="cls", arch=arch, num_classes=7, img_size=cls_size)
    y = cls(torch.randn(1, 3, cls.attnzoo_config["img_size"], cls.attnzoo_config["img_size"]))
    assert y.shape == (1, 7)
    y.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in cls.parameters() if p.requires_grad)
    # segmentation at a non-square size that is not a multiple of the patch size
    seg = create_model(name, task="seg", arch=arch, num_classes=5, img_size=seg_size)
    out = seg(torch.randn(1, 3, *seg_hw))
    assert out.shape == (1, 5, *seg_hw)
    out.mean().backward()
    assert torch.isfinite(seg.encoder.blocks[0].attn.qkv.weight.grad).all()


@pytest.mark.parametrize("arch", ["micro", "tiny"])
@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_every_variant_cls_and_seg_forward_backward(name, arch):
    """micro at its 32 px; tiny (192/12/3) at 64 px to keep the suite fast (224 px: the slow test below)."""
    _forward_backward(
        name,
        arch,
        None if arch == "micro" else 64,
        None if arch == "micro" else 64,
        (30, 41) if arch == "micro" else (70, 50),
    )


@pytest.mark.parametrize("name", per_variant(VARIANT_NAMES))
def test_every_variant_tiny_at_224(name):
    _forward_backward(name, "tiny", 224, 224, (230, 190))


@pytest.mark.parametrize("opts", [{"parallel": True}, {"pr": True}, {"parallel": True, "pr": True}])
def test_mabvit_block_options(opts):
    model = create_model("mabvit-glu", num_classes=3, **opts)
    blk = model.blocks[0]
    assert hasattr(blk, "norm2") != bool(opts.get("parallel"))
    assert blk.mlp.fc1.out_features == (3 if opts.get("pr") else 4) * model.embed_dim
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)


def test_segmenter_mask_decoder_and_sliding_window():
    torch.manual_seed(0)
    seg = create_model("belief2", task="seg", num_classes=4, decoder="mask").eval()
    assert isinstance(seg, Segmenter)
    big = torch.randn(1, 3, 70, 45)
    with torch.no_grad():
        out = seg.forward_sliding(big)
        small = torch.randn(1, 3, 20, 28)
        torch.testing.assert_close(seg.forward_sliding(small), seg(small))
    assert out.shape == (1, 4, 70, 45) and torch.isfinite(out).all()


def test_alias_wafe_dot_is_standard():
    assert VARIANTS["wafe-dot"] is VARIANTS["standard"]
    torch.manual_seed(0)
    a = create_model("wafe-dot", num_classes=3)
    torch.manual_seed(0)
    b = create_model("standard", num_classes=3)
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(a(x), b(x))
    assert a.attnzoo_config["variant"] == "standard"


# ----------------------------------------------------------------------------- bad inputs
def test_unknown_variant_lists_valid_names():
    with pytest.raises(ValueError, match="unknown variant 'beleif'.*valid variants: anti-wafe-dot.*belief2"):
        create_model("beleif")
    with pytest.raises(ValueError, match="unknown variant"):
        create_attention("nope", D, M)


def test_unknown_option_lists_valid_options():
    with pytest.raises(ValueError, match=r"unknown option\(s\) zz for variant 'belief'; valid options: eps"):
        create_model("belief", zz=True)
    with pytest.raises(ValueError, match="unknown phi 'relu'; valid: identity, gelu, silu"):
        create_model("belief2", phi="relu")


def test_unknown_task_arch_decoder():
    with pytest.raises(ValueError, match="unknown task 'det'; valid: cls, seg"):
        create_model("standard", task="det")
    with pytest.raises(ValueError, match="unknown arch 'huge'; valid: micro, micro-conv, tiny, small, base"):
        create_model("standard", arch="huge")
    with pytest.raises(ValueError, match="unknown decoder"):
        create_model("standard", task="seg", decoder="fpn")


def test_wrong_input_rank():
    with pytest.raises(ValueError, match=r"expects tokens of shape \(batch, tokens, 32\), got \(9, 32\)"):
        create_attention("belief", D, M)(torch.randn(N, D))
    with pytest.raises(ValueError, match=r"Segmenter expects images of shape \(batch, 3, H, W\)"):
        create_model("standard", task="seg", num_classes=3)(torch.randn(3, 32, 32))
