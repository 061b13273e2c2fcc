"""The OpenVINO target: the ``openvino`` backend (OpenVINO's CPU plugin on the same verified ONNX file, its bf16 and
NNCF int8 paths), ``--format openvino`` (an OpenVINO IR verified before it is written) and the bf16 verification
that serving asks for.

The modules, by role:

- :mod:`.library`: whether OpenVINO runs here and its version, reading a model, the per-node f32 pins of bf16 and
  their read-back from the compiled model, NNCF's int8 of the fp32 ONNX, and the IR files written in place;
- :mod:`.backend`: the ``openvino`` backend, its sessions and the one place an OpenVINO model is compiled
  (``compile_onnx``);
- :mod:`.format` and its checks :mod:`.checks`: ``--format openvino``, the IR's graph checks (the extra math per
  block at f32, a dynamic batch, the contract in its ``rt_info``) and an int8 IR's gates, its report
  :mod:`.schema`;
- :mod:`.bf16`: bf16 served only once verified on the test split (``serve-demo`` / ``serve-models --dtype bf16``).

Every public name of :mod:`.library` is importable from here. A test that replaces one of its functions patches it in
:mod:`.library` (the backend, the format and its checks call it there). The fusion audit's OpenVINO reading stays in
:mod:`attnzoo.runtime.fusion`, which audits every runtime by one definition of "fused" and opens OpenVINO's compiled
model through the backend registry.
"""

from __future__ import annotations

from attnzoo.runtime.targets import Target

from . import library
from .backend import OPENVINO, OpenVINOBackend, OpenVINORuntimeSession, OpenVINOSession, compile_onnx, tensor_values
from .library import *  # noqa: F403 -- the library's public names (its __all__) are the package's face
from .schema import OpenVINOReport, SourceOnnx

__all__ = [
    "TARGET",
    "OPENVINO",
    "OpenVINOBackend",
    "OpenVINORuntimeSession",
    "OpenVINOSession",
    "compile_onnx",
    "tensor_values",
    "OpenVINOReport",
    "SourceOnnx",
]
__all__ += library.__all__

TARGET = Target(
    "openvino",
    "OpenVINO",
    "OpenVINO's CPU plugin on the verified ONNX file or an OpenVINO IR of it (bf16 with the extra math pinned to "
    "f32, NNCF's int8), and IR files verified before they are written",
    requires=("openvino",),
    install="pip install openvino",
    backends=(OPENVINO,),
    formats={"openvino": "attnzoo.targets.openvino.format:FORMAT"},
    reports={"openvino": OpenVINOReport},
    order=25,
)
