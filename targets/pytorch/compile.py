"""``compile``: the PyTorch model through ``torch.compile`` (Inductor), with CUDA graphs on a GPU."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from typing import Any

from attnzoo.runtime.backends import LoadOptions

from .eager import TorchBackend

__all__ = ["CompileBackend", "COMPILE"]


@dataclass(frozen=True)
class CompileBackend(TorchBackend):
    """``torch.compile``: ``default`` mode on the CPU, ``reduce-overhead`` (CUDA graphs) on a GPU; compiled for the
    load's ``batch``, or -- ``batch`` left out -- once per model with the batch dimension dynamic, the compiled copy
    shared by the model's later sessions (:class:`~attnzoo.targets.pytorch.eager.TorchSession`)."""

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
        reason = super().unavailable_reason(dtype, device)
        if reason:
            return reason
        if device == "cpu" and not (shutil.which("g++") or shutil.which("c++")):
            return "torch.compile on the CPU needs a C++ compiler (g++), none found"
        if device == "cuda" and importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs triton, not installed"
        return None

    def compiling(self, options: LoadOptions) -> dict[str, Any]:
        mode = "reduce-overhead" if str(options.device).startswith("cuda") else "default"
        return {"compile_mode": mode, "dynamic_batch": options.batch is None}


COMPILE = CompileBackend(
    "compile",
    "torch.compile (Inductor) of the PyTorch model; CUDA graphs on a GPU",
    aliases=("torch-compile", "inductor"),
    dtypes=("fp32", "tf32", "fp16", "bf16"),
    reads=("device", "threads", "batch"),
    jit_compiles=True,
)
