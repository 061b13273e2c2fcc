"""``aoti``: an AOTInductor package (``.pt2``, :mod:`attnzoo.targets.aoti.package`) of the model, run through
``torch._inductor.aoti_load_package`` on the CPU or a CUDA GPU.

It loads a package file that ``export-model --format aoti`` wrote and verified (its report says so, for this very
file, precision and device: :func:`attnzoo.runtime.sessions.verified_report`), or compiles one from the PyTorch
module into ``<cache_dir>/aoti/``, keyed by the module's content (weights, source, config), the device, the
precision and the torch version: one compile per model serves every batch size (the batch dimension is dynamic)
and every later run. Loading a package runs its native code, so nothing else is loaded: a file without such a
report, or a cached package that is not the one recorded when it was compiled (:func:`.package.cached_package`),
is refused or compiled again, never opened.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnzoo.fileio import default_cache_dir
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import TORCH_DTYPES, Backend, LoadOptions, TorchDeviceSession
from attnzoo.runtime.device import DeviceMemory, fp32_math
from attnzoo.runtime.sessions import verified_file

from . import package as aoti

torch = lazy_import("torch")

__all__ = ["AotiBackend", "AotiSession", "AOTI"]


class AotiSession(TorchDeviceSession):
    """A loaded AOTInductor package; ``facts`` says where it came from (file, or the cache and whether it was
    compiled now)."""

    def __init__(self, path: Path, *, backend: str, dtype: str, device: str, threads: int | None, facts: dict) -> None:
        self.backend = backend
        self.device = torch.device(device)
        self.memory = DeviceMemory() if self.device.type == "cuda" else None
        self.dtype = getattr(torch, TORCH_DTYPES[dtype])
        if threads:
            torch.set_num_threads(int(threads))
        self.net = aoti.load_package(path)
        self._info = {"device": str(self.device), "dtype": dtype, "package": str(path), **facts}
        if self.device.type == "cuda":
            self._info["fp32_matmul"] = "ieee"

    def _forward(self, xin):
        math = fp32_math(False) if self.device.type == "cuda" else contextlib.nullcontext()
        with torch.inference_mode(), math:
            return self.net(xin)


@dataclass(frozen=True)
class AotiBackend(Backend):
    """AOTInductor: a ``.pt2`` file ``export-model`` verified (its report beside it, for this file, precision and
    device), or the PyTorch module compiled into the cache (``cache_dir``)."""

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
        return super().unavailable_reason(dtype, device) or aoti.aoti_problem(device, dtype)

    def open(self, model: Any, options: LoadOptions) -> AotiSession:
        reason = self.unavailable_reason(options.dtype, options.device)
        if reason:
            raise ValueError(f"{self.name}: {reason}")
        if isinstance(model, (str, Path)):
            kind = str(options.device).split(":")[0]
            path = verified_file(self.name, model, options.dtype, fmt="aoti", title="AOTInductor package", device=kind)
            facts: dict[str, Any] = {"cached": None}
        else:
            cache = options.cache_dir or default_cache_dir()
            path, facts = aoti.cached_package(model, cache, device=options.device, dtype=options.dtype)
        return AotiSession(
            path, backend=self.name, dtype=options.dtype, device=options.device, threads=options.threads, facts=facts
        )


AOTI = AotiBackend(
    "aoti",
    "AOTInductor: torch.export + ahead-of-time Inductor compile into one .pt2 package (CPU fp32, CUDA fp32/fp16)",
    aliases=("aotinductor",),
    takes="module",
    device="torch",
    dtypes=("fp32", "fp16"),
    reads=("device", "threads", "cache_dir"),
    library="torch",
    jit_compiles=True,
)
