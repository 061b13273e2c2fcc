"""The Triton target's own options, ``--triton-platform`` and ``--triton-queue-delay-us``, and the platforms a model
folder is written for (light: ``export-model`` reads them to make its flags)."""

from __future__ import annotations

from dataclasses import dataclass

from attnzoo.runtime.targets import FormatOption

__all__ = [
    "PLATFORMS",
    "MODEL_FILES",
    "DEFAULT_QUEUE_DELAY_US",
    "TritonPlatform",
    "TRITON_PLATFORMS",
    "PLATFORM",
    "QUEUE_DELAY_US",
]

#: ``--triton-platform`` -> Triton platform name.
PLATFORMS: dict[str, str] = {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan"}
#: Triton's default model file name in a version folder, per platform.
MODEL_FILES: dict[str, str] = {"onnxruntime_onnx": "model.onnx", "tensorrt_plan": "model.plan"}
#: How long Triton's dynamic batcher holds a request for others to join it.
DEFAULT_QUEUE_DELAY_US = 2000


@dataclass(frozen=True)
class TritonPlatform:
    """One ``--triton-platform``: the Triton platform the model's folder is written for.

    Attributes:
        name: The ``--triton-platform`` choice (a key of :data:`~attnzoo.targets.triton.config.PLATFORMS`).
        platform: Triton's platform name in ``config.pbtxt``.
        engine_library: The TensorRT library whose engines the platform loads (an engine built here from the
            verified ONNX is its model file); ``None``: it serves the ONNX itself.
    """

    name: str
    platform: str
    engine_library: str | None = None

    @property
    def builds_engine(self) -> bool:
        """Its model file is a TensorRT engine built from the verified ONNX, which stays beside ``1/``."""
        return self.engine_library is not None

    @property
    def model_file(self) -> str:
        """Triton's default model file name in the version folder."""
        return MODEL_FILES[self.platform]


#: Every ``--triton-platform`` by name, in :data:`~attnzoo.targets.triton.config.PLATFORMS`'s order.
TRITON_PLATFORMS: dict[str, TritonPlatform] = {
    p.name: p
    for p in (
        TritonPlatform("onnxruntime", PLATFORMS["onnxruntime"]),
        TritonPlatform("tensorrt", PLATFORMS["tensorrt"], engine_library="tensorrt"),
    )
}
#: ``--triton-platform`` and ``--triton-queue-delay-us``: the Triton target's options.
PLATFORM = FormatOption(
    "triton_platform",
    owner="triton",
    help="--format triton: onnxruntime (platform onnxruntime_onnx, default) or tensorrt (tensorrt_plan: an engine "
    "of TensorRT proper, built on the GPU it will serve on); max_batch_size is the largest of --batch-sizes",
    default="onnxruntime",
    choices=tuple(TRITON_PLATFORMS),
    title="Triton platform",
)
QUEUE_DELAY_US = FormatOption(
    "triton_queue_delay_us",
    owner="triton",
    help=f"--format triton: dynamic batching's max_queue_delay_microseconds (default {DEFAULT_QUEUE_DELAY_US})",
    default=DEFAULT_QUEUE_DELAY_US,
    kind=int,
    metavar="US",
)
