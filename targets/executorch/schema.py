"""The ExecuTorch target's report: ``<program>.pte.json``, an ExecuTorch program's lowering, its extra math
counted in the lowered graph and its parity (``python -m attnzoo.runtime.schemas executorch`` prints its JSON
Schema)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from attnzoo.runtime.schemas import BlockDivergence, ExtraMathCheck, FormatReport, ParityCheck

__all__ = ["ExecuTorchReport"]


@dataclass
class ExecuTorchReport(FormatReport):
    """``<program>.pte.json``: an ExecuTorch program (``export-model --format executorch``).

    Attributes:
        quantization: How an int8 program is quantized (``None`` at fp32).
        delegate: The backend its graph is lowered to (XNNPACK).
        batch_dim, batch_range: Its dynamic batch.
        metadata: The model contract it carries.
        torch, executorch: The versions that lowered it.
        lower_time_s, num_nodes, serialize_time_s: The lowering and the program.
    """

    what: ClassVar[str] = "ExecuTorch program report"

    quantization: str | None = field(kw_only=True)
    delegate: str = field(kw_only=True)
    batch_dim: str = field(kw_only=True)
    batch_range: list[int] = field(kw_only=True)
    metadata: dict[str, str] = field(kw_only=True)
    torch: str = field(kw_only=True)
    executorch: str = field(kw_only=True)
    divergence: BlockDivergence | None = None
    lower_time_s: float | None = None
    num_nodes: int | None = None
    extra_math: ExtraMathCheck | None = None
    serialize_time_s: float | None = None
    parity: ParityCheck | None = None
    file_size: int | None = None
    sha256: str | None = None
    passed: bool = False
    failures: list[str] = field(default_factory=list)
