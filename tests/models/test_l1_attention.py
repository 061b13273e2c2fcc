"""The fused pairwise-L1 core (``attnzoo::l1_attention``: its Numba CPU kernel, its ATen tiles, its Triton kernel;
its decomposed form) against eq. 5-6.

The reference below is written from the paper's equations (Yi Jin 2024, eq. 5-6:
``H = softmax(-/+ ||q_i - k_j||_1 / d) V``) with plain float64 loops over the queries; it calls no attnzoo code.
Rows whose keys are all masked are zeros in the reference, as the core returns them (and as
``F.scaled_dot_product_attention`` does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attnzoo.models.kernels import (
    cpu_kernel_unavailable_reason,
    l1_attention,
    l1_attention_decomposed,
    l1_core,
    triton_unavailable_reason,
)

ROOT = Path(__file__).resolve().parents[2]
NEG_INF = float("-inf")


def reference(q, k, v, sign, mask=None, causal=False):
    """eq. 5 (sign -1) / eq. 6 (sign +1) in float64, query by query: s_ij = sign * sum_c |q_ic - k_jc| / d, a
    float mask added and causal pairs (key j after query i) dropped before the softmax over j."""
    q, k, v = q.double(), k.double(), v.double()
    d = q.shape[-1]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    for i in range(q.shape[-2]):
        s = sign * (q[..., i : i + 1, :] - k).abs().sum(-1) / d  # (B, M, Nk): q_i against every k_j
        if mask is not None:
            s = s + mask.double().expand(*q.shape[:2], q.shape[-2], k.shape[-2])[..., i, :]
        if causal:
            s[..., i + 1 :] = NEG_INF
        top = s.max(-1, keepdim=True).values
        e = torch.where(top == NEG_INF, 0.0, (s - torch.where(top == NEG_INF, 0.0, top)).exp())
        z = e.sum(-1, keepdim=True)
        h = ((e / z.clamp_min(1e-300)).unsqueeze(-2) @ v).squeeze(-2)  # (B, M, dv)
        out[..., i, :] = torch.where(z > 0, h, 0.0)
    return out


def _inputs(nq, nk, d=8, dv=5, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, nq, d, generator=gen)
    k = torch.randn(2, 3, nk, d, generator=gen)
    v = torch.randn(2, 3, nk, dv, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _mask(kind, nq, nk, seed=1):
    """None, a (2, 1, nq, nk) boolean mask (True = keep) or additive mask; query 1 of image 0 keeps no key."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "bool":
        keep = torch.rand(2, 1, nq, nk, generator=gen) > 0.3
        keep[0, 0, 1] = False
        return keep
    if kind == "float":
        mask = torch.randn(2, 1, nq, nk, generator=gen)
        mask[0, 0, 1] = NEG_INF
        return mask
    return None


def _additive(mask):
    return (
        torch.zeros(mask.shape).masked_fill(~mask, NEG_INF) if mask is not None and mask.dtype == torch.bool else mask
    )


#: (queries, keys, block_q, block_k): several query and key tiles (the online softmax over key tiles, a last tile
#: of another size), one tile of each, and more keys than queries in tiles of 3 and 7.
SHAPES = [(13, 11, 4, 5), (37, 37, 64, 1024), (9, 20, 3, 7)]
MASK_KINDS = ["none", "bool", "float"]


@pytest.fixture(params=["numba", "aten"])
def cpu_path(request, monkeypatch):
    """The op's two CPU paths: its Numba kernel, and the ATen tiles it runs on where Numba is missing."""
    if request.param == "numba" and cpu_kernel_unavailable_reason() is not None:
        pytest.fail(f"the CPU kernel must run here: {cpu_kernel_unavailable_reason()}")
    if request.param == "aten":
        monkeypatch.setattr(l1_core, "cpu_kernel_unavailable_reason", lambda: "Numba is not installed")
    return request.param


def test_cpu_kernel_scores_match_the_distances():
    """The Numba kernel's tile of scores == ``coef * sum_c |q_ic - k_jc|`` in float64 loops, for tiles inside the
    sequences (rows not a multiple of its four rows per pass, offset key spans), fp32 and fp64, an empty tile."""
    from attnzoo.models.kernels import l1_cpu

    gen = torch.Generator().manual_seed(2)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        q, k = torch.randn(3, 11, 7, generator=gen, dtype=dtype), torch.randn(3, 13, 7, generator=gen, dtype=dtype)
        kt = k.transpose(-1, -2).contiguous()
        half_q, half_k = q.sum(-1) * -0.5, k.sum(-1) * -0.5
        for i0, i1, j0, j1 in ((0, 11, 0, 13), (2, 9, 3, 12), (10, 11, 12, 13), (4, 5, 0, 13)):
            got = l1_cpu.l1_scores(q, kt, half_q, half_k, i0, i1, j0, j1, -0.25)
            want = torch.zeros(3, i1 - i0, j1 - j0, dtype=torch.float64)
            for g in range(3):
                for i in range(i0, i1):
                    for j in range(j0, j1):
                        want[g, i - i0, j - j0] = -0.25 * sum(
                            abs(float(q[g, i, c]) - float(k[g, j, c])) for c in range(7)
                        )
            assert got.dtype == dtype
            torch.testing.assert_close(got.double(), want, rtol=0, atol=tol)
        assert l1_cpu.l1_scores(q, kt, half_q, half_k, 3, 3, 0, 13, 1.0).shape == (3, 0, 13)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("sign", [-1.0, 1.0])
@pytest.mark.parametrize("nq,nk,bq,bk", SHAPES)
def test_fused_op_matches_eq_5_6(nq, nk, bq, bk, sign, kind, causal, cpu_path):
    q, k, v = _inputs(nq, nk)
    mask = _mask(kind, nq, nk)
    out = l1_attention(q, k, v, sign, attn_mask=mask, is_causal=causal, block_q=bq, block_k=bk)
    assert out.dtype == torch.float32 and out.shape == (2, 3, nq, 5)
    torch.testing.assert_close(out.double(), reference(q, k, v, sign, _additive(mask), causal), rtol=0, atol=1e-5)


@pytest.mark.parametrize("n,merged", [(256, False), (20, True)])
def test_images_merge_only_where_they_leave_a_tile_unfilled(n, merged, cpu_path):
    """q, k, v as a qkv projection's strided head views: where one image's heads fill a tile the op tiles image by
    image and reads k and v in place (only q, for the kernel, and k channels first are copied); small images'
    heads are merged into (1, B*M, ...) to fill one. Either layout against eq. 5."""
    d, heads = 8, 3
    assert (heads * n * n >= l1_core.TILE_ELEMENTS) is not merged
    qkv = torch.randn(2, n, 3, heads, d, generator=torch.Generator().manual_seed(4)).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    block_q = l1_core.default_block_q(q.shape, n)
    tiles = l1_core._Tiles(q, k, v, None, block_q, l1_core.BLOCK_K)
    assert tiles.q.shape[:2] == ((1, 2 * heads) if merged else (2, heads))
    assert (tiles.k.data_ptr() == k.data_ptr() and tiles.v.data_ptr() == v.data_ptr()) is not merged
    out = l1_attention(q, k, v, -1.0, block_q=block_q)
    torch.testing.assert_close(out.double(), reference(q, k, v, -1.0), rtol=0, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("nq,nk,block", [(13, 11, 4), (9, 20, 128)])
def test_decomposed_form_matches_eq_5_6(nq, nk, block, kind, causal):
    q, k, v = _inputs(nq, nk)
    mask = _mask(kind, nq, nk)
    out = l1_attention_decomposed(q, k, v, 1.0, attn_mask=mask, is_causal=causal, block=block)
    torch.testing.assert_close(out.double(), reference(q, k, v, 1.0, _additive(mask), causal), rtol=0, atol=1e-5)


def test_decomposed_tiles_shrink_with_the_keys():
    """A tile of the decomposed form holds about DECOMPOSED_TILE scores per image whatever the sequence: 63 queries
    of a ViT-S image (6 heads, 1,025 keys), 16 at 4,096, never fewer than DECOMPOSED_MIN_BLOCK nor more than
    DECOMPOSED_BLOCK."""
    assert l1_core.decomposed_block(6, 1025) == 63
    assert l1_core.decomposed_block(6, 4096) == 16
    assert l1_core.decomposed_block(6, 197) == l1_core.DECOMPOSED_BLOCK
    assert l1_core.decomposed_block(6, 10**6) == l1_core.DECOMPOSED_MIN_BLOCK
    for n_k in (1025, 2048, 4096):  # above, the floor of DECOMPOSED_MIN_BLOCK queries binds
        assert 6 * l1_core.decomposed_block(6, n_k) * n_k <= l1_core.DECOMPOSED_TILE


def test_decomposed_form_by_default_holds_one_tile_of_differences(monkeypatch):
    """Run eagerly, the decomposed form's largest buffer is one tile's (B, M, block, N, d) differences, the tile
    chosen by decomposed_block: not the whole (B, M, N, N, d) tensor."""
    monkeypatch.setattr(l1_core, "DECOMPOSED_TILE", 3 * 8 * 64)  # 8 queries of 64 keys per head of 3
    monkeypatch.setattr(l1_core, "DECOMPOSED_MIN_BLOCK", 1)
    n, d = 64, 16
    q, k, v = _inputs(n, n, d=d, dv=d)
    with torch.no_grad(), torch.profiler.profile(profile_memory=True) as prof:
        out = l1_attention_decomposed(q, k, v, -1.0)
    biggest = max(e.self_cpu_memory_usage for e in prof.events())
    assert biggest <= 2 * 3 * 8 * n * d * 4  # (B=2, M=3, 8 queries, 64 keys, 16 channels) fp32
    torch.testing.assert_close(out.double(), reference(q, k, v, -1.0), rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_op_low_precision_computes_in_fp32(dtype, cpu_path):
    """Large, similar vectors (entries near 50): in 16 bits ``2 max - a - b`` would lose the distances; the core
    computes in fp32 and returns the inputs' dtype, off the fp64 reference by that dtype's rounding only."""
    gen = torch.Generator().manual_seed(4)
    q, k, v = ((50 + torch.randn(1, 2, 16, 64, generator=gen)).to(dtype) for _ in range(3))
    out = l1_attention(q, k, v, -1.0, block_q=4, block_k=8)
    assert out.dtype == dtype
    ref = reference(q, k, v, -1.0)
    assert (out.double() - ref).abs().max() < 2 * 50 * torch.finfo(dtype).eps


def test_fused_op_gradients_gradcheck(cpu_path):
    """The op's backward (tiled, probabilities recomputed) against finite differences, float64, with a float mask,
    causal, a fully masked row and several tiles."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, c, generator=gen, dtype=torch.float64, requires_grad=True) for n, c in
               [(6, 3), (5, 3), (5, 4)])  # fmt: skip
    mask = torch.randn(1, 1, 6, 5, generator=gen, dtype=torch.float64)
    mask[0, 0, 2] = NEG_INF
    for causal in (False, True):

        def fn(q, k, v, causal=causal):
            return l1_attention(q, k, v, 1.0, attn_mask=mask, is_causal=causal, block_q=4, block_k=2)

        assert torch.autograd.gradcheck(fn, (q, k, v))


@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_fused_op_gradients_match_the_reference_fp32(sign, cpu_path):
    """fp32 gradients of the op == autograd through the float64 reference of eq. 5-6."""
    q, k, v = (t.requires_grad_() for t in _inputs(13, 11))
    mask = _mask("float", 13, 11)
    out = l1_attention(q, k, v, sign, attn_mask=mask, is_causal=True, block_q=4, block_k=5)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = torch.autograd.grad((reference(q64, k64, v64, sign, mask, True) * w.double()).sum(), (q64, k64, v64))
    for got, want in zip(grads, ref, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)


def test_op_registration_schema_fake_and_autograd():
    """torch.library's own checks of the op: schema, fake (meta) kernel, autograd registration, AOT dispatch."""
    q, k, v = (t.requires_grad_() for t in _inputs(9, 7, d=4, dv=3))
    for mask, causal in [(None, False), (_mask("float", 9, 7), True)]:
        result = torch.library.opcheck(
            torch.ops.attnzoo.l1_attention.default, (q, k, v, mask, -1.0, 0.25, causal, 4, 3)
        )
        assert set(result.values()) == {"SUCCESS"}, result


def test_op_stays_in_one_compiled_graph():
    """torch.compile(fullgraph=True) traces through the op (its fake kernel) with no graph break, forward and
    backward (AOTAutograd's graphs, run by the eager backend)."""
    q, k, v = (t.requires_grad_() for t in _inputs(13, 11))
    fn = torch.compile(
        lambda q, k, v: l1_attention(q, k, v, -1.0, block_q=4, block_k=5), fullgraph=True, backend="aot_eager"
    )
    out = fn(q, k, v)
    torch.testing.assert_close(out.double(), reference(q, k, v, -1.0), rtol=0, atol=1e-5)
    out.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v))


def test_fused_op_holds_tiles_not_the_scores():
    """No allocation of the N x N scores, let alone the (B, M, N, N, d) differences: the largest is a tile."""
    n, bq, bk = 200, 16, 64
    q, k, v = _inputs(n, n, d=16, dv=16)
    with torch.no_grad(), torch.profiler.profile(profile_memory=True) as prof:
        l1_attention(q, k, v, -1.0, block_q=bq, block_k=bk)
    biggest = max(e.self_cpu_memory_usage for e in prof.events())
    assert biggest < 2 * 3 * n * n * 4 / 4  # a quarter of the scores of one call


@pytest.mark.parametrize(
    "args, words",
    [
        (
            (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)),
            "must be (batch, heads, tokens, channels)",
        ),
        ((torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 5, 8), torch.zeros(1, 2, 4, 8)), "do not pair"),
        ((torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 5, 7), torch.zeros(1, 2, 5, 8)), "do not pair"),
        ((torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8).half(), torch.zeros(1, 1, 4, 8)), "share one floating"),
    ],
)
def test_bad_inputs_are_one_clear_error(args, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        l1_attention(*args)
    with pytest.raises(ValueError, match="block_q and block_k must be >= 1"):
        l1_attention(*_inputs(3, 3), block_q=0)


# The Triton kernel on the CPU, under Triton's interpreter: in a fresh interpreter, because TRITON_INTERPRET is
# read when a kernel is decorated, and this process may have imported the module without it.
_TRITON_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from attnzoo.models.kernels import l1_triton
    cases = json.loads(sys.argv[1])
    torch.manual_seed(0)
    for case in cases:
        nq, nk, d, dv, sign, kind, causal, dtype = case
        dtype = getattr(torch, dtype)
        q, k = torch.randn(2, 3, nq, d).to(dtype), torch.randn(2, 3, nk, d).to(dtype)
        v = torch.randn(2, 3, nk, dv).to(dtype)
        mask = torch.randn(2, 1, nq, nk) if kind == "float" else None
        if mask is not None:
            mask[0, 0, 1] = float("-inf")
        out, lse = l1_triton.l1_attention_forward(q, k, v, mask, sign, 1.0 / d, causal)
        saved = {"q": q, "k": k, "v": v, "mask": mask, "out": out, "lse": lse}
        torch.save(saved, f"{sys.argv[2]}/{cases.index(case)}.pt")
    """
)
#: (queries, keys, d, dv, sign, mask, causal, dtype): tiles of 32 with ragged last ones, a fully masked row, causal,
#: channels not a multiple of the channel chunk, a value width padded to 16, fp16 in and out.
TRITON_CASES = [
    (37, 45, 12, 8, -1.0, "none", False, "float32"),
    (37, 45, 12, 8, 1.0, "float", True, "float32"),
    (5, 40, 20, 20, -1.0, "float", False, "float32"),
    (33, 33, 16, 16, 1.0, "none", True, "float16"),
]


@pytest.mark.skipif(triton_unavailable_reason() is not None, reason=str(triton_unavailable_reason()))
def test_triton_kernel_matches_eq_5_6_in_the_interpreter(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT, json.dumps(TRITON_CASES), str(tmp_path)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for i, (*_, sign, _, causal, dtype) in enumerate(TRITON_CASES):
        r = torch.load(tmp_path / f"{i}.pt")
        ref = reference(r["q"], r["k"], r["v"], sign, r["mask"], causal)
        assert r["out"].dtype == getattr(torch, dtype) and r["lse"].dtype == torch.float32
        atol = 1e-5 if dtype == "float32" else 4e-3
        torch.testing.assert_close(r["out"].double(), ref, rtol=0, atol=atol)
        # the row log-sum-exp the backward recomputes probabilities from, -inf where no key is kept
        s = sign * (r["q"].double().unsqueeze(-2) - r["k"].double().unsqueeze(-3)).abs().sum(-1) / r["q"].shape[-1]
        if r["mask"] is not None:
            s = s + r["mask"].double()
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).tril().logical_not(), NEG_INF)
        torch.testing.assert_close(r["lse"].double(), torch.logsumexp(s, -1), rtol=0, atol=1e-4)
