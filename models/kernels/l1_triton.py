"""The Triton kernel of ``attnzoo::l1_attention`` for CUDA GPUs: forward, online softmax over key tiles.

Paper: Yi Jin, "Divergence vs. Convergence: What Do We Need? -- Substitutes for 'Attention'", 2024, eq. 5-6.

One program per (query tile, image x head): for each tile of keys the distances ``sum_c |q_ic - k_jc|`` are summed
over channel chunks in registers (a (BLOCK_M, BLOCK_N, BLOCK_D) broadcast per chunk, never stored), scaled, masked,
and folded into a running maximum, sum and output per query row (flash attention's online softmax); ``P V`` is a
``tl.dot`` (IEEE fp32 for fp32 inputs, so that the result matches the fp32 reference, not TF32's). The output is
in the inputs' dtype, the row log-sum-exp in fp32 (what the op's backward recomputes the probabilities from).
Distances accumulate in fp32 whatever the inputs' dtype.

Imported only where the op runs on a CUDA tensor (``import triton`` needs the package torch's CUDA wheels bring);
the tests run it on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["l1_attention_forward", "BLOCK_M", "BLOCK_N", "BLOCK_D"]

#: Queries per program.
BLOCK_M = 32
#: Keys per tile.
BLOCK_N = 32
#: Channels per chunk of the distance sum (the (BLOCK_M, BLOCK_N, BLOCK_D) broadcast held in registers).
BLOCK_D = 8


@triton.jit
def _l1_distances(
    q_rows,
    k_rows,
    row_ok,
    key_ok,
    stride_qd,
    stride_kd,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The L1 distances ``sum_c |q_c - k_c|`` of a tile of queries to a tile of keys (``q_rows``, ``k_rows``: the
    pointers to each row's first channel), in fp32, read ``BLOCK_D`` channels at a time; rows, keys and channels
    out of range read 0."""
    dist = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for c0 in range(0, HEAD_DIM, BLOCK_D):
        ch = c0 + tl.arange(0, BLOCK_D)
        ch_ok = ch < HEAD_DIM
        q = tl.load(q_rows + ch[None, :] * stride_qd, mask=row_ok[:, None] & ch_ok[None, :], other=0.0).to(tl.float32)
        k = tl.load(k_rows + ch[None, :] * stride_kd, mask=key_ok[:, None] & ch_ok[None, :], other=0.0).to(tl.float32)
        dist += tl.sum(tl.abs(q[:, None, :] - k[None, :, :]), axis=2)
    return dist


@triton.jit
def _l1_attention_fwd(
    Q,
    K,
    V,
    Mask,
    Out,
    Lse,
    stride_qb,
    stride_qh,
    stride_qn,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_mb,
    stride_mh,
    stride_mq,
    stride_mk,
    stride_ob,
    stride_oh,
    stride_on,
    stride_od,
    heads,
    n_q,
    n_k,
    coef,
    HEAD_DIM: tl.constexpr,
    VALUE_DIM: tl.constexpr,
    VALUE_PAD: tl.constexpr,
    HAS_MASK: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    IEEE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads
    h = pid_bh % heads
    q_base = Q + b * stride_qb + h * stride_qh
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_q
    cols_v = tl.arange(0, VALUE_PAD)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, VALUE_PAD], tl.float32)
    hi = n_k
    if IS_CAUSAL:
        hi = tl.minimum(n_k, (pid_m + 1) * BLOCK_M)  # later keys are after every query of this tile
    q_rows = q_base + rows[:, None] * stride_qn  # each query row's first channel
    for start in range(0, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < n_k
        k_rows = k_base + keys[:, None] * stride_kn
        dist = _l1_distances(q_rows, k_rows, row_ok, key_ok, stride_qd, stride_kd, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D)
        s = dist * coef
        if HAS_MASK:
            s += tl.load(
                Mask + b * stride_mb + h * stride_mh + rows[:, None] * stride_mq + keys[None, :] * stride_mk,
                mask=row_ok[:, None] & key_ok[None, :],
                other=0.0,
            ).to(tl.float32)
        keep = key_ok[None, :] & row_ok[:, None]
        if IS_CAUSAL:
            keep = keep & (keys[None, :] <= rows[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key kept yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_base + keys[:, None] * stride_vn + cols_v[None, :] * stride_vd,
            mask=key_ok[:, None] & (cols_v[None, :] < VALUE_DIM),
            other=0.0,
        )
        if IEEE_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    kept = l_i > 0
    out = tl.where(kept[:, None], acc / tl.where(kept, l_i, 1.0)[:, None], 0.0)
    tl.store(
        Out + b * stride_ob + h * stride_oh + rows[:, None] * stride_on + cols_v[None, :] * stride_od,
        out.to(Out.dtype.element_ty),
        mask=row_ok[:, None] & (cols_v[None, :] < VALUE_DIM),
    )
    lse = tl.where(kept, m_i + tl.log(tl.where(kept, l_i, 1.0)), float("-inf"))
    tl.store(Lse + pid_bh * n_q + rows, lse, mask=row_ok)


def l1_attention_forward(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, sign: float, scale: float, is_causal: bool
) -> tuple[Tensor, Tensor]:
    """(out in q's dtype, fp32 row log-sum-exp) of ``softmax(sign * ||q_i - k_j||_1 * scale + mask) v`` for
    (B, M, Nq, d) queries, (B, M, Nk, d) keys, (B, M, Nk, dv) values and an additive mask broadcastable to
    (B, M, Nq, Nk); the arguments are the op's (``attnzoo.models.kernels.l1_attention`` checks them)."""
    B, M, n_q, d = q.shape
    n_k, dv = k.shape[-2], v.shape[-1]
    out = torch.empty((B, M, n_q, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, M, n_q), dtype=torch.float32, device=q.device)
    mask = attn_mask.expand(B, M, n_q, n_k) if attn_mask is not None else out  # a placeholder pointer if none
    mask_strides = mask.stride() if attn_mask is not None else (0, 0, 0, 0)
    grid = (triton.cdiv(n_q, BLOCK_M), B * M)
    _l1_attention_fwd[grid](
        q,
        k,
        v,
        mask,
        out,
        lse,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *mask_strides,
        *out.stride(),
        M,
        n_q,
        n_k,
        float(sign * scale),
        HEAD_DIM=d,
        VALUE_DIM=dv,
        VALUE_PAD=max(16, triton.next_power_of_2(dv)),
        HAS_MASK=attn_mask is not None,
        IS_CAUSAL=bool(is_causal),
        IEEE_DOT=q.dtype == torch.float32,
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
    )
    return out, lse
