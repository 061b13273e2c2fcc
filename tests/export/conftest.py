"""Fixtures the export tests share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from attnzoo.export import quantize as qz


def quantize_random(
    path: Path, out: Path, config: dict[str, Any], count: int, *, seed: int | None = None, **options: Any
) -> dict[str, Any]:
    """``quantize_verified`` of the fp32 ONNX ``path`` to int8 at ``out``, calibrated on ``count`` random 32 x 32
    inputs (``seed`` given: drawn with it and recorded as the calibration seed), its accuracy not measured unless
    ``measure_accuracy=True``; ``options`` are the rest of its keywords. The report, or its refusal."""
    calibration = (
        qz.random_calibration((32, 32), count) if seed is None else qz.random_calibration((32, 32), count, seed)
    )
    if seed is not None:
        options["calibration_seed"] = seed
    options.setdefault("measure_accuracy", False)
    return qz.quantize_verified(
        path, out, config, dtype="int8", calibration=calibration, calibration_source="random", **options
    )


@pytest.fixture(scope="session")
def random_int8() -> Callable[..., dict[str, Any]]:
    """:func:`quantize_random`: an int8 export of a test's untrained model, calibrated on random inputs."""
    return quantize_random
