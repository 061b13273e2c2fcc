"""The models the demo serves: ONNX files (ONNX Runtime or OpenVINO on the CPU, or TensorRT) or checkpoints
(PyTorch), each wrapped as a :class:`ServedModel` that maps a float32 batch (N, 3, H, W) to logits.

The default backend, ``auto``, is the faster of the installed CPU runtimes (ONNX Runtime, OpenVINO), measured
on this machine on the files about to be served (:func:`attnzoo.runtime.choice.fastest_cpu_runtime`).

Everything the demo needs (task, class names, input size, mean/std) comes from the ONNX metadata written by
``export-model`` or from the checkpoint config, so any folder of exported models can be served. By default the
zoo's checkpoints are exported once into a cache folder keyed by the zoo manifest's hash and reused later.

``dtype="int8"`` serves int8 Q/DQ models (``export-model --dtype int8``; for the zoo, quantized once into the same
cache folder by the same code, :func:`attnzoo.export.quantize.quantize_verified`, calibrated on the model's
training images and scored on its test split). A quantized file is served only when its verification report
is intact (:func:`attnzoo.runtime.sessions.verification_problem`); otherwise it is skipped with the reason. The
``auto`` backend is then timed on the int8 files themselves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from attnzoo import zoo
from attnzoo.errors import quoted
from attnzoo.export.zoo_cache import export_zoo, zoo_onnx_folder, zoo_onnx_name, zoo_rows
from attnzoo.runtime.backends import cpu_runtimes, get_backend
from attnzoo.runtime.choice import choose_cpu_backend
from attnzoo.runtime.sessions import SERVED_DTYPES
from attnzoo.serve.bf16 import load_bf16_models
from attnzoo.serve.folders import (
    load_checkpoint_dir,
    load_onnx_dir,
    model_files,
    models_folder,
    recording_skips,
    unread_reason,
)
from attnzoo.serve.remote import RemoteError, load_remote
from attnzoo.serve.served import AUTO, MAX_TENSOR_BATCH, REFERENCE, ServedModel, tensor_batch_limit
from attnzoo.serve.zoo_models import load_zoo_onnx, load_zoo_torch
from attnzoo.zoo import DEFAULT_DATA

__all__ = [
    "AUTO",
    "REFERENCE",
    "resolve_backend",
    "ServedModel",
    "load_models",
    "zoo_rows",
    "load_onnx_dir",
    "load_checkpoint_dir",
    "load_zoo_torch",
    "load_zoo_onnx",
    "export_zoo",
    "zoo_onnx_folder",
    "zoo_onnx_name",
    "choose_cpu_backend",
    "model_files",
    "models_folder",
    "unread_reason",
    "load_remote",
    "RemoteError",
    "load_bf16_models",
    "recording_skips",
    "MAX_TENSOR_BATCH",
    "tensor_batch_limit",
]


def resolve_backend(name: str) -> str:
    """``auto``, or the registry's one name for ``name`` (an alias such as ``onnxruntime`` or ``pytorch`` is
    accepted).

    Raises:
        ValueError: an unknown name (the valid ones listed), or a backend that cannot run here (with the reason).
    """
    if name == AUTO:
        return AUTO
    try:
        backend = get_backend(name)
    except ValueError as exc:
        raise ValueError(f"{exc}; or {AUTO} (the faster CPU runtime here, measured)") from None
    reason = backend.unavailable_reason("fp32", "cpu")
    if reason:
        raise ValueError(
            f"the {backend.name} backend is not available: {reason}; use --backend {AUTO} (the faster "
            "CPU runtime here) instead"
        )
    return backend.name


def _unique_names(models: list[ServedModel]) -> list[ServedModel]:
    """Label each model by its variant, or by its file name where a variant appears twice for a task; sort
    them in ``VARIANT_NAMES`` order."""
    counts = Counter((m.task, m.variant) for m in models)
    for m in models:
        if counts[(m.task, m.variant)] > 1:
            m.name = Path(m.source).stem

    # standard first, then the papers' variants: the zoo's order, which is the registry's (a replica sorts its
    # models without importing PyTorch and timm); a variant the zoo lacks (a plugin's) after them
    order = {v: i for i, v in enumerate(dict.fromkeys(e["variant"] for e in zoo.entries()))}
    return sorted(models, key=lambda m: (m.task, order.get(m.variant, len(order)), m.name))


def load_models(
    models_dir: Path | None = None,
    backend: str = AUTO,
    data: str = DEFAULT_DATA,
    cache_dir: Path | None = None,
    threads: int | None = None,
    only: Sequence[str] | None = None,
    dtype: str | None = None,
) -> list[ServedModel]:
    """The models to serve.

    Args:
        models_dir: A folder of ``.onnx`` files from ``export-model`` (``.safetensors`` checkpoints with the
            pytorch backend); None serves the zoo.
        backend: ``auto`` (the faster CPU runtime here, measured: :func:`choose_cpu_backend`) or a backend of
            the runtime's registry, by name or alias: ``ort-cpu`` / ``openvino`` (CPU), ``eager`` (alias
            ``pytorch``: the checkpoints in PyTorch), ``tensorrt`` (engines built once, cached) ...
        data: Which zoo models (trained on this data set) to serve when ``models_dir`` is None.
        cache_dir: Root of the zoo's ONNX exports and the TensorRT engines (default
            :func:`attnzoo.fileio.default_cache_dir`).
        threads: CPU runtime threads per model (None: the runtime's default).
        only: Load just these ``.onnx`` file names of ``models_dir``.
        dtype: ``int8``: only verified int8 models (the zoo: quantized once, verified); ``fp32``: only fp32
            files; ``bf16``: the fp32 files at OpenVINO's bf16 precision, each verified first
            (:func:`load_bf16_models`); ``None``: every file of ``models_dir`` (a quantized one only when
            verified), the zoo at fp32.

    Raises:
        ValueError: the backend cannot run here, the folder is missing or not a folder (:func:`models_folder`), or
            nothing servable was found (bad files are skipped with a warning naming each).
    """
    backend = resolve_backend(backend)
    if dtype is not None and dtype not in SERVED_DTYPES:
        raise ValueError(f"unknown dtype {quoted(dtype)}; valid: {', '.join(SERVED_DTYPES)}")
    if dtype == "int8" and backend != AUTO and backend not in [b.name for b in cpu_runtimes()]:
        raise ValueError(
            f"--dtype int8 serves the int8 ONNX models on the CPU runtimes, not {backend} "
            f"(use --backend {AUTO}, {' or '.join(b.name for b in cpu_runtimes())})"
        )
    if models_dir is not None:
        models_folder(Path(models_dir))
    if dtype == "bf16":
        return _unique_names(load_bf16_models(models_dir, backend, data, cache_dir, threads, only))
    if backend != AUTO and get_backend(backend).takes == "module":
        models = load_checkpoint_dir(Path(models_dir)) if models_dir else load_zoo_torch(data)
        wanted = ".safetensors checkpoints"
    elif models_dir is None:
        models = load_zoo_onnx(data, backend, threads, cache_dir, dtype=dtype or "fp32")
        wanted = "zoo models" + (f" ({dtype})" if dtype else "")
    else:
        note = ""
        if backend == AUTO:
            backend, note = choose_cpu_backend(Path(models_dir), threads, dtype)
        models = load_onnx_dir(Path(models_dir), backend, threads, cache_dir, only, dtype)
        for m in models:
            m.backend_note = note
        wanted = f"{dtype + ' ' if dtype else ''}.onnx files (or OpenVINO IRs) exported by export-model" + (
            " with their verification reports" if dtype == "int8" else ""
        )
    if not models:
        raise ValueError(f"no servable models in {models_dir or 'the zoo'} (expected {wanted})")
    return _unique_names(models)
