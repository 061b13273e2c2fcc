"""The AOTInductor target's report: ``<package>.pt2.json``, an AOTInductor package's export and compile, its extra
math counted in the exported program and its parity (``python -m attnzoo.runtime.schemas aoti`` prints its JSON
Schema)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from attnzoo.runtime.schemas import BlockDivergence, ExtraMathCheck, FormatReport, ParityCheck

__all__ = ["AOTIReport"]


@dataclass
class AOTIReport(FormatReport):
    """``<package>.pt2.json``: an AOTInductor package (``export-model --format aoti``).

    Attributes:
        device, gpu: What it was compiled for (the GPU's name on CUDA).
        batch_dim, batch_range: Its dynamic batch.
        export_time_s, num_nodes: ``torch.export``'s time and the program's call nodes.
        torch: PyTorch's version.
        compile_time_s, load_time_s: AOTInductor's compile and the package's load.
    """

    what: ClassVar[str] = "AOTInductor package report"

    device: str = field(kw_only=True)
    gpu: str | None = field(kw_only=True)
    batch_dim: str = field(kw_only=True)
    batch_range: list[int] = field(kw_only=True)
    export_time_s: float = field(kw_only=True)
    num_nodes: int = field(kw_only=True)
    extra_math: ExtraMathCheck | None = None
    divergence: BlockDivergence | None = None
    torch: str = field(kw_only=True)
    compile_time_s: float | None = None
    load_time_s: float | None = None
    parity: ParityCheck | None = None
    file_size: int | None = None
    sha256: str | None = None
    passed: bool = False
    failures: list[str] = field(default_factory=list)
