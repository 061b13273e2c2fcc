"""ONNX Runtime on a CUDA GPU, inputs and outputs bound to CUDA memory (I/O binding), with a CUDA graph where ONNX
Runtime allows one: two backends of one class.

- ``ort-cuda``: the CUDA execution provider. Precision is the row's: ``fp32`` with the provider's ``use_tf32`` off
  (ONNX Runtime's default is on), ``tf32`` with it on (same fp32 file), ``fp16`` the fp16 export with ``use_tf32``
  off for its fp32 islands.
- ``ort-trt``: the TensorRT execution provider (engine cache on disk, CUDA for what it rejects). The network is
  strongly typed (no ``trt_fp16_enable``: the fp16 export's own types hold, its fp32 islands stay fp32). TensorRT's
  TF32 flag cannot be cleared through the EP, so its fp32 rows are ``tf32`` rows (:func:`.sessions.providers_for`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from attnzoo.fileio import cache_subdir
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import Backend, Call, LoadOptions, Session
from attnzoo.runtime.contract import INPUT_NAME, OUTPUT_NAME
from attnzoo.runtime.device import DeviceMemory, cuda_available, release_cuda_cache, tf32_problem

from .sessions import available_providers, inference_session, session_options

onnx = lazy_import("onnx")
torch = lazy_import("torch")

__all__ = ["OrtGpuBackend", "OrtGpuSession", "ORT_CUDA", "ORT_TRT"]


class OrtGpuSession(Session):
    """ONNX Runtime with the CUDA or TensorRT execution provider; ``call`` binds torch CUDA tensors.

    A CUDA graph is tried first; ONNX Runtime refuses it when some nodes (shape arithmetic) run on the CPU, and
    then the session is rebuilt without one (``cuda_graph`` False). The session for host arrays (:meth:`run`) is
    made only when asked for, so a timed call's device memory is its own session's.
    """

    _bound: tuple[Any, Any, Any, Any] | None  # (input, output, session, IO binding) of the last call

    def __init__(self, path: Path, backend: str, provider: str, dtype: str, cache_dir: Path | None) -> None:
        self.memory = DeviceMemory()  # before anything of this session is on the device
        self.path, self.backend, self.provider, self.dtype, self.cache_dir = path, backend, provider, dtype, cache_dir
        graph = onnx.load(str(path), load_external_data=False).graph
        self._dims = {
            v.name: [d.dim_value or None for d in v.type.tensor_type.shape.dim] for v in (*graph.input, *graph.output)
        }
        self.fixed_size = all(self._dims[INPUT_NAME][2:])
        self._host = None

    @property
    def session(self):
        """The session :meth:`run` uses (made on first use; not after :meth:`close`)."""
        if self.closed:
            raise RuntimeError(f"this {self.backend} session is closed")
        if self._host is None:
            self._host = self._session(graph=False)
        return self._host

    def _session(self, graph: bool):
        extra: dict[str, Any] = {"cache_dir": self.cache_dir} if self.provider == "tensorrt-ep" else {}
        return inference_session(
            self.path,
            self.provider,
            options=session_options(sequential=False),
            cuda_graph=graph,
            tf32=self.dtype == "tf32",
            **extra,
        )

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(
            self.session.run([OUTPUT_NAME], {INPUT_NAME: np.ascontiguousarray(x, np.float32)})[0], dtype=np.float32
        )

    def _output_shape(self, x: np.ndarray) -> tuple[int, ...]:
        """The logits' shape for ``x``: from the graph (only the batch is symbolic), else by running it once."""
        dims = self._dims[OUTPUT_NAME]
        if dims and all(dims[1:]):
            return cast(tuple[int, ...], (len(x), *dims[1:]))  # all(dims[1:]): ints
        return self.run(x).shape

    def call(self, x: np.ndarray) -> Call:
        out_shape = self._output_shape(x)
        xin = torch.from_numpy(np.ascontiguousarray(x, np.float32)).to("cuda")
        yout = torch.full(out_shape, float("nan"), device="cuda", dtype=torch.float32)  # unwritten -> fails parity
        torch.cuda.synchronize()  # ONNX Runtime reads them on its own stream
        for graph in (True, False):
            try:
                sess = self._session(graph)
                binding = sess.io_binding()
                binding.bind_input(INPUT_NAME, "cuda", 0, np.float32, tuple(xin.shape), xin.data_ptr())
                binding.bind_output(OUTPUT_NAME, "cuda", 0, np.float32, out_shape, yout.data_ptr())
                sess.run_with_iobinding(binding)  # with a graph: the capture run
                break
            except Exception:  # the graph-less retry reports its own failure
                if not graph:
                    raise

        def fn():
            sess.run_with_iobinding(binding)

        def output() -> np.ndarray:
            fn()
            torch.cuda.synchronize()
            return yout.cpu().numpy()

        self._bound = (xin, yout, sess, binding)
        return Call(fn, output, cuda=True, cuda_graph=graph, memory=self.memory.device_used, session=self)

    def info(self) -> dict[str, Any]:
        tf32 = "on" if self.dtype == "tf32" else "off"
        math = (
            f"use_tf32 {tf32} (CUDA EP); TensorRT's TF32 flag at its default, on (the TensorRT EP has no option "
            "for it); network strongly typed: no trt_fp16/int8/bf16 flag"
            if self.provider == "tensorrt-ep"
            else f"use_tf32 {tf32}"
        )
        return {"providers": self.session.get_providers(), "precision": math}

    def release(self) -> None:
        """Drop the host session and the bound one with its CUDA buffers; PyTorch's cache is emptied."""
        self._host, self._bound = None, None
        release_cuda_cache()


@dataclass(frozen=True)
class OrtGpuBackend(Backend):
    """ONNX Runtime on a CUDA GPU; ``provider``: ``cuda`` or ``tensorrt-ep`` (its TensorRT execution provider)."""

    device: str = "cuda"
    library: str = "onnxruntime"
    provider: str = "cuda"

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
        if dtype == "int8":
            return (
                "int8 rows here are the CPU runtimes'; the GPU int8 engine is export-model --dtype int8 "
                "--format tensorrt"
            )
        if not cuda_available():
            return "no CUDA GPU on this machine"
        wanted = "CUDAExecutionProvider" if self.provider == "cuda" else "TensorrtExecutionProvider"
        if wanted not in available_providers():
            return (
                f"onnxruntime has no {wanted} (install onnxruntime-gpu"
                f"{' with the TensorRT libraries' if self.provider == 'tensorrt-ep' else ''})"
            )
        if dtype == "bf16":
            return "bf16 ONNX graphs are not exported (export dtypes: fp32, fp16)"
        if dtype == "fp32" and self.provider == "tensorrt-ep":
            return (
                "ONNX Runtime's TensorRT EP has no option to clear TensorRT's TF32 flag (on by default), so its "
                "fp32 graph runs as TF32: ask for tf32"
            )
        return (tf32_problem("cuda") if dtype == "tf32" else None) or super().unavailable_reason(dtype, device)

    def open(self, model: Any, options: LoadOptions) -> OrtGpuSession:
        """``options.cache_dir`` (the TensorRT execution provider): its engines are kept in ``<cache_dir>/ort-trt``."""
        cache = None
        if options.cache_dir is not None and self.provider == "tensorrt-ep":  # its engines: the user's folder alone
            cache = cache_subdir(options.cache_dir, "ort-trt")
        return OrtGpuSession(Path(model), self.name, self.provider, options.dtype, cache)


ORT_CUDA = OrtGpuBackend(
    "ort-cuda",
    "ONNX Runtime, CUDA execution provider, I/O bound to GPU memory, CUDA graph where allowed",
    aliases=("onnxruntime-cuda",),
    dtypes=("fp32", "tf32", "fp16"),
    provider="cuda",
)
ORT_TRT = OrtGpuBackend(
    "ort-trt",
    "ONNX Runtime, TensorRT execution provider (engines cached on disk), CUDA for the rest",
    aliases=("onnxruntime-tensorrt", "tensorrt-ep"),
    dtypes=("tf32", "fp16"),
    reads=("cache_dir",),
    provider="tensorrt-ep",
)
