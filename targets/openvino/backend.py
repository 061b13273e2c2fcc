"""``openvino``: OpenVINO on the CPU, reading the same verified ONNX file (or NNCF's int8 IR of it, or the IR
``.xml`` that ``export-model --format openvino`` writes, whose contract :class:`ModelContract` reads from its
``rt_info``).

The settings (fp32 inference precision, the caller's threads, the latency hint, no thread pinning, the batch
fixed when known) are :mod:`attnzoo.targets.openvino.library`'s. ``bf16`` (CPUs with bf16 units): the same file at
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
from attnzoo.runtime.backends import Backend, Call, LoadOptions, Session
from attnzoo.runtime.contract import INPUT_NAME, OUTPUT_NAME, ModelContract
from attnzoo.runtime.sessions import IR_SUFFIX
from attnzoo.signals import off_altstack

from . import library as ov

ov_lib = lazy_import("openvino")
models = lazy_import("attnzoo.models")  # torch and timm: the registry imports without them

__all__ = ["OpenVINOBackend", "OpenVINORuntimeSession", "OPENVINO", "OpenVINOSession", "compile_onnx", "tensor_values"]


def compile_onnx(
    path: str | Path | Any,
    *,
    threads: int | None = None,
    batch: int | None = None,
    hint: str = "LATENCY",
    pin: bool = False,
    precision: str = "fp32",
):
    """An ``openvino.CompiledModel`` of an ONNX file on the CPU, with the settings of
    :mod:`.library` (whose functions, ``ov.`` here, read, pin and check the model): the one place an
    OpenVINO model is compiled. The backend's sessions compile through it; :meth:`OpenVINOBackend.compiled` gives
    the compiled model itself to a caller that reads OpenVINO's own objects.

    Args:
        path: The ``.onnx`` file (an attnzoo export: input ``image``, output ``logits``), an OpenVINO IR ``.xml``
            of one (``ov.nncf_int8``), or an ``openvino.Model`` already read (``ov.read_onnx``, ``ov.pin_f32``;
            ``batch`` is then ignored).
        threads: ``INFERENCE_NUM_THREADS`` (``None``: OpenVINO's default, the machine's cores).
        batch: Fix the batch dimension to this size (``None``: keep it symbolic).
        hint: ``PERFORMANCE_HINT``, one of ``ov.HINTS``.
        pin: ``ENABLE_CPU_PINNING`` (off by default).
        precision: ``fp32`` or ``bf16`` (``ov.PRECISIONS``), the ``INFERENCE_PRECISION_HINT``. bf16 is refused where
            ``ov.bf16_unavailable_reason`` says why; :class:`OpenVINOSession` also pins the extra math and checks
            the compiled model.

    Raises:
        ValueError: unknown hint or precision, a batch / thread count below 1, bf16 on a CPU without it.
    """
    if hint not in ov.HINTS:
        raise ValueError(f"unknown performance hint {hint!r}; valid: {', '.join(ov.HINTS)}")
    if precision not in ov.PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(ov.PRECISIONS)}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    if precision == "bf16":
        ov.refuse_bf16()
    model = path if isinstance(path, ov_lib.Model) else ov.read_onnx(path, batch)
    config: dict[str, Any] = {
        "PERFORMANCE_HINT": hint,
        "INFERENCE_PRECISION_HINT": ov.PRECISIONS[precision],
        "ENABLE_CPU_PINNING": bool(pin),
    }
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    off_altstack()  # the plugin may leave this thread on an unmapped alternate stack (attnzoo.signals)
    return ov_lib.Core().compile_model(model, "CPU", config)


class OpenVINOSession:
    """One compiled model and one reused infer request: ``run(x) -> logits`` (float32 NumPy); what an
    :class:`OpenVINORuntimeSession` holds.

    Args:
        path, threads, batch, hint, pin, precision: As for :func:`compile_onnx`.
        keep_f32: Names of the ops to keep at f32 (the variant's extra math,
            :func:`attnzoo.export.quantize.extra_math_nodes`): pinned (``ov.pin_f32``) and, after compiling, read
            back from the runtime model (``ov.runtime_precisions``, in ``precision_check``). Required for bf16 (an
            empty list for a variant without extra math).
        outputs: Tensor names (the ONNX tensor names an IR converted from an attnzoo ONNX keeps) added as outputs
            before compiling, for :meth:`tensors`; a name the model does not keep (folded or fused away) is left
            out of :attr:`outputs`.

    Raises:
        ValueError: bf16 without ``keep_f32``, or where ``ov.bf16_unavailable_reason`` says why not.
        PrecisionCheckError: the runtime model does not run the precisions asked for
            (``ov.check_runtime_precisions``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        threads: int | None = None,
        batch: int | None = None,
        hint: str = "LATENCY",
        pin: bool = False,
        precision: str = "fp32",
        keep_f32: Sequence[str] | None = None,
        outputs: Sequence[str] = (),
    ) -> None:
        if precision == "bf16":  # refused before any work
            ov.refuse_bf16()
            if keep_f32 is None:
                raise ValueError(
                    "bf16 needs the names of the ops to keep at f32 (the variant's extra math, "
                    "attnzoo.export.quantize.extra_math_nodes; an empty list for a variant without)"
                )
        model, pinned, missing = ov.read_onnx(path, batch), list[str](), list[str]()
        kept = {name for op in model.get_ops() for out in op.outputs() for name in out.get_names()} if outputs else ()
        self.outputs = [n for n in dict.fromkeys(outputs) if n and n in kept]
        if self.outputs:
            model.add_outputs(self.outputs)
        if keep_f32 is not None:
            model, pinned, missing = ov.pin_f32(model, keep_f32)
        self.compiled = compile_onnx(model, threads=threads, hint=hint, pin=pin, precision=precision)
        self.precision, self.precision_check, self.pinned = precision, None, pinned
        if keep_f32 is not None:
            self.precision_check = ov.runtime_precisions(self.compiled, pinned, missing)
            ov.check_runtime_precisions(self.precision_check, precision)
        self.request = self.compiled.create_infer_request()
        self.batch = batch

    def infer(self, x: np.ndarray) -> np.ndarray:
        """One inference; the returned array is the request's own output buffer (overwritten by the next
        call). The input is used in place, without a copy (float32, C-contiguous)."""
        self.request.infer({INPUT_NAME: x}, share_inputs=True, share_outputs=True)
        return self.request.get_tensor(OUTPUT_NAME).data

    def tensors(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The tensors :attr:`outputs` on ``x``, as float32 arrays the caller owns (one inference)."""
        self.infer(np.ascontiguousarray(x, dtype=np.float32))
        return {n: np.array(self.request.get_tensor(n).data, dtype=np.float32) for n in self.outputs}

    def run(self, x: np.ndarray) -> np.ndarray:
        """Logits of ``x`` (N, 3, H, W) as a float32 array the caller owns. A model compiled for batch 1 takes
        any N, one image at a time.

        Raises:
            ValueError: N differs from a fixed batch size other than 1.
        """
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.batch is None or len(x) == self.batch:
            return np.array(self.infer(x), dtype=np.float32)
        if self.batch != 1:
            raise ValueError(f"this OpenVINO model is compiled for batch {self.batch}, got {len(x)} images")
        return np.concatenate([np.array(self.infer(x[i : i + 1]), dtype=np.float32) for i in range(len(x))])

    def info(self) -> dict[str, Any]:
        """The settings the compiled model ended up with (what a benchmark row reports)."""
        props = {}
        for key in (
            "INFERENCE_NUM_THREADS",
            "PERFORMANCE_HINT",
            "INFERENCE_PRECISION_HINT",
            "NUM_STREAMS",
            "ENABLE_CPU_PINNING",
        ):
            try:
                value = self.compiled.get_property(key)
            except Exception:  # a property this version does not report is left out
                continue
            # ov.Type -> "f32", enums -> "LATENCY"; ints and bools stay as they are
            props[key.lower()] = value.to_string() if hasattr(value, "to_string") else getattr(value, "name", value)
        info = {"openvino": ov.version(), "fixed_batch": self.batch, **props}
        if self.precision_check is not None:
            info["precision_check"] = ov.precision_summary(self.precision_check)
        return info


class OpenVINORuntimeSession(Session):
    """An :class:`OpenVINOSession` behind the registry's interface."""

    def __init__(self, session: OpenVINOSession, backend: str) -> None:
        self.session: OpenVINOSession | None = session
        self.backend, self.fixed_size = backend, True

    def live(self) -> OpenVINOSession:
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
        session = OpenVINOSession(
            Path(model),
            threads=options.threads,
            batch=options.batch,
            precision=precision,
            keep_f32=list(keep_f32) if keep_f32 is not None else None,
        )
        return OpenVINORuntimeSession(session, self.name)

    def compiled(self, model: Any, threads: int | None = None) -> Any:
        """The ``openvino.CompiledModel`` of ``model`` (an ONNX or IR file, any graph, not only a model's export)
        with the backend's fp32 settings: for a caller that reads OpenVINO's own objects instead of running a model
        (the fusion audit's runtime graph, the GEMM ceiling's infer request on a bare matmul)."""
        return compile_onnx(Path(model), threads=threads)


def tensor_values(
    path: str | Path, names: Sequence[str], x: np.ndarray, *, threads: int | None = None
) -> dict[str, np.ndarray]:
    """The tensors ``names`` of an IR (or ONNX) file as OpenVINO's CPU plugin computes them on ``x`` at f32: a
    fresh read of ``path`` with those tensors added as outputs (a name it does not keep is left out), run once.
    What an export's per-block comparison reads from an IR (:func:`attnzoo.export.divergence.divergence_vs_eager`)."""
    session = OpenVINOSession(Path(path), threads=threads, outputs=names)
    return session.tensors(x)


def _extra_scopes(path: Path) -> tuple:
    """The extra-math scopes of the variant an attnzoo ONNX file holds (none for an unregistered variant)."""
    spec = models.VARIANTS.get(str(ModelContract.from_onnx(path).config.get("variant")))
    return tuple(spec.extra_scopes) if spec is not None else ()


OPENVINO = OpenVINOBackend(
    "openvino",
    "OpenVINO, CPU plugin, on the same verified ONNX file (bf16: extra math pinned to f32; int8: NNCF's "
    "quantization of it)",
    aliases=("ov",),
    dtypes=("fp32", "bf16", "int8"),
    reads=("threads", "batch", "keep_f32"),
    library="openvino",
    int8_model="nncf",
    serving_batch=1,
    suffixes=(".onnx", IR_SUFFIX),
)
