"""OpenVINO on the CPU: compile the same verified ONNX file that ONNX Runtime runs, and run it.

The ONNX file is read by OpenVINO's own ONNX front end (``Core.read_model``; no conversion tool, so nothing of
OpenVINO's telemetry is ever called). Settings, for every consumer (benchmark, demo, parity tests):

- ``INFERENCE_PRECISION_HINT f32``: on CPUs with bf16 units (``avx512_bf16``, AMX) OpenVINO would otherwise
  run fp32 graphs in bf16, which is a different precision than the file's, not a faster fp32 (``bf16`` is asked
  for by name, below);
- ``INFERENCE_NUM_THREADS``: the caller's thread count (the benchmark's ``--threads``);
- ``PERFORMANCE_HINT LATENCY``: one stream, all threads on one request (the demo and the benchmark run one
  synchronous request at a time; ``THROUGHPUT`` only pays with several requests in flight);
- ``ENABLE_CPU_PINNING False`` (OpenVINO pins its threads to cores by default): on a machine whose cores are
  busy with other work a pinned thread cannot move off a busy core, and ONNX Runtime, which it is compared
  with, does not pin. ``pin=True`` turns it back on for a dedicated machine;
- optionally the batch dimension fixed (``batch``), as the benchmark fixes it for ONNX Runtime.

int8: OpenVINO gains nothing from a Q/DQ ONNX made for TensorRT / ONNX Runtime (ModelOpt's); it wants its own
post-training quantization, NNCF's. :func:`nncf_int8` quantizes the OpenVINO model of the same fp32 ONNX file,
calibrated on the caller's images, with the variant's extra-math nodes in NNCF's ignored scope, checks that no
FakeQuantize feeds them (:func:`fake_quantized`) and writes the IR (``.xml`` + ``.bin``) that
:mod:`attnzoo.targets.openvino.backend` reads like an ONNX file.

bf16 (``precision="bf16"``, CPUs with bf16 units only: :func:`bf16_unavailable_reason`): the same fp32 file
compiled with ``INFERENCE_PRECISION_HINT bf16``, the variant's extra-math ops pinned to f32 first
(:func:`pin_f32`, the names passed in by the caller as for NNCF's ignored scope), then read back from the
compiled model's runtime model (:func:`runtime_precisions`): every runtime node that computes an extra-math op
must run at f32 and every matrix product outside it at bf16, or the model is refused
(:class:`PrecisionCheckError`). The pin is OpenVINO's own per-node precision control: the ``precise_0`` runtime
info that OpenVINO's IR serializer turns into its ``DisablePrecisionConversion`` attribute, which the CPU plugin
reads to keep a node at its original precision under a lower inference precision. The attribute is not copied
to the nodes a graph transformation makes from a pinned one, so two of the CPU plugin's rewrites are forestalled:
a pinned ``Divide`` is marked ``nonconvertable_divide_0`` (OpenVINO's flag that keeps it from becoming
``Multiply(x, Power(y, -1))``), and a pinned ``Subtract`` is written as the ``Add(a, Multiply(b, -1))`` that the
plugin would make of it, with a ``-1`` vector rather than a scalar so that OpenVINO's ``SubtractFusion`` does not
fold it back into a ``Subtract`` (exact: negation does not round). Where a rewrite still drops a pin, the
runtime read-back refuses the model, naming the node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.errors import install_hint
from attnzoo.fileio import temporary_sibling
from attnzoo.lazy import lazy_import
from attnzoo.machine import bf16_problem
from attnzoo.runtime.contract import INPUT_NAME, IR_RT_INFO, read_ir
from attnzoo.runtime.contract import openvino_error as error_message

ov = lazy_import("openvino")
opset = lazy_import("openvino.opset13")

__all__ = [
    "HINTS",
    "PRECISIONS",
    "MATMUL_LAYERS",
    "unavailable_reason",
    "bf16_unavailable_reason",
    "version",
    "error_message",
    "read_onnx",
    "refuse_bf16",
    "pin_f32",
    "runtime_precisions",
    "check_runtime_precisions",
    "precision_summary",
    "PrecisionCheckError",
    "nncf_unavailable_reason",
    "nncf_int8",
    "fake_quantized",
    "NNCFCheckError",
    "temporary_ir",
    "save_ir",
    "place_ir",
]

HINTS = ("LATENCY", "THROUGHPUT")
#: attnzoo precision -> OpenVINO's ``INFERENCE_PRECISION_HINT``.
PRECISIONS: dict[str, str] = {"fp32": "f32", "bf16": "bf16"}
#: Runtime-model layer types of the matrix products: outside the extra math they must run at the inference
#: precision for bf16 to be in effect at all.
MATMUL_LAYERS = ("FullyConnected", "MatMul", "Convolution")
#: Runtime info that pins an op to f32: written from Python as this string key, turned by OpenVINO's IR serializer
#: into :data:`_PINNED`, the attribute the CPU plugin reads.
_PIN = "precise_0"
_PINNED = "DisablePrecisionConversion_0"
#: Runtime info that keeps a ``Divide`` from being rewritten as ``Multiply(x, Power(y, -1))`` (a new, unpinned op).
_NONCONVERTIBLE_DIVIDE = "nonconvertable_divide_0"


class PrecisionCheckError(RuntimeError):
    """OpenVINO's runtime model does not run the precisions asked for (extra math at f32, matmuls at bf16)."""


def unavailable_reason() -> str | None:
    """Why OpenVINO cannot run here (one line), or ``None`` when it can."""
    try:
        core = ov.Core  # the first attribute read imports openvino
    except ImportError:
        return "openvino is not installed (pip install openvino)"
    if "CPU" not in core().available_devices:
        return "OpenVINO has no CPU device on this machine"
    return None


def bf16_unavailable_reason() -> str | None:
    """Why OpenVINO cannot run bf16 here (one line), or ``None``: the CPU needs bf16 units
    (:func:`attnzoo.machine.bf16_problem`) and OpenVINO's CPU plugin must report its ``BF16`` capability (it has
    bf16 kernels on x86 only). Without them OpenVINO would compile a bf16 request at f32 without saying so."""
    reason = unavailable_reason() or bf16_problem()
    if reason:
        return reason

    caps = [str(c) for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]
    if "BF16" not in caps:
        return f"OpenVINO {version()}'s CPU plugin has no BF16 capability on this CPU (it has {', '.join(caps)})"
    return None


def refuse_bf16() -> None:
    """``ValueError`` naming why bf16 cannot run here (:func:`bf16_unavailable_reason`); nothing when it can."""
    reason = bf16_unavailable_reason()
    if reason:
        raise ValueError(f"bf16: {reason}")


def version() -> str | None:
    """The installed OpenVINO version, or ``None``."""
    try:
        get_version = ov.get_version  # the first attribute read imports openvino
    except ImportError:
        return None
    return str(get_version())


def read_onnx(path: str | Path, batch: int | None = None):
    """OpenVINO's model of an ONNX file (or IR ``.xml``), its batch dimension fixed to ``batch`` when given.

    Raises:
        ValueError: OpenVINO cannot read the file (naming it and the reason), or a batch below 1.
    """
    model = read_ir(path)
    if batch is not None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        shape = model.input(INPUT_NAME).get_partial_shape()
        shape[0] = int(batch)
        model.reshape({INPUT_NAME: shape})
    return model


# ------------------------------------------------------------------------------------------ per-node precision
def _negated_add(model: Any, sub: Any) -> str:
    """Replace the ``Subtract`` ``sub`` (``a - b``) of ``model`` by ``Add(a, Multiply(b, -1))``, the Add taking
    its name, the Multiply ``<name>/negate``; returns the Multiply's name. The ``-1`` is a vector over the last
    axis (when that axis is static and longer than 1), which OpenVINO's ``SubtractFusion`` does not fold back."""
    name = sub.get_friendly_name()
    shape = sub.get_output_partial_shape(0)
    last = shape[shape.rank.get_length() - 1] if shape.rank.is_static and shape.rank.get_length() else None
    width = last.get_length() if last is not None and last.is_static and last.get_length() > 1 else 1
    minus_one = opset.constant(np.full([width], -1.0, dtype=np.float32))
    negate = opset.multiply(sub.input_value(1), minus_one)
    add = opset.add(sub.input_value(0), negate)
    for target in list(sub.output(0).get_target_inputs()):
        target.replace_source_output(add.output(0))
    for result in model.get_results():  # a Subtract that is the model's output
        if result.input_value(0).get_node() is sub:
            result.input(0).replace_source_output(add.output(0))
    sub.set_friendly_name(f"{name}/replaced")
    add.set_friendly_name(name)
    negate.set_friendly_name(f"{name}/negate")
    return negate.get_friendly_name()


def pin_f32(model: Any, names: Sequence[str]) -> tuple[Any, list[str], list[str]]:
    """Pin the ops ``names`` of an OpenVINO model to f32 under a lower inference precision (module docstring).

    The model goes through OpenVINO's IR serializer and reader (in memory) so that each pin becomes the CPU
    plugin's attribute; every pinned op is then checked to carry it.

    Returns:
        ``(model, pinned, missing)``: the model to compile, the names of the pinned ops (``names`` found, plus
        the negations written for their Subtracts) and the ``names`` that are not ops of the model (OpenVINO's
        ONNX front end may fold an op away).

    Raises:
        PrecisionCheckError: none of ``names`` is an op of the model (nothing could be pinned or checked), or a
            pinned op lacks the attribute after the round trip.
    """
    by_name = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
    missing = [n for n in names if n not in by_name]
    pinned = [n for n in names if n in by_name]
    if names and not pinned:
        raise PrecisionCheckError(
            f"none of the {len(names)} ops to keep at f32 (e.g. {list(names)[0]}) is an op of "
            "OpenVINO's model of the file: nothing can be pinned or checked"
        )
    pinned += [_negated_add(model, by_name[n]) for n in list(pinned) if by_name[n].get_type_name() == "Subtract"]
    wanted = set(pinned)
    for op in model.get_ordered_ops():
        if op.get_friendly_name() in wanted:
            op.get_rt_info()[_PIN] = ""
    with tempfile.TemporaryDirectory(prefix="attnzoo-ov-") as tmp:
        xml, weights = Path(tmp) / "model.xml", Path(tmp) / "model.bin"
        ov.save_model(model, str(xml), compress_to_fp16=False)
        model = ov.Core().read_model(xml.read_bytes(), ov.Tensor(np.fromfile(weights, dtype=np.uint8)))
    lost = []
    for op in model.get_ordered_ops():
        if op.get_friendly_name() in wanted:
            if _PINNED not in op.get_rt_info():
                lost.append(op.get_friendly_name())
            if op.get_type_name() == "Divide":
                op.get_rt_info()[_NONCONVERTIBLE_DIVIDE] = ""
    if lost:
        raise PrecisionCheckError(f"{len(lost)} op(s) lost their f32 pin in OpenVINO's serializer, e.g. {lost[0]}")
    return model, pinned, missing


def _rt(op: Any, key: str) -> str:
    info = op.get_rt_info()
    return str(info[key].astype(str)) if key in info else ""


#: Runtime kernels that only move data (no arithmetic): their precision is the precision of what they are given.
_MOVE_KERNELS = ("Reshape", "Transpose")


def _carries_input(op: Any, in_extra: set) -> bool:
    """Whether a runtime node of the extra math only moves data that enters the extra math: a data-movement
    kernel fed (through other such kernels) only by nodes outside the extra math. It runs at the precision its
    input arrives in (the output of a matrix product at bf16, say) and rounds nothing itself; the arithmetic of
    the extra math after it is what must run at f32."""
    if _rt(op, "layerType") not in _MOVE_KERNELS:
        return False
    for i in range(op.get_input_size()):
        src = op.input_value(i).get_node()
        if _rt(src, "layerType") in ("Const", "Constant", "Input", "Parameter"):
            continue
        if src.get_friendly_name() in in_extra and not _carries_input(src, in_extra):
            return False
    return True


def runtime_precisions(compiled: Any, pinned: Sequence[str], missing: Sequence[str] = ()) -> dict[str, Any]:
    """What OpenVINO's compiled model runs at, read back from its runtime model (``get_runtime_model()``: one
    node per executed kernel, with the ``runtimePrecision``, ``layerType`` and ``originalLayersNames`` of the
    model's ops it computes).

    Args:
        compiled: The ``openvino.CompiledModel``.
        pinned: Names of the ops that must run at f32 (:func:`pin_f32`).
        missing: Names asked for that were not ops of the model (reported).

    Returns:
        ``{"inference_precision", "extra_math": {"ops", "missing", "runtime_nodes", "by_precision", "not_f32",
        "unpinned"}, "matmuls": {"by_precision", "not_inference_precision"}, "other": {"by_precision"}}``:
        ``not_f32`` lists the runtime nodes computing a pinned op at another precision (``carried``: the
        data-movement kernels that only pass the extra math's inputs on at the precision they arrive in, which
        compute nothing and are not refused, see :func:`_carries_input`); ``unpinned`` those whose
        first op (the kernel's own) carries no pin, which OpenVINO then is free to run at the inference precision;
        ``matmuls`` counts the matrix products outside the pinned ops.
    """
    value = compiled.get_property("INFERENCE_PRECISION_HINT")
    infer = value.to_string() if hasattr(value, "to_string") else str(value)
    wanted = set(pinned)
    extra: Counter = Counter()
    matmuls: Counter = Counter()
    other: Counter = Counter()
    not_f32, unpinned, not_infer, carried, nodes = [], [], [], [], 0
    runtime = compiled.get_runtime_model().get_ordered_ops()
    in_extra = {op.get_friendly_name() for op in runtime if wanted & set(_rt(op, "originalLayersNames").split(","))}
    for op in runtime:
        layer, prec = _rt(op, "layerType"), _rt(op, "runtimePrecision")
        if layer in ("Input", "Output", "Const", "Parameter", "Result", "Constant"):
            continue
        names = [n for n in _rt(op, "originalLayersNames").split(",") if n]
        if wanted & set(names):
            nodes += 1
            extra[prec] += 1
            label = f"{op.get_friendly_name()} ({layer}, {prec})"
            if prec != "f32" and _carries_input(op, in_extra):
                carried.append(label)
            elif prec != "f32":
                not_f32.append(label)
            if op.get_friendly_name() not in wanted:
                unpinned.append(label)
        elif layer in MATMUL_LAYERS:
            matmuls[prec] += 1
            if prec != infer:
                not_infer.append(f"{op.get_friendly_name()} ({layer}, {prec})")
        else:
            other[prec] += 1
    return {
        "inference_precision": infer,
        "extra_math": {
            "ops": len(wanted),
            "missing": list(missing),
            "runtime_nodes": nodes,
            "by_precision": dict(extra),
            "not_f32": not_f32,
            "unpinned": unpinned,
            "carried": carried,
        },
        "matmuls": {"by_precision": dict(matmuls), "not_inference_precision": not_infer},
        "other": {"by_precision": dict(other)},
    }


def check_runtime_precisions(report: dict[str, Any], precision: str) -> None:
    """Refuse a compiled model whose runtime model (:func:`runtime_precisions`) does not run ``precision``: it
    must have compiled at that inference precision, every runtime node computing a pinned op at f32, and (bf16)
    its matrix products outside the pinned ops at bf16.

    Raises:
        PrecisionCheckError: one line naming what runs at what.
    """
    want = PRECISIONS[precision]
    if report["inference_precision"] != want:
        raise PrecisionCheckError(f"OpenVINO compiled the model at {report['inference_precision']}, not {want}")
    x = report["extra_math"]
    if x["ops"] and not x["runtime_nodes"]:
        raise PrecisionCheckError(
            f"none of the {x['ops']} pinned ops appears in OpenVINO's runtime model: their "
            "precision cannot be read back"
        )
    if x["not_f32"]:
        raise PrecisionCheckError(
            f"{len(x['not_f32'])} of {x['runtime_nodes']} runtime nodes of the extra math do not "
            f"run at f32 under {want}, e.g. {x['not_f32'][0]}"
        )
    m = report["matmuls"]
    if want != "f32" and (m["not_inference_precision"] or not m["by_precision"]):
        example = m["not_inference_precision"][0] if m["not_inference_precision"] else "none found"
        raise PrecisionCheckError(
            f"the matrix products outside the extra math do not all run at {want} "
            f"({m['by_precision'] or 'none'}; e.g. {example}): {want} is not in effect"
        )


def precision_summary(report: dict[str, Any]) -> dict[str, Any]:
    """A compact :func:`runtime_precisions` report (counts, and at most 3 examples per list) for a results row."""
    x, m = report["extra_math"], report["matmuls"]
    return {
        "inference_precision": report["inference_precision"],
        "extra_math_ops": x["ops"],
        "extra_math_missing": len(x["missing"]),
        "extra_math_runtime_nodes": x["by_precision"],
        "extra_math_not_f32": x["not_f32"][:3],
        "extra_math_unpinned": x["unpinned"][:3],
        "extra_math_carried": len(x.get("carried", [])),
        "matmuls": m["by_precision"],
    }


# ------------------------------------------------------------------------------------------------ IR files
@contextlib.contextmanager
def temporary_ir(out: str | Path) -> Iterator[Path]:
    """A temporary IR ``.xml`` beside ``out`` (its ``.bin`` beside it; :func:`attnzoo.fileio.temporary_sibling`),
    both removed on the way out whatever happened, or after a kill by the next export to ``out``: what
    :func:`place_ir` has not moved to ``out`` is never left behind."""
    tmp = temporary_sibling(out, ".xml")
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_suffix(".bin").unlink(missing_ok=True)


def save_ir(
    model: Any, path: str | Path, *, compress_to_fp16: bool = False, metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``model`` as IR (``path`` and its ``.bin``), its weights fp16 when ``compress_to_fp16`` (OpenVINO
    decompresses them to f32 where they are used), with ``metadata`` (the model contract's entries, as an ONNX file
    keeps them in ``metadata_props``) in the :data:`attnzoo.runtime.contract.IR_RT_INFO` section of its
    ``rt_info``."""
    for key, value in (metadata or {}).items():
        model.set_rt_info(str(value), [IR_RT_INFO, str(key)])
    ov.save_model(model, str(path), compress_to_fp16=compress_to_fp16)


def place_ir(tmp: str | Path, out: str | Path) -> None:
    """Rename the IR ``tmp`` (and its ``.bin``) to ``out``: the old ``.xml`` goes first and the new one comes last,
    so an ``.xml`` that exists has its own weights, never an old ``.xml`` beside a new ``.bin``."""
    tmp, out = Path(tmp), Path(out)
    out.unlink(missing_ok=True)
    os.replace(tmp.with_suffix(".bin"), out.with_suffix(".bin"))
    os.replace(tmp, out)


# ------------------------------------------------------------------------------------------------ NNCF int8
#: Ops a quantizer's FakeQuantize may pass through before it reaches a consumer (layout only, no arithmetic).
_LAYOUT_OPS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Convert")


class NNCFCheckError(RuntimeError):
    """The NNCF model quantized an op it was told to leave alone, or quantized nothing."""


def nncf_unavailable_reason() -> str | None:
    """Why NNCF int8 cannot be made here (one line), or ``None``."""
    reason = unavailable_reason()
    if reason:
        return reason
    try:
        import nncf  # noqa: F401 -- optional: NNCF (the [quantize] extra); importing it is the check
    except ImportError:
        return f"nncf is not installed ({install_hint('quantize')})"
    return None


def fake_quantized(model: Any, names: Sequence[str]) -> list[str]:
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


def nncf_int8(
    onnx_path: str | Path,
    out: str | Path,
    calibration: np.ndarray,
    *,
    ignored: Sequence[str] = (),
    model_type: str | None = "transformer",
    metadata: Mapping[str, str] | None = None,
) -> dict[str, Any]:
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
        metadata: The model contract's entries to record in the IR (:func:`save_ir`).

    Returns:
        The report: NNCF version, calibration count, FakeQuantize count, ignored names found / missing, time.

    Raises:
        NNCFCheckError: none of the ``ignored`` names is an op of the model (nothing could be kept or checked),
            an ignored op reads a FakeQuantize output, or nothing was quantized (nothing written).
    """
    import nncf  # optional: NNCF (the [quantize] extra)

    nncf.set_log_level(logging.ERROR)
    calibration = np.ascontiguousarray(calibration, dtype=np.float32)
    if calibration.ndim != 4 or not len(calibration):
        raise ValueError(f"calibration must be a non-empty (N, 3, H, W) array, got shape {calibration.shape}")
    out = Path(out)
    model = ov.Core().read_model(str(onnx_path))
    present = {op.get_friendly_name() for op in model.get_ordered_ops()}
    found = [n for n in ignored if n in present]
    if ignored and not found:  # the check below would then test nothing
        raise NNCFCheckError(
            f"none of the {len(ignored)} extra-math op names (e.g. {list(ignored)[0]}) is an op of "
            "OpenVINO's model of the ONNX file: the ignored scope cannot be applied or checked"
        )
    kwargs: dict[str, Any] = {"subset_size": len(calibration)}
    if found:
        kwargs["ignored_scope"] = nncf.IgnoredScope(names=found)
    if model_type == "transformer":
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
    elif model_type is not None:
        raise ValueError(f"unknown model_type {model_type!r}; valid: transformer, None")
    start = time.perf_counter()
    quantized = nncf.quantize(model, nncf.Dataset([calibration[i : i + 1] for i in range(len(calibration))]), **kwargs)
    elapsed = time.perf_counter() - start
    fq = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ordered_ops())
    leaked = fake_quantized(quantized, found)
    if leaked:
        raise NNCFCheckError(f"NNCF quantized {len(leaked)} op(s) of the ignored scope, e.g. {leaked[0]}")
    if fq == 0:
        raise NNCFCheckError("NNCF inserted no FakeQuantize: nothing was quantized")
    with temporary_ir(out) as tmp:
        save_ir(quantized, tmp, metadata=metadata)
        place_ir(tmp, out)
    return {
        "quantizer": "nncf.quantize (OpenVINO model of the fp32 ONNX)",
        "nncf": nncf.__version__,
        "openvino": version(),
        "model_type": model_type or "default",
        "calibration_count": len(calibration),
        "fake_quantize": fq,
        "ignored_found": len(found),
        "ignored_missing": [n for n in ignored if n not in present],
        "ignored_fake_quantized": leaked,
        "time_s": round(elapsed, 3),
        "path": str(out),
    }
