"""What the gate tests of every format share: an output moved by a multiple of its precision's tolerance, a model
whose extra-math scope is renamed before it is exported, and the fixtures' expensive files made once."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
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


#: A folder the mutation check (``.ci/mutation-check``) makes for one run: a fixture's expensive file (a torch export,
#: a ModelOpt quantization) is made there once and copied by every mutant's test process. Unset, each fixture makes
#: its own.
CACHE_ENV = "ATTNZOO_TEST_CACHE"


def made_once(path: Path, make: Callable[[Path], Any], siblings: Sequence[str] = ()) -> Path:
    """``path``, written by ``make(path)`` (with the files ``make`` writes beside it, named ``path`` + each of
    ``siblings``); under the mutation check, made once per run in :data:`CACHE_ENV`'s folder and copied from there
    (the modules a mutant changes are never the ones that make these files: the exporter, the quantizer)."""
    shared = os.environ.get(CACHE_ENV)
    if not shared:
        make(path)
        return path
    stored = Path(shared) / path.name
    if not stored.is_file():
        tmp = stored.with_name(f"{os.getpid()}-{path.name}")
        make(tmp)
        for suffix in siblings:  # beside it first: a stored file always has its siblings
            os.replace(f"{tmp}{suffix}", f"{stored}{suffix}")
        os.replace(tmp, stored)
    for suffix in ("", *siblings):
        shutil.copyfile(f"{stored}{suffix}", f"{path}{suffix}")
    return path
