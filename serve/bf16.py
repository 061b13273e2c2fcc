"""``--dtype bf16``: verified fp32 exports run by OpenVINO at bf16, each verified on its test split first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attnzoo.export.zoo_cache import export_zoo, zoo_rows
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import LoadOptions, cpu_runtimes
from attnzoo.runtime.contract import ModelContract
from attnzoo.runtime.sessions import serves, verification_problem
from attnzoo.serve.folders import _model_files, _skip
from attnzoo.serve.served import AUTO, ServedModel, _from_config, _warmed_up
from attnzoo.serve.zoo_models import _with_scores
from attnzoo.targets.openvino.bf16 import verify_bf16  # OpenVINO's bf16 path, the one CPU runtime with one
from attnzoo.zoo import DEFAULT_DATA

# imported on first use, so that the servers start without onnx and the exporter
quantize = lazy_import("attnzoo.export.quantize")
onnx = lazy_import("onnx")

__all__ = ["load_bf16_models"]


def load_bf16_models(
    models_dir: Path | None,
    backend: str = AUTO,
    data: str = DEFAULT_DATA,
    cache_dir: Path | None = None,
    threads: int | None = None,
    only: Sequence[str] | None = None,
) -> list[ServedModel]:
    """``--dtype bf16``: the verified fp32 exports (``models_dir``'s, or the zoo's trained on ``data``, all exported
    first) run by OpenVINO at bf16 with the variant's extra math pinned to f32 and read back, each verified on its
    test split next to fp32 before it is served (:func:`attnzoo.targets.openvino.bf16.verify_bf16`, kept per file,
    OpenVINO version and CPU); a file that fails is skipped with the reason.

    Raises:
        ValueError: a backend other than OpenVINO (``auto`` is OpenVINO, the one CPU runtime with a bf16 path), or
            a CPU without bf16 units (one line, before any work); nothing servable.
    """
    ov = next(b for b in cpu_runtimes() if "bf16" in b.dtypes)  # OpenVINO: the CPU runtime with a bf16 path
    if backend not in (AUTO, ov.name):
        raise ValueError(f"--dtype bf16 runs on OpenVINO (--backend {AUTO} or {ov.name}), not {backend}")
    reason = ov.unavailable_reason("bf16")
    if reason:
        raise ValueError(f"--dtype bf16: {reason}")
    folder = Path(models_dir) if models_dir is not None else export_zoo(data, cache_dir)
    note = f"{ov.name}, the CPU runtime with a bf16 path (extra math pinned to f32; verified on the test split)"
    models = []
    for path in _model_files(folder, ".onnx"):
        if only is not None and path.name not in only:
            continue
        try:
            contract = ModelContract.from_onnx(path)
            if not serves("bf16", contract.dtype):
                continue
            problem = verification_problem(path, contract.dtype)
            if problem:
                raise ValueError(f"not served: {problem}")
            names = quantize.extra_math_nodes(onnx.load(str(path), load_external_data=False), contract.config)
            verify_bf16(path, contract.config, names, cache_dir=cache_dir, threads=threads, progress=True)
            session = ov.load(
                path, LoadOptions(dtype="bf16", threads=threads, batch=ov.serving_batch, keep_f32=tuple(names))
            )
            served = _from_config(
                contract.config,
                session.run,
                session.fixed_size,
                path,
                session.backend,
                contract.input_size,
                contract.input_style,
            )
            served.dtype, served.backend_note = "bf16", note
            models.append(_warmed_up(served))
        except Exception as exc:  # this file is not served at bf16; say why, serve the others
            _skip(path, exc)
    if not models:
        raise ValueError(
            f"no servable bf16 models in {models_dir or 'the zoo'} (expected fp32 exports of trained "
            "models that pass the bf16 verification; the warnings say why each was skipped)"
        )
    return _with_scores(models, zoo_rows(data)) if models_dir is None else models
