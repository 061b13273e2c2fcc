"""attnzoo.models.kernels: attention cores no PyTorch kernel computes, as ``torch.library`` custom ops.

- :mod:`.l1_core`: ``attnzoo::l1_attention``, the fused pairwise-L1 core of WAFE-MAE and anti-WAFE-MAE
  (``softmax(sign * ||q_i - k_j||_1 * scale + mask) V`` tile by tile with an online softmax) and its backward, and
  :func:`l1_attention_decomposed`, the same core in ordinary ops for compilers to fuse;
- :mod:`.l1_cpu`: the op's CPU kernel of the tiles' scores, compiled by Numba (imported where the op runs on the
  CPU);
- :mod:`.l1_triton`: the op's CUDA kernel in Triton (imported only where the op runs on a CUDA tensor).
"""

from .l1_core import (
    BLOCK_K,
    BLOCK_Q,
    DECOMPOSED_BLOCK,
    L1_ATTENTION_OP,
    TILE_ELEMENTS,
    cpu_kernel_unavailable_reason,
    l1_attention,
    l1_attention_decomposed,
    triton_unavailable_reason,
    work_dtype,
)

__all__ = [
    "BLOCK_K",
    "BLOCK_Q",
    "DECOMPOSED_BLOCK",
    "L1_ATTENTION_OP",
    "TILE_ELEMENTS",
    "cpu_kernel_unavailable_reason",
    "l1_attention",
    "l1_attention_decomposed",
    "triton_unavailable_reason",
    "work_dtype",
]
