"""``eager``: the PyTorch model itself, run eagerly on the CPU or a CUDA GPU (the reference every other backend
is checked against)."""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import weakref
from dataclasses import dataclass
from typing import Any

from attnzoo.lazy import lazy_import
from attnzoo.machine import bf16_problem, cpu_info
from attnzoo.runtime.backends import TORCH_DTYPES, Backend, LoadOptions, TorchDeviceSession
from attnzoo.runtime.device import DeviceMemory, fp32_math, tf32_problem

torch = lazy_import("torch")
models = lazy_import("attnzoo.models")  # timm too: the registry imports without them

__all__ = ["TorchBackend", "TorchSession", "EAGER", "bf16_autocast"]


def quiet_cuda_home() -> None:
    """Silence torch's "No CUDA runtime is found, using CUDA_HOME=..." (``torch.utils.cpp_extension``, logged when
    torch.compile first looks for a C++ toolchain) on a machine without a CUDA GPU, where no runtime is expected and
    the line is noise; with a GPU the logger is left as it is."""
    if not torch.cuda.is_available():
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


#: ``torch.compile``d copies compiled with a dynamic batch, shared by every session of the same model object at the
#: same precision, device and mode while that model lives: (id(model), dtype, device, mode) -> compiled copy.
_DYNAMIC_COMPILED: dict[tuple[int, str, str, str], Any] = {}


class TorchSession(TorchDeviceSession):
    """A private copy of the model at the asked precision on the asked device (so its memory is its own);
    ``compile_mode``: wrapped in ``torch.compile`` with that mode, for the batch size of its first call
    (``dynamic_batch=False``), or with the batch dimension dynamic and the compiled copy shared by every later
    session of the same model object (``dynamic_batch=True``: one compile serves every batch size; PyTorch still
    specialises batch 1 into its own graph). Closing it drops the copy (and its compiled wrapper)."""

    def __init__(
        self,
        model: Any,
        *,
        backend: str,
        dtype: str,
        device: str,
        threads: int | None,
        compile_mode: str | None = None,
        dynamic_batch: bool = False,
    ) -> None:
        self.backend = backend
        self.device = torch.device(device)
        self.memory = DeviceMemory() if self.device.type == "cuda" else None  # before the copy to the device
        self.autocast = dtype == "bf16"  # fp32 weights and inputs, bf16 autocast, the extra math in fp32
        self.dtype = torch.float32 if self.autocast else getattr(torch, TORCH_DTYPES[dtype])
        self.tf32 = dtype == "tf32"  # every call on a GPU sets TF32 on or off itself: the switches are global
        if threads:
            torch.set_num_threads(int(threads))
        self.dynamic_batch = dynamic_batch and compile_mode is not None
        key = (id(model), dtype, str(self.device), str(compile_mode))
        shared = _DYNAMIC_COMPILED.get(key) if self.dynamic_batch else None
        self.net = (
            shared if shared is not None else copy.deepcopy(model).to(device=self.device, dtype=self.dtype).eval()
        )
        self._info: dict[str, Any] = {"device": str(self.device), "dtype": dtype}
        if self.autocast and shared is None:
            scopes = bf16_autocast(self.net, self.device.type)
            self._info["autocast"] = f"bfloat16, {scopes} extra-math scope module(s) in fp32"
        if self.device.type == "cuda":
            self._info["fp32_matmul"] = "tf32" if self.tf32 else "ieee"
        if compile_mode is not None and shared is None:
            quiet_cuda_home()
            self.net = torch.compile(self.net, mode=compile_mode, dynamic=None if self.dynamic_batch else False)
            if self.dynamic_batch:
                _DYNAMIC_COMPILED[key] = self.net
                weakref.finalize(model, _DYNAMIC_COMPILED.pop, key, None)
        if compile_mode is not None:
            self._info["compile_mode"] = compile_mode
            self._info["batch"] = "dynamic" if self.dynamic_batch else "static"
            if self.dynamic_batch:
                self._info["compiled_copy"] = "shared (compiled by an earlier session)" if shared is not None else "new"
        self.cuda_graph = compile_mode == "reduce-overhead" and self.device.type == "cuda"
        self.fixed_size = (getattr(model, "attnzoo_config", None) or {}).get("task", "cls") == "cls"

    def _forward(self, xin):
        math = fp32_math(self.tf32) if self.device.type == "cuda" else contextlib.nullcontext()
        if self.dynamic_batch:
            torch._dynamo.maybe_mark_dynamic(xin, 0)
        with torch.inference_mode(), math:
            return self.net(xin)


def bf16_autocast(net: Any, device_type: str) -> int:
    """Make ``net`` run under ``torch.autocast(device_type, torch.bfloat16)`` with the variant's extra-math scopes
    (``<...>.attn.<scope>``, :attr:`attnzoo.models.VariantSpec.extra_scopes`) in fp32, as the fp16 export keeps
    them: each such module gets its floating inputs as fp32 and runs with autocast off (a matrix product inside,
    such as WAFE's blocked L1 distance, would otherwise be cast to bf16). Everything else follows autocast's
    policy for the device (on the CPU, LayerNorm and softmax too take the bf16 tensors). Returns the number of
    scope modules."""
    spec = models.VARIANTS.get(str((getattr(net, "attnzoo_config", None) or {}).get("variant")))
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


def torch_dtype_problem(dtype: str, device: str) -> str | None:
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
    """PyTorch eager: the model's own device and thread count are the caller's (``device``, ``threads``)."""

    takes: str = "module"
    device: str = "torch"
    reads: tuple[str, ...] = ("device", "threads")
    library: str = "torch"

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
        return torch_dtype_problem(dtype, device) or super().unavailable_reason(dtype, device)

    def open(self, model: Any, options: LoadOptions) -> TorchSession:
        compiling = self.compiling(options)
        return TorchSession(
            model, backend=self.name, dtype=options.dtype, device=options.device, threads=options.threads, **compiling
        )

    def compiling(self, options: LoadOptions) -> dict[str, Any]:
        """How its sessions wrap the model in ``torch.compile`` (:class:`TorchSession`'s ``compile_mode`` and
        ``dynamic_batch``): eagerly, not at all."""
        return {}


EAGER = TorchBackend(
    "eager",
    "PyTorch eager on the CPU or a CUDA GPU (the reference every backend is checked against)",
    aliases=("pytorch", "torch"),
    dtypes=("fp32", "tf32", "fp16", "bf16"),
    is_reference=True,
)
