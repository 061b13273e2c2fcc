"""``ort-trt``: ONNX Runtime's TensorRT execution provider (engine cache on disk, CUDA for what it rejects).

The network is strongly typed (no ``trt_fp16_enable``: the fp16 export's own types hold, its fp32 islands stay
fp32). TensorRT's TF32 flag cannot be cleared through the EP, so its fp32 rows are ``tf32`` rows
(:func:`attnzoo.runtime.sessions.providers_for`)."""

from __future__ import annotations

from . import register_backend
from .ort_cuda import OrtGpuBackend

__all__ = ["ORT_TRT"]

ORT_TRT = register_backend(
    OrtGpuBackend(
        "ort-trt",
        "ONNX Runtime, TensorRT execution provider (engines cached on disk), CUDA for the rest",
        aliases=("onnxruntime-tensorrt", "tensorrt-ep"),
        takes="onnx",
        device="cuda",
        dtypes=("tf32", "fp16"),
        reads=("cache_dir",),
        library="onnxruntime",
        provider="tensorrt-ep",
    )
)
