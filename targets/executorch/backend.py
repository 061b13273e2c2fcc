"""``executorch``: an ExecuTorch program (``.pte``, :mod:`.program`) of the model, run through ExecuTorch's Python
runtime on the CPU (XNNPACK delegate), at fp32 or dynamic int8.

It loads a program file that ``export-model --format executorch`` wrote and verified (its report says so, for this
very file: :func:`attnzoo.runtime.sessions.verified_report`), or lowers one from the PyTorch module into its cache
(:func:`.program.cached_program`); every program is checked before ExecuTorch's runtime sees it
(:func:`.program.program_problem`). ``threads`` sizes ExecuTorch's one CPU threadpool before the program loads
(:func:`.program.set_threads`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.fileio import default_cache_dir
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import Backend, LoadOptions, Session
from attnzoo.runtime.sessions import verified_file

from . import program as et  # called through the module: tests replace its functions there

torch = lazy_import("torch")

__all__ = ["EXECUTORCH", "ExecuTorchBackend", "ExecuTorchSession"]


class ExecuTorchSession(Session):
    """A loaded ExecuTorch program's ``forward``; ``facts`` says where it came from."""

    def __init__(self, path: Path, *, backend: str, dtype: str, facts: dict, threads: int | None = None) -> None:
        self.backend = backend
        self.method = et.load_method(path, threads)
        pool = et.set_threads(None)
        self._info = {
            "device": "cpu",
            "dtype": dtype,
            "program": str(path),
            "delegate": "XnnpackBackend",
            "threads": pool,
            **facts,
        }

    def run(self, x: np.ndarray) -> np.ndarray:
        if self.method is None:
            raise ValueError("this executorch session is closed")
        xin = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        return self.method.execute([xin])[0].float().numpy()

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def release(self) -> None:
        self.method = None


@dataclass(frozen=True)
class ExecuTorchBackend(Backend):
    """ExecuTorch with the XNNPACK delegate: a ``.pte`` file ``export-model`` verified (its report beside it, for
    this file and precision), or the PyTorch module lowered into the cache."""

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
        return super().unavailable_reason(dtype, device) or et.executorch_problem(dtype)

    def open(self, model: Any, options: LoadOptions) -> ExecuTorchSession:
        reason = self.unavailable_reason(options.dtype)
        if reason:
            raise ValueError(f"{self.name}: {reason}")
        if isinstance(model, (str, Path)):
            path = verified_file(self.name, model, options.dtype, fmt="executorch", title="ExecuTorch program")
            facts: dict[str, Any] = {"cached": None}
        else:
            path, facts = et.cached_program(model, options.cache_dir or default_cache_dir(), dtype=options.dtype)
        return ExecuTorchSession(path, backend=self.name, dtype=options.dtype, facts=facts, threads=options.threads)


EXECUTORCH = ExecuTorchBackend(
    "executorch",
    "ExecuTorch: torch.export lowered to the XNNPACK delegate in one .pte program, run by ExecuTorch's runtime "
    "(CPU fp32, dynamic int8 Linear layers)",
    takes="module",
    device="cpu",
    dtypes=et.EXECUTORCH_DTYPES,
    reads=("cache_dir", "threads"),
    library="executorch",
    jit_compiles=True,
)
