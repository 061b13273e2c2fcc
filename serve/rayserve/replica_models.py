"""The models one serve-models replica serves: the files the driver verified, loaded at start with the demo's
loader (:func:`attnzoo.serve.loading.load_models`) after their sha256 is checked, and the zoo models the driver is
still exporting, loaded on first use once it lists them ready; what it could not load, with the reason."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attnzoo.errors import first_line
from attnzoo.fileio import sha256_file
from attnzoo.serve.folders import recording_skips
from attnzoo.serve.loading import load_models
from attnzoo.serve.served import ServedModel

__all__ = ["ReplicaModels"]


class ReplicaModels:
    """The replica's models by ``(task, name)``, in the order they are listed.

    Args:
        folder: Folder of the ONNX files (the same path on every node of a cluster).
        files: ``{file name: sha256}`` to load; a file with another hash stops the replica (``RuntimeError``).
        settings: ``backend``, ``threads``, ``cache_dir``, ``dtype``; ``pending`` (``[{"task", "name", "file"}]``)
            and ``ready_file``: zoo models the driver is still exporting, loaded on first use once ``ready_file``
            lists them.
    """

    def __init__(self, folder: str | Path, files: Mapping[str, str], settings: Mapping[str, Any]) -> None:
        for name, digest in files.items():
            if sha256_file(Path(folder) / name) != digest:
                raise RuntimeError(f"{Path(folder) / name} is not the file the driver verified (sha256 differs)")
        self.settings = dict(settings)
        self.folder = Path(folder)
        #: Files this replica could not load: file name -> the reason (the driver prints them).
        self.skipped: dict[str, str] = {}
        models = self.load(sorted(files))
        self.models = {(m.task, m.name): m for m in models}
        self.order = [(m.task, m.name) for m in models]
        #: Zoo models still being exported by the driver: (task, name) -> file; loaded on first use once the
        #: driver lists them in ``ready_file`` (``{file: sha256}``, written whole) with the sha256 to check.
        self.pending = {(p["task"], p["name"]): p["file"] for p in settings.get("pending", ())}
        self.ready_file = settings.get("ready_file")
        self.failed: set = set()  # pending models whose file did not load (the reason is in ``skipped``)
        self._load_lock = threading.Lock()

    def names(self, task: str) -> list[str]:
        """The names of ``task``'s models, loaded and pending, the first the default."""
        return [n for t, n in [*self.order, *self.pending] if t == task]

    def load(self, files: Sequence[str]) -> list[ServedModel]:
        """The models of ``files`` (the loader's sessions, warm-up and names); a file the loader skips is left out
        with its reason in :attr:`skipped` (the replica's stderr goes to Ray's log, not to the user: the driver
        prints these)."""
        cache = self.settings.get("cache_dir")
        with recording_skips() as skipped:
            try:
                models = load_models(
                    self.folder,
                    self.settings["backend"],
                    threads=self.settings["threads"],
                    cache_dir=Path(cache) if cache else None,
                    only=list(files),
                    dtype=self.settings.get("dtype"),
                )
            except Exception as exc:  # nothing servable (the loader's ValueError) or a loader fault
                models, reason = [], first_line(exc)
            else:
                reason = "the loader served nothing from it"
        loaded = {Path(m.source).name for m in models}
        self.skipped.update({f: skipped.get(f, reason) for f in files if f not in loaded})
        return models

    def load_pending(self, task: str, name: str) -> bool:
        """Load a pending zoo model if the driver has listed it as ready (its sha256 checked first)."""
        with self._load_lock:
            if (task, name) in self.models:
                return True
            try:
                ready = json.loads(Path(self.ready_file).read_text()) if self.ready_file else {}
            except (OSError, ValueError):
                ready = {}
            file = self.pending[(task, name)]
            if file not in ready:
                return False
            if sha256_file(self.folder / file) != ready[file]:
                raise RuntimeError(f"{self.folder / file} is not the file the driver verified (sha256 differs)")
            for m in self.load([file]):
                self.models[(m.task, m.name)] = m
                self.order.append((m.task, m.name))
            del self.pending[(task, name)]
            if (task, name) not in self.models:
                self.failed.add((task, name))
            return True
