"""Every variant against an explicit, slow reference written from its paper's equations (float64).

The references below do not call any attnzoo code: they read the layer's weight tensors and evaluate the
equations token by token / head by head with plain torch arithmetic in float64.
"""

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from attnzoo.models import VARIANT_NAMES, VARIANTS, create_attention, wafe
from attnzoo.models.wafe import MAE_BLOCK, auto_mae_impl, export_mae_impl, mae_block, pairwise_l1

D, M, N, B = 32, 4, 7, 2
d = D // M
EPS = 1e-6


def _lin(x, layer):
    """x W^T + b in float64 from a layer's parameters."""
    y = x @ layer.weight.double().T
    return y + layer.bias.double() if layer.bias is not None else y


def _heads(attn, x):
    """Q_m, K_m, V_m (lists over heads of (B, N, d)) from the fused qkv weight; timm's layout [Q | K | V]."""
    qkv = _lin(x, attn.qkv)
    q, k, v = qkv[..., :D], qkv[..., D : 2 * D], qkv[..., 2 * D :]
    split = lambda t: [t[..., m * d : (m + 1) * d] for m in range(M)]  # noqa: E731
    return split(q), split(k), split(v)


def _softmax_rows(s):
    s = s - s.max(dim=-1, keepdim=True).values
    e = s.exp()
    return e / e.sum(dim=-1, keepdim=True)


def _dot_scores(q, k, sign=1.0):
    return sign * (q @ k.transpose(-1, -2)) / math.sqrt(d)


def _pairwise(q, k, p):
    """S[i, j] = ||q_i - k_j||_p^p, by an explicit loop over the queries i (all keys j at once)."""
    out = torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype)
    for i in range(q.shape[1]):
        diff = q[:, i : i + 1] - k  # (B, Nk, d): q_i against every k_j
        out[:, i] = (diff.abs() if p == 1 else diff * diff).sum(-1)
    return out


def _masked(s, mask, causal):
    """Scores (B, Nq, Nk) with a boolean (True = keep) or additive mask (B, 1, Nq, Nk) and/or causal: key j
    is dropped (-inf) for query i when j > i."""
    if mask is not None:
        s = s.masked_fill(~mask[:, 0], float("-inf")) if mask.dtype == torch.bool else s + mask[:, 0].double()
    if causal:
        later = torch.ones(s.shape[-2:], dtype=torch.bool).triu(1)  # [i, j] = j > i
        s = s.masked_fill(later, float("-inf"))
    return s


def _project(a, v):
    """Per-row orthogonal projection (BeliefFormer eq. 10/13 with <v,v> + eps): returns (perp, parallel)."""
    coef = (a * v).sum(-1, keepdim=True) / ((v * v).sum(-1, keepdim=True) + EPS)
    return a - coef * v, coef * v


def _signed(sign, p):
    """WAFE eq. 5/6 scores: ``sign * ||q_i - k_j||_p^p / d`` (WAFE -1, anti-WAFE +1; p = 1 MAE, 2 MSE)."""
    return lambda attn, x, m, q, k: sign * _pairwise(q, k, p) / d


def _dot(sign=1.0):
    return lambda attn, x, m, q, k: _dot_scores(q, k, sign)


def _zz_scores(attn, x, m, q, k):
    """Improved Belief-Attention eq. 11: (Q K^T + Z Z^T) / sqrt(d)."""
    z = _lin(x, attn.z)[..., m * d : (m + 1) * d]
    return (q @ k.transpose(-1, -2) + z @ z.transpose(-1, -2)) / math.sqrt(d)


def _cosine_scores(attn, x, m, q, k):
    """Swin Transformer V2 eq. 2 (B = 0): cos(q_i, k_j) / max(tau_m, 0.01) (the example plugin's variant)."""
    cos = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)
    return cos / attn.cosine.tau.double().ravel()[m].clamp(min=0.01)


def _glu_values(attn, x, V):
    """MABViT: V = (X W^a) * SiLU(X W^b)."""
    gate = _lin(x, attn.v_gate)
    return [V[m] * F.silu(gate[..., m * d : (m + 1) * d]) for m in range(M)]


def _gelu_values(attn, x, V):
    """MABViT: V = GELU(X W^V)."""
    return [F.gelu(v) for v in V]


def _plain_out(attn, x, H, V):
    return _lin(torch.cat(H, -1), attn.proj)


def _belief_out(attn, x, H, V):
    """BeliefFormer eq. 10-12: the part of MH orthogonal to V."""
    return _lin(_project(torch.cat(H, -1), torch.cat(V, -1))[0], attn.proj)


def _belief_star_out(attn, x, H, V):
    """BeliefFormer eq. 13-15: eq. 12 plus each head's own orthogonal part through its projection."""
    delta_s = torch.cat([_project(H[m], V[m])[0] for m in range(M)], -1)
    return _belief_out(attn, x, H, V) + _lin(delta_s, attn.proj_s)


def _exclusive_out(attn, x, H, V):
    """BeliefFormer Remark 1: each head's orthogonal part only."""
    return _lin(torch.cat([_project(H[m], V[m])[0] for m in range(M)], -1), attn.proj)


def _belief2_out(attn, x, H, V):
    """Improved Belief-Attention eq. 15 with phi = GELU (the default)."""
    perp, par = _project(torch.cat(H, -1), torch.cat(V, -1))
    return _lin(perp, attn.proj) + _lin(F.gelu(par), attn.proj_p)


def _horizontal(attn, x, H):
    """HV paper eq. 5-6, per token: the heads weighted by a softmax over heads of a small MLP's scores."""
    a_x = x @ attn.head_a2.weight.double().T
    b = torch.stack(
        [
            F.relu(H[m] @ attn.head_a1.weight.double().T + a_x) @ attn.head_b.weight.double()[0]
            + attn.head_b.bias.double()[0]
            for m in range(M)
        ],
        dim=-1,
    )  # (B, N, M)
    alpha = _softmax_rows(b)
    return torch.cat([alpha[..., m : m + 1] * H[m] for m in range(M)], -1)


def _vertical(attn, x, Y):
    """HV paper eq. 7-8, per token: the output gated channel-wise by a sigmoid of a small MLP."""
    U = F.relu(x @ attn.chan_u1.weight.double().T + Y @ attn.chan_u2.weight.double().T)
    return torch.sigmoid(_lin(U, attn.chan_u)) * Y


def _hv_out(horizontal, vertical):
    def out(attn, x, H, V):
        Y = _lin(_horizontal(attn, x, H) if horizontal else torch.cat(H, -1), attn.proj)
        return _vertical(attn, x, Y) if vertical else Y

    return out


@dataclass(frozen=True)
class Equations:
    """One variant's update from its paper, in three parts (float64, plain torch arithmetic).

    Attributes:
        scores: ``(attn, x, m, Q_m, K_m) -> S_m`` (B, Nq, Nk), before the mask and the softmax.
        output: ``(attn, x, H, V) -> Y`` (B, N, D) from the heads' ``softmax(S_m) V_m`` and values.
        values: ``(attn, x, V) -> V`` (the per-head values), where the variant changes them.
    """

    scores: Callable = _dot()
    output: Callable = _plain_out
    values: Callable | None = None


#: Every variant's reference, by name (docs/variants.md, "What each variant computes"). A registered variant
#: missing here fails test_every_registered_variant_has_a_reference, which names it: write its equations here.
REFERENCES: dict[str, Equations] = {
    "standard": Equations(),
    "belief": Equations(output=_belief_out),
    "belief-star": Equations(output=_belief_star_out),
    "exclusive": Equations(output=_exclusive_out),
    "belief2": Equations(scores=_zz_scores, output=_belief2_out),
    "mabvit-glu": Equations(values=_glu_values),
    "mabvit-gelu": Equations(values=_gelu_values),
    "anti-wafe-dot": Equations(scores=_dot(-1.0)),
    "wafe-mse": Equations(scores=_signed(-1.0, 2)),
    "anti-wafe-mse": Equations(scores=_signed(1.0, 2)),
    "wafe-mae": Equations(scores=_signed(-1.0, 1)),
    "anti-wafe-mae": Equations(scores=_signed(1.0, 1)),
    "horizontal": Equations(output=_hv_out(True, False)),
    "vertical": Equations(output=_hv_out(False, True)),
    "horizontal-vertical": Equations(output=_hv_out(True, True)),
    "cosine": Equations(scores=_cosine_scores),  # examples/attnzoo-cosine, when installed
}


def unreferenced() -> list[str]:
    """The registered variants (built-in and plugins) with no entry in :data:`REFERENCES`."""
    return [name for name in VARIANT_NAMES if name not in REFERENCES]


def reference(name, attn, x, mask=None, causal=False):
    """The variant's update written from its equations (:data:`REFERENCES`), float64; ``mask`` and ``causal`` act
    on every head's scores before the softmax."""
    eq = REFERENCES[name]
    Q, K, V = _heads(attn, x)
    if eq.values is not None:
        V = eq.values(attn, x, V)
    H = [_softmax_rows(_masked(eq.scores(attn, x, m, Q[m], K[m]), mask, causal)) @ V[m] for m in range(M)]
    return eq.output(attn, x, H, V)


def test_every_registered_variant_has_a_reference():
    """The table covers the registry: a variant registered without its paper's equations here fails, named."""
    assert unreferenced() == [], f"no reference in tests/models/test_models_reference.py for: {unreferenced()}"


def test_a_variant_without_a_reference_is_named(registry_restored):
    """The coverage check can fail: a variant registered here (a StandardAttention under a new name) has no
    reference, and the check names it, and its reference refuses to fall back to another variant's."""
    from attnzoo.models import StandardAttention, register_variant

    class Unreferenced(StandardAttention):
        """Standard attention under a name of its own."""

    register_variant("tp-unreferenced", Unreferenced, paper="Test paper, https://example.org", equations="eq. 1")
    assert unreferenced() == ["tp-unreferenced"]
    with pytest.raises(KeyError, match="tp-unreferenced"):
        reference("tp-unreferenced", _layer("standard"), torch.randn(B, N, D, dtype=torch.float64))


def _layer(name, seed=0, **opts):
    torch.manual_seed(seed)
    attn = create_attention(name, D, M, qkv_bias=True, **opts).eval()
    with torch.no_grad():  # non-trivial biases everywhere
        for p in attn.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return attn


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_matches_reference_fp32(name):
    attn = _layer(name)
    x = torch.randn(B, N, D)
    with torch.no_grad():
        out = attn(x)
    ref = reference(name, attn, x.double())
    assert out.dtype == torch.float32 and out.shape == (B, N, D)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("impl", ["fused", "tiled", "cdist", "broadcast", "blocked"])
@pytest.mark.parametrize("name", ["wafe-mae", "anti-wafe-mae"])
def test_mae_impls_match_reference(name, impl):
    """Every form of the MAE core, run eagerly, against the paper's eq. 5/6 (``auto`` runs ``fused`` here; the
    training form, ``cdist``, is checked with gradients below)."""
    attn = _layer(name, mae_impl=impl)
    x = torch.randn(B, N, D)
    with torch.no_grad():
        out = attn(x)
    torch.testing.assert_close(out.double(), reference(name, attn, x.double()), rtol=0, atol=1e-5)


# ------------------------------------------------------------------------ fused cores, masks, long sequences
MASKS = ("none", "bool", "float", "causal", "bool+causal")
#: (tokens, mask) of the core checks: a ViT at 224 px, and 37, a multiple of no kernel block, with every mask.
CORE_CASES = [(197, "none"), (197, "bool+causal"), *((37, kind) for kind in MASKS)]
#: Variants whose scores are dot products (with a sign, a per-key bias or Z Z^T): one fused kernel each.
DOT_VARIANTS = [v for v in VARIANT_NAMES if not VARIANTS[v].pairwise_scores]
MAE_VARIANTS = [v for v in VARIANT_NAMES if VARIANTS[v].pairwise_scores]


def _mask(kind, n, seed=1):
    """A (B, 1, n, n) boolean (True = keep; every query keeps itself) or additive mask, or None."""
    gen = torch.Generator().manual_seed(seed)
    if kind.startswith("bool"):
        return (torch.rand(B, 1, n, n, generator=gen) > 0.3) | torch.eye(n, dtype=torch.bool)
    return torch.randn(B, 1, n, n, generator=gen) if kind == "float" else None


@pytest.mark.parametrize("n,kind", CORE_CASES)
@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_core_matches_reference_with_masks(name, n, kind):
    """Each variant's core (fused kernel, MAE distance) against its paper's equation, fp32, with boolean and
    additive masks, causal, and a mask with causal (the fused kernel takes them as one mask)."""
    attn = _layer(name)
    x = torch.randn(B, n, D, generator=torch.Generator().manual_seed(2))
    mask, causal = _mask(kind, n), kind.endswith("causal")
    with torch.no_grad():
        out = attn(x, attn_mask=mask, is_causal=causal)
    ref = reference(name, attn, x.double(), mask, causal)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)


def _profiled_ops(attn, x, **kwargs):
    with torch.no_grad(), torch.profiler.profile(profile_memory=True) as prof:
        attn(x, **kwargs)
    return prof.events()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", DOT_VARIANTS)
def test_dot_product_cores_run_one_fused_kernel(name, causal):
    """softmax(S) V of every dot-product variant is PyTorch's fused flash kernel on the CPU (never its unfused
    math fallback, which stores the N x N weights): Belief2's [Q|Z] [K|Z]^T included."""
    ops = {e.name for e in _profiled_ops(_layer(name), torch.randn(B, 197, D), is_causal=causal)}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops


@pytest.mark.parametrize("name", MAE_VARIANTS)
def test_mae_core_never_stores_the_differences(name):
    """No tensor of the (B, M, N, N, d) differences |q_i - k_j|: the fused core (eager inference) holds one tile
    of scores (all of them where they fit one, as at 197 tokens here), never more; the cdist form (training)
    holds the scores, not the differences."""
    from attnzoo.models.kernels import TILE_ELEMENTS

    for n in (197, 400):
        x = torch.randn(B, n, D)
        scores = B * M * n * n * 4
        biggest = max(e.self_cpu_memory_usage for e in _profiled_ops(_layer(name), x))
        assert biggest <= min(scores, 4 * TILE_ELEMENTS), n
    n = 197
    scores = B * M * n * n * 4
    biggest = max(e.self_cpu_memory_usage for e in _profiled_ops(_layer(name, mae_impl="cdist"), torch.randn(B, n, D)))
    assert scores <= biggest < scores * d / 2


@pytest.mark.parametrize("name", MAE_VARIANTS)
def test_mae_training_path_gradients_match_reference(name):
    """Where autograd records, ``auto`` runs the cdist form: its output and its gradients for the layer's weights
    against autograd through the float64 reference of eq. 5/6."""
    attn = _layer(name)
    x = torch.randn(B, N, D, generator=torch.Generator().manual_seed(7))
    assert attn.distance.resolved(needs_grad=True) == "cdist"
    out = attn(x)
    grads = torch.autograd.grad(out.square().sum(), [attn.qkv.weight, attn.proj.weight])
    ref_attn = _layer(name).double()
    ref = reference(name, ref_attn, x.double())
    ref_grads = torch.autograd.grad(ref.square().sum(), [ref_attn.qkv.weight, ref_attn.proj.weight])
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-4)


def test_auto_mae_impl_follows_the_tracer(monkeypatch):
    """mae_impl="auto": the fused op in eager inference, cdist where autograd records and under a plain
    torch.export (ExecuTorch runs the program with its own kernels), what export_mae_impl sets under it, the
    fused op under torch.compile on the CPU (its Numba kernel; the compiler keeps the op as one call), the tiled
    core there where Numba is missing (the compiler fuses each tile); the ONNX export's blocked form is tested
    there."""
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(auto_mae_impl(device=x.device))
            return x + 1

    probe = Probe()
    probe(torch.zeros(1))
    assert auto_mae_impl(needs_grad=True) == "cdist"
    with warnings.catch_warnings(record=True) as caught:  # the kernel check is traced as plain code
        warnings.simplefilter("always")
        torch.compile(probe, backend="eager", fullgraph=True)(torch.zeros(1))
    assert not [w for w in caught if "cache" in str(w.message)], [str(w.message) for w in caught]
    compiled = len(seen)
    torch.export.export(probe, (torch.zeros(1),))
    exported = len(seen)
    with export_mae_impl("tiled"):
        torch.export.export(probe, (torch.zeros(1),))
    assert seen[0] == "fused"
    assert set(seen[1:compiled]) == {"fused"}
    assert set(seen[compiled:exported]) == {"cdist"}
    assert set(seen[exported:]) == {"tiled"}
    with pytest.raises(ValueError, match="unknown mae_impl 'nope'"), export_mae_impl("nope"):
        pass
    seen.clear()
    torch._dynamo.reset()
    monkeypatch.setattr(wafe, "cpu_kernel_unavailable_reason", lambda: "Numba is not installed")
    torch.compile(probe, backend="eager", fullgraph=True)(torch.zeros(1))
    assert seen and set(seen) == {"tiled"}


@pytest.mark.slow
def test_compiled_mae_core_matches_reference():
    """torch.compile (Inductor, CPU) of an MAE layer: the tiled core, one loop per tile, against eq. 5, and no
    allocation of the (B, M, N, N, d) differences (anti-WAFE differs by the sign only)."""
    name, n = "wafe-mae", 37
    attn = _layer(name)
    x = torch.randn(B, n, D, generator=torch.Generator().manual_seed(2))
    compiled = torch.compile(attn, fullgraph=True)
    with torch.no_grad():
        out = compiled(x)
    torch.testing.assert_close(out.double(), reference(name, attn, x.double()), rtol=0, atol=1e-5)
    biggest = max(e.self_cpu_memory_usage for e in _profiled_ops(compiled, x))
    assert biggest < B * M * n * n * d * 4 / 2


@pytest.mark.parametrize("block", [1, 4, 13, 50, None])
def test_pairwise_l1_equals_sum_of_absolute_differences(block):
    """pairwise_l1 (2 sum max - sum q - sum k, blocked) == sum_c |q_ic - k_jc| by explicit loops, Nq != Nk."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 13, 5, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, 9, 5, generator=gen, dtype=torch.float64)
    ref = _pairwise(q.reshape(6, 13, 5), k.reshape(6, 9, 5), 1).reshape(2, 3, 13, 9)
    torch.testing.assert_close(pairwise_l1(q, k, block), ref, rtol=0, atol=1e-12)


def test_pairwise_l1_block_size_rule():
    assert mae_block(197) == MAE_BLOCK  # ViT-Ti/S at 224 px: the measured block
    for n in (1, 65, 197, 577, 4097):
        b = mae_block(n)
        assert b >= MAE_BLOCK and -(-n // b) <= 16  # at most 16 blocks per head in the unrolled export
    with pytest.raises(ValueError, match="block"):
        pairwise_l1(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), 0)


def test_pairwise_l1_fp16_computes_in_fp32():
    """Large, similar vectors: 2 sum max and the token sums (~3,200) cancel to distances of ~64; in fp16 that
    subtraction alone would be off by several units. Computed in fp32 and rounded once, the error is fp16's
    rounding of the distance."""
    gen = torch.Generator().manual_seed(4)
    q = (50 + torch.randn(1, 2, 16, 64, generator=gen)).half()
    k = (50 + torch.randn(1, 2, 16, 64, generator=gen)).half()
    out = pairwise_l1(q, k, 4)
    ref = torch.cdist(q.double(), k.double(), p=1)
    assert out.dtype == torch.float16
    assert ((out.double() - ref).abs() / ref).max() < 1e-3


@pytest.mark.parametrize("phi,fn", [("identity", lambda t: t), ("silu", F.silu)])
def test_belief2_phi_options(phi, fn):
    attn = _layer("belief2", phi=phi, zz=False)
    x = torch.randn(B, N, D)
    Q, K, V = _heads(attn, x.double())
    MH = torch.cat([_softmax_rows(_dot_scores(Q[m], K[m])) @ V[m] for m in range(M)], -1)
    perp, par = _project(MH, torch.cat(V, -1))
    ref = _lin(perp, attn.proj) + _lin(fn(par), attn.proj_p)
    with torch.no_grad():
        torch.testing.assert_close(attn(x).double(), ref, rtol=0, atol=1e-5)


def test_fused_zz_equals_explicit_scores():
    """[Q|Z][K|Z]^T through the fused kernel == softmax((QK^T + ZZ^T)/sqrt(d)) V computed explicitly."""
    attn = _layer("belief2")
    x = torch.randn(B, N, D)
    with torch.no_grad():
        q, k, v = attn.project_qkv(x)
        fused = attn.scores_attention(x, q, k, v, None, False)
        z = attn.z(x).reshape(B, N, M, d).transpose(1, 2)
        explicit = ((q @ k.transpose(-1, -2) + z @ z.transpose(-1, -2)) / math.sqrt(d)).softmax(-1) @ v
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name,sign", [("wafe-mse", -1.0), ("anti-wafe-mse", 1.0)])
def test_fused_mse_equals_pairwise(name, sign):
    """Query scale 2/d plus the per-key bias -||k||^2/d == softmax(-||q_i - k_j||^2 / d) (row constant cancels)."""
    attn = _layer(name)
    x = torch.randn(B, N, D)
    with torch.no_grad():
        q, k, v = attn.project_qkv(x)
        fused = attn.scores_attention(x, q, k, v, None, False)
        dist = ((q.unsqueeze(-2) - k.unsqueeze(-3)) ** 2).sum(-1)
        explicit = (sign * dist / d).softmax(-1) @ v
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-6)
