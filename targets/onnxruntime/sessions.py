"""ONNX Runtime's session settings and provider lists, and the one place its ``InferenceSession`` is made.

One place builds ``SessionOptions`` and provider lists, so export verification, the benchmark and the demo run
models the same way; the sessions themselves are the ``ort-cpu``, ``ort-cuda`` and ``ort-trt`` backends' (a caller
outside this target asks the registry for ONNX Runtime's CPU session: ``onnx_reference().session(...)`` or
``get_backend("ort-cpu").load(...)``, :mod:`attnzoo.runtime.backends`). ``provider``:

- ``cpu``: ``CPUExecutionProvider`` (export verification always runs here: fp32 without TF32);
- ``cuda``: ``CUDAExecutionProvider`` (optionally with a CUDA graph);
- ``tensorrt-ep``: ``TensorrtExecutionProvider`` (engine cache on disk), falling back to CUDA for what it rejects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnzoo.fileio import private_dir
from attnzoo.lazy import lazy_import

ort = lazy_import("onnxruntime")

__all__ = [
    "OrtProvider",
    "ORT_PROVIDERS",
    "PROVIDERS",
    "LEVELS",
    "available_providers",
    "session_options",
    "providers_for",
    "inference_session",
]


@dataclass(frozen=True)
class OrtProvider:
    """One ``provider`` of :func:`providers_for`: an ONNX Runtime execution provider and what it needs.

    Attributes:
        name: Its name here (one of :data:`PROVIDERS`).
        execution_provider: ONNX Runtime's name for it.
        gpu: It comes with ``onnxruntime-gpu`` (checked among :func:`available_providers`); else always there.
        needs_tensorrt: It also needs the TensorRT libraries, and falls back to CUDA for what it rejects.
    """

    name: str
    execution_provider: str
    gpu: bool = True
    needs_tensorrt: bool = False


#: Every provider of :func:`providers_for` by name (see the module docstring).
ORT_PROVIDERS: dict[str, OrtProvider] = {
    p.name: p
    for p in (
        OrtProvider("cpu", "CPUExecutionProvider", gpu=False),
        OrtProvider("cuda", "CUDAExecutionProvider"),
        OrtProvider("tensorrt-ep", "TensorrtExecutionProvider", needs_tensorrt=True),
    )
}
PROVIDERS: tuple[str, ...] = tuple(ORT_PROVIDERS)
LEVELS: tuple[str, ...] = ("disable", "basic", "extended", "all")


def available_providers() -> tuple[str, ...]:
    """Execution providers of the installed onnxruntime (empty when it is not installed)."""
    try:
        return tuple(ort.get_available_providers())
    except ImportError:  # the first attribute read imports onnxruntime
        return ()


def session_options(
    threads: int | None = None,
    level: str = "all",
    optimized_path: Path | None = None,
    profile_prefix: str | None = None,
    sequential: bool = True,
    spinning: bool = True,
):
    """``onnxruntime.SessionOptions``.

    Args:
        threads: Intra-op threads (``None``: ONNX Runtime's default, one per core); set: one inter-op thread.
        level: Graph optimization level, one of ``LEVELS``.
        optimized_path: Save the optimized graph here.
        profile_prefix: Turn the profiler on, writing ``<prefix>_<date>.json``.
        sequential: Sequential execution mode.
        spinning: Let intra-op threads spin after a run (ONNX Runtime's default); off on a shared machine.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown optimization level {level!r}; valid: {', '.join(LEVELS)}")
    levels = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    so = ort.SessionOptions()
    so.graph_optimization_level = levels[level]
    so.log_severity_level = 3
    if sequential:
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def providers_for(
    provider: str = "cpu", *, cuda_graph: bool = False, tf32: bool = False, cache_dir: Path | None = None
) -> list[Any]:
    """The provider list for ``provider`` (one of :data:`PROVIDERS`; see the module docstring).

    Precision is set explicitly, never left to a provider's default: the CUDA provider's ``use_tf32`` (on by
    default in ONNX Runtime) is ``tf32``. The TensorRT provider gets no precision flag at all: ONNX Runtime's
    TensorRT EP builds a strongly typed network, taking every tensor's type from the graph (an fp16 export keeps
    its fp32 LayerNorm / softmax / extra math), as long as none of ``trt_fp16_enable`` / ``trt_int8_enable`` /
    ``trt_bf16_enable`` is set (setting one turns strong typing off); it has no strong-typing option of its own and
    no option for TensorRT's TF32 flag, which stays at TensorRT's default (on).

    Raises:
        ValueError: unknown provider, or the installed onnxruntime lacks it.
    """
    if provider not in ORT_PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; valid: {', '.join(PROVIDERS)}")
    p = ORT_PROVIDERS[provider]
    if not p.gpu:
        return [p.execution_provider]
    if p.execution_provider not in available_providers():
        raise ValueError(
            f"onnxruntime has no {p.execution_provider} (install onnxruntime-gpu"
            f"{' with the TensorRT libraries' if p.needs_tensorrt else ''})"
        )
    cuda = {"use_tf32": "1" if tf32 else "0"}
    if not p.needs_tensorrt:
        return [(p.execution_provider, {**cuda, "enable_cuda_graph": "1" if cuda_graph else "0"})]
    opts: dict[str, Any] = {"trt_cuda_graph_enable": bool(cuda_graph)}
    if cache_dir is not None:  # ONNX Runtime loads the engines it finds there by name: the user's folder alone
        private_dir(cache_dir, "TensorRT engine cache folder")
        opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=str(cache_dir))
    return [(p.execution_provider, opts), ("CUDAExecutionProvider", cuda)]


def inference_session(
    model: Any,
    provider: str = "cpu",
    *,
    threads: int | None = None,
    options: Any = None,
    providers: Sequence[Any] | None = None,
    **provider_kwargs: Any,
) -> Any:
    """The one place an ``onnxruntime.InferenceSession`` is made (``ort-cpu``; ``ort-cuda`` and ``ort-trt`` with
    their provider).

    Args:
        model: ``.onnx`` path, the model's bytes, or an ``onnx.ModelProto``.
        provider: One of :data:`PROVIDERS` (default: the CPU).
        threads: Intra-op threads when ``options`` is not given.
        options: Ready ``SessionOptions`` (default: :func:`session_options` with
            ``threads``).
        providers: Explicit provider list (overrides ``provider``).
        **provider_kwargs: ``cuda_graph``, ``tf32``, ``cache_dir`` for
            :func:`providers_for`.
    """
    so = options if options is not None else session_options(threads)
    plist = list(providers) if providers is not None else providers_for(provider, **provider_kwargs)
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    src = model if isinstance(model, (bytes, bytearray)) else str(model)
    return ort.InferenceSession(src, so, providers=plist)
