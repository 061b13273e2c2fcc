"""``ort-cpu``: ONNX Runtime's CPU execution provider on a verified ONNX file, tuned.

Tuning (measured in ``results/bench-latency/cpu-tiny*``): all graph optimizations (``ORT_ENABLE_ALL``: constant
folding, MatMul+Add -> Gemm/FusedMatMul, BiasGelu, SkipLayerNormalization, NCHWc layouts), the batch dimension
fixed when the caller knows it, intra-op threads as given, one inter-op thread, sequential execution, and no
thread spinning once a run ends (spinning threads steal the cores PyTorch or a neighbour needs on a shared
machine). With a cache folder the portable ``ORT_ENABLE_EXTENDED`` result is saved once (``<name>.ort.onnx``)
so later sessions skip the graph work; it is reused only while its record (``<name>.ort.json``: the source's
sha256, ONNX Runtime's version, the saved file's own sha256) matches both files, else made again. int8: the
Q/DQ graph ``export-model --dtype int8`` writes runs as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from attnzoo.fileio import atomic_path, derived_is_current, record_derived, sha256_file
from attnzoo.lazy import lazy_import
from attnzoo.runtime.backends import Backend, Call, LoadOptions, Session
from attnzoo.runtime.contract import BATCH_DIM, INPUT_NAME, OUTPUT_NAME

from .sessions import available_providers, inference_session, session_options

ort = lazy_import("onnxruntime")

__all__ = ["OrtCpuBackend", "OrtSession", "tuned_cpu_session", "ORT_CPU"]


def tuned_cpu_session(
    onnx_path: Path,
    threads: int | None,
    cache_dir: Path | None = None,
    batch: int | None = None,
    profile_prefix: str | None = None,
):
    """ONNX Runtime CPU session with the module docstring's settings, and a dict describing them.

    ``cache_dir``: write the ``ORT_ENABLE_EXTENDED``-optimized graph there once and load it with
    ``ORT_ENABLE_ALL`` (the machine-specific layout passes are redone at load time). ``batch`` fixes the dynamic
    batch dimension (the shape arithmetic then folds away). ``profile_prefix`` turns the profiler on.
    """
    onnx_path = Path(onnx_path)
    source = onnx_path
    if cache_dir is not None:
        cache_dir = Path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
        source = cache_dir / f"{onnx_path.stem}.ort.onnx"
        record = source.with_suffix(".json")
        source_sha, key = sha256_file(onnx_path), {"onnxruntime": ort.__version__, "level": "extended"}
        if not derived_is_current(record, source_sha, [source], key):
            record.unlink(missing_ok=True)
            with atomic_path(source) as tmp:
                inference_session(
                    onnx_path, "cpu", options=session_options(threads, "extended", optimized_path=tmp, spinning=False)
                )
            record_derived(record, source_sha, [source], key)
    so = session_options(threads, "all", profile_prefix=profile_prefix, spinning=False)
    if batch is not None:
        so.add_free_dimension_override_by_name(BATCH_DIM, int(batch))
    sess = inference_session(source, "cpu", options=so)
    info = {
        "optimized_model": source.name if cache_dir is not None else None,
        "graph_optimization": "extended (saved) + all" if cache_dir is not None else "all",
        "intra_op_threads": threads,
        "execution_mode": "sequential",
        "spinning": False,
        "fixed_batch": batch,
    }
    return sess, info


class OrtSession(Session):
    """An ``onnxruntime.InferenceSession`` behind the :class:`~attnzoo.runtime.backends.Session` interface.

    Attributes:
        session: The ``onnxruntime.InferenceSession`` itself, for a caller that feeds other inputs than the model
            contract's ``image`` or reads its inputs (``None`` once closed).
    """

    def __init__(self, session: Any, backend: str, info: dict[str, Any]) -> None:
        self.session, self.backend, self._info = session, backend, info
        inp = session.get_inputs()[0]
        self._dtype = np.float16 if "float16" in inp.type else np.float32
        self.fixed_size = all(isinstance(d, int) for d in inp.shape[2:])

    def run(self, x: np.ndarray) -> np.ndarray:
        out = self.session.run([OUTPUT_NAME], {INPUT_NAME: np.ascontiguousarray(x).astype(self._dtype, copy=False)})
        return np.asarray(out[0], dtype=np.float32)

    def call(self, x: np.ndarray) -> Call:
        feed = {INPUT_NAME: np.ascontiguousarray(x).astype(self._dtype, copy=False)}

        def fn():
            return self.session.run([OUTPUT_NAME], feed)

        return Call(fn, lambda: np.asarray(fn()[0], dtype=np.float32), session=self)

    def info(self) -> dict[str, Any]:
        return {"providers": self.session.get_providers(), **self._info}

    def release(self) -> None:
        self.session = None  # the InferenceSession and its arena go with the last reference


@dataclass(frozen=True)
class OrtCpuBackend(Backend):
    """ONNX Runtime, CPU execution provider."""

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
        if "CPUExecutionProvider" not in available_providers():
            return "onnxruntime is not installed"
        if dtype in ("fp16", "bf16"):
            return f"ONNX Runtime's CPU kernels are fp32 (a {dtype} graph runs as casts); int8 is the CPU fast path"
        return super().unavailable_reason(dtype, device)

    def open(self, model: Any, options: LoadOptions) -> OrtSession:
        sess, info = tuned_cpu_session(Path(model), options.threads, options.cache_dir, options.batch)
        return OrtSession(sess, self.name, info)

    def load(self, model: Any, options: LoadOptions | None = None) -> OrtSession:
        return cast(OrtSession, super().load(model, options))

    def session(
        self, model: Any, threads: int | None = None, *, spinning: bool = True, optimized_path: Path | None = None
    ) -> OrtSession:
        """An untuned session: ONNX Runtime's own settings (all graph optimizations, sequential execution,
        ``threads`` intra-op threads, threads spinning), as export verification, the int8 gates and the studies
        that score a file run it; :meth:`load` gives the tuned one.

        Args:
            model: ``.onnx`` path, the model's bytes, or an in-memory ``onnx.ModelProto``.
            threads: Intra-op threads (``None``: ONNX Runtime's default, one per core).
            spinning: Let intra-op threads spin after a run (ONNX Runtime's default); off on a shared machine.
            optimized_path: Save the optimized graph there (the fusion audit reads what ONNX Runtime fused).
        """
        options = session_options(threads, spinning=spinning, optimized_path=optimized_path)
        sess = inference_session(model, "cpu", options=options)
        return OrtSession(sess, self.name, {"intra_op_threads": threads, "tuned": False})

    def profiled(self, model: Any, options: LoadOptions, profile_prefix: str, *, optimize: bool = True) -> OrtSession:
        """A session of the ONNX file ``model`` with ONNX Runtime's profiler on (``<profile_prefix>_<date>.json``):
        the tuned session :meth:`load` gives with ``options`` (``optimize``), or the export as it is, graph
        optimizations off, with the same threads, execution mode and no spinning (the profiling baseline: the ops as
        exported; ``options.batch`` and ``cache_dir`` unused), so a comparison of the two isolates the graph work.
        """
        if optimize:
            sess, info = tuned_cpu_session(
                Path(model), options.threads, options.cache_dir, options.batch, profile_prefix
            )
            return OrtSession(sess, self.name, info)
        so = session_options(options.threads, "disable", profile_prefix=profile_prefix, spinning=False)
        info = {"graph_optimization": "disable", "intra_op_threads": options.threads, "spinning": False}
        return OrtSession(inference_session(Path(model), "cpu", options=so), self.name, info)


ORT_CPU = OrtCpuBackend(
    "ort-cpu",
    "ONNX Runtime, CPU execution provider, on the verified ONNX file (int8: its Q/DQ graph)",
    aliases=("onnxruntime", "ort"),
    dtypes=("fp32", "int8"),
    reads=("threads", "batch", "cache_dir"),
    library="onnxruntime",
    int8_model="qdq",
)
