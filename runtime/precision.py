"""The precisions an exported model file is written at, one object each.

A :class:`Precision` holds what every format and every check needs to know about it, so that none of them
branches on a dtype's name: whether the graph is traced at that precision or quantized from the verified fp32
graph, the tolerance its outputs are compared under, the ops it keeps fp32, what ONNX Runtime's CPU provider runs
in its place, which Q/DQ placements and calibration defaults apply and which TensorRT targets can build it.

======  ==========================================================================================================
fp32    the traced graph, IEEE fp32; top-1 must agree with eager PyTorch on every input
fp16    the traced graph in fp16 with LayerNorm, softmax and the extra math in fp32 (fp32 input and output)
int8    ModelOpt's static int8 Q/DQ graph of the verified fp32 one, calibrated, scored on the test split; the CPU
        runtimes run it (ONNX Runtime, OpenVINO) as TensorRT does
fp8     ModelOpt's FP8 (e4m3) Q/DQ graph, calibrated, scored on the test split through its exact float simulation
        (ONNX Runtime's CPU provider refuses float8 tensors); TensorRT on SM 8.9 or newer builds it
======  ==========================================================================================================

The run-time precisions a benchmark row or a served model runs at (``tf32``, ``bf16`` ...) are
:data:`attnzoo.runtime.backends.DTYPES`; this table is the files'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

__all__ = ["Precision", "PRECISIONS", "TRACED", "QUANTIZED", "get_precision"]


@dataclass(frozen=True)
class Precision:
    """One precision an exported file is written at.

    Attributes:
        name: ``fp32``, ``fp16``, ``int8`` or ``fp8`` (``--dtype``).
        quantized: A Q/DQ graph made from the verified fp32 graph with calibration inputs and judged by its
            test-split score next to fp32 (the ``--calibration-*`` / ``--qdq-placement`` flags apply); otherwise
            the model traced at this precision.
        parity_key: The :data:`attnzoo.runtime.parity.TOLERANCES` entry a file is compared under against its
            reference (a quantized engine against ONNX Runtime's Q/DQ graph: kernels round differently).
        fp32_ops: ONNX op types the graph must compute in fp32 (explicit casts around them) besides the extra math.
        same_top1: Every classification input must get eager PyTorch's top-1 class (exact arithmetic).
        cpu_runtimes: The CPU runtimes run it (the ``cpu`` Q/DQ placement applies, and what each group kept fp32
            costs in speed is measured there).
        smooth_quant: ``auto`` placement migrates activation outliers with SmoothQuant first unless told otherwise.
        ort_simulated: ONNX Runtime's CPU provider cannot run the graph itself; :meth:`ort_graph` is its exact
            float simulation (same Q/DQ points, same scales).
        min_compute_capability: The oldest TensorRT target that builds it, ``(major, minor)``, or ``None``.
        half: Traced in fp16 (weights and activations outside the fp32 parts).
    """

    name: str
    quantized: bool = False
    parity_key: str = ""
    fp32_ops: tuple[str, ...] = ()
    same_top1: bool = False
    cpu_runtimes: bool = True
    smooth_quant: bool = False
    ort_simulated: bool = False
    min_compute_capability: tuple[int, int] | None = None
    half: bool = False

    @property
    def file_tag(self) -> str:
        """What a default file name says after the model's name: nothing for fp32, else ``_<name>``."""
        return "" if self.name == "fp32" else f"_{self.name}"

    def ort_graph(self, proto: onnx.ModelProto) -> onnx.ModelProto:
        """The graph ONNX Runtime's CPU provider runs for ``proto``: itself, or its exact simulation."""
        if not self.ort_simulated:
            return proto
        from .fp8 import simulate_fp8

        return simulate_fp8(proto)


#: Every precision a file is written at, by name (``--dtype`` of export-model).
PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", parity_key="fp32", same_top1=True),
        Precision("fp16", parity_key="fp16", fp32_ops=("LayerNormalization", "Softmax"), half=True),
        Precision("int8", quantized=True, parity_key="int8", smooth_quant=True),
        Precision(
            "fp8",
            quantized=True,
            parity_key="int8",
            cpu_runtimes=False,
            ort_simulated=True,
            min_compute_capability=(8, 9),
        ),
    )
}
#: The precisions traced from the model itself, and those quantized from its verified fp32 graph.
TRACED: tuple[str, ...] = tuple(n for n, p in PRECISIONS.items() if not p.quantized)
QUANTIZED: tuple[str, ...] = tuple(n for n, p in PRECISIONS.items() if p.quantized)


def get_precision(name: str) -> Precision:
    """The :class:`Precision` called ``name``.

    Raises:
        ValueError: an unknown name (the line lists the valid ones).
    """
    try:
        return PRECISIONS[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(PRECISIONS)}") from None
