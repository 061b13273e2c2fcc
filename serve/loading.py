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

import atexit
import contextlib
import contextvars
import hashlib
import io
import json
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from attnzoo import zoo
from attnzoo.errors import first_line, quoted
from attnzoo.fileio import default_cache_dir, sha256_file
from attnzoo.filekind import DIRECTORY, MISSING, file_kind
from attnzoo.lazy import lazy_import
from attnzoo.limits import MAX_UPLOAD_BYTES
from attnzoo.machine import cpu_info
from attnzoo.modelconfig import check_logits
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, input_style_of
from attnzoo.runtime.backends import (
    ONNX_REFERENCE,
    LoadOptions,
    Session,
    backends,
    check_against_reference,
    cpu_runtimes,
    get_backend,
    reference_backend,
)
from attnzoo.runtime.choice import fastest_cpu_runtime
from attnzoo.runtime.contract import ModelContract, metadata_props
from attnzoo.runtime.schemas import QuantizationReport
from attnzoo.runtime.sessions import (
    IR_SUFFIX,
    SERVED_DTYPES,
    read_report,
    served_precision,
    serves,
    verification_problem,
)
from attnzoo.targets.openvino.bf16 import verify_bf16  # OpenVINO's bf16 path, the one CPU runtime with one
from attnzoo.zoo import DEFAULT_DATA
from attnzoo.zoo.names import entry_name

# imported on first use, so that serve-demo and serve-models (their --help too) start without timm, onnx and the
# exporter, which only an export or a checkpoint needs; httpx only for --backend-url
registry = lazy_import("attnzoo.models")
checkpoint = lazy_import("attnzoo.models.checkpoint")
export = lazy_import("attnzoo.export")
quantize = lazy_import("attnzoo.export.quantize")
onnx = lazy_import("onnx")
httpx = lazy_import("httpx")

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

#: ``--backend auto``: the faster of the registry's CPU runtimes on this machine, measured at start-up on the
#: served files; any other value is a backend of :mod:`attnzoo.runtime.backends` (a name or an alias).
AUTO = "auto"
#: The backend the others are checked against: ONNX Runtime on the CPU, which verified every export.
REFERENCE = ONNX_REFERENCE
#: Most sliding windows run in one call (the TensorRT profile's largest batch).
SLIDING_BATCH = 16
#: Most images one request to serve-models' tensor route (``/models/{task}/{name}/logits``) carries; fewer where
#: they would not fit :data:`MAX_TENSOR_BODY` (:func:`tensor_batch_limit`).
MAX_TENSOR_BATCH = 64
#: Room for a ``.npy`` header on top of a tensor batch's data (numpy pads it to 64 bytes; 4 KiB is ample).
NPY_HEADER_ROOM = 4096
#: Largest tensor-route body: the largest upload with its multipart envelope, so that serve-models' ingress holds
#: it whole before a replica sees it (:data:`attnzoo.serve.rayserve.environment.INGRESS_BUFFER_BYTES`).
MAX_TENSOR_BODY = MAX_UPLOAD_BYTES + 64 * 1024


def tensor_batch_limit(input_size: Sequence[int]) -> int:
    """Most float32 ``(3, H, W)`` images of ``input_size`` one tensor-route request carries: at most
    :data:`MAX_TENSOR_BATCH`, and as many as fit :data:`MAX_TENSOR_BODY` (at least 1); the demo's
    ``--backend-url`` splits larger batches into requests of this many."""
    h, w = int(input_size[0]), int(input_size[1])
    return max(1, min(MAX_TENSOR_BATCH, (MAX_TENSOR_BODY - NPY_HEADER_ROOM) // (12 * h * w)))


@dataclass
class ServedModel:
    """One servable model.

    Attributes:
        name: Label shown in the variant dropdowns (the variant, or the file name when variants repeat).
        variant: Attention variant.
        task: ``cls`` or ``seg``.
        class_names: Class names, index = logit channel.
        input_size: (H, W) the model was exported / trained at.
        mean, std: Normalisation.
        fixed_size: True when the backend only takes ``input_size`` inputs (exported ONNX); segmentation then
            pads or tiles with windows of that size.
        run: Float32 (N, 3, H, W) -> float32 logits (N, K) or (N, K, H, W).
        source: File it was loaded from.
        backend: The registry's name of the backend that runs it (``ort-cpu``, ``openvino``, ``eager`` ...).
        arch: Architecture name (``micro`` ...), from the metadata.
        backend_note: Why this backend serves it (``auto``'s measurement), for the page.
        input_style: How an upload is converted before preprocessing (:data:`attnzoo.preprocess.INPUT_STYLES`).
        score: The zoo's measured test metric of the model (``score_name``: ``top1`` or ``miou``), or None.
        timm_name: A zoo model's timm name (:mod:`attnzoo.zoo.names`; its card, where one ships), else ``""``.
    """

    name: str
    variant: str
    task: str
    class_names: list[str]
    input_size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    fixed_size: bool
    run: Callable[[np.ndarray], np.ndarray] = field(repr=False)
    source: str = ""
    backend: str = REFERENCE
    arch: str = ""
    backend_note: str = ""
    input_style: str = "rgb"
    score: float | None = None
    score_name: str = ""
    dtype: str = "fp32"
    timm_name: str = ""


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
    return f"an OpenVINO IR is served with --backend {' or '.join(_readers(Path(path).suffix))}, not {backend}"


def _readers(suffix: str, among: Iterable[str] | None = None) -> list[str]:
    """The backends (of ``among``, else the registry) that load a model file ending in ``suffix``."""
    names = [b.name for b in backends()] if among is None else list(among)
    return [name for name in names if suffix in get_backend(name).suffixes]


def choose_cpu_backend(folder: Path, threads: int | None = None, dtype: str | None = None) -> tuple[str, str]:
    """``auto``: the faster CPU runtime of the registry on this machine, timed on the first valid classifier and
    segmenter of ``folder`` (only files of precision ``dtype`` when given, and only servable ones: a quantized
    file must pass :func:`attnzoo.runtime.sessions.verification_problem`); returns ``(backend, one-line reason)``."""
    installed = {
        b.name: (lambda p, b=b: b.load(p, b.options(threads=threads, batch=1)))
        for b in cpu_runtimes()
        if b.unavailable_reason("fp32", "cpu") is None
    }
    if len(installed) < 2:
        only = next(iter(installed), REFERENCE)
        return only, f"{only} (the only CPU runtime installed)"
    probes: dict[str, tuple[Path, tuple[int, int]]] = {}
    for path in sorted(Path(folder).glob("*.onnx")):
        if not path.is_file():  # never open a FIFO or a device; load_onnx_dir warns about them
            continue
        try:
            contract = ModelContract.from_onnx(path)
        except Exception:  # an invalid file is not a probe; load_onnx_dir says why it is skipped
            continue
        if (dtype and contract.dtype != dtype) or verification_problem(path, contract.dtype):
            continue
        probes.setdefault(contract.task, (path, contract.input_size))
    readers = _readers(IR_SUFFIX, installed)
    if not probes and readers and any(p.is_file() for p in Path(folder).glob(f"*{IR_SUFFIX}")):
        return readers[0], f"{readers[0]} (the folder holds OpenVINO IRs and no ONNX file)"
    choice = fastest_cpu_runtime(installed, list(probes.values()), cpu=cpu_info()["model"], dtype=dtype or "")
    return choice.runtime, choice.reason


def _from_config(
    config: dict,
    run: Callable,
    fixed: bool,
    source: Path,
    backend: str,
    input_size: Sequence[int] | None = None,
    input_style: str | None = None,
) -> ServedModel:
    size = input_size or (config["img_size"], config["img_size"])
    names = [str(c) for c in config.get("class_names") or range(int(config["num_classes"]))]
    return ServedModel(
        name=str(config["variant"]),
        variant=str(config["variant"]),
        task=str(config["task"]),
        class_names=names,
        input_size=(int(size[0]), int(size[1])),
        mean=tuple(config.get("mean", DEFAULT_MEAN)),
        std=tuple(config.get("std", DEFAULT_STD)),
        fixed_size=fixed,
        run=run,
        source=str(source),
        backend=backend,
        arch=str(config.get("arch", "")),
        input_style=input_style or input_style_of(config),
    )


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


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _warmed_up(m: ServedModel) -> ServedModel:
    """Run ``m`` once on zeros (the first call allocates, so the first latency shown is a real one) and check
    that it outputs one logit channel per class name; ``ValueError`` naming both counts otherwise."""
    out = m.run(np.zeros((1, 3, *m.input_size), np.float32))
    check_logits(m.class_names, out.shape, m.task, Path(m.source).name)
    return m


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


def zoo_rows(data: str, variants: Sequence[str] | None = None, tasks: Sequence[str] | None = None) -> list[dict]:
    """Manifest rows trained on ``data`` (only ``variants`` / ``tasks`` when given; an unknown variant or a
    selection the zoo lacks is a ``ValueError`` naming what it has)."""
    rows = [e for e in zoo.entries() if e["data"] == data]
    if not rows:
        have = sorted({e["data"] for e in zoo.entries()})
        raise ValueError(
            f"the zoo has no models trained on {quoted(data)} (it has: {', '.join(have) or 'none'}); "
            "serve a folder of exported models with --models DIR"
        )
    names = {e["variant"] for e in rows}  # canonical already: the registry (PyTorch, timm) only for an alias
    wanted = None if variants is None else {v if v in names else registry.canonical_name(v) for v in variants}
    chosen = [e for e in rows if (wanted is None or e["variant"] in wanted) and (tasks is None or e["task"] in tasks)]
    if not chosen:
        have = sorted(f"{e['variant']}/{e['task']}" for e in rows)
        raise ValueError(
            f"the zoo has no {quoted(data)} model of {', '.join(sorted(wanted or ['any variant']))} for task "
            f"{', '.join(tasks or ['any'])}; it has: {', '.join(have)}"
        )
    return chosen


def zoo_onnx_name(variant: str, task: str, data: str = DEFAULT_DATA, dtype: str = "fp32") -> str:
    """File name of a zoo model's ONNX export (``dtype`` int8: its quantized copy) in :func:`export_zoo`'s folder."""
    name = zoo.onnx_name(variant, task, data)
    return name if dtype == "fp32" else name.replace(".onnx", f"_{dtype}.onnx")


def _quantize_zoo(fp32: Path, out: Path, config: dict, data: str) -> None:
    """The verified int8 copy of a zoo export (``export-model --dtype int8 --qdq-placement cpu``'s code: the
    demo and serve-models run it on the CPU; calibrated on the model's training images, scored on its test split,
    refused beyond the tolerance), unless the one at ``out`` is intact and made from this fp32 file so."""
    if out.is_file() and verification_problem(out, "int8") is None:  # its report then reads as a QuantizationReport
        made = QuantizationReport.from_dict(read_report(out.with_suffix(".report.json")))
        if (
            made.fp32_source.get("sha256") == sha256_file(fp32)
            and made.quantization.options.get("placement") == quantize.CPU_QDQ_PLACEMENT
        ):
            return
    calibration = quantize.calibration_images(
        config, quantize.DEFAULT_CALIBRATION_COUNT, quantize.DEFAULT_CALIBRATION_SEED
    )
    quantize.quantize_verified(
        fp32,
        out,
        config,
        dtype="int8",
        calibration=calibration,
        calibration_source=f"{len(calibration)} {data} training images",
        calibration_seed=quantize.DEFAULT_CALIBRATION_SEED,
        progress=True,
        placement=quantize.CPU_QDQ_PLACEMENT,
    )


def load_zoo_torch(data: str = DEFAULT_DATA) -> list[ServedModel]:
    """The zoo's checkpoints trained on ``data``, run by PyTorch."""
    models, rows = [], zoo_rows(data)
    for e in rows:
        model, config = zoo.load(e["variant"], e["task"], data)
        path = zoo.checkpoint_path(e["variant"], e["task"], data)
        session = get_backend(reference_backend()).load(model, LoadOptions())
        models.append(_warmed_up(_from_config(config, session.run, session.fixed_size, path, session.backend)))
    return _with_scores(models, rows)


def zoo_onnx_folder(cache_dir: Path | None = None) -> Path:
    """The folder :func:`export_zoo` writes to: ``<cache>/onnx/<first 12 hex of the manifest's sha256>``."""
    digest = hashlib.sha256(json.dumps(zoo.manifest(), sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir or default_cache_dir()) / "onnx" / digest


def export_zoo(
    data: str = DEFAULT_DATA,
    cache_dir: Path | None = None,
    variants: Sequence[str] | None = None,
    tasks: Sequence[str] | None = None,
    dtype: str = "fp32",
) -> Path:
    """Export the zoo's models trained on ``data`` (only ``variants`` / ``tasks`` when given) to ONNX once;
    return the folder.

    The folder is ``<cache>/onnx/<first 12 hex of the manifest's sha256>``, so a new zoo gets a new folder; a
    file whose ``checkpoint_sha256`` metadata matches its checkpoint and whose extra-math scopes pass
    :func:`attnzoo.export.check_extra_math` is reused. A model the zoo ships as ONNX
    (:func:`attnzoo.zoo.shipped_onnx`) is copied in after the same verification as a fresh export (seconds);
    the others are exported. A tqdm bar shows the work. ``dtype="int8"`` also writes each model's verified int8
    copy (:func:`zoo_onnx_name`); a model whose int8 fails its verification is left out with a warning.
    """
    rows = zoo_rows(data, variants, tasks)
    folder = zoo_onnx_folder(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)

    def fresh(path: Path, sha: str) -> bool:
        """Exported from this checkpoint, and its extra-math scopes are the variant's (older code may have
        declared others)."""
        try:
            return (
                path.is_file()
                and metadata_props(path).get("checkpoint_sha256") == sha
                and export.check_extra_math(path)["ok"]
            )
        except Exception:  # a damaged file is exported again
            return False

    todo = [e for e in rows if not fresh(folder / zoo_onnx_name(e["variant"], e["task"], data), e["sha256"])]
    for e in tqdm(todo, desc=f"exporting zoo models to ONNX ({folder})", unit="model", disable=not todo):
        model, config = zoo.load(e["variant"], e["task"], data)
        out, shipped = folder / zoo_onnx_name(e["variant"], e["task"], data), zoo.shipped_onnx(e)
        # verified the way export-model verifies (a failing model is not left in the folder)
        if shipped is not None:
            export.adopt_verified(model, shipped, out, config, batch_sizes=(1,), checkpoint_sha256=e["sha256"])
        else:
            export.export_verified(model, out, config, batch_sizes=(1,), checkpoint_sha256=e["sha256"])
    if dtype != "fp32":
        for e in rows:
            fp32 = folder / zoo_onnx_name(e["variant"], e["task"], data)
            try:
                _quantize_zoo(
                    fp32,
                    folder / zoo_onnx_name(e["variant"], e["task"], data, dtype),
                    zoo.load(e["variant"], e["task"], data)[1],
                    data,
                )
            except Exception as exc:  # this model is not served in int8; say why, go on
                _warn(f"{e['variant']} {e['task']}: no {dtype} model: {first_line(exc)}")
    return folder


#: Serialises the exports and loads of :class:`_LazyZooRunner` (one torch export at a time).
_LAZY_LOCK = threading.Lock()


class _LazyZooRunner:
    """``run`` of a zoo model that is exported (verified), loaded and warmed up on its first call, or earlier by
    :func:`load_zoo_onnx`'s background export."""

    def __init__(
        self, row: dict, data: str, backend: str, threads: int | None, cache_dir: Path | None, dtype: str = "fp32"
    ):
        self.row, self.data, self.backend, self.threads, self.cache_dir = row, data, backend, threads, cache_dir
        self.dtype = dtype
        self._run: Callable[[np.ndarray], np.ndarray] | None = None

    def ready(self) -> Callable[[np.ndarray], np.ndarray]:
        """The loaded model's ``run`` (exporting and loading it first if needed); ``ValueError`` if it fails."""
        if self._run is None:
            with _LAZY_LOCK:
                if self._run is None:
                    v, t = self.row["variant"], self.row["task"]
                    folder = export_zoo(self.data, self.cache_dir, variants=[v], tasks=[t], dtype=self.dtype)
                    name = zoo_onnx_name(v, t, self.data, self.dtype)
                    loaded = load_onnx_dir(folder, self.backend, self.threads, self.cache_dir, only=[name])
                    if not loaded:
                        raise ValueError(f"the zoo's {v} {t} model could not be loaded (the server's log says why)")
                    self._run = loaded[0].run
        return self._run

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.ready()(x)


def export_zoo_in_child(
    data: str,
    cache_dir: Path | None,
    wanted: Sequence[tuple[str, str]],
    dtype: str = "fp32",
    while_running: Callable[[], None] | None = None,
    *,
    quiet: bool = False,
    nice: int = 19,
) -> int:
    """Export (verified, as :func:`export_zoo` does) the zoo models ``wanted`` (``(variant, task)`` pairs) in a
    child process at a lower CPU priority (``nice`` added to this one's; 19, the lowest, by default): its own
    interpreter, so a torch export never holds the caller's GIL while a request waits, or while Ray starts. Waits
    for it (calling ``while_running`` every 2 s meanwhile, e.g. to publish the models written so far) and returns
    its exit code; the child is ended when this process exits (a file is written whole or not at all). A failure
    is one ``error:`` line on the child's stderr; ``quiet``: nothing of the child is shown (its progress bars),
    and a failure raises ``ValueError`` with that line instead."""
    # the child lowers its own priority first: preexec_fn is not safe in a process with threads (Ray's, the
    # demo's server)
    code = (
        "import os, signal, sys, json\n"
        # Ctrl-C in the terminal reaches this child too: it ends quietly (exit 130), the parent says what happened
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(130))\n"
        f"if hasattr(os, 'nice'): os.nice({int(nice)})\n"
        "from pathlib import Path; from attnzoo.errors import first_line\n"
        "from attnzoo.serve.loading import export_zoo\n"
        "data, cache, wanted, dtype = json.loads(sys.argv[1])\n"
        "try:\n"
        "    for v, t in wanted:\n"
        "        export_zoo(data, Path(cache) if cache else None, variants=[v], tasks=[t], dtype=dtype)\n"
        "except Exception as exc:\n"
        "    sys.exit(f'error: {first_line(exc)}')\n"
    )
    args = json.dumps([data, str(cache_dir) if cache_dir else None, [list(w) for w in wanted], dtype])
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(tempfile.TemporaryFile("w+")) if quiet else None
        quiet_kw: dict[str, Any] = {"stderr": err} if quiet else {}  # a test's Popen passes its own stderr
        child = subprocess.Popen([sys.executable, "-c", code, args], stdout=subprocess.DEVNULL, **quiet_kw)
        atexit.register(child.terminate)
        while True:
            try:
                status = child.wait(timeout=None if while_running is None else 2.0)
                break
            except subprocess.TimeoutExpired:  # only with a timeout, i.e. a while_running
                assert while_running is not None
                while_running()
        if err is not None and status != 0:
            err.seek(0)
            lines = [ln.strip() for ln in err.read().splitlines() if ln.strip().startswith("error: ")]
            raise ValueError(lines[-1].removeprefix("error: ") if lines else f"the export exited with status {status}")
    return status


def _prefetch(runners: Sequence[_LazyZooRunner], data: str, cache_dir: Path | None) -> None:
    """Export every lazy model in a child process (:func:`export_zoo_in_child`), then load them here; a daemon
    thread's work. A failure is logged, not raised: the model's first call retries and reports it."""
    wanted = [(r.row["variant"], r.row["task"]) for r in runners]
    code = export_zoo_in_child(data, cache_dir, wanted, runners[0].dtype if runners else "fp32")
    if code != 0:
        _warn(
            f"exporting the other zoo models in the background failed (exit code {code}); each is "
            "exported on its first use instead"
        )
    for runner in runners:
        try:
            runner.ready()
        except Exception as exc:  # logged; the demo stays up for the other models
            _warn(f"preparing {runner.row['variant']} {runner.row['task']} failed: {first_line(exc)}")


def _with_scores(models: list[ServedModel], rows: Sequence[dict]) -> list[ServedModel]:
    """Give each zoo model its manifest test metric and its timm name."""
    by_key = {(e["variant"], e["task"]): e for e in rows}
    for m in models:
        row = by_key.get((m.variant, m.task), {})
        m.score, m.score_name = row.get("test_metric"), row.get("metric_name", "")
        m.timm_name = entry_name(row) if row else ""
    return models


def load_zoo_onnx(
    data: str = DEFAULT_DATA,
    backend: str = AUTO,
    threads: int | None = None,
    cache_dir: Path | None = None,
    prefetch: bool = True,
    dtype: str = "fp32",
) -> list[ServedModel]:
    """The zoo's models trained on ``data`` on an ONNX backend, ready to answer within seconds on a fresh
    install: the best classifier and segmenter (:func:`attnzoo.zoo.best_entries`, shipped as ONNX) are verified,
    loaded and warmed up now; every other model is listed at once and exported, verified and loaded on its first
    call, or before that by a low-priority child process (``prefetch``). Each model carries its zoo test
    metric. ``dtype="int8"``: the same with each model's verified int8 copy (:func:`export_zoo`)."""
    rows = zoo_rows(data)
    best = zoo.best_entries(data)
    for task, e in best.items():  # one folder per zoo: every call returns the same one
        folder = export_zoo(data, cache_dir, variants=[e["variant"]], tasks=[task], dtype=dtype)
    note = ""
    if backend == AUTO:
        backend, note = choose_cpu_backend(folder, threads, dtype)
    names = [zoo_onnx_name(e["variant"], e["task"], data, dtype) for e in best.values()]
    models = load_onnx_dir(folder, backend, threads, cache_dir, only=names)
    lazy = []
    first = {(e["variant"], e["task"]) for e in best.values()}
    for e in rows:
        if (e["variant"], e["task"]) in first:
            continue
        runner = _LazyZooRunner(e, data, backend, threads, cache_dir, dtype)
        config = checkpoint.read_config(zoo.checkpoint_path(e["variant"], e["task"], data))
        models.append(
            _from_config(config, runner, True, folder / zoo_onnx_name(e["variant"], e["task"], data, dtype), backend)
        )
        models[-1].dtype = dtype
        lazy.append(runner)
    for m in _with_scores(models, rows):
        m.backend_note = note
    if prefetch and lazy:
        threading.Thread(target=_prefetch, args=(lazy, data, cache_dir), name="attnzoo-prefetch", daemon=True).start()
    return models


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


# --------------------------------------------------------------------------- a serve-models deployment
class RemoteError(RuntimeError):
    """A ``serve-models`` deployment answered with an error or could not be reached."""


def _remote_runner(client, url: str, task: str, name: str, most: int = MAX_TENSOR_BATCH) -> Callable:
    """``run(x) -> logits`` that posts the float32 batch as ``.npy`` to ``<url>/models/<task>/<name>/logits``, in
    requests of at most ``most`` images (:func:`tensor_batch_limit`)."""

    def run(x: np.ndarray) -> np.ndarray:
        if len(x) > most:
            return np.concatenate([run(x[i : i + most]) for i in range(0, len(x), most)])
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(x, np.float32), allow_pickle=False)
        try:
            r = client.post(
                f"{url}/models/{task}/{name}/logits",
                content=buf.getvalue(),
                headers={"Content-Type": "application/x-npy"},
            )
        except Exception as exc:  # httpx transport errors: one line naming the server
            raise RemoteError(f"the model server {url} did not answer: {type(exc).__name__}: {exc}") from None
        if r.status_code != 200:
            try:
                message = r.json().get("error", r.text)
            except ValueError:
                message = r.text[:200]
            raise RemoteError(f"the model server answered {r.status_code}: {message}")
        return np.load(io.BytesIO(r.content), allow_pickle=False)

    return run


def load_remote(url: str, timeout: float = 60.0) -> list[ServedModel]:
    """The models of a running ``serve-models`` deployment at ``url``, each run on the server.

    ``GET <url>/models`` lists them with their contract (task, class names, input size, mean/std); each
    :class:`ServedModel`'s ``run`` posts a preprocessed float32 batch to the server's tensor route, where it
    joins the deployment's dynamic batches. Preprocessing, sliding windows and the pictures stay in
    :mod:`attnzoo.serve.predict`, exactly as with a local backend.

    Raises:
        ValueError: the server cannot be reached, is not a serve-models deployment, or serves no model.
    """
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--backend-url must start with http:// or https://, got {quoted(url)}")
    client = httpx.Client(timeout=timeout)
    try:
        listed = client.get(f"{url}/models")
        listed.raise_for_status()
        rows = listed.json()["models"]
    except Exception as exc:  # connection refused, HTTP errors, not JSON: one line
        client.close()
        raise ValueError(
            f"cannot list the models of {url} ({type(exc).__name__}: {exc}); is serve-models running there?"
        ) from None
    models = [
        ServedModel(
            name=r["name"],
            variant=r["variant"],
            task=r["task"],
            class_names=list(r["class_names"]),
            input_size=(int(r["input_size"][0]), int(r["input_size"][1])),
            mean=tuple(r["mean"]),
            std=tuple(r["std"]),
            fixed_size=bool(r["fixed_size"]),
            run=_remote_runner(client, url, r["task"], r["name"], tensor_batch_limit(r["input_size"])),
            source=f"{url}/models/{r['task']}/{r['name']}",
            backend=f"serve-models at {url}",
            arch=r.get("arch", ""),
            input_style=input_style_of(r),
        )
        for r in rows
    ]
    if not models:
        raise ValueError(f"the model server {url} serves no models")
    return models
