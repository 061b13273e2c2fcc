"""``tensorrt``: a TensorRT engine built from the verified ONNX file by the runtime's builder
(:mod:`attnzoo.runtime.tensorrt`: ``tensorrt_rtx`` ahead of time, or ``tensorrt`` on the GPU present), run on torch
CUDA buffers on the engine's own stream, from a CUDA graph where the context can be captured. Without a GPU the
engine can still be built (:meth:`TensorRTBackend.build_only`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import numpy as np

from .. import tensorrt as rt
from . import Backend, Call, Session, register_backend
from .eager import DeviceMemory, tf32_problem

__all__ = ["TensorRTBackend", "TensorRTSession", "TENSORRT"]


class TensorRTSession(Session):
    """One engine (built for the batch sizes given, or loaded from an engine file) and one execution context."""

    def __init__(self, engine: "rt.Engine", backend: str, facts: Dict[str, Any],
                 memory: Optional[DeviceMemory] = None) -> None:
        self.engine, self.backend, self._facts, self.memory = engine, backend, facts, memory
        self.fixed_size = True
        self._graph_note = "not made"

    def run(self, x: np.ndarray) -> np.ndarray:
        return self.engine.run(x)

    def call(self, x: np.ndarray) -> Call:
        """The engine's enqueue on its own stream, captured once in a CUDA graph when the context says it can be
        (``is_stream_capturable``) and the capture succeeds; else timed as plain enqueues (the row says which).
        The first enqueue, before any capture, is where TensorRT sets itself up; the runtime cache is written
        after it."""
        import torch

        engine = self.engine
        yout = engine.bind(torch.from_numpy(np.ascontiguousarray(x, np.float32)).to("cuda"))
        engine.enqueue()
        engine.stream.synchronize()
        engine.save_runtime_cache()
        graph = None
        if not engine.capturable():
            self._graph_note = "not capturable (is_stream_capturable: False); timed as plain enqueues"
        else:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=engine.stream):
                    engine.enqueue()
                self._graph_note = "captured"
            except Exception as exc:  # noqa: BLE001 -- a capture TensorRT refuses: timed without a graph
                graph, self._graph_note = None, f"capture failed ({type(exc).__name__}); timed as plain enqueues"
                torch.cuda.synchronize()

        def enqueue() -> None:  # ordered with the caller's stream, where the timing events are recorded
            current = torch.cuda.current_stream()
            engine.stream.wait_stream(current)
            engine.enqueue()
            current.wait_stream(engine.stream)

        fn = graph.replay if graph is not None else enqueue

        def output() -> np.ndarray:
            fn()
            torch.cuda.synchronize()
            return yout.float().cpu().numpy()

        self._graph = graph
        return Call(fn, output, cuda=True, cuda_graph=graph is not None,
                    memory=self.memory.device_used if self.memory is not None else None)

    def info(self) -> Dict[str, Any]:
        facts = {k: v for k, v in self._facts.items() if k in ("library", "library_version", "compute_capability",
                                                                "build_time_s", "tf32", "require_user_allocation",
                                                                "profile")}
        return {**facts, **self.engine.settings, "cuda_graph": self._graph_note}


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
        """The engine built ahead of time for :data:`~attnzoo.runtime.tensorrt.DEFAULT_COMPUTE_CAPABILITY` (not run:
        no GPU, or one its engines do not run on), once per ONNX file, shape, profile and TF32 choice (kept in
        ``cache_dir/tensorrt`` and reused); its build facts."""
        return rt.build_cached(onnx_path, Path(cache_dir) / "tensorrt", batch_sizes=batch_sizes, tf32=dtype == "tf32",
                               compute_capability=rt.DEFAULT_COMPUTE_CAPABILITY)

    def load(self, model: Any, *, dtype: str = "fp32", threads: Optional[int] = None, batch: Optional[int] = None,
             device: str = "cpu", cache_dir: Any = None, batch_sizes: Sequence[int] = ()) -> TensorRTSession:
        """``model``: an ONNX file (an engine is built for ``batch_sizes``, else for exactly ``batch``: a static
        shape, the tactics chosen for it; cached under ``cache_dir/tensorrt`` when given, with TensorRT's timing
        cache or TensorRT-RTX's runtime cache beside it) or an ``.engine`` file (loaded as it is)."""
        path = Path(model)
        if path.suffix == ".engine":
            memory = DeviceMemory() if rt.gpu_available() else None
            return TensorRTSession(rt.Engine(path), self.name, {}, memory)
        sizes = tuple(batch_sizes) or ((int(batch),) if batch else (1,))
        if cache_dir is not None:  # engines and compiled kernels kept: every later row and run reuses them
            folder = Path(cache_dir) / "tensorrt"
            facts = rt.build_cached(path, folder, batch_sizes=sizes, tf32=dtype == "tf32")
            lib = rt.load_library()
            memory = DeviceMemory()  # after the build (which needs none of it), before the engine is loaded
            return TensorRTSession(rt.Engine(Path(facts["engine"]), lib, rt.runtime_cache_path(folder, lib)),
                                   self.name, facts, memory)
        built = rt.build(path, batch_sizes=sizes, tf32=dtype == "tf32")
        memory = DeviceMemory() if rt.gpu_available() else None
        return TensorRTSession(rt.Engine(built.blob, built.library), self.name, built.facts(), memory)


TENSORRT = register_backend(TensorRTBackend(
    "tensorrt", "a native TensorRT engine built from the verified ONNX file (TensorRT-RTX or TensorRT), run "
                "from a CUDA graph; without a GPU: built, not run",
    aliases=("trt",), takes="onnx", device="cuda", dtypes=("fp32", "tf32", "fp16")))
