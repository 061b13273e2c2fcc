"""Which verified ONNX files to serve.

Model sources (the same ones as the demo):

- the zoo (default): :func:`attnzoo.export.zoo_cache.export_zoo` exports the chosen models once, verified, into
  the cache;
- ``--models DIR``: ``export-model`` outputs (verified when they were written);
- ``--arch tiny|small|base|...``: freshly initialised models exported the way ``export-model --random-init``
  does, verified, cached under ``<cache>/serve-models/``.

Each replica loads exactly the files named here and checks their sha256 first.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from attnzoo import zoo
from attnzoo.export.zoo_cache import export_zoo_in_child, zoo_onnx_folder, zoo_onnx_name, zoo_rows
from attnzoo.fileio import atomic_write_text, default_cache_dir, sha256_file
from attnzoo.lazy import lazy_import
from attnzoo.runtime.contract import ModelContract
from attnzoo.runtime.sessions import serves, verification_problem
from attnzoo.serve.folders import model_files, models_folder, unread_reason
from attnzoo.serve.rayserve.config import ServeConfig

# imported on first use: the driver selects and checks files without timm and the exporter (only --arch needs them)
registry = lazy_import("attnzoo.models")
export = lazy_import("attnzoo.export")

__all__ = ["Selection", "select_models", "check_zoo_selection", "export_pending", "random_init_models"]


@dataclass
class Selection:
    """The files a deployment serves: ``{file name: sha256}`` in ``folder``. ``pending``: zoo models
    (``{"task", "name", "file"}``) that :func:`export_pending` exports and verifies while the server already
    answers; a replica loads each on its first request once ``ready_file`` lists it."""

    folder: Path
    files: dict[str, str]
    pending: list[dict[str, str]] = field(default_factory=list)
    data: str = ""
    dtype: str = "fp32"
    ready_file: Path | None = None


def _matching(
    folder: Path,
    names: Sequence[str],
    variants: Sequence[str] | None,
    tasks: Sequence[str] | None,
    dtype: str = "fp32",
    backend: str | None = None,
) -> Selection:
    """The attnzoo exports among ``names`` whose variant, task and precision are wanted and that ``backend``
    reads (None: ONNX files, which every backend of ``serve-models`` reads); files that are not attnzoo models,
    IRs of another runtime and files whose verification does not hold are left out with a warning (the replicas'
    loader would skip them anyway)."""
    wanted = None if variants is None else {registry.canonical_name(v) for v in variants}
    files, seen = {}, []
    for name in names:
        path = folder / name
        try:
            problem = unread_reason(path, backend) if backend else None
            if problem:
                raise ValueError(problem)
            contract = ModelContract.from_onnx(path)
        except Exception as exc:  # not an attnzoo export, damaged: say so, serve the rest
            print(
                f"warning: skipping {name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                file=sys.stderr,
            )
            continue
        seen.append(f"{contract.variant}/{contract.task}" + ("" if contract.dtype == "fp32" else f"/{contract.dtype}"))
        if not serves(dtype, contract.dtype):
            continue  # fp32 serves the unquantized exports (fp32 and fp16), int8 only int8 files, bf16 fp32 ones
        problem = verification_problem(path, contract.dtype)
        if problem:
            print(f"warning: skipping {name}: not served: {problem}", file=sys.stderr)
            continue
        if (wanted is None or contract.variant in wanted) and (tasks is None or contract.task in tasks):
            files[name] = sha256_file(path)
    if not files:
        raise ValueError(
            f"no {dtype} model in {folder} matches variants {', '.join(sorted(wanted or ['any']))} "
            f"and task {', '.join(tasks or ['any'])}"
            f"{' with an intact verification report' if dtype != 'fp32' else ''}; it has: "
            f"{', '.join(sorted(seen)) or 'no attnzoo models'}"
        )
    return Selection(folder, files)  # in the order given: each task's first model is its default


def random_init_models(arch: str, variants: Sequence[str], tasks: Sequence[str], cache_dir: Path) -> Selection:
    """Freshly initialised ``arch`` models, exported and verified as ``export-model --random-init`` does, once:
    a file whose report says it passed and whose sha256 matches the report is reused."""
    folder = Path(cache_dir) / "serve-models" / arch
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(v, t) for v in variants for t in tasks]
    names = []
    for variant, task in tqdm(
        jobs, desc=f"random-init {arch} models (export + verify once)", unit="model", disable=len(jobs) < 2
    ):
        model, config, _ = export.load_for_export(variant, task, arch, random_init=True)
        path = folder / f"{config['variant']}_{task}_{arch}.onnx"
        names.append(path.name)
        if path.is_file() and verification_problem(path, "fp32") is None:  # its report passed, for this file
            continue
        export.export_verified(model, path, config, batch_sizes=(1, 8))
    return _matching(folder, names, None, None)


def select_models(cfg: ServeConfig) -> Selection:
    """The verified files ``cfg`` asks for (zoo, ``models`` folder, or ``arch`` random-init).

    Raises:
        ValueError: an unknown variant, a folder without matching attnzoo models, a zoo without the models.
    """
    cache = Path(cfg.cache_dir or default_cache_dir())
    variants = [registry.canonical_name(v) for v in cfg.variants] if cfg.variants else None
    if cfg.models is not None:
        folder = models_folder(Path(cfg.models))
        names = [p.name for p in model_files(folder)]
        return _matching(folder, names, variants, cfg.tasks, cfg.dtype, cfg.backend)
    if cfg.arch is not None:
        print(
            f"warning: --arch {cfg.arch}: serving UNTRAINED models with random weights; their predictions are "
            "meaningless (use them to measure serving, not accuracy)",
            file=sys.stderr,
        )
        return random_init_models(cfg.arch, variants or ["standard"], cfg.tasks or ["cls"], cache)
    return _zoo_first(cfg.data, cache, variants, cfg.tasks, cfg.dtype)


def check_zoo_selection(cfg: ServeConfig) -> None:
    """``ValueError`` naming what the zoo has when it lacks the data set, variants or task ``cfg`` asks for."""
    zoo_rows(cfg.data, [registry.canonical_name(v) for v in cfg.variants] if cfg.variants else None, cfg.tasks)


def _zoo_first(
    data: str, cache: Path, variants: Sequence[str] | None, tasks: Sequence[str] | None, dtype: str = "fp32"
) -> Selection:
    """The zoo models to serve at once: per task, the best wanted model the zoo ships as ONNX (verified and
    copied in seconds), else the first wanted one (exported now); the other wanted models are ``pending``.
    ``dtype="int8"``: each model's verified int8 copy (:func:`attnzoo.export.zoo_cache.export_zoo`: calibrated on
    its training images, scored on its test split next to fp32), made from the fp32 export."""
    rows = zoo_rows(data, variants, tasks)  # ValueError naming what the zoo has
    first = []
    for task in dict.fromkeys(e["task"] for e in rows):
        mine = [e for e in rows if e["task"] == task]
        shipped = sorted(
            (e for e in mine if zoo.shipped_onnx(e) is not None), key=lambda e: -(e.get("test_metric") or 0)
        )
        first.append((shipped or mine)[0])
    graph = _graph_dtype(dtype)
    # verified in a child process at a lower priority (nice 10): its PyTorch (the parity with each checkpoint)
    # never holds this process's GIL, and it mostly takes the CPU that Ray's and Serve's start leave idle; at the
    # lowest priority it ended after them, and the deploy waited for it (python -m attnzoo.serve.rayserve.coldstart)
    export_zoo_in_child(data, cache, [(e["variant"], e["task"]) for e in first], graph, quiet=True, nice=10)
    folder = zoo_onnx_folder(cache)
    names = [zoo_onnx_name(e["variant"], e["task"], data, graph) for e in first]
    selection = _matching(folder, [n for n in names if (folder / n).is_file()], None, None, dtype)
    selection.pending = [
        {"task": e["task"], "name": e["variant"], "file": zoo_onnx_name(e["variant"], e["task"], data, graph)}
        for e in rows
        if e not in first
    ]
    selection.data, selection.dtype = data, dtype
    return selection


def _graph_dtype(dtype: str) -> str:
    """The precision of the files ``--dtype`` serves: bf16 runs the fp32 exports (each replica verifies them at
    bf16 on their test split before serving, :func:`attnzoo.serve.bf16.load_bf16_models`)."""
    return "fp32" if dtype == "bf16" else dtype


def export_pending(selection: Selection, cache_dir: Path | None) -> int:
    """Export the zoo models ``selection`` left pending (verified, as ``export-model`` does: a model that fails
    is not written; one that passes is renamed into place whole) in a child process at the lowest CPU priority,
    so the server keeps answering. Every 2 s, and at the end, every file that is there is listed in
    ``selection.ready_file`` with its sha256, so each model is served as soon as it is written. Returns how many
    are ready. A signal to this process ends the child too (:func:`stop` ends every process this one started)."""
    ready = dict(selection.files)

    def written(path: Path) -> bool:  # an int8 copy is ready once its verification report is beside it
        return path.is_file() and verification_problem(path, _graph_dtype(selection.dtype)) is None

    def publish() -> None:
        new = {
            p["file"]: sha256_file(selection.folder / p["file"])
            for p in selection.pending
            if p["file"] not in ready and written(selection.folder / p["file"])
        }
        if new:
            ready.update(new)
            if selection.ready_file is not None:
                atomic_write_text(selection.ready_file, json.dumps(ready))

    code = export_zoo_in_child(
        selection.data,
        Path(cache_dir or default_cache_dir()),
        [(p["name"], p["task"]) for p in selection.pending],
        _graph_dtype(selection.dtype),
        while_running=publish,
    )
    publish()
    if code != 0:
        print(
            f"warning: exporting the other zoo models failed (exit code {code}); those not written answer 503",
            file=sys.stderr,
        )
    return len(ready)
