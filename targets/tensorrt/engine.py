"""Running a TensorRT engine: deserialize it, bind torch CUDA buffers, enqueue on a CUDA stream of its own, time it.
The ``tensorrt`` backend's loader (:mod:`attnzoo.targets.tensorrt.backend`): every engine is run through it.

An :class:`Engine` enqueues on a stream of its own (never the legacy default stream, which makes TensorRT add
synchronisations). TensorRT-RTX contexts specialise kernels eagerly (``EAGER``: no fallback kernel while a
shape-specialised one compiles, so a timed or captured run uses the final kernels) and keep the compiled kernels in
a runtime cache on disk (:func:`runtime_cache_path`); whether a context can be captured into a CUDA graph is asked
(``is_stream_capturable``) before a graph is made. ``set_input_shape``'s answer is checked. Running an engine needs
an NVIDIA GPU; device buffers are torch CUDA tensors (no pycuda / cuda-python). Deserializing, which logs through a
callback, runs inside :func:`attnzoo.signals.signals_deferred`: a signal is raised as soon as TensorRT returns.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.fileio import atomic_write_bytes
from attnzoo.lazy import lazy_import
from attnzoo.runtime.contract import INPUT_NAME, OUTPUT_NAME
from attnzoo.signals import signals_deferred

from .library import (
    Library,
    TensorRTError,
    TensorRTUnavailable,
    gpu_available,
    last_errors,
    load_library,
    make_logger,
    run_problem,
    target_name,
)

torch = lazy_import("torch")

__all__ = ["runtime_cache_path", "set_input_shape", "Engine"]


def runtime_cache_path(cache_dir: str | Path, library: Library) -> Path:
    """Where TensorRT-RTX keeps the kernels it compiles at run time for the visible GPU (one file per library
    version and GPU; the library checks the GPU and versions itself and ignores a cache that does not fit)."""
    return Path(cache_dir) / f"runtime_{library.name}-{library.version}_{target_name('CURRENT')}.cache"


def set_input_shape(context: Any, engine: Any, name: str, shape: Sequence[int]) -> None:
    """``context.set_input_shape``, its answer checked: ``TensorRTError`` naming the shape and the engine's
    profile (min/opt/max) when TensorRT refuses it (it returns ``False``, it does not raise)."""
    if not context.set_input_shape(name, tuple(shape)):
        profile = " / ".join(str(tuple(d)) for d in engine.get_tensor_profile_shape(name, 0))
        raise TensorRTError(
            f"the engine does not take {name} of shape {tuple(shape)}: its profile (min / opt / max) is {profile}"
        )


# ------------------------------------------------------------------------------------------------ running
class Engine:
    """A deserialized engine with one execution context, run on torch CUDA buffers on a CUDA stream of its own
    (needs a GPU).

    Args:
        data: Serialized engine (bytes) or an engine file.
        library: The library that built it (default :func:`load_library`).
        runtime_cache: TensorRT-RTX: the file of compiled run-time kernels (:func:`runtime_cache_path`), read if
            there; :meth:`save_runtime_cache` writes it back.

    Raises:
        TensorRTUnavailable: no GPU, or one this library's engines do not run on (:func:`run_problem`).
        TensorRTError: the engine cannot be deserialized.
    """

    _bound: tuple[Any, Any] | None  # the input and output buffers bound to the context

    def __init__(
        self, data: bytes | str | Path, library: Library | None = None, runtime_cache: str | Path | None = None
    ) -> None:
        if not gpu_available():
            raise TensorRTUnavailable("running a TensorRT engine needs an NVIDIA GPU and none is visible")

        self.library = library or load_library(gpu=True)
        problem = run_problem(self.library)
        if problem:
            raise TensorRTUnavailable(problem)
        trt = self.library.module
        blob = data if isinstance(data, (bytes, bytearray)) else Path(data).read_bytes()
        self._logger = make_logger(trt)
        self._runtime = trt.Runtime(self._logger)
        with signals_deferred():  # TensorRT logs through ``_logger``: a signal is raised once it returns
            self.engine = self._runtime.deserialize_cuda_engine(blob)
        if self.engine is None:
            raise TensorRTError(
                f"{self.library.describe()} could not deserialize the engine (built by another "
                f"TensorRT version, or for another GPU?){last_errors(self._logger)}"
            )
        self.stream = torch.cuda.Stream()  # not the legacy default stream: TensorRT synchronises around that one
        self.runtime_cache_file = Path(runtime_cache) if runtime_cache is not None else None
        self.settings: dict[str, Any] = {"stream": "own", "kernel_specialization": "n/a", "runtime_cache": None}
        with signals_deferred():
            self.context = self.engine.create_execution_context(*self._runtime_config())

    def _runtime_config(self) -> tuple[Any, ...]:
        """TensorRT-RTX's runtime config: eager kernel specialisation (the final kernels from the first call on, not
        a fallback while they compile) and the runtime cache; ``()`` for a library without one."""
        trt = self.library.module
        strategy = getattr(trt, "DynamicShapesKernelSpecializationStrategy", None)
        if strategy is None or not hasattr(self.engine, "create_runtime_config"):
            return ()
        config = self.engine.create_runtime_config()
        config.dynamic_shapes_kernel_specialization_strategy = strategy.EAGER
        self.settings["kernel_specialization"] = "EAGER"
        if self.runtime_cache_file is not None:
            self._cache = config.create_runtime_cache()
            if self.runtime_cache_file.is_file():
                self._cache.deserialize(self.runtime_cache_file.read_bytes())
            config.set_runtime_cache(self._cache)
            self.settings["runtime_cache"] = str(self.runtime_cache_file)
        self._config = config  # alive as long as the context
        return (config,)

    def save_runtime_cache(self) -> None:
        """Write the kernels compiled so far to the runtime cache file (atomically; no-op without one)."""
        cache = getattr(self, "_cache", None)
        if cache is not None and self.runtime_cache_file is not None:
            self.runtime_cache_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.runtime_cache_file, bytes(cache.serialize()))

    def _torch_dtype(self, name: str):
        return torch.from_numpy(np.zeros(0, self.library.module.nptype(self.engine.get_tensor_dtype(name)))).dtype

    def bind(self, x) -> Any:
        """Bind a CUDA input tensor; return the (NaN-filled) CUDA output tensor the engine writes to.

        Raises:
            TensorRTError: the shape is outside the engine's profile.
        """
        xin = x.to("cuda", self._torch_dtype(INPUT_NAME)).contiguous()
        set_input_shape(self.context, self.engine, INPUT_NAME, xin.shape)
        out = torch.full(
            tuple(self.context.get_tensor_shape(OUTPUT_NAME)),
            float("nan"),
            device="cuda",
            dtype=self._torch_dtype(OUTPUT_NAME),
        )
        self.context.set_tensor_address(INPUT_NAME, xin.data_ptr())
        self.context.set_tensor_address(OUTPUT_NAME, out.data_ptr())
        self.stream.wait_stream(torch.cuda.current_stream())  # the copies above were made on the current stream
        self._bound = (xin, out)  # keep the buffers alive while bound
        return out

    def close(self) -> None:
        """Free the execution context, the engine and its bound buffers (in that order: a context needs its
        engine); the engine cannot run after it. Closing twice is closing once."""
        self._bound = None
        for name in ("context", "_config", "_cache", "engine", "_runtime"):
            if hasattr(self, name):
                setattr(self, name, None)

    def capturable(self) -> bool:
        """Whether an enqueue on :attr:`stream` may be captured into a CUDA graph (TensorRT-RTX answers;
        TensorRT proper has no such query: ``True``, and a failed capture falls back to plain enqueues)."""
        ask = getattr(self.context, "is_stream_capturable", None)
        return True if ask is None else bool(ask(self.stream.cuda_stream))

    def enqueue(self, stream=None) -> None:
        """Enqueue one execution on ``stream`` (default: the engine's own)."""
        if not self.context.execute_async_v3((stream or self.stream).cuda_stream):
            raise TensorRTError(f"TensorRT execution failed{last_errors(self._logger)}")

    def run(self, x: np.ndarray) -> np.ndarray:
        """One float32 NCHW batch -> float32 logits on the host."""
        out = self.bind(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        self.enqueue()
        self.stream.synchronize()
        return out.float().cpu().numpy()

    def latency_ms(self, x: np.ndarray, iters: int = 50, warmup_s: float = 0.2) -> dict[str, float]:
        """Median and min latency of the enqueue on resident inputs, timed with CUDA events on the engine's stream
        after at least ``warmup_s`` seconds (and 10 calls) of warm-up."""
        self.bind(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
        n, end = 0, time.perf_counter() + warmup_s
        while n < 10 or time.perf_counter() < end:
            self.enqueue()
            self.stream.synchronize()
            n += 1
        times = []
        for _ in range(iters):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            self.enqueue()
            stop.record(self.stream)
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return {
            "batch": int(x.shape[0]),
            "iterations": iters,
            "warmup_calls": n,
            "median_ms": float(np.median(times)),
            "min_ms": float(np.min(times)),
        }
