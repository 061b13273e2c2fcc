"""``openvino``: OpenVINO on the CPU, reading the same verified ONNX file (or NNCF's int8 IR of it, or the IR
``.xml`` that ``export-model --format openvino`` writes, whose contract :class:`ModelContract` reads from its
``rt_info``).

The settings (fp32 inference precision, the caller's threads, the latency hint, no thread pinning, the batch
fixed when known) are :mod:`attnzoo.runtime.openvino`'s. ``bf16`` (CPUs with bf16 units): the same file at
OpenVINO's bf16 inference precision with the variant's extra-math ops pinned to f32, read back from the
runtime model before the session is returned; the caller passes those ops' names (``keep_f32``,
:func:`attnzoo.export.quantize.extra_math_nodes`), as for NNCF's ignored scope.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from attnzoo.lazy import lazy_import

from .. import openvino as ov
from ..contract import ModelContract
from ..sessions import IR_SUFFIX
from . import Backend, Call, LoadOptions, Session, register_backend

models = lazy_import("attnzoo.models")  # torch and timm: the registry imports without them

__all__ = ["OpenVINOBackend", "OpenVINORuntimeSession", "OPENVINO", "tensor_values"]


class OpenVINORuntimeSession(Session):
    """An :class:`attnzoo.runtime.openvino.OpenVINOSession` behind the registry's interface."""

    def __init__(self, session: ov.OpenVINOSession, backend: str) -> None:
        self.session: ov.OpenVINOSession | None = session
        self.backend, self.fixed_size = backend, True

    def live(self) -> ov.OpenVINOSession:
        """The OpenVINO session (its compiled model and infer request); raises once this is closed."""
        if self.session is None:
            raise RuntimeError(f"this {self.backend} session is closed")
        return self.session

    def run(self, x: np.ndarray) -> np.ndarray:
        return self.live().run(x)

    def call(self, x: np.ndarray) -> Call:
        xin = np.ascontiguousarray(x, dtype=np.float32)
        if self.live().batch not in (None, len(xin)):
            return super().call(x)
        return Call(  # the session looked up at each call: a closed one raises, and its memory goes with it
            lambda: self.live().infer(xin),
            lambda: np.array(self.live().infer(xin), dtype=np.float32),
            session=self,
        )

    def info(self) -> dict[str, Any]:
        return self.live().info()

    def release(self) -> None:
        self.session = None  # the compiled model and its infer request go with the last reference


@dataclass(frozen=True)
class OpenVINOBackend(Backend):
    """OpenVINO, CPU plugin."""

    def unavailable_reason(self, dtype: str = "fp32", device: str = "cpu", build_only: bool = False) -> str | None:
        reason = ov.unavailable_reason()
        if reason:
            return reason
        if dtype == "int8":
            return ov.nncf_unavailable_reason()
        if dtype == "bf16":
            return ov.bf16_unavailable_reason()
        if dtype != "fp32" and dtype in self.dtypes:
            return None
        if dtype != "fp32":
            return f"OpenVINO runs the fp32 ONNX file here at fp32 precision (no {dtype} inference-precision hint set)"
        return None

    def load(self, model: Any, options: LoadOptions | None = None) -> OpenVINORuntimeSession:
        return cast(OpenVINORuntimeSession, super().load(model, options))

    def open(self, model: Any, options: LoadOptions) -> OpenVINORuntimeSession:
        """``options.keep_f32``: the names of the ops bf16 keeps at f32 (the variant's extra math; not needed for a
        variant without, refused when missing for one with)."""
        keep_f32 = options.keep_f32
        if options.dtype == "bf16" and keep_f32 is None and not _extra_scopes(Path(model)):
            keep_f32 = ()
        precision = "bf16" if options.dtype == "bf16" else "fp32"  # an int8 IR carries its own precision
        session = ov.OpenVINOSession(
            Path(model),
            threads=options.threads,
            batch=options.batch,
            precision=precision,
            keep_f32=list(keep_f32) if keep_f32 is not None else None,
        )
        return OpenVINORuntimeSession(session, self.name)


def tensor_values(
    path: str | Path, names: Sequence[str], x: np.ndarray, *, threads: int | None = None
) -> dict[str, np.ndarray]:
    """The tensors ``names`` of an IR (or ONNX) file as OpenVINO's CPU plugin computes them on ``x`` at f32: a
    fresh read of ``path`` with those tensors added as outputs (a name it does not keep is left out), run once.
    What an export's per-block comparison reads from an IR (:func:`attnzoo.export.divergence.divergence_vs_eager`)."""
    session = ov.OpenVINOSession(Path(path), threads=threads, outputs=names)
    return session.tensors(x)


def _extra_scopes(path: Path) -> tuple:
    """The extra-math scopes of the variant an attnzoo ONNX file holds (none for an unregistered variant)."""
    spec = models.VARIANTS.get(str(ModelContract.from_onnx(path).config.get("variant")))
    return tuple(spec.extra_scopes) if spec is not None else ()


OPENVINO = register_backend(
    OpenVINOBackend(
        "openvino",
        "OpenVINO, CPU plugin, on the same verified ONNX file (bf16: extra math pinned to f32; int8: NNCF's "
        "quantization of it)",
        aliases=("ov",),
        takes="onnx",
        device="cpu",
        dtypes=("fp32", "bf16", "int8"),
        reads=("threads", "batch", "keep_f32"),
        library="openvino",
        int8_model="nncf",
        serving_batch=1,
        suffixes=(".onnx", IR_SUFFIX),
    )
)
