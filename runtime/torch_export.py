"""What every file exported from the PyTorch module shares, below the targets that write one: the fingerprint a
derived file is keyed by (the ONNX export's reuse, the AOTInductor and ExecuTorch caches), and, for the
``torch.export`` programs of AOTInductor and ExecuTorch, the batch they are traced at and how they name a module.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from attnzoo.lazy import lazy_import

torch = lazy_import("torch")  # the backend registry (and --help) load without torch

__all__ = ["TRACE_BATCH", "module_path", "fingerprint"]

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
