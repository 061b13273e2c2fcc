"""OpenVINO on the CPU: compile the same verified ONNX file that ONNX Runtime runs, and run it.

The ONNX file is read by OpenVINO's own ONNX front end (``Core.read_model``; no conversion tool, so nothing of
OpenVINO's telemetry is ever called). Settings, for every consumer (benchmark, demo, parity tests):

- ``INFERENCE_PRECISION_HINT f32``: on CPUs with bf16 units (``avx512_bf16``, AMX) OpenVINO would otherwise
  run fp32 graphs in bf16, which is a different precision than the file's, not a faster fp32;
- ``INFERENCE_NUM_THREADS``: the caller's thread count (the benchmark's ``--threads``);
- ``PERFORMANCE_HINT LATENCY``: one stream, all threads on one request (the demo and the benchmark run one
  synchronous request at a time; ``THROUGHPUT`` only pays with several requests in flight);
- ``ENABLE_CPU_PINNING False`` (OpenVINO pins its threads to cores by default): on a machine whose cores are
  busy with other work a pinned thread cannot move off a busy core. A one-off check (not a committed run) on a
  2-core AVX2-only AMD EPYC at load average 8, a micro ViT at batch 1 with one thread: 11.8-13.6 ms pinned,
  1.19-1.33 ms unpinned (ONNX Runtime, which does not pin: 1.29-1.35 ms). ``pin=True`` turns it back on for a
  dedicated machine;
- optionally the batch dimension fixed (``batch``), as the benchmark fixes it for ONNX Runtime.

int8: OpenVINO gains nothing from a Q/DQ ONNX made for TensorRT / ONNX Runtime (ModelOpt's); it wants its own
post-training quantization, NNCF's. :func:`nncf_int8` quantizes the OpenVINO model of the same fp32 ONNX file,
calibrated on the caller's images, with the variant's extra-math nodes in NNCF's ignored scope, checks that no
FakeQuantize feeds them (:func:`fake_quantized`) and writes the IR (``.xml`` + ``.bin``) that
:func:`compile_onnx` / :class:`OpenVINOSession` read like an ONNX file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from .contract import INPUT_NAME, OUTPUT_NAME

__all__ = ["HINTS", "unavailable_reason", "version", "error_message", "compile_onnx", "OpenVINOSession",
           "nncf_unavailable_reason", "nncf_int8", "fake_quantized", "NNCFCheckError"]

HINTS = ("LATENCY", "THROUGHPUT")


def unavailable_reason() -> Optional[str]:
    """Why OpenVINO cannot run here (one line), or ``None`` when it can."""
    try:
        import openvino as ov
    except ImportError:
        return "openvino is not installed (pip install openvino)"
    if "CPU" not in ov.Core().available_devices:
        return "OpenVINO has no CPU device on this machine"
    return None


def version() -> Optional[str]:
    """The installed OpenVINO version, or ``None``."""
    try:
        import openvino as ov
    except ImportError:
        return None
    return str(ov.get_version())


def error_message(exc: BaseException) -> str:
    """The reason in an OpenVINO exception: its last line that is not a source location or a failed check's
    header (its first line is ``Exception from src/...cpp:NN:``)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Exception from ", "Check '"))]
    return (useful or lines or [type(exc).__name__])[-1]


def compile_onnx(path: Union[str, Path], *, threads: Optional[int] = None, batch: Optional[int] = None,
                 hint: str = "LATENCY", pin: bool = False):
    """An ``openvino.CompiledModel`` of an ONNX file on the CPU, with the settings of the module docstring.

    Args:
        path: The ``.onnx`` file (an attnzoo export: input ``image``, output ``logits``), or an OpenVINO IR
            ``.xml`` of one (:func:`nncf_int8`).
        threads: ``INFERENCE_NUM_THREADS`` (``None``: OpenVINO's default, the machine's cores).
        batch: Fix the batch dimension to this size (``None``: keep it symbolic).
        hint: ``PERFORMANCE_HINT``, one of ``HINTS``.
        pin: ``ENABLE_CPU_PINNING`` (off by default, see the module docstring).

    Raises:
        ValueError: unknown hint, or a batch / thread count below 1.
    """
    import openvino as ov

    if hint not in HINTS:
        raise ValueError(f"unknown performance hint {hint!r}; valid: {', '.join(HINTS)}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    core = ov.Core()
    try:
        model = core.read_model(str(path))
    except RuntimeError as exc:  # OpenVINO's message: a source location first, the reason last
        raise ValueError(f"{Path(path).name}: OpenVINO cannot read it: {error_message(exc)}") from None
    if batch is not None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        shape = model.input(INPUT_NAME).get_partial_shape()
        shape[0] = int(batch)
        model.reshape({INPUT_NAME: shape})
    config: Dict[str, Any] = {"PERFORMANCE_HINT": hint, "INFERENCE_PRECISION_HINT": "f32",
                              "ENABLE_CPU_PINNING": bool(pin)}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return core.compile_model(model, "CPU", config)


class OpenVINOSession:
    """One compiled model and one reused infer request: ``run(x) -> logits`` (float32 NumPy).

    Args:
        path, threads, batch, hint, pin: As for :func:`compile_onnx`.
    """

    def __init__(self, path: Union[str, Path], *, threads: Optional[int] = None, batch: Optional[int] = None,
                 hint: str = "LATENCY", pin: bool = False) -> None:
        self.compiled = compile_onnx(path, threads=threads, batch=batch, hint=hint, pin=pin)
        self.request = self.compiled.create_infer_request()
        self.batch = batch

    def infer(self, x: np.ndarray) -> np.ndarray:
        """One inference; the returned array is the request's own output buffer (overwritten by the next
        call). The input is used in place, without a copy (float32, C-contiguous)."""
        self.request.infer({INPUT_NAME: x}, share_inputs=True, share_outputs=True)
        return self.request.get_tensor(OUTPUT_NAME).data

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
        return np.concatenate([np.array(self.infer(x[i:i + 1]), dtype=np.float32) for i in range(len(x))])

    def info(self) -> Dict[str, Any]:
        """The settings the compiled model ended up with (what a benchmark row reports)."""
        props = {}
        for key in ("INFERENCE_NUM_THREADS", "PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT", "NUM_STREAMS",
                    "ENABLE_CPU_PINNING"):
            try:
                value = self.compiled.get_property(key)
            except Exception:  # noqa: BLE001 -- a property this version does not report is left out
                continue
            # ov.Type -> "f32", enums -> "LATENCY"; ints and bools stay as they are
            props[key.lower()] = value.to_string() if hasattr(value, "to_string") else getattr(value, "name", value)
        return {"openvino": version(), "fixed_batch": self.batch, **props}


# ------------------------------------------------------------------------------------------------ NNCF int8
#: Ops a quantizer's FakeQuantize may pass through before it reaches a consumer (layout only, no arithmetic).
_LAYOUT_OPS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Convert")


class NNCFCheckError(RuntimeError):
    """The NNCF model quantized an op it was told to leave alone, or quantized nothing."""


def nncf_unavailable_reason() -> Optional[str]:
    """Why NNCF int8 cannot be made here (one line), or ``None``."""
    reason = unavailable_reason()
    if reason:
        return reason
    try:
        import nncf  # noqa: F401
    except ImportError:
        return "nncf is not installed (pip install -e '.[quantize]')"
    return None


def fake_quantized(model: Any, names: Sequence[str]) -> List[str]:
    """The ops of ``names`` in an OpenVINO model that read an input produced by a FakeQuantize (through layout
    ops only): with the extra math in the ignored scope this must be empty."""
    ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    hit = []
    for name in names:
        op = ops.get(name)
        if op is None:
            continue
        for inp in op.inputs():
            src = inp.get_source_output().get_node()
            while src.get_type_name() in _LAYOUT_OPS and src.get_input_size():
                src = src.input_value(0).get_node()
            if src.get_type_name() == "FakeQuantize":
                hit.append(name)
                break
    return hit


def nncf_int8(onnx_path: Union[str, Path], out: Union[str, Path], calibration: np.ndarray, *,
              ignored: Sequence[str] = (), model_type: Optional[str] = "transformer") -> Dict[str, Any]:
    """NNCF post-training int8 quantization of the OpenVINO model of an fp32 ONNX file; checked, then written.

    Args:
        onnx_path: The verified fp32 export.
        out: The IR ``.xml`` to write (its weights go to the ``.bin`` beside it; the ``.bin`` is renamed into
            place first, the ``.xml`` last, so an ``.xml`` that exists has its weights).
        calibration: float32 NCHW calibration inputs (one NNCF sample per image).
        ignored: Node names NNCF must leave unquantized (the variant's extra math,
            :func:`attnzoo.export.quantize.extra_math_nodes`); names OpenVINO's ONNX front end dropped are
            reported, not an error.
        model_type: ``"transformer"`` (NNCF's ViT scheme: FakeQuantize on MatMul inputs, SmoothQuant) or
            ``None`` (NNCF's default scheme, which also quantizes elementwise ops).

    Returns:
        The report: NNCF version, calibration count, FakeQuantize count, ignored names found / missing, time.

    Raises:
        NNCFCheckError: none of the ``ignored`` names is an op of the model (nothing could be kept or checked),
            an ignored op reads a FakeQuantize output, or nothing was quantized (nothing written).
    """
    import logging

    import nncf
    import openvino as ov

    nncf.set_log_level(logging.ERROR)
    calibration = np.ascontiguousarray(calibration, dtype=np.float32)
    if calibration.ndim != 4 or not len(calibration):
        raise ValueError(f"calibration must be a non-empty (N, 3, H, W) array, got shape {calibration.shape}")
    out = Path(out)
    model = ov.Core().read_model(str(onnx_path))
    present = {op.get_friendly_name() for op in model.get_ordered_ops()}
    found = [n for n in ignored if n in present]
    if ignored and not found:  # the check below would then test nothing
        raise NNCFCheckError(f"none of the {len(ignored)} extra-math op names (e.g. {list(ignored)[0]}) is an op of "
                             "OpenVINO's model of the ONNX file: the ignored scope cannot be applied or checked")
    kwargs: Dict[str, Any] = {"subset_size": len(calibration)}
    if found:
        kwargs["ignored_scope"] = nncf.IgnoredScope(names=found)
    if model_type == "transformer":
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
    elif model_type is not None:
        raise ValueError(f"unknown model_type {model_type!r}; valid: transformer, None")
    start = time.perf_counter()
    quantized = nncf.quantize(model, nncf.Dataset([calibration[i:i + 1] for i in range(len(calibration))]),
                              **kwargs)
    elapsed = time.perf_counter() - start
    fq = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ordered_ops())
    leaked = fake_quantized(quantized, found)
    if leaked:
        raise NNCFCheckError(f"NNCF quantized {len(leaked)} op(s) of the ignored scope, e.g. {leaked[0]}")
    if fq == 0:
        raise NNCFCheckError("NNCF inserted no FakeQuantize: nothing was quantized")
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp.xml")
    try:
        ov.save_model(quantized, str(tmp), compress_to_fp16=False)
        out.unlink(missing_ok=True)  # an .xml that exists has its weights: never an old .xml beside a new .bin
        os.replace(tmp.with_suffix(".bin"), out.with_suffix(".bin"))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".bin").unlink(missing_ok=True)
    return {"quantizer": "nncf.quantize (OpenVINO model of the fp32 ONNX)", "nncf": nncf.__version__,
            "openvino": version(), "model_type": model_type or "default", "calibration_count": len(calibration),
            "fake_quantize": fq, "ignored_found": len(found), "ignored_missing": [n for n in ignored if n not in present],
            "ignored_fake_quantized": leaked, "time_s": round(elapsed, 3), "path": str(out)}
