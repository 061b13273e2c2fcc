"""The fused pairwise-L1 attention core: ``softmax(sign * ||q_i - k_j||_1 * scale + mask) V``, tile by tile.

Paper: Yi Jin, "Divergence vs. Convergence: What Do We Need? -- Substitutes for 'Attention'", 2024, eq. 5-6
(``WAFE_MAE``: ``sign = -1``, anti-WAFE: ``+1``; ``scale = 1/d``). Its scores ``sum_c |q_ic - k_jc|`` are no matrix
product, so no attention kernel of PyTorch computes them; this module does, without ever storing the
(B, M, N, N, d) differences or the N x N scores.

``attnzoo::l1_attention`` (:func:`l1_attention`) is a ``torch.library`` custom op, flash-style:

- the queries in tiles of ``block_q`` rows, the keys in tiles of ``block_k``, several heads of one image at once
  (:data:`TILE_ELEMENTS` scores per tile); each tile's distances through ``|a - b| = 2 max(a, b) - a - b``: on
  the CPU in a kernel Numba compiles for the machine it runs on (:mod:`.l1_cpu`: four query rows per pass over
  the channels, vectorised along the keys at the machine's width, AVX2 or AVX-512, on
  ``torch.get_num_threads()`` threads), elsewhere, or without Numba, in ATen ops (one broadcast ``maximum`` of a
  query column against a contiguous row of keys and one in-place add per channel);
- an online softmax over the key tiles (a running maximum and sum per query row, the partial output rescaled),
  ``P V`` a matrix product per tile, so memory is O(tile + N d);
- rows whose keys are all masked give zeros, as ``F.scaled_dot_product_attention`` does;
- fp16 and bf16 inputs compute in fp32 (the ``2 max - a - b`` difference would lose small distances of large
  vectors) and return their own dtype.

The op has a fake (meta) kernel, so ``torch.compile`` keeps it in one graph and ``torch.export`` records it; a
backward (``attnzoo::l1_attention_backward``: the tiles again, the probabilities recomputed from the saved row
log-sum-exp, ``d/dq |q - k| = sign(q - k)``), so it trains; and on CUDA tensors its Triton kernel
(:mod:`attnzoo.models.kernels.l1_triton`) where Triton is installed. Nothing is compiled at install: the CPU
kernel on the op's first CPU call (seconds, then cached on disk), the Triton kernel on its first CUDA call. The
backward's ``sign(q - k)`` terms run on ATen ops.

:func:`l1_attention_decomposed` is the same core in ordinary ops, query tile by query tile, for compilers to fuse
(``torch.compile`` and AOTInductor turn each tile's broadcast ``|q_i - k_j|`` sum into one loop): it stores a
tile of the scores, never the differences, when compiled; run eagerly it stores one tile of differences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "BLOCK_Q",
    "BLOCK_K",
    "TILE_ELEMENTS",
    "DECOMPOSED_BLOCK",
    "DECOMPOSED_MIN_BLOCK",
    "DECOMPOSED_TILE",
    "L1_ATTENTION_OP",
    "default_block_q",
    "decomposed_block",
    "l1_attention",
    "l1_attention_decomposed",
    "work_dtype",
    "triton_unavailable_reason",
    "cpu_kernel_unavailable_reason",
]

#: Queries per tile of the fused op, at least (:func:`default_block_q`).
BLOCK_Q = 64
#: Keys per tile of the fused op: longer sequences take an online softmax over key tiles (a ViT-S image's 1,025
#: tokens are one tile, so its rows are never rescaled).
BLOCK_K = 2048
#: Scores per tile (heads x queries x keys): heads are taken together up to this many (2 heads x 64 x 1,025 at a
#: ViT-S image's 1,025 tokens). Larger tiles make fewer calls per score, smaller ones keep a tile's buffers in a
#: core's L2 cache (the ATen tiles' running sum and one channel's maxima, 768 KB each): on that Xeon (2 MB L2)
#: the ATen tiles took 136 ms instead of 151 ms at 1,025 tokens and 2.2 s instead of 3.8 s at 4,096 than with
#: tiles twice this size (``results/studies/fused-cores/l1-quick-1025-xeon``).
TILE_ELEMENTS = 6 * 32 * 1024
#: Queries per tile of :func:`l1_attention_decomposed`, at most (:func:`decomposed_block`).
DECOMPOSED_BLOCK = 128
#: Queries per tile of :func:`l1_attention_decomposed`, at least: a tile count that compile time can bear.
DECOMPOSED_MIN_BLOCK = 16
#: Scores per image in one tile of :func:`l1_attention_decomposed` (heads x queries x keys: a ViT-S image's six heads
#: x 64 queries x 1,024 keys, 1.5 MB in fp32). Longer sequences take fewer queries per tile, so the buffers a compiler
#: keeps per tile stay this size. Inductor's C++ backend fuses up to eight tiles side by side (one kernel reading the
#: keys once for all; ``cpp.max_horizontal_fusion_size``), so eight tiles' scores are alive at once: with 128 queries
#: per tile a ViT-S block's AOTInductor package at 4,096 tokens peaked at 2.05-2.14x ``standard``'s memory, with 16
#: at 1.19-1.26x, the block 1.07-1.4x slower (``results/studies/fused-cores/l1-numba-4096-xeon``, a 2-core Xeon).
DECOMPOSED_TILE = 6 * 64 * 1024

_NEG_INF = float("-inf")


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the core computes in: fp32 for fp16/bf16/fp32, fp64 for fp64."""
    return torch.promote_types(dtype, torch.float32)


def triton_unavailable_reason() -> str | None:
    """Why the op's Triton kernel cannot run here (``None`` where it can): Triton not installed."""
    try:
        import triton  # noqa: F401  # optional: triton (brought by torch's CUDA wheels); the CUDA kernel only
    except ImportError as e:
        return f"Triton is not installed ({e})"
    return None


def cpu_kernel_unavailable_reason() -> str | None:
    """Why the op's compiled CPU kernel (:mod:`.l1_cpu`, Numba) cannot run here (``None`` where it can); without
    it the op runs on ATen ops."""
    try:
        import numba  # noqa: F401  # a dependency of the package; the CPU kernel's compiler
    except ImportError as e:
        return f"Numba is not installed ({e})"
    return None


def _spans(n: int, block: int) -> list[tuple[int, int]]:
    """[start, stop) of ``ceil(n / block)`` tiles of near-equal size (1,025 keys in blocks of 1,024: 513 + 512,
    not 1,024 + 1)."""
    if n <= 0:
        return []
    count = -(-n // block)
    size = -(-n // count)
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def _merges_images(q_shape: Sequence[int], n_k: int, block_k: int, masked: bool) -> bool:
    """Whether :func:`l1_attention` tiles every image's heads together, as (1, B*M, ...): only without a mask and
    only where one image's heads leave a tile of :data:`TILE_ELEMENTS` scores unfilled (fewer than ~180 tokens for
    six heads). Merging copies q, k and v (a qkv projection's head views cannot be merged in place): at 4,096 tokens,
    batch 8, 48 MB each, which a ViT-S block's peak memory under torch.compile showed (1.51x ``standard``'s on a
    2-core Xeon, ``results/studies/fused-cores/l1-numba-4096-b8-xeon``)."""
    B, M, n_q = q_shape[0], q_shape[1], q_shape[2]
    return not masked and B > 1 and M * n_q * max(1, min(block_k, n_k)) < TILE_ELEMENTS


def default_block_q(q_shape: Sequence[int], n_k: int, block_k: int = BLOCK_K, masked: bool = False) -> int:
    """Queries per tile of :func:`l1_attention`: :data:`BLOCK_Q`, or more where every head the op tiles together
    (an image's, or all images' where :func:`_merges_images`) fits :data:`TILE_ELEMENTS` with them (at 197 tokens,
    batch 1, six heads: one tile of all 197 queries instead of four, a quarter of the per-op overhead)."""
    B, M, n_q = q_shape[0], q_shape[1], q_shape[2]
    heads = B * M if _merges_images(q_shape, n_k, block_k, masked) else M
    keys = max(1, min(block_k, n_k))
    return max(1, min(max(n_q, 1), max(BLOCK_Q, TILE_ELEMENTS // (heads * keys))))


def decomposed_block(heads: int, n_k: int) -> int:
    """Queries per tile of :func:`l1_attention_decomposed` for ``heads`` heads of an image and ``n_k`` keys: as many
    as fit :data:`DECOMPOSED_TILE` scores, within [:data:`DECOMPOSED_MIN_BLOCK`, :data:`DECOMPOSED_BLOCK`] (63 at a
    ViT-S image's 1,025 tokens, 16 at 4,096, 128 at 197)."""
    fit = DECOMPOSED_TILE // max(1, heads * n_k)
    return max(DECOMPOSED_MIN_BLOCK, min(DECOMPOSED_BLOCK, fit))


def _causal_drop(i0: int, i1: int, j0: int, j1: int, device: torch.device) -> Tensor | None:
    """(bq, bk) True where key j is after query i (dropped), or None when the tile keeps every pair."""
    if j1 - 1 <= i0:
        return None
    rows = torch.arange(i0, i1, device=device).unsqueeze(-1)
    return torch.arange(j0, j1, device=device) > rows


def _tile_scores(q: Tensor, kt: Tensor, half_q: Tensor, half_k: Tensor, coef: float) -> Tensor:
    """``coef * sum_c |q_ic - k_jc|`` of one tile, (G, bq, bk), in ATen ops (any device).

    ``q`` (G, bq, d); ``kt`` (G, d, bk), channels first; ``half_q`` (G, bq, 1) and ``half_k`` (G, 1, bk) are
    ``-sum_c / 2`` of each token, so that ``half_q + half_k + sum_c max(q_ic, k_jc)`` is half the distance.
    """
    acc = half_q + half_k
    tmp = torch.empty_like(acc)
    # one query column (G, bq, 1) against a contiguous row of keys (G, 1, bk) per channel: vectorised on the keys
    for q_c, k_c in zip(q.transpose(-1, -2).unsqueeze(-1).unbind(1), kt.unsqueeze(-2).unbind(1), strict=True):
        torch.maximum(q_c, k_c, out=tmp)
        acc.add_(tmp)
    return acc.mul_(2.0 * coef)


class _Tiles:
    """Inputs of one call laid out for tiling: work dtype, keys channels first, token half-sums, the mask as a
    (B, M, Nq, Nk) view (never copied); :meth:`chunks` walks (image, heads, query tile), the caller the key tiles.
    Small images' heads are tiled together, as (1, B*M, ...), so that they fill a tile too (:func:`_merges_images`);
    otherwise k and v stay the caller's views (q is made contiguous for the compiled kernel, k copied channels
    first)."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, block_q: int, block_k: int) -> None:
        wd = work_dtype(q.dtype)
        B, M, n_q, _ = q.shape
        n_k = k.shape[-2]
        if _merges_images(q.shape, n_k, block_k, attn_mask is not None):
            q, k, v = (t.reshape(1, B * M, *t.shape[2:]) for t in (q, k, v))
        self.q, self.k, self.v = q.to(wd), k.to(wd), v.to(wd)
        self.kt = self.k.transpose(-1, -2).contiguous()  # (B, M, d, Nk)
        #: the compiled CPU kernel (:mod:`.l1_cpu`) where it runs, else the ATen ops of :func:`_tile_scores`
        self.cpu_kernel = q.device.type == "cpu" and cpu_kernel_unavailable_reason() is None
        if self.cpu_kernel:
            self.q = self.q.contiguous()
        self.half_q = self.q.sum(-1, keepdim=True).mul_(-0.5)  # (B, M, Nq, 1)
        self.half_k = self.k.sum(-1).unsqueeze(-2).mul_(-0.5)  # (B, M, 1, Nk)
        self.mask = None if attn_mask is None else attn_mask.expand(B, M, n_q, n_k)
        self.q_spans, self.k_spans = _spans(n_q, block_q), _spans(n_k, block_k)
        tile = max(1, min(block_q, n_q)) * max(1, min(block_k, n_k))
        self.head_spans = _spans(self.q.shape[1], max(1, TILE_ELEMENTS // tile))
        self.shape = (B, M)

    def tiled(self, x: Tensor) -> Tensor:
        """A (B, M, ...) tensor in the tiles' layout."""
        return x.reshape(*self.q.shape[:2], *x.shape[2:])

    def restored(self, x: Tensor) -> Tensor:
        """A tensor of the tiles' layout as (B, M, ...)."""
        return x.reshape(*self.shape, *x.shape[2:])

    def chunks(self):
        for b in range(self.q.shape[0]):
            for h0, h1 in self.head_spans:
                for i0, i1 in self.q_spans:
                    yield b, slice(h0, h1), i0, i1

    def scores(self, b: int, h: slice, i0: int, i1: int, j0: int, j1: int, coef: float, is_causal: bool):
        """Scores of one tile, (G, bq, bk): ``coef * dist + mask``, pairs the causal mask drops ``-inf``."""
        if self.cpu_kernel:
            from . import l1_cpu  # heavy: Numba loads LLVM (about a second); only the op's CPU calls need it

            half_q, half_k = self.half_q[b, h].squeeze(-1), self.half_k[b, h].squeeze(-2)
            scores = l1_cpu.l1_scores(self.q[b, h], self.kt[b, h], half_q, half_k, i0, i1, j0, j1, coef)
        else:
            scores = _tile_scores(
                self.q[b, h, i0:i1],
                self.kt[b, h, :, j0:j1],
                self.half_q[b, h, i0:i1],
                self.half_k[b, h, :, j0:j1],
                coef,
            )
        if self.mask is not None:
            scores.add_(self.mask[b, h, i0:i1, j0:j1].to(self.q.dtype))
        if is_causal and (drop := _causal_drop(i0, i1, j0, j1, self.q.device)) is not None:
            scores.masked_fill_(drop, _NEG_INF)
        return scores


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    sign: float,
    scale: float,
    is_causal: bool,
    block_q: int,
    block_k: int,
) -> tuple[Tensor, Tensor]:
    """The op's kernel on any device: (out in q's dtype, row log-sum-exp in the work dtype)."""
    t = _Tiles(q, k, v, attn_mask, block_q, block_k)
    out = torch.zeros(*t.q.shape[:-1], v.shape[-1], dtype=t.q.dtype, device=q.device)
    lse = torch.full(t.q.shape[:-1], _NEG_INF, dtype=t.q.dtype, device=q.device)
    coef = sign * scale
    for b, h, i0, i1 in t.chunks():
        m = rowsum = acc = None
        for j0, j1 in t.k_spans:
            if is_causal and j0 > i1 - 1:
                break  # every later key tile is after every query of this one
            s = t.scores(b, h, i0, i1, j0, j1, coef, is_causal)
            m_new = s.amax(-1, keepdim=True) if m is None else torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = m_new.masked_fill(m_new == _NEG_INF, 0.0)  # rows with no key kept yet
            p = s.sub_(m_safe).exp_()
            pv = p @ t.v[b, h, j0:j1]
            if m is None or rowsum is None or acc is None:
                rowsum, acc = p.sum(-1, keepdim=True), pv
            else:  # online softmax: rescale what the earlier key tiles summed to the new running maximum
                alpha = (m - m_safe).exp_()
                rowsum = rowsum.mul_(alpha).add_(p.sum(-1, keepdim=True))
                acc = acc.mul_(alpha).add_(pv)
            m = m_new
        if m is None or rowsum is None or acc is None:  # no key tile (no keys)
            continue
        kept = rowsum > 0
        out[b, h, i0:i1] = torch.where(kept, acc / rowsum.clamp_min(torch.finfo(rowsum.dtype).tiny), 0.0)
        lse[b, h, i0:i1] = torch.where(kept, m + rowsum.log(), _NEG_INF).squeeze(-1)
    return t.restored(out).to(q.dtype), t.restored(lse)


def _backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    out: Tensor,
    lse: Tensor,
    sign: float,
    scale: float,
    is_causal: bool,
    block_q: int,
    block_k: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of the core for (q, k, v): flash attention's backward with the L1 scores' own derivative,
    ``d dist_ij / d q_ic = sign(q_ic - k_jc) = -d dist_ij / d k_jc``; the probabilities are recomputed per tile."""
    t = _Tiles(q, k, v, attn_mask, block_q, block_k)
    wd = t.q.dtype
    grad, out = t.tiled(grad).to(wd), t.tiled(out).to(wd)
    delta = (grad * out).sum(-1, keepdim=True)  # (B, M, Nq, 1): sum_j P_ij dP_ij
    lse = t.tiled(lse).to(wd)
    lse_safe = lse.masked_fill(lse == _NEG_INF, math.inf).unsqueeze(-1)  # fully masked rows: P = 0
    dq, dk, dv = torch.zeros_like(t.q), torch.zeros_like(t.k), torch.zeros_like(t.v)
    coef = sign * scale
    for b, h, i0, i1 in t.chunks():
        g_out, q_i = grad[b, h, i0:i1], t.q[b, h, i0:i1]
        q_cols = q_i.transpose(-1, -2).unsqueeze(-1).unbind(1)  # (G, bq, 1) per channel
        dq_i = dq[b, h, i0:i1]
        for j0, j1 in t.k_spans:
            if is_causal and j0 > i1 - 1:
                break
            p = t.scores(b, h, i0, i1, j0, j1, coef, is_causal).sub_(lse_safe[b, h, i0:i1]).exp_()
            v_j, dk_j = t.v[b, h, j0:j1], dk[b, h, j0:j1]
            dv[b, h, j0:j1] += p.transpose(-1, -2) @ g_out
            # d loss / d dist_ij = coef * P_ij (dP_ij - delta_i), dP = dO V^T
            dist_grad = (g_out @ v_j.transpose(-1, -2)).sub_(delta[b, h, i0:i1]).mul_(p).mul_(coef)
            sg = torch.empty_like(p)
            k_rows = t.kt[b, h, :, j0:j1].unsqueeze(-2).unbind(1)  # (G, 1, bk) per channel
            for c, (q_c, k_c) in enumerate(zip(q_cols, k_rows, strict=True)):
                torch.sub(q_c, k_c, out=sg).sign_().mul_(dist_grad)
                dq_i[..., c] += sg.sum(-1)
                dk_j[..., c] -= sg.sum(-2)
    return t.restored(dq).to(q.dtype), t.restored(dk).to(k.dtype), t.restored(dv).to(v.dtype)


#: ``(softmax(sign * ||q_i - k_j||_1 * scale + mask) v, row log-sum-exp)``; see :func:`l1_attention`.
_l1_attention_op = torch.library.custom_op("attnzoo::l1_attention", _forward, mutates_args=())
#: The op's overload, as graphs (an export, a translation table) name it.
L1_ATTENTION_OP = torch.ops.attnzoo.l1_attention.default


@_l1_attention_op.register_kernel("cuda")
def _l1_attention_cuda(q, k, v, attn_mask, sign, scale, is_causal, block_q, block_k):
    """The Triton kernel where Triton is installed and the dtype is fp32/fp16/bf16 (the tiles of :func:`_forward`
    otherwise)."""
    if triton_unavailable_reason() is not None or q.dtype == torch.float64:
        return _forward(q, k, v, attn_mask, sign, scale, is_causal, block_q, block_k)
    from . import l1_triton  # optional: triton (brought by torch's CUDA wheels); only CUDA tensors need it

    out, lse = l1_triton.l1_attention_forward(q, k, v, attn_mask, sign, scale, is_causal)
    return out, lse.to(work_dtype(q.dtype))


@_l1_attention_op.register_fake
def _l1_attention_fake(q, k, v, attn_mask, sign, scale, is_causal, block_q, block_k):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(q.shape[:-1], dtype=work_dtype(q.dtype))


#: Gradients of ``attnzoo::l1_attention`` for (q, k, v).
_l1_attention_backward_op = torch.library.custom_op("attnzoo::l1_attention_backward", _backward, mutates_args=())


@_l1_attention_backward_op.register_fake
def _l1_attention_backward_fake(grad, q, k, v, attn_mask, out, lse, sign, scale, is_causal, block_q, block_k):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, attn_mask, sign, scale, is_causal, block_q, block_k = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, attn_mask, out, lse)
    ctx.settings = (sign, scale, is_causal, block_q, block_k)
    ctx.mark_non_differentiable(lse)


def _backward_formula(ctx, grad_out, grad_lse):
    q, k, v, attn_mask, out, lse = ctx.saved_tensors
    sign, scale, is_causal, block_q, block_k = ctx.settings
    dq, dk, dv = _l1_attention_backward_op(
        grad_out, q, k, v, attn_mask, out, lse, sign, scale, is_causal, block_q, block_k
    )
    return dq, dk, dv, None, None, None, None, None, None


_l1_attention_op.register_autograd(_backward_formula, setup_context=_setup_context)


def _checked(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None) -> Tensor | None:
    """Shapes and dtypes the core takes; a boolean mask as its additive form (0 keep, -inf drop)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (batch, heads, tokens, channels), got {q.dim()}-, {k.dim()}-, {v.dim()}-D")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not pair")
    if not (q.is_floating_point() and q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        zeros = torch.zeros(attn_mask.shape, dtype=work_dtype(q.dtype), device=attn_mask.device)
        return zeros.masked_fill(~attn_mask, _NEG_INF)
    return attn_mask


def l1_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sign: float = -1.0,
    scale: float | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    block_q: int | None = None,
    block_k: int = BLOCK_K,
) -> Tensor:
    """``softmax(sign * ||q_i - k_j||_1 * scale + mask) v`` through the fused op ``attnzoo::l1_attention``.

    Args:
        q: Queries (B, M, Nq, d).
        k: Keys (B, M, Nk, d).
        v: Values (B, M, Nk, dv).
        sign: ``-1`` attends to the nearest keys (WAFE-MAE, eq. 5), ``+1`` to the farthest (anti-WAFE, eq. 6).
        scale: Multiplies the distance (default ``1/d``, the paper's).
        attn_mask: Boolean (True = keep) or additive float mask broadcastable to (B, M, Nq, Nk).
        is_causal: Query ``i`` sees keys ``j <= i`` only (as :func:`attnzoo.models.standard.apply_attn_mask`).
        block_q: Queries per tile (default :func:`default_block_q`).
        block_k: Keys per tile.

    Returns:
        (B, M, Nq, dv) in q's dtype; rows with every key masked are zeros.
    """
    attn_mask = _checked(q, k, v, attn_mask)
    if block_q is None:
        block_q = default_block_q(q.shape, k.shape[-2], block_k, attn_mask is not None)
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block_q and block_k must be >= 1, got {block_q}, {block_k}")
    scale = 1.0 / q.shape[-1] if scale is None else float(scale)
    out, _ = torch.ops.attnzoo.l1_attention(q, k, v, attn_mask, float(sign), scale, bool(is_causal), block_q, block_k)
    return out


def l1_attention_decomposed(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sign: float = -1.0,
    scale: float | None = None,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    block: int | None = None,
) -> Tensor:
    """The same core in ordinary ops, ``block`` queries at a time (default :func:`decomposed_block`), for
    ``torch.compile`` and AOTInductor, which fuse each tile's broadcast ``|q_i - k_j|`` sum into one loop; other
    arguments as :func:`l1_attention`."""
    attn_mask = _checked(q, k, v, attn_mask)
    if block is None:
        block = decomposed_block(q.shape[1], k.shape[-2])
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    scale = 1.0 / q.shape[-1] if scale is None else float(scale)
    dtype = q.dtype
    q, k, v = (t.to(work_dtype(dtype)) for t in (q, k, v))
    n_q, n_k = q.shape[-2], k.shape[-2]
    mask = None if attn_mask is None else attn_mask.expand(*q.shape[:2], n_q, n_k)
    keys = torch.arange(n_k, device=q.device)
    outs = []
    for i0, i1 in _spans(n_q, block):
        s = (q[..., i0:i1, :].unsqueeze(-2) - k.unsqueeze(-3)).abs().sum(-1) * (sign * scale)
        if mask is not None:
            s = s + mask[..., i0:i1, :]
        if is_causal:
            s = s.masked_fill(keys > torch.arange(i0, i1, device=q.device).unsqueeze(-1), _NEG_INF)
        p = torch.where(s.amax(-1, keepdim=True) == _NEG_INF, 0.0, torch.softmax(s, dim=-1))
        outs.append(p @ v)
    out = torch.cat(outs, dim=-2) if outs else q.new_zeros((*q.shape[:-1], v.shape[-1]))
    return out.to(dtype)
