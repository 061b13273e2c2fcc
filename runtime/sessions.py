"""ONNX Runtime sessions for every consumer: CPU, CUDA and the TensorRT execution provider.

One place builds ``SessionOptions`` and provider lists, so export verification, the benchmark and the demo run
models the same way. ``device``:

- ``cpu``: ``CPUExecutionProvider``;
- ``cuda``: ``CUDAExecutionProvider`` (optionally with a CUDA graph);
- ``tensorrt``: ``TensorrtExecutionProvider`` (engine cache on disk), falling back to CUDA for what it rejects;
- ``auto``: CUDA when the installed onnxruntime has it, else CPU.

Quantized files (int8 / fp8 Q/DQ graphs from ``export-model --dtype int8|fp8``) are served only when
:func:`quantized_problem` finds their verification report intact: written by the export's checks, for exactly
this file, scored on the test split within the tolerance of fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple, Union

__all__ = ["DEVICES", "LEVELS", "QUANTIZED_DTYPES", "SERVED_DTYPES", "served_precision", "available_providers",
           "session_options", "providers_for", "ort_session", "quantized_problem"]

DEVICES: Tuple[str, ...] = ("auto", "cpu", "cuda", "tensorrt")
LEVELS: Tuple[str, ...] = ("disable", "basic", "extended", "all")
#: Graph precisions that need :func:`quantized_problem`'s check before they are served.
QUANTIZED_DTYPES: Tuple[str, ...] = ("int8", "fp8")
#: What the demo's and serve-models' ``--dtype`` select: ``fp32``, the unquantized exports (fp32 and fp16
#: graphs, both with fp32 input and output), or ``int8``, verified int8 Q/DQ graphs (:func:`served_precision`).
SERVED_DTYPES: Tuple[str, ...] = ("fp32", "int8")


def served_precision(graph_dtype: str) -> str:
    """The ``--dtype`` that serves a graph of ``graph_dtype``: ``fp32`` for fp32 and fp16 exports, else the
    quantized precision itself (``int8``; ``fp8`` graphs are TensorRT's, served by neither CPU command)."""
    return graph_dtype if graph_dtype in QUANTIZED_DTYPES else "fp32"


def available_providers() -> Tuple[str, ...]:
    """Execution providers of the installed onnxruntime (empty when it is not installed)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return ()
    return tuple(ort.get_available_providers())


def session_options(threads: Optional[int] = None, level: str = "all", optimized_path: Optional[Path] = None,
                    profile_prefix: Optional[str] = None, sequential: bool = True, spinning: bool = True):
    """``onnxruntime.SessionOptions``.

    Args:
        threads: Intra-op threads (``None``: ONNX Runtime's default, one per core); set: one inter-op thread.
        level: Graph optimization level, one of ``LEVELS``.
        optimized_path: Save the optimized graph here.
        profile_prefix: Turn the profiler on, writing ``<prefix>_<date>.json``.
        sequential: Sequential execution mode.
        spinning: Let intra-op threads spin after a run (ONNX Runtime's default); off on a shared machine.
    """
    import onnxruntime as ort

    if level not in LEVELS:
        raise ValueError(f"unknown optimization level {level!r}; valid: {', '.join(LEVELS)}")
    levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
              "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
              "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
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


def providers_for(device: str = "auto", *, cuda_graph: bool = False, fp16: bool = False,
                  cache_dir: Optional[Path] = None) -> List[Any]:
    """The provider list for ``device`` (see the module docstring).

    Raises:
        ValueError: unknown device, or the installed onnxruntime lacks its provider.
    """
    have = available_providers()
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; valid: {', '.join(DEVICES)}")
    if device == "auto":
        return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in have]
    if device == "cpu":
        return ["CPUExecutionProvider"]
    wanted = "CUDAExecutionProvider" if device == "cuda" else "TensorrtExecutionProvider"
    if wanted not in have:
        raise ValueError(f"onnxruntime has no {wanted} (install onnxruntime-gpu"
                         f"{' with the TensorRT libraries' if device == 'tensorrt' else ''})")
    if device == "cuda":
        return [("CUDAExecutionProvider", {"enable_cuda_graph": "1" if cuda_graph else "0"})]
    opts = {"trt_fp16_enable": bool(fp16), "trt_cuda_graph_enable": bool(cuda_graph)}
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=str(cache_dir))
    return [("TensorrtExecutionProvider", opts), "CUDAExecutionProvider"]


def ort_session(model: Union[str, Path, bytes], device: str = "auto", *, threads: Optional[int] = None,
                options=None, providers: Optional[Sequence[Any]] = None, **provider_kwargs: Any):
    """An ``onnxruntime.InferenceSession`` for an ONNX file (or serialized model).

    Args:
        model: ``.onnx`` path or model bytes.
        device: One of ``DEVICES``.
        threads: Intra-op threads when ``options`` is not given.
        options: Ready ``SessionOptions`` (default: :func:`session_options` with ``threads``).
        providers: Explicit provider list (overrides ``device``).
        **provider_kwargs: ``cuda_graph``, ``fp16``, ``cache_dir`` for :func:`providers_for`.
    """
    import onnxruntime as ort

    so = options if options is not None else session_options(threads)
    plist = list(providers) if providers is not None else providers_for(device, **provider_kwargs)
    src = model if isinstance(model, (bytes, bytearray)) else str(model)
    return ort.InferenceSession(src, so, providers=plist)


def quantized_problem(path: Union[str, Path], dtype: str) -> Optional[str]:
    """Why the quantized model ``path`` (graph precision ``dtype``) must not be served (one line), or ``None``.

    Served only when its ``<model>.report.json`` (written by ``export-model --dtype int8|fp8`` after its checks:
    Q/DQ placement, extra math fp32, finite outputs, test-split accuracy next to fp32) says it passed, names this
    precision, matches the file's SHA-256, and its accuracy was measured and is within the tolerance (a drop
    accepted with ``--accept-accuracy-drop``, one scored on part of the test split with ``--eval-limit``, or an
    unscored ``--random-init`` model is not served). fp32 / fp16
    files: always ``None`` (their own verification is the export's).
    """
    import json

    from attnzoo.fileio import sha256_file

    if dtype not in QUANTIZED_DTYPES:
        return None
    path = Path(path)
    report = path.with_suffix(".report.json")
    if not report.is_file():
        return f"{dtype} model without its verification report {report.name} (export it with export-model --dtype {dtype})"
    try:
        rep = json.loads(report.read_text())
    except (OSError, ValueError) as exc:
        return f"{report.name} is unreadable ({type(exc).__name__})"
    if not isinstance(rep, dict) or not rep.get("passed"):
        return f"{report.name} does not say the {dtype} model passed its verification"
    if rep.get("dtype") != dtype:
        return f"{report.name} is for a {rep.get('dtype')} model, the file is {dtype}"
    if rep.get("sha256") != sha256_file(path):
        return f"{path.name} differs from the file its report {report.name} verified (SHA-256 mismatch)"
    acc = rep.get("accuracy") or {}
    if not acc.get("metrics"):
        return f"{path.name} was not scored on a test set ({acc.get('warning') or acc.get('reason') or 'no accuracy'})"
    if acc.get("limit"):
        return (f"{path.name} was scored on only {acc.get('n_images')} test images (--eval-limit); export it without "
                "--eval-limit to serve it")
    if not acc.get("within_tolerance"):
        return (f"{path.name} is {acc.get('drop', float('nan')):.2f} points below fp32 (tolerance "
                f"{acc.get('tolerance')}; written with --accept-accuracy-drop)")
    return None
