"""FLOPs and memory traffic of one forward pass, counted from the ops PyTorch dispatches.

One counter for every consumer (the roofline table, the scaling fits; a GFLOP/s column can use it too):

- **Matrix FLOPs** (tensor-core work on a GPU): every op in ``torch.utils.flop_counter``'s registry (``mm``,
  ``addmm``, ``bmm``, convolutions, the CUDA SDPA kernels) with its formulas, 2 FLOPs per multiply-add, plus
  the CPU SDPA kernel (``_scaled_dot_product_flash_attention_for_cpu``), which that registry lacks, so
  ``FlopCounterMode`` alone misses every attention matmul on a CPU.
- **Vector ops** (CUDA-core / SIMD work that no matrix unit does): the pairwise L1 distance of the MAE
  variants (``torch.cdist(p=1)``, or inside their fused core ``attnzoo::l1_attention``, whose ``P V`` is counted
  as matrix FLOPs), 3 ops per (query, key, channel): subtract, absolute value, add.
- **Not counted**: other element-wise ops (softmax, LayerNorm, GELU, residual adds, the projection's inner
  products); they are a few percent of the matrix FLOPs for every variant here.

Memory traffic, the *fused-kernel model*: each counted op reads its operands from DRAM and writes its result
once; everything element-wise is fused into a neighbouring counted op, and SDPA is one fused kernel (flash
attention: the N x N scores never reach DRAM, but explicit score tensors, as in the MAE variants, do). Weights
are read once per use. Elements are counted, so bytes follow from the storage width of a precision
(:meth:`Count.bytes`); a broadcast (stride-0) operand counts its stored elements only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnzoo.models import create_model  # registers attnzoo::l1_attention (WAFE-MAE's fused core)

__all__ = [
    "CDIST_FLOPS_PER_TERM",
    "Count",
    "count_flops",
    "count_forward",
    "count_variant",
    "meta_model",
    "stored_elements",
]

aten = torch.ops.aten

#: Ops per ``|a - b|`` term of an L1 ``cdist``: subtract, absolute value, add.
CDIST_FLOPS_PER_TERM = 3


def stored_elements(t: torch.Tensor) -> int:
    """Elements a tensor occupies in memory: its size without broadcast (stride-0) dimensions."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=False):
        if stride != 0:
            n *= size
    return n


def _sdpa_cpu_flops(query, key, value, *args, **kwargs) -> int:
    return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)


def _cdist_ops(x1, x2, p: float = 2.0, *args, **kwargs) -> int:
    """Vector ops of ``cdist``: 3 per (row of x1, row of x2, channel) for p = 1 (sub, abs, add)."""
    batch = 1
    for s in x1.shape[:-2]:
        batch *= s
    return CDIST_FLOPS_PER_TERM * batch * x1.shape[-2] * x2.shape[-2] * x1.shape[-1]


def _l1_core_counts(q, k, v, *args, **kwargs) -> tuple[int, int]:
    """(matrix FLOPs, vector ops) of the fused L1 core: ``P V`` as a matrix product, the distances as
    :func:`_cdist_ops` counts them."""
    heads = q.shape[0] * q.shape[1]
    return 2 * heads * q.shape[2] * k.shape[2] * v.shape[3], _cdist_ops(q, k)


#: Fused cores counted as both: op packet -> formula(args, kwargs) -> (matrix FLOPs, vector ops).
_BOTH: dict[Any, Callable[..., tuple[int, int]]] = {torch.ops.attnzoo.l1_attention: _l1_core_counts}
#: Matrix ops the torch registry lacks: op packet -> formula(args, kwargs) -> FLOPs.
_EXTRA_MATRIX: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu_flops,
    aten.scaled_dot_product_attention: _sdpa_cpu_flops,
}
#: Vector-op counters: op packet -> formula(args, kwargs) -> ops.
_VECTOR: dict[Any, Callable[..., int]] = {aten._cdist_forward: _cdist_ops, aten.cdist: _cdist_ops}


@dataclass
class Count:
    """What one forward pass costs.

    Attributes:
        matrix_flops: FLOPs of matrix ops (2 per multiply-add).
        vector_ops: Element-wise ops of the MAE pairwise distance (0 for the other variants).
        weight_elements: Weight elements read (each use counted).
        activation_elements: Activation elements read and written by the counted ops.
        ops: Per aten op: ``calls``, ``flops``, ``vector_ops``, ``elements``.
    """

    matrix_flops: int = 0
    vector_ops: int = 0
    weight_elements: int = 0
    activation_elements: int = 0
    ops: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))

    def bytes(self, width: float, weight_width: float | None = None) -> float:
        """Bytes moved when activations are ``width`` bytes per element (weights ``weight_width``, default
        the same)."""
        return self.activation_elements * width + self.weight_elements * (
            width if weight_width is None else weight_width
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "matrix_flops": self.matrix_flops,
            "vector_ops": self.vector_ops,
            "weight_elements": self.weight_elements,
            "activation_elements": self.activation_elements,
            "ops": {k: dict(v) for k, v in sorted(self.ops.items())},
        }


class _Counter(TorchDispatchMode):
    """Dispatch mode adding every counted op's FLOPs and operand/result elements to a :class:`Count`."""

    def __init__(self, count: Count, weight_storages: set[int]) -> None:
        super().__init__()
        self.count = count
        self.weights = weight_storages

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        matrix = flop_counter.flop_registry.get(packet)
        extra = _EXTRA_MATRIX.get(packet)
        vector = _VECTOR.get(packet)
        both = _BOTH.get(packet)
        if matrix is None and extra is None and vector is None and both is None:
            # not counted: a composite op decomposes, so its matrix parts are seen (as in FlopCounterMode)
            with self:
                out = func.decompose(*args, **kwargs)
            return func(*args, **kwargs) if out is NotImplemented else out
        out = func(*args, **kwargs)
        c = self.count
        row = c.ops[str(packet)]
        row["calls"] += 1
        if matrix is not None:
            flops = int(matrix(*args, **kwargs, out_val=out))
            c.matrix_flops += flops
            row["flops"] += flops
        elif extra is not None or both is not None:
            flops, ops = (int(extra(*args, **kwargs)), 0) if extra is not None else both(*args, **kwargs)
            c.matrix_flops += flops
            row["flops"] += flops
            c.vector_ops += ops
            row["vector_ops"] += ops
        else:
            ops = int(vector(*args, **kwargs))
            c.vector_ops += ops
            row["vector_ops"] += ops
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outputs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        if (extra is not None or both is not None) and isinstance(out, tuple):
            outputs = outputs[:1]  # a kernel's logsumexp is a by-product, not written in inference
        for t in inputs:
            n = stored_elements(t)
            if t.untyped_storage()._cdata in self.weights:
                c.weight_elements += n
            else:
                c.activation_elements += n
            row["elements"] += n
        for t in outputs:
            c.activation_elements += t.numel()
            row["elements"] += t.numel()
        return out


def _weight_storages(modules: Iterable[nn.Module]) -> set[int]:
    return {p.untyped_storage()._cdata for m in modules for p in m.parameters()}


def count_forward(model: nn.Module, x: torch.Tensor) -> Count:
    """Count one ``model(x)``; works on the ``meta`` device (no weights, no time), see :func:`count_variant`.

    Runs under ``torch.inference_mode``, where composite ops reach the dispatcher whole: the counter
    decomposes every op it does not count (``linear`` -> ``addmm`` ...) but sees SDPA as the one fused op it
    is on every device (under ``no_grad`` the CPU and meta paths would split it differently).
    """
    count = Count()
    with torch.inference_mode(), _Counter(count, _weight_storages([model])):
        model(x)
    return count


def meta_model(
    variant: str, task: str = "cls", arch: str = "tiny", img_size: int | None = None, **create_kwargs: Any
) -> nn.Module:
    """``create_model(...)`` on the ``meta`` device: shapes only, built in milliseconds, no memory."""
    with torch.device("meta"):
        return create_model(variant, task=task, arch=arch, img_size=img_size, **create_kwargs).eval()


def count_variant(
    variant: str,
    task: str = "cls",
    arch: str = "tiny",
    img_size: int | None = None,
    batch: int = 1,
    model: nn.Module | None = None,
    **create_kwargs: Any,
) -> Count:
    """Count a ``(batch, 3, S, S)`` forward of ``create_model(variant, task, arch, img_size=S)`` on ``meta``
    (``model``: such a meta model, to count several batch sizes without rebuilding it)."""
    model = model if model is not None else meta_model(variant, task, arch, img_size, **create_kwargs)
    size = cast(dict[str, Any], model.attnzoo_config)["img_size"]
    return count_forward(model, torch.empty(batch, 3, size, size, device="meta"))


def count_flops(model: nn.Module, img_size: int | tuple) -> dict[str, Any]:
    """FLOPs of one image through ``model`` for a GFLOP/s column: matrix FLOPs plus the MAE vector ops.

    Args:
        model: An eval-mode model (run once on zeros; a ``meta`` model works too).
        img_size: Input side, or ``(H, W)``.

    Returns:
        ``{"flops_per_image": int, "by_op": {aten op: FLOPs or ops}, "counter": how it was counted}``.
    """
    h, w = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    device = next(model.parameters()).device
    count = count_forward(model, torch.zeros(1, 3, int(h), int(w), device=device))
    by_op = {op: row.get("flops", 0) + row.get("vector_ops", 0) for op, row in count.ops.items()}
    return {
        "flops_per_image": count.matrix_flops + count.vector_ops,
        "by_op": {k: v for k, v in by_op.items() if v},
        "counter": "attnzoo.benchmarks.flops (torch.utils.flop_counter formulas + CPU attention and cdist)",
    }
