"""``tensorrt``: a TensorRT engine built from the verified ONNX file by the runtime's builder
(:mod:`attnzoo.runtime.tensorrt`: ``tensorrt_rtx`` ahead of time, or ``tensorrt`` on the GPU present), run
from a CUDA graph on torch CUDA buffers. Without a GPU the engine can still be built (:meth:`build_only`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np

from .. import tensorrt as rt
from . import Backend, Call, Session, register_backend
from .eager import tf32_problem
from .ort_cuda import device_memory_used

__all__ = ["TensorRTBackend", "TensorRTSession", "TENSORRT"]


class TensorRTSession(Session):
    """One engine (built for the batch sizes given, or loaded from an engine file) and one execution context."""

    def __init__(self, engine: "rt.Engine", backend: str, facts: Dict[str, Any]) -> None:
        self.engine, self.backend, self._facts = engine, backend, facts
        self.fixed_size = True

    def run(self, x: np.ndarray) -> np.ndarray:
        return self.engine.run(x)

    def call(self, x: np.ndarray) -> Call:
        """The engine's enqueue captured once in a CUDA graph on a stream of its own."""
        import torch

        yout = self.engine.bind(torch.from_numpy(np.ascontiguousarray(x, np.float32)).to("cuda"))
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            self.engine.enqueue(stream)  # TensorRT sets itself up on the first enqueue; it must precede the capture
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            self.engine.enqueue(stream)

        def output() -> np.ndarray:
            graph.replay()
            torch.cuda.synchronize()
            return yout.float().cpu().numpy()

        self._graph = graph
        return Call(graph.replay, output, cuda=True, cuda_graph=True, memory=device_memory_used)

    def info(self) -> Dict[str, Any]:
        return {k: v for k, v in self._facts.items() if k in ("library", "library_version", "compute_capability",
                                                               "build_time_s", "tf32")}


@dataclass(frozen=True)
class TensorRTBackend(Backend):
    """Native TensorRT engines."""

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False
                           ) -> Optional[str]:
        if dtype == "int8":
            return ("int8 rows here are the CPU runtimes'; the GPU int8 engine is export-model --dtype int8 "
                    "--format tensorrt")
        if dtype == "bf16":
            return "bf16 ONNX graphs are not exported (export dtypes: fp32, fp16)"
        return (rt.unavailable_reason(run=not build_only) or super().unavailable_reason(dtype, device)
                or (tf32_problem("cuda") if dtype == "tf32" and not build_only else None))

    def build_only(self, onnx_path: Path, batch_sizes: Sequence[int], cache_dir: Path,
                   dtype: str = "fp32") -> Dict[str, Any]:
        """The engine built ahead of time (not run), once per ONNX file, shape, profile and TF32 choice (kept in
        ``cache_dir/tensorrt`` and reused); its build facts."""
        return rt.build_cached(onnx_path, Path(cache_dir) / "tensorrt", batch_sizes=batch_sizes, tf32=dtype == "tf32")

    def load(self, model: Any, *, dtype: str = "fp32", threads: Optional[int] = None, batch: Optional[int] = None,
             device: str = "cpu", cache_dir: Any = None, batch_sizes: Sequence[int] = ()) -> TensorRTSession:
        """``model``: an ONNX file (an engine is built for ``batch`` or ``batch_sizes``, cached under
        ``cache_dir/tensorrt`` when given) or an ``.engine`` file (loaded as it is)."""
        path = Path(model)
        if path.suffix == ".engine":
            return TensorRTSession(rt.Engine(path), self.name, {})
        sizes = tuple(batch_sizes) or ((int(batch),) if batch else (1,))
        if cache_dir is not None:
            facts = rt.build_cached(path, Path(cache_dir) / "tensorrt", batch_sizes=sizes, tf32=dtype == "tf32")
            return TensorRTSession(rt.Engine(Path(facts["engine"])), self.name, facts)
        built = rt.build(path, batch_sizes=sizes, tf32=dtype == "tf32")
        return TensorRTSession(rt.Engine(built.blob, built.library), self.name, built.facts())


TENSORRT = register_backend(TensorRTBackend(
    "tensorrt", "a native TensorRT engine built from the verified ONNX file (TensorRT-RTX or TensorRT), run "
                "from a CUDA graph; without a GPU: built, not run",
    aliases=("trt",), takes="onnx", device="cuda", dtypes=("fp32", "tf32", "fp16")))
