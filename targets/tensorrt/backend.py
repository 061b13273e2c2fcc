"""``tensorrt``: a TensorRT engine built from the verified ONNX file by the runtime's builder
(:mod:`attnzoo.targets.tensorrt`: ``tensorrt_rtx`` ahead of time, or ``tensorrt`` on the GPU present), run on torch
CUDA buffers on the engine's own stream, from a CUDA graph where the context can be captured. Without a GPU the
engine can still be built (:meth:`TensorRTBackend.build_only`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.errors import first_line
from attnzoo.fileio import cache_subdir
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import Backend, Call, LoadOptions, Session
from attnzoo.runtime.device import DeviceMemory, release_cuda_cache, tf32_problem

from . import builder, library
from .engine import Engine, runtime_cache_path
from .schema import EngineReport, engine_report_path

torch = lazy_import("torch")

__all__ = ["TensorRTBackend", "TensorRTSession", "TENSORRT"]


class TensorRTSession(Session):
    """One engine (built for the batch sizes given, or loaded from an engine file) and one execution context."""

    def __init__(self, engine: Engine, backend: str, facts: dict[str, Any], memory: DeviceMemory | None = None) -> None:
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
            except Exception as exc:  # a capture TensorRT refuses: timed without a graph
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
        return Call(
            fn,
            output,
            cuda=True,
            cuda_graph=graph is not None,
            memory=self.memory.device_used if self.memory is not None else None,
            session=self,
        )

    def latency_ms(self, x: np.ndarray, iters: int = 50) -> dict[str, float]:
        """Median and min latency of the engine's enqueue on ``x`` made resident, timed with CUDA events after a
        warm-up (:meth:`~attnzoo.targets.tensorrt.engine.Engine.latency_ms`): what an export's engine
        check reports."""
        return self.engine.latency_ms(x, iters)

    def info(self) -> dict[str, Any]:
        facts = {
            k: v
            for k, v in self._facts.items()
            if k
            in (
                "library",
                "library_version",
                "compute_capability",
                "build_time_s",
                "tf32",
                "require_user_allocation",
                "profile",
            )
        }
        return {**facts, **self.engine.settings, "cuda_graph": self._graph_note}

    def release(self) -> None:
        """Drop the CUDA graph, then the engine's context, engine and buffers; PyTorch's cache is emptied."""
        self._graph = None
        self.engine.close()
        release_cuda_cache()


@dataclass(frozen=True)
class TensorRTBackend(Backend):
    """Native TensorRT engines."""

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
        if dtype == "int8":
            return (
                "int8 rows here are the CPU runtimes'; the GPU int8 engine is export-model --dtype int8 "
                "--format tensorrt"
            )
        if dtype == "bf16":
            return "bf16 ONNX graphs are not exported (export dtypes: fp32, fp16)"
        return (
            library.unavailable_reason(run=not build_only)
            or super().unavailable_reason(dtype, device)
            or (tf32_problem("cuda") if dtype == "tf32" and not build_only else None)
        )

    def build_only(self, model: Any, options: LoadOptions) -> dict[str, Any]:
        """The engine of the ONNX file ``model`` built ahead of time for
        :data:`~attnzoo.targets.tensorrt.DEFAULT_COMPUTE_CAPABILITY` (not run: no GPU, or one its engines do not run
        on), once per ONNX file, shape, profile and TF32 choice (kept in ``options.cache_dir/tensorrt`` and reused);
        its build facts."""
        if options.cache_dir is None:
            raise ValueError(f"{self.name}: building without running keeps the engine; give a cache_dir")
        return builder.build_cached(
            Path(model),
            cache_subdir(options.cache_dir, "tensorrt"),
            batch_sizes=_sizes(options),
            tf32=options.dtype == "tf32",
            compute_capability=library.DEFAULT_COMPUTE_CAPABILITY,
        )

    def open(self, model: Any, options: LoadOptions) -> TensorRTSession:
        """``model``: an ONNX file (an engine is built for ``options.batch_sizes``, else for exactly
        ``options.batch``: a static shape, the tactics chosen for it; cached under ``cache_dir/tensorrt`` when
        given -- :func:`attnzoo.targets.tensorrt.build_cached`, the one engine cache -- with TensorRT's timing cache
        or TensorRT-RTX's runtime cache beside it) or an ``.engine`` file (loaded as it is; options that would shape
        an engine are refused for it)."""
        path = Path(model)
        if path.suffix == ".engine":
            shaping = [n for n in ("batch", "batch_sizes", "cache_dir") if n in options.set_fields()]
            if shaping:
                raise ValueError(
                    f"{path.name} is a built engine: {', '.join(shaping)} cannot change it (build "
                    "from the ONNX file instead)"
                )
            try:
                blob = trusted_engine(path)
            except ValueError as exc:
                raise ValueError(f"{self.name}: {path} is not loaded: {exc}") from None
            memory = DeviceMemory() if library.gpu_available() else None
            return TensorRTSession(Engine(blob), self.name, {}, memory)
        sizes, tf32 = _sizes(options), options.dtype == "tf32"
        if options.cache_dir is not None:  # engines and compiled kernels kept: every later row and run reuses them
            folder = cache_subdir(options.cache_dir, "tensorrt")
            facts = builder.build_cached(path, folder, batch_sizes=sizes, tf32=tf32)
            lib = library.load_library()
            memory = DeviceMemory()  # after the build (which needs none of it), before the engine is loaded
            return TensorRTSession(
                Engine(Path(facts["engine"]), lib, runtime_cache_path(folder, lib)), self.name, facts, memory
            )
        return self.open_built(builder.build(path, batch_sizes=sizes, tf32=tf32))

    def open_built(self, built: builder.Built) -> TensorRTSession:
        """A session of the engine :func:`~attnzoo.targets.tensorrt.build` just made, from its bytes (nothing read
        from disk): what ``export-model``'s engine check runs before the engine is kept.

        Raises:
            TensorRTUnavailable: no GPU, or one the engine's library does not run on.
        """
        memory = DeviceMemory() if library.gpu_available() else None
        return TensorRTSession(Engine(built.blob, built.library), self.name, built.facts(), memory)


#: How an engine the backend would not load by path is made anew.
_EXPORT_IT = "build it with export-model --format tensorrt"


def trusted_engine(path: Path) -> bytes:
    """The bytes of the engine file ``path``, read once (what is checked is what TensorRT deserializes), when its
    report ``<engine>.json`` says it passed the checks of ``export-model --format tensorrt`` and records their
    SHA-256. An engine holds code TensorRT runs, so a file without such a record is not trusted: a report written
    before engines were hashed records none (the engine is built again to be loaded by path).

    Raises:
        ValueError: one line saying why not (no engine file, no report, unreadable, not passed, no SHA-256 recorded,
            other bytes).
    """
    if not path.is_file():
        raise ValueError("no such engine file")
    report_path = engine_report_path(path)
    if not report_path.is_file():
        raise ValueError(f"no engine report {report_path.name} beside it ({_EXPORT_IT})")
    try:
        report = EngineReport.from_json(report_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{report_path.name} is not an engine report export-model writes ({first_line(exc)})"
        ) from None
    if not report.passed:
        raise ValueError(f"{report_path.name} does not say the engine passed its checks")
    if not report.engine_sha256:
        raise ValueError(
            f"{report_path.name} records no SHA-256 of the engine (written before engines were hashed), so it is not "
            f"trusted; {_EXPORT_IT} again"
        )
    mismatch = f"{path.name} differs from the engine its report {report_path.name} verified (SHA-256 mismatch)"
    if report.engine_size is not None and path.stat().st_size != report.engine_size:
        raise ValueError(mismatch)  # another size: not read
    blob = path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != report.engine_sha256:
        raise ValueError(mismatch)
    return blob


def _sizes(options: LoadOptions) -> tuple[int, ...]:
    """The batch sizes an engine is built for: ``batch_sizes``, else exactly ``batch``, else 1."""
    return options.batch_sizes or ((int(options.batch),) if options.batch else (1,))


TENSORRT = TensorRTBackend(
    "tensorrt",
    "a native TensorRT engine built from the verified ONNX file (TensorRT-RTX or TensorRT), run "
    "from a CUDA graph; without a GPU: built, not run",
    aliases=("trt",),
    device="cuda",
    dtypes=("fp32", "tf32", "fp16"),
    reads=("batch", "batch_sizes", "cache_dir"),
    library="tensorrt",
    builds_engine=True,
)
