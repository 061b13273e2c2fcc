"""Counted FLOPs of a model: one count per model, shared by every backend's row.

The count is :class:`torch.utils.flop_counter.FlopCounterMode` on the eager model, one image, plus two
formulas it lacks: the CPU kernel of ``F.scaled_dot_product_attention``
(``_scaled_dot_product_flash_attention_for_cpu``, counted as PyTorch counts the GPU kernels: ``Q K^T`` and
``P V``, 2 FLOPs per multiply-add) and ``torch.cdist`` (the MAE scores: 3 FLOPs per term, subtract, absolute
value, add). Conventions:

- matmul-class work only (linear, convolution, ``mm``/``bmm``, attention, ``cdist``); element-wise ops
  (normalisation, softmax, GELU, the projection) are not counted;
- every op here is per image, so a batch of ``n`` costs ``n`` times the count of one image.
"""

from __future__ import annotations

import math
from typing import Any, Dict

import torch
from torch import nn

__all__ = ["count_flops", "CDIST_FLOPS_PER_TERM"]

#: FLOPs per ``|a - b|`` term of an L1 ``cdist``: subtract, absolute value, add.
CDIST_FLOPS_PER_TERM = 3


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
    """``Q K^T`` and ``P V`` of the CPU attention kernel (PyTorch's formula for the GPU kernels)."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cdist_flops(x1_shape, x2_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
    """``cdist(x1 (..., P, M), x2 (..., R, M))``: ``CDIST_FLOPS_PER_TERM`` per (p, r, m) term."""
    lead = math.prod(x1_shape[:-2])
    return CDIST_FLOPS_PER_TERM * lead * x1_shape[-2] * x2_shape[-2] * x1_shape[-1]


def _mapping() -> Dict[Any, Any]:
    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops, aten._cdist_forward: _cdist_flops}


def count_flops(model: nn.Module, img_size: int | tuple) -> Dict[str, Any]:
    """FLOPs of one forward pass of ``model`` on one ``img_size`` image (see the module docstring).

    Args:
        model: An eval-mode PyTorch model (fp32; run once on zeros, on the CPU).
        img_size: Input side, or ``(H, W)``.

    Returns:
        ``{"flops_per_image": int, "by_op": {aten op: FLOPs}, "counter": how it was counted}``.
    """
    from torch.utils.flop_counter import FlopCounterMode

    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    device = next(model.parameters()).device
    x = torch.zeros(1, 3, int(h), int(w), device=device)
    counter = FlopCounterMode(display=False, custom_mapping=_mapping())
    with counter, torch.inference_mode():
        model(x)
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items() if n}
    return {"flops_per_image": int(counter.get_total_flops()), "by_op": by_op,
            "counter": "torch.utils.flop_counter.FlopCounterMode + CPU attention and cdist formulas "
                       "(attnzoo.benchmarks.flops)"}
