"""The Triton target: ``--format triton`` writes a model's folder of a Triton Inference Server model repository
(``config.pbtxt`` checked with Triton's own schema, ``labels.txt``, the verified ONNX or a TensorRT engine), with its
options ``--triton-platform`` and ``--triton-queue-delay-us``. Serving it is Triton's; this package runs no Triton
server."""

from attnzoo.runtime.targets import Target

from .options import PLATFORM, QUEUE_DELAY_US
from .schema import TritonConfigCheck, TritonIO

__all__ = ["TARGET", "TritonConfigCheck", "TritonIO"]

TARGET = Target(
    "triton",
    "Triton",
    "model repositories for the Triton Inference Server (ONNX Runtime or TensorRT platform)",
    requires=("tritonclient",),
    install="pip install 'attnzoo[serving]' (tritonclient: Triton's config schema)",
    formats={"triton": "attnzoo.targets.triton.format:FORMAT"},
    reports={"triton": TritonConfigCheck},
    options=(PLATFORM, QUEUE_DELAY_US),
    order=60,
)
