"""AOTInductor: a model compiled ahead of time into one ``.pt2`` package (``torch.export`` with a dynamic batch
dimension, then ``torch._inductor.aoti_compile_and_package``), run without the model's Python code.

The package holds the compiled kernels (C++ on the CPU, Triton on a CUDA GPU), the wrapper that calls them and the
weights; ``torch._inductor.aoti_load_package`` (or C++'s ``AOTIModelPackageLoader``) runs it. One package serves
every batch size from 1 to :data:`attnzoo.limits.MAX_BATCH_SIZE`; it is traced at batch :data:`TRACE_BATCH`.

Where it compiles for: the CPU at fp32, a CUDA GPU at fp32 (IEEE, TF32 off when run) or fp16 (the whole model in
fp16, as eager fp16 and ``torch.compile`` fp16 run it). :func:`aoti_problem` says why a device and precision
cannot be compiled here. ``export-model --format aoti`` (:mod:`attnzoo.targets.aoti.format`) verifies a
package before writing it; the ``aoti`` backend (:mod:`attnzoo.targets.aoti.backend`) loads one, or compiles one
from the module into its cache (:func:`cached_package`, keyed by :func:`attnzoo.runtime.torch_export.fingerprint`).

A package holds native code that loading it runs, so a cached one is loaded only when its SHA-256 is the one
recorded when it was compiled, in a cache folder that is the user's alone (:func:`attnzoo.fileio.cache_subdir`);
anything else at its name is compiled again, never opened. :func:`load_package` first checks that the file is a
package (:func:`package_problem`) and names it when it is not.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import shutil
import time
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from attnzoo.fileio import atomic_path
from attnzoo.lazy import lazy_import
from attnzoo.limits import MAX_BATCH_SIZE
from attnzoo.runtime.contract import BATCH_DIM
from attnzoo.runtime.torch_export import TRACE_BATCH, BuildCache, model_input

torch = lazy_import("torch")  # the registry (and --help) load without torch
inductor = lazy_import("torch._inductor")
wafe = lazy_import("attnzoo.models.wafe")

__all__ = [
    "AOTI_DTYPES",
    "TRACE_BATCH",
    "aoti_problem",
    "export_program",
    "temporary_package",
    "compile_package",
    "package_problem",
    "load_package",
    "cached_package",
    "MAE_IMPL",
    "CODE_MODULES",
]

#: Precisions a package is compiled at, per device: fp32 on the CPU; fp32 and fp16 on a CUDA GPU.
AOTI_DTYPES: dict[str, tuple[str, ...]] = {"cpu": ("fp32",), "cuda": ("fp32", "fp16")}
#: How a package computes the MAE variants' L1 core (``attnzoo.models.wafe.export_mae_impl``): ``tiled``, ordinary
#: ops that Inductor compiles into the package as one loop per query tile. The fused op ``attnzoo::l1_attention``
#: is a Python custom op: a package calling it loads only in a Python process that imported attnzoo (C++'s
#: loader refuses it: "Custom operators created via torch.library.custom_op cannot be run via AOTI without Python
#: environment").
MAE_IMPL = "tiled"
#: Modules whose code a package holds besides the model's classes (the tiled L1 core): part of the cache key.
CODE_MODULES = ("attnzoo.models.kernels.l1_core",)
#: Where the backend keeps the packages it compiles from the module: ``<cache_dir>/aoti/``
#: ``<variant>_<device>_<dtype>_<key>.pt2`` (:func:`cached_package`).
CACHE = BuildCache("aoti", ".pt2", "package")
_TORCH_DTYPES = {"fp32": "float32", "fp16": "float16"}


def aoti_problem(device: str, dtype: str) -> str | None:
    """Why a package for ``device`` at ``dtype`` cannot be compiled and run here (one line), or ``None``."""
    kind = str(device).split(":")[0]
    if kind not in AOTI_DTYPES:
        return f"AOTInductor compiles for cpu or cuda, not {device}"
    if dtype not in AOTI_DTYPES[kind]:
        return f"AOTInductor packages for {kind} are compiled at {', '.join(AOTI_DTYPES[kind])}, not {dtype}"
    if not (shutil.which("g++") or shutil.which("c++")):
        return "AOTInductor needs a C++ compiler (g++) for its wrapper, none found"
    if kind == "cuda":
        if not torch.cuda.is_available():
            return "no CUDA GPU visible"
        if importlib.util.find_spec("triton") is None:
            return "AOTInductor on CUDA needs triton, not installed"
    return None


def _torch_dtype(dtype: str):
    return getattr(torch, _TORCH_DTYPES[dtype])


def export_program(
    model: Any, hw: tuple[int, int], *, device: str = "cpu", dtype: str = "fp32", mae_impl: str = MAE_IMPL
) -> Any:
    """``torch.export`` of a copy of ``model`` at ``dtype`` on ``device``, traced at batch :data:`TRACE_BATCH` with
    the batch dimension dynamic (1 .. :data:`~attnzoo.limits.MAX_BATCH_SIZE`): the ``ExportedProgram`` whose graph
    keeps each node's ``nn_module_stack`` (where the extra math is counted). The MAE variants' L1 core runs as
    ``mae_impl`` (default :data:`MAE_IMPL`)."""
    net = copy.deepcopy(model).to(device=device, dtype=_torch_dtype(dtype)).eval()
    x = torch.zeros(TRACE_BATCH, 3, *hw, device=device, dtype=_torch_dtype(dtype))
    batch = torch.export.Dim(BATCH_DIM, min=1, max=MAX_BATCH_SIZE)
    with torch.no_grad(), wafe.export_mae_impl(mae_impl):
        return torch.export.export(net, (x,), dynamic_shapes=({0: batch},), strict=False)


@contextlib.contextmanager
def temporary_package(out: Path) -> Iterator[Path]:
    """A temporary ``.pt2`` name in ``out``'s folder (AOTInductor insists on the suffix): compile and check the
    package there; leaving the block normally makes it ``out`` (:func:`attnzoo.fileio.atomic_path`), an exception
    (a failed check, Ctrl-C) removes it."""
    with atomic_path(out) as tmp:
        package = tmp.with_name(tmp.name + ".pt2")
        try:
            yield package
            os.replace(package, tmp)
        finally:
            package.unlink(missing_ok=True)


def compile_package(program: Any, path: Path, metadata: Mapping[str, str] | None = None) -> float:
    """Compile ``program`` with AOTInductor into the package ``path`` (a ``.pt2`` name, e.g. from
    :func:`temporary_package`), with ``metadata`` (strings, read back by the package loader's ``get_metadata()``);
    returns the seconds it took."""
    start = time.perf_counter()
    configs = {"aot_inductor.metadata": dict(metadata)} if metadata else None
    inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)
    return time.perf_counter() - start


def package_problem(path: str | Path) -> str | None:
    """Why the file ``path`` is not an AOTInductor package (one line), or ``None``: a package is a zip archive
    (every member's CRC intact: a truncated or damaged one is not) with one top folder holding ``archive_format``
    ``pt2`` and the compiled model under ``data/aotinductor/``, no member's name leaving that folder."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            roots = {name.split("/")[0] for name in names}
            if len(roots) != 1:
                return f"a zip archive with {len(roots)} top folders, not a package's one"
            root = roots.pop()
            if any(name.startswith("/") or ".." in name.split("/") for name in names):
                return "a zip archive whose member names leave its folder"
            if f"{root}/archive_format" not in names or archive.read(f"{root}/archive_format") != b"pt2":
                return "a zip archive that does not say it is a pt2 package (archive_format)"
            if not any(name.startswith(f"{root}/data/aotinductor/") for name in names):
                return "a pt2 archive with no AOTInductor model (data/aotinductor/)"
            damaged = archive.testzip()
            if damaged is not None:
                return f"a damaged archive (member {damaged} fails its CRC)"
    except (OSError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        return f"not a zip archive, or a truncated one ({exc})"
    return None


def load_package(path: str | Path) -> Any:
    """The callable model of the package at ``path`` (tensors on the package's device in, its outputs out).

    Raises:
        ValueError: one line naming ``path`` when it is not a package (:func:`package_problem`), before
            AOTInductor opens it.
    """
    problem = package_problem(path)
    if problem is not None:
        raise ValueError(f"{path} is not an AOTInductor package: {problem}")
    return inductor.aoti_load_package(str(path))


def cached_package(
    model: Any, cache_dir: str | Path, *, device: str = "cpu", dtype: str = "fp32", hw: tuple[int, int] | None = None
) -> tuple[Path, dict[str, Any]]:
    """The package of ``model`` for ``device`` at ``dtype`` in ``<cache_dir>/aoti/`` (:data:`CACHE`), compiled when
    none of the same fingerprint (weights, source, config, device, precision, input size, torch version) is there. A
    package there is used only when it is the file compiled and recorded there
    (:meth:`attnzoo.runtime.torch_export.BuildCache.get`, which raises ``ValueError`` for a cache folder that is not
    the user's alone); one edited, planted or left without its record is compiled again, never opened.

    Returns:
        ``(path, facts)``: ``facts`` says whether it was ``cached``, and the export and compile seconds.
    """
    config, hw = model_input(model, hw)
    kind = str(device).split(":")[0]
    head = {"config": config, "device": kind, "dtype": dtype, "hw": list(hw), "torch": torch.__version__}
    if kind == "cuda":
        head["gpu"] = torch.cuda.get_device_name(torch.device(device))

    def compile_into(path: Path) -> dict[str, float]:
        start = time.perf_counter()
        program = export_program(model, (hw[0], hw[1]), device=device, dtype=dtype)
        exported = time.perf_counter() - start
        with temporary_package(path) as tmp:
            compiled = compile_package(program, tmp)
        return {"export_s": round(exported, 2), "compile_s": round(compiled, 2)}

    facts = {"device": kind, "dtype": dtype, "trace_batch": TRACE_BATCH}
    return CACHE.get(model, head, cache_dir, (kind, dtype), facts, compile_into, modules=(__name__, *CODE_MODULES))
