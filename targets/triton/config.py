"""Triton Inference Server model repositories from verified attnzoo exports.

A repository holds one folder per model::

    DIR/<name>/config.pbtxt      platform, max_batch_size, input/output, dynamic_batching
    DIR/<name>/labels.txt        class names, one a line (index = logit channel), named by label_filename
    DIR/<name>/1/model.onnx      the verified ONNX export (platform onnxruntime_onnx)
    DIR/<name>/1/model.plan      or a TensorRT engine built from it (platform tensorrt_plan)

Everything in ``config.pbtxt`` comes from the model contract (:mod:`attnzoo.runtime.contract`): input
``image`` float32 (3, H, W) and output ``logits`` float32 (K) or (K, H, W), the batch dimension left to Triton
(``max_batch_size`` > 0). Every written config is parsed with Triton's own protobuf schema
(``tritonclient.grpc.model_config_pb2.ModelConfig``) and checked against the model file's graph
(:func:`check_config`) before it is written; nothing is half-written (atomic writes, config last).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
from google.protobuf import text_format

from attnzoo.errors import install_hint
from attnzoo.fileio import atomic_write_text
from attnzoo.runtime.contract import INPUT_NAME, OUTPUT_NAME
from attnzoo.runtime.precision import get_precision

from .options import DEFAULT_QUEUE_DELAY_US, MODEL_FILES, PLATFORMS
from .schema import TritonConfigCheck, TritonIO

__all__ = [
    "PLATFORMS",
    "MODEL_FILES",
    "LABELS_FILE",
    "DEFAULT_QUEUE_DELAY_US",
    "triton_unavailable_reason",
    "model_name",
    "config_text",
    "parse_config",
    "check_config",
    "write_config",
    "summary",
]

LABELS_FILE = "labels.txt"
#: ONNX TensorProto element type -> Triton data type (the contract's tensors are float32; fp16 listed for
#: completeness).
_ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16"}


def triton_unavailable_reason() -> str | None:
    """Why Triton's config schema cannot be loaded here (one line), or None."""
    try:
        from tritonclient.grpc import model_config_pb2  # noqa: F401  # optional: the [serving] extra; installed?
    except ImportError as exc:
        return f"Triton's config schema needs tritonclient[grpc] ({exc}); install it with {install_hint('serving')}"
    return None


def model_name(contract: Any) -> str:
    """``<variant>_<task>_<arch>[_<dtype>]``, the name ``export-model`` gives the model's files."""
    return f"{contract.variant}_{contract.task}_{contract.arch}{get_precision(contract.dtype).file_tag}"


def _dims(values: Sequence[int]) -> str:
    return "[ " + ", ".join(str(int(v)) for v in values) + " ]"


def config_text(
    contract: Any, name: str, platform: str, max_batch_size: int, queue_delay_us: int = DEFAULT_QUEUE_DELAY_US
) -> str:
    """The ``config.pbtxt`` of one model (protobuf text format of Triton's ``ModelConfig``).

    Args:
        contract: The model's :class:`attnzoo.runtime.contract.ModelContract`.
        name: Model (and folder) name.
        platform: ``onnxruntime_onnx`` or ``tensorrt_plan``.
        max_batch_size: Largest batch Triton forms; the batch dimension is left out of ``dims``.
        queue_delay_us: Dynamic batching's ``max_queue_delay_microseconds``.
    """
    if platform not in MODEL_FILES:
        raise ValueError(f"unknown Triton platform {platform!r}; valid: {', '.join(MODEL_FILES)}")
    h, w = contract.input_size
    k = len(contract.class_names)
    out_dims = [k] if contract.task == "cls" else [k, h, w]
    return (
        f"# {contract.variant} {contract.task} ({contract.arch}, {contract.dtype}): written by export-model "
        "--format triton from the verified export\n"
        f'name: "{name}"\n'
        f'platform: "{platform}"\n'
        f"max_batch_size: {int(max_batch_size)}\n"
        f'input [\n  {{\n    name: "{INPUT_NAME}"\n    data_type: TYPE_FP32\n    dims: {_dims([3, h, w])}\n  }}\n]\n'
        f'output [\n  {{\n    name: "{OUTPUT_NAME}"\n    data_type: TYPE_FP32\n    dims: {_dims(out_dims)}\n'
        f'    label_filename: "{LABELS_FILE}"\n  }}\n]\n'
        f"dynamic_batching {{\n  max_queue_delay_microseconds: {int(queue_delay_us)}\n}}\n"
        "instance_group [\n  {\n    count: 1\n    kind: KIND_AUTO\n  }\n]\n"
    )


def parse_config(text: str, source: str = "config.pbtxt"):
    """Parse ``text`` with Triton's ``ModelConfig`` schema (from ``tritonclient``).

    Raises:
        ValueError: a field Triton does not know, a wrong type or syntax (the parser's message).
    """
    from tritonclient.grpc import model_config_pb2  # optional: tritonclient (the [serving] extra)

    try:
        return text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ValueError(f"{source}: not a valid Triton model config: {exc}") from None


def _graph_io(onnx_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(input, output) of the ONNX graph as {name, elem_type, shape} (symbolic dims as strings)."""
    graph = onnx.load(str(onnx_path), load_external_data=False).graph

    def info(v) -> dict[str, Any]:
        t = v.type.tensor_type
        return {
            "name": v.name,
            "elem_type": t.elem_type,
            "shape": [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim],
        }

    return info(graph.input[0]), info(graph.output[0])


def check_config(config, contract: Any, onnx_path: str | Path, labels: Sequence[str]) -> list[str]:
    """What is wrong with a parsed ``config`` for this model (empty: nothing).

    Checks the platform and model file, ``max_batch_size`` > 0 with a symbolic batch dimension in the graph,
    one input and one output with the graph's names, data types and non-batch dims (read from the ONNX
    file, not from the config's writer), the labels file (one name per logit channel, as in the contract) and
    dynamic batching.
    """
    from tritonclient.grpc import model_config_pb2 as pb  # optional: tritonclient (the [serving] extra)

    failures = []
    if config.platform not in MODEL_FILES:
        failures.append(f"platform {config.platform!r} is not one of {', '.join(MODEL_FILES)}")
    if config.max_batch_size < 1:
        failures.append(f"max_batch_size is {config.max_batch_size}; the batch dimension must be Triton's (> 0)")
    if not config.HasField("dynamic_batching"):
        failures.append("dynamic_batching is not enabled")
    g_in, g_out = _graph_io(Path(onnx_path))
    for kind, entries, graph in (("input", config.input, g_in), ("output", config.output, g_out)):
        if len(entries) != 1:
            failures.append(f"{len(entries)} {kind}s, the graph has 1")
            continue
        entry = entries[0]
        dtype = pb.DataType.Name(entry.data_type)
        if entry.name != graph["name"]:
            failures.append(f"{kind} name {entry.name!r}, the graph's is {graph['name']!r}")
        if dtype != _ONNX_TO_TRITON.get(graph["elem_type"]):
            failures.append(f"{kind} {entry.name}: data_type {dtype}, the graph's is ONNX type {graph['elem_type']}")
        batch, *rest = graph["shape"]
        if not isinstance(batch, str):
            failures.append(f"{kind} {entry.name}: the graph's batch dimension is fixed ({batch}), not symbolic")
        # symbolic non-batch dims in the graph (none in attnzoo exports) are checked against the contract only
        want = [d if isinstance(d, int) and d > 0 else -1 for d in rest]
        got = list(entry.dims)
        if len(got) != len(want) or any(w not in (-1, g) for w, g in zip(want, got, strict=False)):
            failures.append(f"{kind} {entry.name}: dims {got}, the graph's are {rest}")
    h, w = contract.input_size
    k = len(contract.class_names)
    expect_out = [k] if contract.task == "cls" else [k, h, w]
    if config.input and list(config.input[0].dims) != [3, h, w]:
        failures.append(f"input dims {list(config.input[0].dims)}, the contract's are {[3, h, w]}")
    if config.output and list(config.output[0].dims) != expect_out:
        failures.append(f"output dims {list(config.output[0].dims)}, the contract's are {expect_out}")
    if config.output and config.output[0].label_filename != LABELS_FILE:
        failures.append(f"output label_filename is {config.output[0].label_filename!r}, not {LABELS_FILE!r}")
    if list(labels) != list(contract.class_names):
        failures.append(f"{LABELS_FILE} has {len(labels)} lines that differ from the contract's {k} class names")
    return failures


def write_config(
    model_dir: str | Path,
    contract: Any,
    onnx_path: str | Path,
    platform: str,
    max_batch_size: int,
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US,
) -> TritonConfigCheck:
    """Write ``labels.txt`` and then ``config.pbtxt`` into ``model_dir``, after both pass :func:`check_config`.

    The model file itself (``1/model.onnx`` or ``1/model.plan``) must already be there; ``onnx_path`` is the
    verified ONNX it is (or was built from), whose graph the config is checked against.

    Returns:
        The verification part of the report (``passed``, ``failures``, what was parsed).

    Raises:
        ValueError: the config does not parse with Triton's schema or does not match the graph; nothing is
            written then.
    """
    model_dir = Path(model_dir)
    name = model_dir.name
    model_file = model_dir / "1" / MODEL_FILES.get(platform, "?")
    if not model_file.is_file():
        raise ValueError(f"{model_file} is missing; write the model file before its config")
    text = config_text(contract, name, platform, max_batch_size, queue_delay_us)
    labels_text = "".join(f"{c}\n" for c in contract.class_names)
    parsed = parse_config(text, str(model_dir / "config.pbtxt"))
    failures = check_config(parsed, contract, onnx_path, labels_text.splitlines())
    if parsed.name != name:
        failures.append(f"config name {parsed.name!r} differs from its folder {name!r}")
    if failures:
        raise ValueError(f"{model_dir.name}: the Triton config does not match the model: {'; '.join(failures)}")
    atomic_write_text(model_dir / LABELS_FILE, labels_text)
    atomic_write_text(model_dir / "config.pbtxt", text)  # last: a folder with a config is complete
    return TritonConfigCheck(
        passed=True,
        failures=[],
        schema="tritonclient.grpc.model_config_pb2.ModelConfig",
        platform=parsed.platform,
        max_batch_size=parsed.max_batch_size,
        input=TritonIO(name=parsed.input[0].name, dims=list(parsed.input[0].dims)),
        output=TritonIO(name=parsed.output[0].name, dims=list(parsed.output[0].dims)),
        dynamic_batching_max_queue_delay_us=parsed.dynamic_batching.max_queue_delay_microseconds,
        labels=len(contract.class_names),
    )


def summary(model_dir: str | Path, check: TritonConfigCheck) -> str:
    """Two lines for the terminal."""
    return (
        f"{model_dir}: Triton model ({check.platform}, max_batch_size {check.max_batch_size}, "
        f"input {check.input.dims}, output {check.output.dims}, {check.labels} labels)\n"
        f"  config.pbtxt parsed with Triton's schema ({check.schema}) and matches the graph: PASSED"
    )
