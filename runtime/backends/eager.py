"""``eager``: the PyTorch model itself, run eagerly on the CPU or a CUDA GPU (the reference every other backend
is checked against)."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from attnzoo.machine import bf16_problem, cpu_info

from . import Backend, Call, Session, register_backend

__all__ = ["TorchBackend", "TorchSession", "EAGER", "TORCH_DTYPES", "fp32_math", "tf32_problem", "DeviceMemory",
           "bf16_autocast"]

#: attnzoo precision -> torch dtype name (``tf32``: float32 tensors, TF32 matmuls / convolutions).
TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@contextlib.contextmanager
def fp32_math(tf32: bool) -> Iterator[None]:
    """Within the block, fp32 CUDA matmuls and cuDNN convolutions run as TF32 (``tf32``) or as IEEE fp32; the
    settings before are restored after it.

    Both switches are set through the calls that keep every reader consistent in torch 2.9-2.14
    (``set_float32_matmul_precision`` and ``cudnn.allow_tf32``): after them the newer
    ``backends.cuda.matmul.fp32_precision`` / ``backends.cudnn.conv.fp32_precision`` read the same; setting
    those newer ones instead makes the older readers (Inductor's convolution template among them) raise.
    PyTorch's own defaults differ per switch (matmul IEEE, cuDNN TF32), hence both are always set.
    """
    import torch

    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def tf32_problem(device: str = "cuda") -> Optional[str]:
    """Why ``tf32`` cannot run on ``device`` (one line), or ``None``: TF32 is a tensor-core mode of NVIDIA GPUs of
    compute capability 8.0 (Ampere) and newer."""
    if not str(device).startswith("cuda"):
        return "tf32 is a GPU tensor-core mode (compute capability 8.0+); on the CPU fp32 is IEEE fp32: run fp32"
    import torch

    if not torch.cuda.is_available():
        return "tf32 needs a CUDA GPU of compute capability 8.0+; none is visible"
    major, minor = torch.cuda.get_device_capability(0)
    if major < 8:
        return (f"tf32 needs compute capability 8.0+ (Ampere or newer); {torch.cuda.get_device_name(0)} is "
                f"{major}.{minor}: run fp32")
    return None


class DeviceMemory:
    """The device memory of one session, from a clean baseline taken when it is created -- before the session
    allocates anything, after freeing what earlier sessions left: a garbage collection, PyTorch's cache emptied and
    its peak statistics reset. Sessions alive before (a benchmark's A/B partners) are in the baseline, not in the
    number, so a row's memory does not depend on what ran before it.
    """

    def __init__(self) -> None:
        import gc

        import torch

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.allocated = torch.cuda.memory_allocated()
        free, total = torch.cuda.mem_get_info()
        self.used = total - free

    def torch_peak(self) -> Tuple[float, str]:
        """MB: PyTorch's peak allocation since the baseline, less what was allocated at it (a PyTorch session)."""
        import torch

        return ((torch.cuda.max_memory_allocated() - self.allocated) / 2 ** 20,
                "peak PyTorch allocation of this session (max_memory_allocated - allocated before it was loaded)")

    def device_used(self) -> Tuple[float, str]:
        """MB: device memory in use now less at the baseline (a runtime that allocates outside PyTorch: its
        arena or engine memory, plus its PyTorch input/output buffers)."""
        import torch

        free, total = torch.cuda.mem_get_info()
        return ((total - free - self.used) / 2 ** 20,
                "device memory in use after timing - before the session was loaded (mem_get_info, PyTorch cache "
                "emptied first)")


class TorchSession(Session):
    """A private copy of the model at the asked precision on the asked device (so its memory is its own);
    ``compile_mode``: wrapped in ``torch.compile`` with that mode."""

    def __init__(self, model: Any, *, backend: str, dtype: str, device: str, threads: Optional[int],
                 compile_mode: Optional[str] = None) -> None:
        import torch

        self.backend = backend
        self.device = torch.device(device)
        self.memory = DeviceMemory() if self.device.type == "cuda" else None  # before the copy to the device
        self.autocast = dtype == "bf16"  # fp32 weights and inputs, bf16 autocast, the extra math in fp32
        self.dtype = torch.float32 if self.autocast else getattr(torch, TORCH_DTYPES[dtype])
        self.tf32 = dtype == "tf32"  # every call on a GPU sets TF32 on or off itself: the switches are global
        if threads:
            torch.set_num_threads(int(threads))
        self.net = copy.deepcopy(model).to(device=self.device, dtype=self.dtype).eval()
        self._info: Dict[str, Any] = {"device": str(self.device), "dtype": dtype}
        if self.autocast:
            scopes = bf16_autocast(self.net, self.device.type)
            self._info["autocast"] = f"bfloat16, {scopes} extra-math scope module(s) in fp32"
        if self.device.type == "cuda":
            self._info["fp32_matmul"] = "tf32" if self.tf32 else "ieee"
        if compile_mode is not None:
            self.net = torch.compile(self.net, mode=compile_mode, dynamic=False)
            self._info["compile_mode"] = compile_mode
        self.cuda_graph = compile_mode == "reduce-overhead" and self.device.type == "cuda"
        self.fixed_size = (getattr(model, "attnzoo_config", None) or {}).get("task", "cls") == "cls"

    def _forward(self, xin):
        import torch

        math = fp32_math(self.tf32) if self.device.type == "cuda" else contextlib.nullcontext()
        with torch.inference_mode(), math:
            return self.net(xin)

    def run(self, x: np.ndarray) -> np.ndarray:
        import torch

        xin = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(self.device, self.dtype)
        return self._forward(xin).float().cpu().numpy()

    def call(self, x: np.ndarray) -> Call:
        import torch

        xin = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)).to(self.device, self.dtype)
        cuda = self.device.type == "cuda"
        return Call(lambda: self._forward(xin), lambda: self._forward(xin).float().cpu().numpy(), cuda=cuda,
                    cuda_graph=self.cuda_graph, memory=self.memory.torch_peak if cuda else None)

    def info(self) -> Dict[str, Any]:
        return dict(self._info)


def bf16_autocast(net: Any, device_type: str) -> int:
    """Make ``net`` run under ``torch.autocast(device_type, torch.bfloat16)`` with the variant's extra-math scopes
    (``<...>.attn.<scope>``, :attr:`attnzoo.models.VariantSpec.extra_scopes`) in fp32, as the fp16 export keeps
    them: each such module gets its floating inputs as fp32 and runs with autocast off (a matrix product inside,
    such as WAFE's blocked L1 distance, would otherwise be cast to bf16). Everything else follows autocast's
    policy for the device (on the CPU, LayerNorm and softmax too take the bf16 tensors). Returns the number of
    scope modules."""
    import functools

    import torch

    from attnzoo.models import VARIANTS

    spec = VARIANTS.get(str((getattr(net, "attnzoo_config", None) or {}).get("variant")))
    scopes = spec.extra_scopes if spec is not None else ()

    def fp32(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.float()
        return type(value)(fp32(v) for v in value) if isinstance(value, (tuple, list)) else value

    def in_fp32(forward):
        @functools.wraps(forward)
        def run(*args, **kwargs):
            with torch.autocast(device_type, enabled=False):
                return forward(*fp32(args), **{k: fp32(v) for k, v in kwargs.items()})
        return run

    count = 0
    for name, module in net.named_modules():
        if any(name == f"attn.{s}" or name.endswith(f".attn.{s}") for s in scopes):
            module.forward, count = in_fp32(module.forward), count + 1
    forward = net.forward

    @functools.wraps(forward)
    def autocast_forward(*args, **kwargs):
        with torch.autocast(device_type, dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    net.forward = autocast_forward
    return count


def torch_dtype_problem(dtype: str, device: str) -> Optional[str]:
    """Why PyTorch cannot run ``dtype`` on ``device`` usefully here, or ``None``."""
    if dtype == "int8":
        return "int8 is a CPU-runtime path here (ModelOpt Q/DQ for ort-cpu, NNCF for openvino); no PyTorch int8"
    if dtype == "tf32":
        return tf32_problem(device)
    if device == "cpu" and dtype == "fp16" and not {"avx512_fp16", "amx_fp16"} & set(cpu_info()["flags"]):
        return "fp16 on this CPU has no native kernels (no avx512_fp16/amx_fp16); use bf16"
    if device == "cpu" and dtype == "bf16":
        return bf16_problem()
    return None


@dataclass(frozen=True)
class TorchBackend(Backend):
    """PyTorch eager."""

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False
                           ) -> Optional[str]:
        return torch_dtype_problem(dtype, device) or super().unavailable_reason(dtype, device)

    def load(self, model: Any, *, dtype: str = "fp32", threads: Optional[int] = None, batch: Optional[int] = None,
             device: str = "cpu", cache_dir: Any = None) -> TorchSession:
        return TorchSession(model, backend=self.name, dtype=dtype, device=device, threads=threads)


EAGER = register_backend(TorchBackend(
    "eager", "PyTorch eager on the CPU or a CUDA GPU (the reference every backend is checked against)",
    aliases=("pytorch", "torch"), takes="module", device="torch", dtypes=("fp32", "tf32", "fp16", "bf16")))
