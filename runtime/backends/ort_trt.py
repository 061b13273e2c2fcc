"""``ort-trt``: ONNX Runtime's TensorRT execution provider (engine cache on disk, CUDA for what it rejects)."""

from __future__ import annotations

from . import register_backend
from .ort_cuda import OrtGpuBackend

__all__ = ["ORT_TRT"]

ORT_TRT = register_backend(OrtGpuBackend(
    "ort-trt", "ONNX Runtime, TensorRT execution provider (engines cached on disk), CUDA for the rest",
    aliases=("onnxruntime-tensorrt", "tensorrt-ep"), takes="onnx", device="cuda", dtypes=("fp32", "fp16"),
    provider="tensorrt-ep"))
