"""Fixtures the benchmark tests share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from attnzoo.benchmarks import scaling


@pytest.fixture
def micro_sweep(tmp_path: Path) -> Callable[..., scaling.Settings]:
    """The settings of a short scaling sweep (``scaling.Settings``) of the micro model: classification at 32 px, no
    batch axis, 10 ms a point, into ``tmp_path`` (its exports in ``tmp_path/cache``), no progress bar; keywords
    override any field."""

    def settings(variants: Sequence[str], backends: Sequence[str], **fields: Any) -> scaling.Settings:
        base: dict[str, Any] = dict(arch="micro", sizes=(32,), seg_sizes=(), batch_sizes=(), min_time=0.01)
        base.update(out=tmp_path, cache_dir=tmp_path / "cache", progress=False)
        return scaling.Settings(variants=list(variants), backends=tuple(backends), **{**base, **fields})

    return settings
