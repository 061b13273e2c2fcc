"""Loading a folder of models: the ``.onnx`` files (and OpenVINO IRs) of ``export-model``, each served only when its
verification report covers it, on one reused session of a backend checked against the export's reference, or
the ``.safetensors`` checkpoints run by PyTorch. A bad file is skipped with a warning naming it and the reason
(recorded too inside :func:`recording_skips`)."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from tqdm import tqdm

from attnzoo.errors import first_line
from attnzoo.fileio import default_cache_dir
from attnzoo.filekind import DIRECTORY, MISSING, file_kind
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import (
    LoadOptions,
    Session,
    backends_reading,
    check_against_reference,
    get_backend,
    reference_backend,
)
from attnzoo.runtime.contract import ModelContract
from attnzoo.runtime.sessions import IR_SUFFIX, served_precision, verification_problem
from attnzoo.serve.served import REFERENCE, SLIDING_BATCH, ServedModel, _from_config, _warmed_up

# imported on first use: only a checkpoint needs PyTorch and timm
checkpoint = lazy_import("attnzoo.models.checkpoint")

__all__ = ["models_folder", "model_files", "unread_reason", "recording_skips", "load_onnx_dir", "load_checkpoint_dir"]


def _session(path: Path, backend: str, threads: int | None, cache_dir: Path | None, contract=None) -> Session:
    """A verified ONNX file (or OpenVINO IR) loaded by ``backend``; a backend other than ONNX Runtime's CPU
    provider (the export's own reference) is checked against it on the same ONNX file first
    (:func:`attnzoo.runtime.backends.check_against_reference`). A backend with a
    :attr:`~attnzoo.runtime.backends.Backend.serving_batch` (OpenVINO: 1) is compiled for it (other batches run
    image by image); one that :attr:`~attnzoo.runtime.backends.Backend.builds_engine` (TensorRT) builds it for
    batch 1 to :data:`SLIDING_BATCH`, once, in the one engine cache (:func:`attnzoo.targets.tensorrt.build_cached`,
    under ``<cache>/tensorrt``)."""
    b = get_backend(backend)
    engine = (
        dict(batch_sizes=(1, SLIDING_BATCH), cache_dir=Path(cache_dir or default_cache_dir()))
        if b.builds_engine
        else {}
    )
    session = b.load(path, b.options(threads=threads, batch=b.serving_batch, **engine))
    try:  # an IR, which ONNX Runtime cannot read, was checked against eager PyTorch when it was written
        if b.name != REFERENCE and Path(path).suffix in get_backend(REFERENCE).suffixes:
            check_against_reference(session, path, contract, threads=threads)
    except BaseException:
        session.close()
        raise
    return session


def models_folder(path: Path) -> Path:
    """``path`` when it is a folder (``--models``); ``ValueError`` saying what it is otherwise (missing, a file:
    which kind, a FIFO ...)."""
    kind = file_kind(path)
    if kind == MISSING:
        raise ValueError(f"models folder not found: {path}")
    if kind != DIRECTORY:
        raise ValueError(f"{path}: is {kind}, not a folder (--models takes a folder of export-model files)")
    return Path(path)


def model_files(directory: Path) -> list[Path]:
    """The model files of ``directory`` a server may load: ``.onnx`` files and OpenVINO IRs (``.xml``), regular
    files only (anything else of that name is skipped with a warning, never opened)."""
    return sorted([*_model_files(directory, ".onnx"), *_model_files(directory, IR_SUFFIX)])


def unread_reason(path: Path, backend: str) -> str | None:
    """Why ``backend`` cannot load the model file ``path`` (an OpenVINO IR on a backend that reads only ONNX), or
    None (:attr:`~attnzoo.runtime.backends.Backend.suffixes`)."""
    if Path(path).suffix in get_backend(backend).suffixes:
        return None
    return f"an OpenVINO IR is served with --backend {' or '.join(backends_reading(Path(path).suffix))}, not {backend}"


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _model_files(directory: Path, suffix: str) -> list[Path]:
    """The regular files ``*<suffix>`` of ``directory``; anything else with that name (a FIFO, a device, a
    folder) is skipped with a warning, never opened."""
    paths = []
    for path in sorted(Path(directory).glob(f"*{suffix}")):
        if path.is_file():
            paths.append(path)
        else:
            _warn(f"skipping {path.name}: is {file_kind(path)}, not a regular file")
    return paths


def _skip(path: Path, exc: BaseException) -> None:
    _warn(f"skipping {path.name}: {first_line(exc)}")
    recorded = _SKIPS.get()
    if recorded is not None:
        recorded[path.name] = first_line(exc)


#: The files skipped while :func:`recording_skips` is active (``None`` outside it).
_SKIPS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("attnzoo_skips", default=None)


@contextlib.contextmanager
def recording_skips() -> Iterator[dict[str, str]]:
    """Inside, every model file the loaders skip is also recorded as ``{file name: reason}``, for a caller whose
    stderr does not reach the user (a Ray Serve replica: the driver prints what its replicas skipped)."""
    recorded: dict[str, str] = {}
    token = _SKIPS.set(recorded)
    try:
        yield recorded
    finally:
        _SKIPS.reset(token)


def load_onnx_dir(
    directory: Path,
    backend: str = REFERENCE,
    threads: int | None = None,
    cache_dir: Path | None = None,
    only: Sequence[str] | None = None,
    dtype: str | None = None,
) -> list[ServedModel]:
    """Every attnzoo ``.onnx`` file of ``directory``, and every OpenVINO IR ``.xml`` when ``backend`` reads one
    (:attr:`~attnzoo.runtime.backends.Backend.suffixes`; ``only``: just these file names; ``dtype``: just the files
    :func:`attnzoo.runtime.sessions.served_precision` serves at that ``--dtype``), each with one reused ONNX
    session of ``backend``. A file that is not an attnzoo model, is larger than an ONNX file can be, has invalid
    metadata (config, input size, class names vs logits), has no verification report that covers it
    (:func:`attnzoo.runtime.sessions.verification_problem`: written by export-model, passed, this file's SHA-256;
    a quantized one also scored within the tolerance), or fails to load is skipped with a warning naming it and the
    reason."""
    models = []
    paths = [p for p in model_files(directory) if only is None or p.name in set(only)]
    for path in tqdm(paths, desc=f"loading models ({backend})", unit="model", disable=len(paths) < 4):
        try:
            problem = unread_reason(path, backend)
            if problem:
                raise ValueError(problem)
            contract = ModelContract.from_onnx(path)  # one read of the file's metadata, validated
            config, input_size = contract.config, contract.input_size
            if dtype and served_precision(contract.dtype) != dtype:
                continue
            problem = verification_problem(path, contract.dtype)
            if problem:
                raise ValueError(f"not served: {problem}")
            session = _session(path, backend, threads, cache_dir, contract)
            served = _from_config(
                config, session.run, session.fixed_size, path, session.backend, input_size, contract.input_style
            )
            served.dtype = contract.dtype
            models.append(_warmed_up(served))
        except Exception as exc:  # onnx, onnxruntime and tensorrt raise their own types; skip the file, say why
            _skip(path, exc)
    return models


def load_checkpoint_dir(directory: Path) -> list[ServedModel]:
    """Every ``.safetensors`` checkpoint of ``directory``, run by PyTorch (segmenters take any size); bad
    files are skipped with a warning, as in :func:`load_onnx_dir`."""
    models = []
    for path in _model_files(directory, ".safetensors"):
        try:
            model, config = checkpoint.load_checkpoint(path)
            session = get_backend(reference_backend()).load(model, LoadOptions())
            served = _from_config(config, session.run, session.fixed_size, path, session.backend)
            models.append(_warmed_up(served))
        except Exception as exc:  # one bad file must not stop the others (like the ONNX path)
            _skip(path, exc)
    return models
