"""The CPU kernel of ``attnzoo::l1_attention``'s scores, ``coef * sum_c |q_ic - k_jc|`` for a tile, through Numba.

Paper: Yi Jin, "Divergence vs. Convergence: What Do We Need? -- Substitutes for 'Attention'", 2024, eq. 5-6.

``|a - b| = 2 max(a, b) - a - b``, so the distance is twice ``sum_c max(q_ic, k_jc)`` plus the token half-sums
``-sum_c q_ic / 2`` and ``-sum_c k_jc / 2`` (computed once per call): a ``max`` and an add per term, one operation
fewer than subtract, absolute value, add. One pass over the channels per four query rows: each channel's row of
keys is loaded once and its maxima added for the four rows in the same loop, which LLVM vectorises along the keys
at the machine's own width (Numba compiles for the CPU it runs on: AVX2, AVX-512); the four rows' sums stay in
the L1 cache, the keys in L2. Numba brings LLVM with it (no C compiler is needed); the kernel is compiled on its first
call (a few seconds, once per dtype) and cached beside this file or in Numba's user cache.

The rows are shared by the threads of Numba's pool (``prange`` over the heads' row groups), as many as
``torch.get_num_threads()``; calls are serialised by a lock, since Numba's fallback pool (``workqueue``, where
neither OpenMP nor TBB is found) must not be entered by two threads at once.
"""

from __future__ import annotations

import threading

import numba
import numpy as np
import torch
from torch import Tensor

__all__ = ["ROWS", "l1_scores"]

#: Query rows per pass over the channels.
ROWS = 4

_LOCK = threading.Lock()
#: The size of Numba's thread pool (``NUMBA_NUM_THREADS``, read when Numba is imported): the most a call can use.
_POOL: int = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # set from the environment at import


@numba.njit(parallel=True, nogil=True, cache=True, boundscheck=False, error_model="numpy")
def _scores(q, kt, half_q, half_k, i0, i1, j0, j1, coef, out):  # pragma: no cover - compiled by Numba
    groups, d = q.shape[0], q.shape[2]
    n, m = i1 - i0, j1 - j0
    per_group = (n + ROWS - 1) // ROWS
    for t in numba.prange(groups * per_group):
        g = t // per_group
        r = (t - g * per_group) * ROWS
        # a last group of fewer than four rows repeats the tile's last row; those sums are not written
        ia, ib, ic, id_ = i0 + r, min(i0 + r + 1, i1 - 1), min(i0 + r + 2, i1 - 1), min(i0 + r + 3, i1 - 1)
        sa, sb, sc, sd = np.zeros(m, q.dtype), np.zeros(m, q.dtype), np.zeros(m, q.dtype), np.zeros(m, q.dtype)
        qg, kg = q[g], kt[g]
        for c in range(d):
            qa, qb, qc, qd = qg[ia, c], qg[ib, c], qg[ic, c], qg[id_, c]
            keys = kg[c, j0:j1]
            for j in range(m):
                x = keys[j]
                sa[j] += max(qa, x)
                sb[j] += max(qb, x)
                sc[j] += max(qc, x)
                sd[j] += max(qd, x)
        og, hq, hk = out[g], half_q[g], half_k[g, j0:j1]
        twice = 2 * coef
        for row, sums in ((r, sa), (r + 1, sb), (r + 2, sc), (r + 3, sd)):
            if row < n:
                h = hq[i0 + row]
                for j in range(m):
                    og[row, j] = (sums[j] + h + hk[j]) * twice


def l1_scores(
    q: Tensor, kt: Tensor, half_q: Tensor, half_k: Tensor, i0: int, i1: int, j0: int, j1: int, coef: float
) -> Tensor:
    """``coef * sum_c |q[g, i, c] - kt[g, c, j]|`` for queries ``i0:i1`` and keys ``j0:j1``, (G, i1 - i0, j1 - j0).

    Args:
        q: Queries (G, Nq, d), fp32 or fp64, C-contiguous, on the CPU.
        kt: Keys channels first (G, d, Nk), q's dtype, C-contiguous.
        half_q: ``-sum_c q_ic / 2`` of each query (G, Nq), C-contiguous.
        half_k: ``-sum_c k_jc / 2`` of each key (G, Nk), C-contiguous.
        i0, i1, j0, j1: The tile's query and key spans.
        coef: Multiplies the distances.
    """
    out = torch.empty(q.shape[0], i1 - i0, j1 - j0, dtype=q.dtype)
    if out.numel():
        with _LOCK:
            numba.set_num_threads(max(1, min(torch.get_num_threads(), _POOL)))
            _scores(q.numpy(), kt.numpy(), half_q.numpy(), half_k.numpy(), i0, i1, j0, j1, coef, out.numpy())
    return out
