"""``serve-models`` settings: one dataclass, filled from its defaults, then a YAML/JSON config file, then flags.

A config file holds the same keys as the long flags (``-`` or ``_``), e.g.::

    replicas: 2
    cpus_per_replica: 1
    max_batch_size: 8
    batch_wait_ms: 2
    models: exported/          # or data: fashion / arch: tiny, with variants: [standard, belief2]
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from attnzoo.errors import quoted
from attnzoo.limits import MAX_BATCH_SIZE
from attnzoo.runtime.backends import backends, canonical_backend, get_backend
from attnzoo.runtime.sessions import SERVED_DTYPES

__all__ = [
    "ServeConfig",
    "TASK_CHOICES",
    "DEFAULT_MAX_BATCH",
    "DEPLOYMENT",
    "onnx_backends",
    "read_config_file",
    "merged",
]

#: Deployment (and Ray Serve application) name.
DEPLOYMENT = "attnzoo"

#: Largest ``--config`` file read (a settings file is a few hundred bytes).
MAX_CONFIG_BYTES = 64 * 1024
#: ``--task``: which models to serve.
TASK_CHOICES = ("cls", "seg", "both")
#: ``max_batch_size`` when none is given, for replicas without / with a GPU. On the CPU, batching does not
#: pay: ONNX Runtime runs ViT-Ti faster per image at batch 1 than at batch 8 on one thread (the figures:
#: ``results/bench-latency/cpu-tiny/README.md``), so it is off; on a GPU, batches are what fill the device.
DEFAULT_MAX_BATCH = {"cpu": 1, "gpu": 8}


def onnx_backends() -> list[str]:
    """The registry's backends a replica can run the verified ONNX files with (``--backend``)."""
    return [b.name for b in backends() if b.takes == "onnx"]


@dataclass
class ServeConfig:
    """Everything ``serve-models`` needs; see ``serve-models --help`` for each field's meaning.

    Attributes:
        host, port: Where Ray Serve's HTTP proxy listens.
        address: Ray cluster to join (``None``: start a local Ray on this machine).
        models: Folder of ``export-model`` ONNX files (else the zoo, or ``arch`` random-init models).
        data: Zoo data set; ``variants`` / ``task``: which models.
        arch: Serve freshly initialised models of this architecture (``tiny`` ... at 224 px), exported and
            verified once into the cache.
        replicas, cpus_per_replica, gpus_per_replica: Ray Serve replicas and the resources each reserves.
        threads: ONNX Runtime intra-op threads per replica (default: ``cpus_per_replica``, at least 1).
        max_batch_size: Most requests one dynamic batch takes (1: batching off; default
            :data:`DEFAULT_MAX_BATCH` for CPU or GPU replicas).
        batch_wait_ms: How long a batch waits for more requests once its first one arrived.
        max_ongoing_requests: Requests a replica accepts at once (the rest queue in the proxy).
        backend: A backend of the runtime's registry that runs ONNX files, by name or alias: ``ort-cpu``
            (alias ``onnxruntime``) or ``openvino`` on the CPU, ``tensorrt`` (engines need a GPU per replica) ...
        cache_dir: Root of the zoo exports and random-init exports.
        dtype: ``fp32`` (the unquantized files: fp32 and fp16), or ``int8``: only verified int8 files (the
            zoo's int8 copies, made and verified in the cache, or those of ``models``).
        decode_memory_mb: MiB of memory the images one replica decodes at once may hold (``None``: a quarter of
            what the replica has, at most room for two images at the pixel cap,
            :func:`attnzoo.serve.rayserve.budget.decode_budget`).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None
    models: Path | None = None
    data: str = "fashion"
    variants: list[str] | None = None
    task: str = "both"
    arch: str | None = None
    replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0
    threads: int | None = None
    max_batch_size: int | None = None
    batch_wait_ms: float = 2.0
    max_ongoing_requests: int = 64
    backend: str = "ort-cpu"
    cache_dir: Path | None = None
    dtype: str = "fp32"
    decode_memory_mb: float | None = None

    @property
    def intra_op_threads(self) -> int:
        """ONNX Runtime threads per replica."""
        return int(self.threads or max(1, math.floor(self.cpus_per_replica)))

    @property
    def tasks(self) -> list[str] | None:
        """The tasks to serve (``None``: both)."""
        return None if self.task == "both" else [self.task]

    def validate(self) -> ServeConfig:
        """``ValueError`` (one line, naming the key) for a value out of range; returns ``self``."""
        if self.max_batch_size is None:
            self.max_batch_size = DEFAULT_MAX_BATCH["gpu" if self.gpus_per_replica > 0 else "cpu"]
        checks = [
            ("port", 1 <= self.port <= 65535, "must be in 1..65535"),
            ("replicas", self.replicas >= 1, "must be at least 1"),
            ("cpus_per_replica", self.cpus_per_replica >= 0, "must be >= 0"),
            ("gpus_per_replica", self.gpus_per_replica >= 0, "must be >= 0"),
            ("threads", self.threads is None or self.threads >= 1, "must be at least 1"),
            ("max_batch_size", 1 <= self.max_batch_size <= MAX_BATCH_SIZE, f"must be in 1..{MAX_BATCH_SIZE}"),
            ("batch_wait_ms", 0 <= self.batch_wait_ms <= 10_000, "must be in 0..10000"),
            (
                "max_ongoing_requests",
                self.max_ongoing_requests >= self.max_batch_size,
                f"must be at least max_batch_size ({self.max_batch_size})",
            ),
            ("task", self.task in TASK_CHOICES, f"must be one of {', '.join(TASK_CHOICES)}"),
            ("dtype", self.dtype in SERVED_DTYPES, f"must be one of {', '.join(SERVED_DTYPES)}"),
            ("host", bool(re.fullmatch(r"[A-Za-z0-9.:-]+", self.host)), "must be an IP address or a host name"),
            (
                "decode_memory_mb",
                self.decode_memory_mb is None or 0 < self.decode_memory_mb < 2**40,
                "must be a positive number of MiB",
            ),
        ]
        for key, ok, why in checks:
            if not ok:
                raise ValueError(f"{key} {why}, got {quoted(getattr(self, key))}")
        self.backend = canonical_backend(self.backend)  # an alias (onnxruntime ...) becomes the one name
        if self.backend not in onnx_backends():
            raise ValueError(
                f"backend must be one of {', '.join(onnx_backends())} (or an alias), got {quoted(self.backend)}"
            )
        if self.models is not None and self.arch is not None:
            raise ValueError("models (a folder) and arch (random-init models) exclude each other")
        if self.dtype == "int8" and self.arch is not None:
            raise ValueError(
                "dtype int8 serves verified int8 models (the zoo's, or a models folder of export-model "
                "--dtype int8 files); random-init models have no test set to verify int8 on"
            )
        if self.dtype == "int8" and get_backend(self.backend).int8_model is None:
            raise ValueError(
                f"dtype int8 is served on the CPU runtimes ("
                f"{', '.join(b.name for b in backends() if b.int8_model)}), not {self.backend}"
            )
        if self.dtype == "bf16" and self.arch is not None:
            raise ValueError(
                "dtype bf16 serves trained models verified on their test split (the zoo's, or a models "
                "folder); random-init models have no test set to verify bf16 on"
            )
        if self.dtype == "bf16" and "bf16" not in get_backend(self.backend).dtypes:
            bf16 = [b.name for b in backends() if b.takes == "onnx" and "bf16" in b.dtypes]
            raise ValueError(f"dtype bf16 runs on OpenVINO (backend {' or '.join(bf16)}), not {self.backend}")
        return self


_FIELDS = {f.name: f for f in dataclasses.fields(ServeConfig)}


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The keys of a YAML (or JSON) config file, ``-`` spelt ``_``.

    Raises:
        ValueError: missing or unreadable file, not a mapping, or an unknown key (the valid ones are listed).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(
            f"config file {path} is {path.stat().st_size / 2**20:.1f} MiB, over the "
            f"{MAX_CONFIG_BYTES // 1024} KiB a settings file can be"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read config file {path}: {str(exc).splitlines()[0]}") from None
    except RecursionError:  # PyYAML's composer recurses once per nesting level
        raise ValueError(f"cannot read config file {path}: nested too deep") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of keys to values, not {type(data).__name__}")
    out = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(out) - set(_FIELDS))
    if unknown:
        raise ValueError(f"config file {path}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(_FIELDS)}")
    return out


def _coerce(key: str, value: Any) -> Any:
    """A config-file value as the field's type (YAML gives ints for floats, strings for paths, ...)."""
    if value is None:
        return None
    default = _FIELDS[key].default
    try:
        if key in ("models", "cache_dir"):
            return Path(str(value))
        if key == "variants":
            return [str(v) for v in (value.split(",") if isinstance(value, str) else value)]
        if key == "decode_memory_mb":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if key in ("threads", "max_batch_size") or isinstance(default, int):
            if isinstance(value, bool) or float(value) != int(float(value)):
                raise ValueError
            return int(float(value))
        if isinstance(default, float):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value)
    except (TypeError, ValueError, OverflowError):
        integral = key in ("threads", "max_batch_size") or isinstance(default, int)
        kind = "an integer" if integral else "a number" if key == "decode_memory_mb" else type(default).__name__
        raise ValueError(f"{key} must be {kind}, got {quoted(value)}") from None


def merged(file_values: Mapping[str, Any], flag_values: Mapping[str, Any]) -> ServeConfig:
    """Defaults, overridden by the config file, overridden by the flags given (``None`` = not given)."""
    values: dict[str, Any] = {}
    for source in (file_values, flag_values):
        for key, value in source.items():
            if key in _FIELDS and value is not None:
                values[key] = _coerce(key, value)
    return ServeConfig(**values).validate()
