"""What every file exported from the PyTorch module shares, below the targets that write one: the fingerprint a
derived file is keyed by (the ONNX export's reuse, the AOTInductor and ExecuTorch caches), and, for the
``torch.export`` programs of AOTInductor and ExecuTorch, the batch they are traced at, how they name a module, the
input a model is exported for and the cache their backends keep what they compile from the module in
(:class:`BuildCache`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnzoo.fileio import cache_subdir, derived_is_current, record_derived
from attnzoo.lazy import lazy_import

torch = lazy_import("torch")  # the backend registry (and --help) load without torch

__all__ = ["TRACE_BATCH", "module_path", "fingerprint", "model_input", "BuildCache"]

#: The batch size ``torch.export`` traces with (every other size is one the program was not traced with).
TRACE_BATCH = 2


def module_path(path: str) -> str:
    """A ``torch.export`` ``nn_module_stack`` path as a dotted module name (``L['self'].blocks[0].attn`` ->
    ``blocks.0.attn``): how the exported programs name the module a node comes from."""
    path = re.sub(r"^L\['self'\]\.?|^L__self__\.?", "", path)
    return re.sub(r"\[(\d+)\]", r".\1", path)


def fingerprint(model: Any, head: Mapping[str, Any], modules: Iterable[str] = ()) -> str:
    """sha256 of what a model compiled from ``model`` depends on: ``head`` (its config and the compile's
    arguments, as JSON), the source files of its modules' classes and of the modules named in ``modules``, and its
    weights and buffers (names, dtypes, shapes, values)."""
    h = hashlib.sha256()
    h.update(json.dumps(dict(head), sort_keys=True, default=str).encode())
    for name in modules:  # hashed by their source: imported first, so a module not loaded yet is not hashed by name
        importlib.import_module(name)
    names = {type(m).__module__ for m in model.modules()} | set(modules)
    for path in sorted({str(getattr(sys.modules.get(name), "__file__", None) or name) for name in names}):
        h.update(path.encode() + (Path(path).read_bytes() if path and Path(path).is_file() else b""))
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def model_input(model: Any, hw: tuple[int, int] | None = None) -> tuple[dict[str, Any], tuple[int, int]]:
    """The config ``model`` carries (``attnzoo_config``; empty for another module) and the input height and width it
    is exported for: ``hw``, else the config's square ``img_size`` (224 when it has none)."""
    config = dict(getattr(model, "attnzoo_config", None) or {})
    if hw is None:
        side = int(config.get("img_size", 224))
        hw = (side, side)
    return config, hw


@dataclass(frozen=True)
class BuildCache:
    """Where a backend keeps what it compiles from the PyTorch module: ``<cache_dir>/<folder>/``, one file per
    model, settings and :func:`fingerprint`, ``<variant>_<settings>_<key><suffix>`` with its record ``.json``
    beside it; ``label``: what its facts call the file (``package``, ``program``)."""

    folder: str
    suffix: str
    label: str

    def get(
        self,
        model: Any,
        head: dict[str, Any],
        cache_dir: str | Path,
        settings: Sequence[str],
        facts: Mapping[str, Any],
        build: Callable[[Path], Mapping[str, Any]],
        modules: Iterable[str] = (),
    ) -> tuple[Path, dict[str, Any]]:
        """The file of ``model`` (``head``: what it is compiled from and with, its ``config`` the model's; keyed by
        their :func:`fingerprint` with ``modules``): the file there when it is the one recorded when it was made
        (its SHA-256 in the record, :func:`attnzoo.fileio.derived_is_current`); else made anew by ``build(path)``,
        which returns how long its stages took, and recorded with its facts.

        Raises:
            ValueError: the cache folder is not the user's alone (:func:`attnzoo.fileio.private_dir`).

        Returns:
            ``(path, facts)``: the file's name (under :attr:`label`), ``facts``, whether it was ``cached`` and, when
            made now, what ``build`` returned.
        """
        key = fingerprint(model, head, modules=modules)
        folder = cache_subdir(cache_dir, self.folder)
        stem = "_".join([str(head["config"].get("variant", type(model).__name__)), *settings, key[:16]])
        path, record = folder / f"{stem}{self.suffix}", folder / f"{stem}.json"
        made = {self.label: path.name, **facts}
        if derived_is_current(record, key, [path], head):  # not when absent, unrecorded or not the file made
            return path, {**made, "cached": True}
        made.update(cached=False, **build(path))
        record_derived(record, key, [path], head, facts={k: v for k, v in made.items() if k != "cached"})
        return path, made
