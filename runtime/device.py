"""Device helpers every backend shares: is a CUDA GPU there, can it run TF32, the fp32 math switches of PyTorch,
and the device memory one loaded model takes.

Kept out of any one backend so that the PyTorch, ONNX Runtime and TensorRT backends (and a new one) measure and
decide the same way.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from attnzoo.lazy import lazy_import

torch = lazy_import("torch")

__all__ = ["cuda_available", "tf32_problem", "fp32_math", "DeviceMemory", "release_cuda_cache"]


def cuda_available() -> bool:
    """A CUDA GPU is visible to PyTorch."""
    return bool(torch.cuda.is_available())


def tf32_problem(device: str = "cuda") -> str | None:
    """Why ``tf32`` cannot run on ``device`` (one line), or ``None``: TF32 is a tensor-core mode of NVIDIA GPUs of
    compute capability 8.0 (Ampere) and newer."""
    if not str(device).startswith("cuda"):
        return "tf32 is a GPU tensor-core mode (compute capability 8.0+); on the CPU fp32 is IEEE fp32: run fp32"

    if not torch.cuda.is_available():
        return "tf32 needs a CUDA GPU of compute capability 8.0+; none is visible"
    major, minor = torch.cuda.get_device_capability(0)
    if major < 8:
        return (
            f"tf32 needs compute capability 8.0+ (Ampere or newer); {torch.cuda.get_device_name(0)} is "
            f"{major}.{minor}: run fp32"
        )
    return None


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
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = bool(tf32)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


class DeviceMemory:
    """The device memory of one session, from a clean baseline taken when it is created -- before the session
    allocates anything, after freeing what earlier sessions left: a garbage collection, PyTorch's cache emptied and
    its peak statistics reset. Sessions alive before (a benchmark's A/B partners) are in the baseline, not in the
    number, so a row's memory does not depend on what ran before it.
    """

    def __init__(self) -> None:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.allocated = torch.cuda.memory_allocated()
        free, total = torch.cuda.mem_get_info()
        self.used = total - free

    def torch_peak(self) -> tuple[float, str]:
        """MB: PyTorch's peak allocation since the baseline, less what was allocated at it (a PyTorch session)."""
        return (
            (torch.cuda.max_memory_allocated() - self.allocated) / 2**20,
            "peak PyTorch allocation of this session (max_memory_allocated - allocated before it was loaded)",
        )

    def device_used(self) -> tuple[float, str]:
        """MB: device memory in use now less at the baseline (a runtime that allocates outside PyTorch: its
        arena or engine memory, plus its PyTorch input/output buffers)."""
        free, total = torch.cuda.mem_get_info()
        return (
            (total - free - self.used) / 2**20,
            "device memory in use after timing - before the session was loaded (mem_get_info, PyTorch cache "
            "emptied first)",
        )


def release_cuda_cache() -> None:
    """Give the blocks PyTorch's caching allocator holds back to the device (no-op without a GPU): what a closed
    session freed is then free for the next one, and for its memory baseline."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
