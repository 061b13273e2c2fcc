"""WAFE and anti-WAFE: dot-product, MSE and MAE scores, converging or diverging.

Paper: Yi Jin, "Divergence vs. Convergence: What Do We Need? -- Substitutes for 'Attention'", 2024, eq. 1-6
(the paper's text names no arXiv identifier; :data:`PAPER` links an arXiv title search):

- eq. 1 ``WAFE_dot``      ``softmax( Q K^T / sqrt(d)) V`` -- standard attention (alias ``wafe-dot``)
- eq. 2 ``anti-WAFE_dot`` ``softmax(-Q K^T / sqrt(d)) V``
- eq. 3 ``WAFE_MSE``      ``softmax(-||q_i - k_j||^2 / d) V``
- eq. 4 ``anti-WAFE_MSE`` ``softmax(+||q_i - k_j||^2 / d) V``
- eq. 5 ``WAFE_MAE``      ``softmax(-||q_i - k_j||_1 / d) V``
- eq. 6 ``anti-WAFE_MAE`` ``softmax(+||q_i - k_j||_1 / d) V``

MSE through the fused kernel (docs/variants.md, "MSE scores"): ``-||q - k||^2 / d = (2 q.k - ||k||^2)/d - ||q||^2/d``;
the last term is constant along a softmax row and cancels, so the scores are dot products with scale
``2/d`` plus the per-key additive bias ``-||k||^2/d`` -- ``F.scaled_dot_product_attention`` with a float mask.
The sign flips for anti-WAFE.

MAE has no such form: it needs the pairwise L1 distances ``sum_c |q_ic - k_jc|`` (N^2 d terms; no matrix
product computes them). No path materialises the (B, M, N, N, d) tensor of differences, and the fused paths not
even the N x N scores (``mae_impl``; ``auto`` picks by where the layer runs, :func:`auto_mae_impl`):

- ``fused``: the custom op ``attnzoo::l1_attention`` (:mod:`attnzoo.models.kernels`), the whole core
  ``softmax(sign * dist / d + mask) V`` tile by tile with an online softmax; each tile's distances in a kernel
  Numba compiles for the CPU it runs on, a Triton kernel on CUDA. ``auto`` in eager inference and under
  ``torch.compile`` (the compiler keeps the op as one call);
- ``tiled``: the same core in ordinary ops, a query tile at a time, which Inductor fuses into one loop per tile
  that never stores the differences. ``auto`` in AOTInductor packages (:func:`export_mae_impl`), whose C++ loader
  could not run the op's Python kernel, and under ``torch.compile`` where the op has no compiled kernel;
- ``cdist``: ``torch.cdist(p=1)``, then softmax and ``P V``. ``auto`` where autograd records (training: its
  backward is one ATen kernel, faster at the zoo's token counts than the op's tiled backward, a Python loop over
  ATen ops) and under a plain ``torch.export`` (ExecuTorch runs the program with its own kernels);
- ``loop``: the fused op exported to ONNX as one ``Loop`` over query tiles of every head, each iteration the whole
  core in ordinary ops (:mod:`attnzoo.export.onnx_l1`), so the graph holds a tile of scores, never a head's N x N;
  ``auto`` while exporting to ONNX from :data:`ONNX_LOOP_TOKENS` keys on, and what ``fused`` exports as (in
  PyTorch it runs ``fused``). Without a mask and not causal only (an image model's core): else ``blocked``;
- ``blocked``: :func:`pairwise_l1`, ordinary ops that ONNX runtimes execute without the broadcast tensor; ``auto``
  while exporting to ONNX below :data:`ONNX_LOOP_TOKENS` keys:

- ``|a - b| = 2 max(a, b) - a - b``, so ``sum_c |q_ic - k_jc| = 2 sum_c max(q_ic, k_jc) - sum_c q_ic -
  sum_c k_jc``: one broadcast ``Max`` per term instead of ``Sub`` then ``Abs``; the two sums are per token.
- Channels first: ``max(q_ic, k_jc)`` is laid out (d, queries, keys), so ``Max`` broadcasts one query value
  over a contiguous row of keys, and the sum over channels is a ``MatMul`` with a row of twos.
- One head and :data:`MAE_BLOCK` queries at a time, so the (B, d, block, N) slab of maxima stays in cache
  (0.8 MB per image for a ViT-Ti at 224 px) instead of the 30 MB broadcast tensor per layer.

``mae_impl="broadcast"`` keeps the direct ``|q_i - k_j|`` broadcast (``Sub``, ``Abs``, ``ReduceSum``) for
comparison. In fp16/bf16 the blocked distance is computed in fp32 (the subtraction of the token sums would
otherwise lose the small distances of large, similar vectors). Attention dropout in training needs the explicit
weights: with it every impl runs as ``cdist``. A query whose keys are all masked gets zeros from ``fused`` and
``tiled`` (as from ``F.scaled_dot_product_attention``), NaN from the softmax of the others.

The distance math is the variant's extra math (``attnzoo.models.register_variant``'s ``extra_scopes``), kept in
its own sub-module so that an export names its ops ``blocks.N.attn.<scope>/...``; they stay fp32 in fp16
exports and unquantized in int8/fp8 ones:

- MAE: ``distance`` (:class:`PairwiseL1`), the pairwise L1 distances of eq. 5-6, all of them (in the core impls,
  and so in an ONNX ``Loop``, the softmax and ``P V`` with them);
- MSE: ``key_norm`` (:class:`KeyNormBias`), the per-key term ``±||k_j||^2 / d`` that turns the fused kernel's
  dot product into the squared distance of eq. 3-4. The ``q.k`` term is the kernel's own product, the same
  op as in standard attention, and is quantized as there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import nn

from .kernels import cpu_kernel_unavailable_reason, l1_attention, l1_attention_decomposed, triton_unavailable_reason
from .registry import Paper, register_variant
from .standard import StandardAttention, additive_mask

__all__ = [
    "WAFEAttention",
    "PairwiseL1",
    "KeyNormBias",
    "SCORE_CHOICES",
    "MAE_IMPLS",
    "MAE_BLOCK",
    "MAE_MAX_BLOCKS",
    "KEY_NORM_OPS",
    "mae_block",
    "pairwise_l1",
    "auto_mae_impl",
    "export_mae_impl",
    "CORE_IMPLS",
    "ONNX_LOOP_TOKENS",
    "PAPER",
]

PAPER = Paper(
    "Divergence vs. Convergence: What Do We Need? -- Substitutes for 'Attention'",
    "Yi Jin",
    2024,
    "https://arxiv.org/search/?searchtype=title&query=Divergence+vs.+Convergence+What+Do+We+Need",
)

SCORE_CHOICES = ("dot", "mse", "mae")
#: How MAE scores compute the pairwise L1 distance (``auto``: :func:`auto_mae_impl`).
MAE_IMPLS = ("auto", "fused", "loop", "tiled", "cdist", "blocked", "broadcast")
#: The impls that compute the whole core ``softmax(sign * dist / d) V`` (the others the distances only).
CORE_IMPLS = ("fused", "loop", "tiled")
#: From this many keys on, ``auto`` exports the ONNX ``Loop`` form (``loop``) instead of ``blocked``: the blocked
#: form holds every head's N x N distances, which OpenVINO (it runs standard's attention fused) does not
#: (``results/studies/fused-cores/l1-memory-4096/``); below, the scores are small and ``blocked`` is faster.
ONNX_LOOP_TOKENS = 2048
#: Queries per block of :func:`pairwise_l1`: the (B, d, block, N) slab of one head is 0.8 MB per image for a
#: ViT-Ti at 224 px. Blocks of 8 and 16 ran alike on a 2-core AVX2 EPYC
#: (``results/bench-latency/cpu-tiny-mae/forms/``); 16 halves the unrolled export. Slabs far past the cache
#: (all heads at once, or 32 queries, at batch 8) were slower in exploratory runs.
MAE_BLOCK = 16
#: Most blocks per head: longer sequences get larger blocks, so the unrolled export stays small.
MAE_MAX_BLOCKS = 16
#: Minimum op counts of one MSE key-norm scope (:class:`KeyNormBias`: ``Mul`` k * k, ``ReduceSum``, ``Mul`` by
#: sign / d).
KEY_NORM_OPS: Mapping[str, int] = {"Mul": 2, "ReduceSum": 1}


def mae_block(n_queries: int) -> int:
    """Queries per block: :data:`MAE_BLOCK`, or more where that would make over :data:`MAE_MAX_BLOCKS` blocks."""
    return max(MAE_BLOCK, -(-n_queries // MAE_MAX_BLOCKS))


def pairwise_l1(q: torch.Tensor, k: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """``out[..., i, j] = sum_c |q[..., i, c] - k[..., j, c]|`` for (B, M, Nq, d) and (B, M, Nk, d) inputs.

    Computed as ``2 sum_c max(q_ic, k_jc) - sum_c q_ic - sum_c k_jc``, one head and one block of queries at a
    time, channels first, the channel sum a matrix product (see the module docstring). The loops unroll over
    the static head and token counts when exported; the batch stays dynamic.

    Args:
        q: Queries (B, M, Nq, d).
        k: Keys (B, M, Nk, d).
        block: Queries per block (default :func:`mae_block` of Nq).
    """
    block = mae_block(q.shape[-2]) if block is None else block
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    dtype = q.dtype
    if dtype in (torch.float16, torch.bfloat16):
        q, k = q.float(), k.float()
    twos = torch.full((1, q.shape[-1]), 2.0, dtype=q.dtype, device=q.device)
    q_col = q.unsqueeze(-1)  # (B, M, Nq, d, 1): one query value against a row of keys
    k_rows = k.transpose(-1, -2).unsqueeze(-3)  # (B, M, 1, d, Nk): channels first
    per_head = []
    for q_h, k_h in zip(q_col.unbind(1), k_rows.unbind(1), strict=False):
        # (B, b, d, Nk) maxima per block of b queries; twos @ sums the channels -> (B, b, 1, Nk)
        per_head.append(torch.cat([twos @ torch.maximum(q_b, k_h) for q_b in q_h.split(block, dim=1)], dim=1))
    doubled = torch.stack(per_head, dim=1).squeeze(-2)  # (B, M, Nq, Nk)
    dist = doubled - q.sum(-1).unsqueeze(-1) - k.sum(-1).unsqueeze(-2)
    return dist.to(dtype)


_EXPORT_IMPL = ["cdist"]  # what ``auto`` runs under torch.export (export_mae_impl)


@contextlib.contextmanager
def export_mae_impl(impl: str) -> Iterator[None]:
    """What ``mae_impl="auto"`` runs under ``torch.export`` inside the block (``cdist`` outside it): the
    AOTInductor export asks for ``tiled``, which Inductor compiles into the package."""
    _checked_mae_impl(impl)
    _EXPORT_IMPL.append(impl)
    try:
        yield
    finally:
        _EXPORT_IMPL.pop()


def auto_mae_impl(needs_grad: bool = False, device: torch.device | str = "cpu", tokens: int = 0) -> str:
    """What ``mae_impl="auto"`` runs now on ``device`` for ``tokens`` keys: while exporting to ONNX ``blocked``,
    or ``loop`` from :data:`ONNX_LOOP_TOKENS` keys on; ``cdist`` where ``needs_grad`` (autograd records); while
    ``torch.compile`` traces, ``fused`` where the op has its compiled kernel (the CPU with Numba, CUDA with Triton;
    the compiler keeps the op as one call) and ``tiled`` elsewhere (the compiler fuses each tile into one loop);
    under ``torch.export`` ``cdist`` or what :func:`export_mae_impl` set; else ``fused``."""
    if torch.onnx.is_in_onnx_export():
        return "loop" if tokens >= ONNX_LOOP_TOKENS else "blocked"
    if needs_grad:
        return "cdist"
    if torch.compiler.is_compiling():
        if torch.compiler.is_exporting():
            return _EXPORT_IMPL[-1]
        kind = torch.device(device).type
        if kind == "cuda":
            return "fused" if triton_unavailable_reason() is None else "tiled"
        return "fused" if kind == "cpu" and cpu_kernel_unavailable_reason() is None else "tiled"
    return "fused"


def _checked_mae_impl(impl: str) -> str:
    if impl not in MAE_IMPLS:
        raise ValueError(f"unknown mae_impl {impl!r}; valid: {', '.join(MAE_IMPLS)}")
    return impl


class PairwiseL1(nn.Module):
    """Pairwise L1 distances ``sum_c |q_ic - k_jc|`` of queries and keys (eq. 5-6), (B, M, Nq, Nk), or with
    values the whole core ``softmax(sign * dist / d + mask) v`` (impls :data:`CORE_IMPLS`), so that every form of
    the variant's extra math runs in this module (its export scope ``distance``).

    Args:
        impl: One of :data:`MAE_IMPLS` (the module docstring says what each runs); ``auto``:
            :func:`auto_mae_impl`.
    """

    def __init__(self, impl: str = "auto") -> None:
        super().__init__()
        self.impl = _checked_mae_impl(impl)

    def resolved(self, needs_grad: bool = False, device: torch.device | str = "cpu", tokens: int = 0) -> str:
        """The impl a call on ``device`` with ``tokens`` keys runs now: ``auto`` resolved; while exporting to ONNX
        the fused op is its ``Loop`` form, and ``loop`` runs the fused op anywhere else."""
        impl = auto_mae_impl(needs_grad, device, tokens) if self.impl == "auto" else self.impl
        if torch.onnx.is_in_onnx_export():
            return "loop" if impl == "fused" else impl
        return "fused" if impl == "loop" else impl

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor | None = None,
        *,
        impl: str | None = None,
        sign: float = -1.0,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        """Distances of ``q`` (B, M, Nq, d) and ``k`` (B, M, Nk, d); with ``v`` (B, M, Nk, dv) and a core impl,
        the attention output (B, M, Nq, dv). ``impl`` defaults to :meth:`resolved`."""
        impl = impl or self.resolved(device=q.device, tokens=k.shape[-2])
        if v is not None:
            if impl not in CORE_IMPLS:
                raise ValueError(f"impl {impl!r} computes distances only; the core: {', '.join(CORE_IMPLS)}")
            core = l1_attention_decomposed if impl == "tiled" else l1_attention  # loop: the op, exported as a Loop
            return core(q, k, v, sign, 1.0 / q.shape[-1], attn_mask, is_causal)
        if impl in ("cdist", "fused", "tiled"):
            return torch.cdist(q, k, p=1.0)
        if impl in ("blocked", "loop"):  # loop: the distances alone have no Loop form; the ONNX one
            return pairwise_l1(q, k)
        return (q.unsqueeze(-2) - k.unsqueeze(-3)).abs().sum(dim=-1)

    def extra_repr(self) -> str:
        return f"impl={self.impl}"


class KeyNormBias(nn.Module):
    """The per-key term ``sign * ||k_j||^2 / d`` of the MSE scores (eq. 3-4), (B, M, 1, Nk).

    Summed in at least fp32 (``||k||^2`` of a 64-channel head passes fp16's 65504 for entries near 32) and
    returned in ``k``'s dtype, the dtype the fused kernel's additive mask must have.

    Args:
        sign: ``-1`` for WAFE (eq. 3), ``+1`` for anti-WAFE (eq. 4).
    """

    def __init__(self, sign: float) -> None:
        super().__init__()
        self.sign = float(sign)

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        k32 = k.to(torch.promote_types(k.dtype, torch.float32))
        d = k.shape[-1]
        return ((self.sign / d) * (k32 * k32).sum(dim=-1).unsqueeze(-2)).to(k.dtype)

    def extra_repr(self) -> str:
        return f"sign={self.sign:+g}"


class WAFEAttention(StandardAttention):
    """Attention with WAFE scores.

    Args:
        score: ``dot``, ``mse`` or ``mae``.
        anti: Flip the sign of the scores (anti-WAFE: attend to the *least* similar keys).
        mae_impl: One of :data:`MAE_IMPLS` (the module docstring says what each runs); ``auto``:
            :func:`auto_mae_impl`.
        **kwargs: ``timm.layers.Attention`` keywords (see :class:`StandardAttention`).
    """

    def __init__(
        self, dim: int, num_heads: int = 8, score: str = "dot", anti: bool = False, mae_impl: str = "auto", **kwargs
    ) -> None:
        if score not in SCORE_CHOICES:
            raise ValueError(f"unknown score {score!r}; valid: {', '.join(SCORE_CHOICES)}")
        _checked_mae_impl(mae_impl)  # for every score, so that a typo is not silently ignored
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.score = score
        self.anti = bool(anti)
        if score == "mse":
            self.key_norm = KeyNormBias(self.sign)
        elif score == "mae":
            self.distance = PairwiseL1(mae_impl)

    @property
    def sign(self) -> float:
        """Sign of the distance in the scores: WAFE ``-distance``, anti-WAFE ``+distance``."""
        return 1.0 if self.anti else -1.0

    def scores_attention(self, x, q, k, v, attn_mask: torch.Tensor | None, is_causal: bool):
        sign = self.sign
        d = self.head_dim
        if self.score == "dot":
            return self.sdpa(-q if self.anti else q, k, v, attn_mask, is_causal)
        if self.score == "mse":
            # sign * ||q - k||^2 / d  ==  (-2 sign) q.k / d + sign ||k||^2 / d  (+ a per-row constant)
            key_bias = self.key_norm(k)  # (B, M, 1, N)
            mask = additive_mask(attn_mask, is_causal, q.shape[-2], k.shape[-2], key_bias.dtype, q.device)
            if mask is not None:  # the kernel takes one mask: the key bias with the masks added
                key_bias = key_bias + mask
            # Keep the kernel's scale positive (torch's ONNX decomposition takes sqrt(scale)): flip q instead.
            return self.sdpa(-q if self.anti else q, k, v, key_bias, False, scale=2.0 / d)
        dropout = self.training and self.attn_drop.p > 0
        needs_grad = torch.is_grad_enabled() and q.requires_grad
        impl = "cdist" if dropout else self.distance.resolved(needs_grad, q.device, k.shape[-2])
        if impl == "loop" and (attn_mask is not None or is_causal):
            impl = "blocked"  # the ONNX Loop form is the image models' core: no mask, not causal
        if impl in CORE_IMPLS:
            return self.distance(q, k, v, impl=impl, sign=sign, attn_mask=attn_mask, is_causal=is_causal)
        return self.softmax_attend((sign / d) * self.distance(q, k, impl=impl), v, attn_mask, is_causal)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", score={self.score}, anti={self.anti}"


#: Each score's extra math, by sub-module (``extra_scopes`` of :func:`register_variant`).
_SCORE_SCOPES: dict[str, dict[str, Mapping[str, int] | None]] = {
    "mse": {"key_norm": KEY_NORM_OPS},  # the ||k||^2 term of the squared distance (eq. 3-4)
    "mae": {"distance": None},  # the pairwise L1 distances (eq. 5-6); their ops depend on mae_impl
}


def _register(name: str, score: str, anti: bool, equations: str, cost_family: str = "") -> None:
    """Register the WAFE variant with ``score`` (``anti``: its scores negated) and what that score brings: its
    extra scopes, and for ``mae`` the ``mae_impl`` option and slab-by-slab pairwise distances."""
    mae = score == "mae"
    register_variant(
        name,
        WAFEAttention,
        paper=PAPER,
        equations=equations,
        options={"score": score, "anti": anti, **({"mae_impl": "auto"} if mae else {})},
        extra_scopes=_SCORE_SCOPES.get(score, {}),
        pairwise_scores=mae,
        cost_family=cost_family,
    )


# ``standard`` is WAFE-dot (eq. 1).
_register("anti-wafe-dot", "dot", True, "eq. 2", cost_family="standard")
_register("wafe-mse", "mse", False, "eq. 3")
_register("anti-wafe-mse", "mse", True, "eq. 4", cost_family="wafe-mse")
_register("wafe-mae", "mae", False, "eq. 5")
_register("anti-wafe-mae", "mae", True, "eq. 6", cost_family="wafe-mae")
