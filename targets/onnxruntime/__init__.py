"""The ONNX Runtime target: the verified ONNX file run by ONNX Runtime, on the CPU (``ort-cpu``, the runtime every
export is verified with) and on a CUDA GPU through its CUDA and TensorRT execution providers (``ort-cuda``,
``ort-trt``).

The modules, by role:

- :mod:`.sessions`: ``SessionOptions``, the provider lists and the one place an ``onnxruntime.InferenceSession`` is
  made;
- :mod:`.cpu`: ``ort-cpu``, its tuned session (graph optimizations saved once per file, fixed batch, no spinning) and
  the untuned one export verification asks for (:func:`attnzoo.runtime.backends.onnx_reference`);
- :mod:`.gpu`: ``ort-cuda`` and ``ort-trt``, I/O bound to CUDA memory, a CUDA graph where ONNX Runtime allows one.

It has no export format of its own: the verified ONNX it runs is the export pipeline's base, which every format
starts from (:mod:`attnzoo.export.formats.onnx_format`).
"""

from attnzoo.runtime.targets import Target

from .cpu import ORT_CPU, OrtCpuBackend, OrtSession
from .gpu import ORT_CUDA, ORT_TRT, OrtGpuBackend, OrtGpuSession

__all__ = ["TARGET", "ORT_CPU", "ORT_CUDA", "ORT_TRT", "OrtCpuBackend", "OrtSession", "OrtGpuBackend", "OrtGpuSession"]

TARGET = Target(
    "onnxruntime",
    "ONNX Runtime",
    "the verified ONNX file on ONNX Runtime's CPU provider (tuned), and its CUDA and TensorRT providers on a GPU",
    requires=("onnxruntime",),
    install="pip install onnxruntime (onnxruntime-gpu in its place for ort-cuda and ort-trt)",
    backends=(ORT_CPU, ORT_CUDA, ORT_TRT),
    order=20,
)
