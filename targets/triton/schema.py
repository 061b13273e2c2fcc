"""The Triton target's report: the check of a model folder's ``config.pbtxt`` against the graph (``python -m
attnzoo.runtime.schemas triton`` prints its JSON Schema)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from attnzoo.runtime.schemas import JsonReport

__all__ = ["TritonIO", "TritonConfigCheck"]


@dataclass
class TritonIO(JsonReport):
    """A Triton config's input or output: its name and its dims (``-1`` for a dynamic one; no batch dim)."""

    name: str
    dims: list[int]


@dataclass
class TritonConfigCheck(JsonReport):
    """The check of a Triton model folder's ``config.pbtxt`` (parsed with Triton's own schema) against the graph.

    Attributes:
        passed, failures: It parsed and matches the model (a folder is written only then).
        schema: The protobuf message it was parsed with.
        platform: ``onnxruntime_onnx`` or ``tensorrt_plan``.
        max_batch_size: The batch dynamic batching may form.
        input, output: The model's tensors as the config names them.
        dynamic_batching_max_queue_delay_us: How long Triton waits to fill a batch.
        labels: Lines of ``labels.txt`` (the model's class names).
    """

    what: ClassVar[str] = "triton config check"

    passed: bool
    failures: list[str]
    schema: str
    platform: str
    max_batch_size: int
    input: TritonIO
    output: TritonIO
    dynamic_batching_max_queue_delay_us: int
    labels: int
