"""attnzoo.runtime: the one deployment layer that export, the benchmark and the demo share.

- :mod:`.contract`: the model contract read from ONNX metadata (:class:`ModelContract`, input/output names);
- :mod:`.backends`: the backend registry, one ``load(model, LoadOptions)`` for every way a model runs;
- :mod:`.device`: the device helpers the backends share (GPU memory, TF32);
- :mod:`.sessions`: which exported files are served (their verification reports, read and checked);
- :mod:`.openvino`: OpenVINO on the CPU, reading the same ONNX files;
- :mod:`.choice`: which CPU runtime is fastest on this machine, measured;
- :mod:`.tensorrt`: TensorRT (``tensorrt_rtx`` or ``tensorrt``) parse, build, load and run;
- :mod:`.parity`: one parity check with one tolerance table.
"""

from .contract import BATCH_DIM, INPUT_NAME, OUTPUT_NAME, ModelContract, config_from_props, metadata_props
from .parity import TOLERANCES, compare, parity_error, tolerance_key

__all__ = [
    "ModelContract",
    "INPUT_NAME",
    "OUTPUT_NAME",
    "BATCH_DIM",
    "metadata_props",
    "config_from_props",
    "TOLERANCES",
    "tolerance_key",
    "parity_error",
    "compare",
]
