"""What the gate tests of every format share: an output moved by a multiple of its precision's tolerance, and a
model whose extra-math scope is renamed before it is exported."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from torch import nn

from attnzoo.runtime.parity import TOLERANCES


def moved(y: Any, factor: float, key: str) -> np.ndarray:
    """``y`` with every value moved by ``factor`` x ``TOLERANCES[key]`` x max(1, max |y|): compared with the
    reference ``y`` approximates, its parity error is ``factor`` tolerances (plus its own, ~1e-6 at fp32)."""
    y = np.asarray(y)
    return y + np.asarray(factor * TOLERANCES[key] * max(1.0, float(np.abs(y).max())), y.dtype)


def shift_parity(monkeypatch: pytest.MonkeyPatch, module: Any, factor: float, key: str) -> None:
    """Every output that ``module.parity_vs_eager`` compares with eager moved by :func:`moved`."""
    real = module.parity_vs_eager

    def shifted(model, run, *args, **kwargs):
        return real(model, lambda x: moved(run(x), factor, key), *args, **kwargs)

    monkeypatch.setattr(module, "parity_vs_eager", shifted)


def rename_scope(model: nn.Module, scope: str, new: str = "renamed") -> nn.Module:
    """``model`` with each block's extra-math module ``attn.<scope>`` registered as ``attn.<new>``: it computes the
    same (the forward still finds it under its old attribute), but an export names its ops ``<new>/...``, as an
    exporter or a refactor that lost the scope's name would."""
    for block in model.blocks:
        module = block.attn._modules.pop(scope)
        block.attn.add_module(new, module)
        object.__setattr__(block.attn, scope, module)
    return model
