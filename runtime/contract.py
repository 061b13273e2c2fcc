"""The model contract: what an attnzoo ONNX file promises its users, read from its ``metadata_props`` (or, for an
OpenVINO IR ``.xml`` that ``export-model --format openvino`` wrote, from the same entries in its ``rt_info`` section
:data:`IR_RT_INFO`).

``export-model`` writes it (:func:`attnzoo.export.export_onnx`); the demo, the benchmark and the TensorRT
builder read it from here and nowhere else. Input ``image`` (batch, 3, H, W) float32, output ``logits``
float32 ((batch, K) or (batch, K, H, W)), for fp32 and fp16 graphs alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnzoo.errors import first_line
from attnzoo.filekind import MISSING, ONNX, file_kind
from attnzoo.lazy import lazy_import
from attnzoo.limits import MAX_ONNX_BYTES, check_side
from attnzoo.modelconfig import validate_config
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, INPUT_STYLES, input_style_of

from .sessions import IR_SUFFIX

onnx = lazy_import("onnx")
ov = lazy_import("openvino")  # the reader of an IR's entries (its weights are read with it)

__all__ = [
    "INPUT_NAME",
    "OUTPUT_NAME",
    "BATCH_DIM",
    "IR_RT_INFO",
    "openvino_error",
    "read_ir",
    "ModelContract",
    "metadata_props",
    "check_onnx_file",
    "config_from_props",
]

INPUT_NAME = "image"
OUTPUT_NAME = "logits"
BATCH_DIM = "batch"
#: The ``rt_info`` section of an OpenVINO IR that holds the entries an ONNX file keeps in ``metadata_props``.
IR_RT_INFO = "attnzoo"


def openvino_error(exc: BaseException) -> str:
    """The reason in an OpenVINO exception: its last line that is not a source location or a failed check's
    header (its first line is ``Exception from src/...cpp:NN:``)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Exception from ", "Check '"))]
    return (useful or lines or [type(exc).__name__])[-1]


def read_ir(path: str | Path) -> Any:
    """OpenVINO's model of an IR ``.xml`` (with its ``.bin``) or an ONNX file, as its reader makes it: the reader
    of an IR's contract (:data:`IR_RT_INFO`) and of the OpenVINO target's models.

    Raises:
        ValueError: OpenVINO cannot read the file (naming it and the reason).
    """
    try:
        return ov.Core().read_model(str(path))
    except RuntimeError as exc:  # OpenVINO's message: a source location first, the reason last
        raise ValueError(f"{Path(path).name}: OpenVINO cannot read it: {openvino_error(exc)}") from None


def _ir_props(path: Path) -> dict[str, str]:
    """The :data:`IR_RT_INFO` entries of an OpenVINO IR ``.xml`` (read by OpenVINO with its ``.bin``; ``ValueError``
    naming the file when OpenVINO cannot read it)."""
    model = read_ir(path)
    if not model.has_rt_info([IR_RT_INFO]):
        return {}
    return {str(k): str(v.astype(str)) for k, v in model.get_rt_info()[IR_RT_INFO].items()}


def metadata_props(model: str | Path | Any) -> dict[str, str]:
    """All ``metadata_props`` of an ONNX file (external weights are not loaded) or model proto, as a dict of
    strings; for an OpenVINO IR ``.xml``, its :data:`IR_RT_INFO` entries. A file is checked to be a regular file
    within :data:`attnzoo.limits.MAX_ONNX_BYTES` before any byte of it is parsed.

    Raises:
        ValueError: not a regular file (a directory ...), larger than an ONNX file can be, or not an ONNX model
            (what it is named: a text file, a zip archive, ...).
    """
    if not isinstance(model, onnx.ModelProto):
        check_onnx_file(model)
        if Path(model).suffix.lower() == IR_SUFFIX:
            return _ir_props(Path(model))
    proto = model if isinstance(model, onnx.ModelProto) else _read_proto(Path(model))
    return {p.key: p.value for p in proto.metadata_props}


def _read_proto(path: Path) -> Any:
    """The ONNX model in ``path`` without its external weights; ``ValueError`` saying what the file is when it holds
    no ONNX model (a protobuf parser reads some bytes of other files, an empty one for instance, as a model with no
    graph)."""
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        kind = file_kind(path)
        if kind == ONNX:  # it starts as a model does: cut short or damaged
            raise ValueError(f"{path.name}: not a readable ONNX model file ({first_line(exc)})") from None
        raise ValueError(f"{path.name}: is {kind}, not an ONNX model file") from None
    if not proto.HasField("graph"):
        raise ValueError(f"{path.name}: is {file_kind(path)}, not an ONNX model file (it holds no graph)")
    return proto


def check_onnx_file(path: str | Path) -> None:
    """``ValueError`` naming ``path`` unless it is a regular file of at most :data:`attnzoo.limits.MAX_ONNX_BYTES`
    (a protobuf cannot be larger; bigger models keep their weights in external data files); a directory, a FIFO or
    a device is named as such and never opened."""
    path = Path(path)
    if not path.is_file():
        kind = file_kind(path)
        raise ValueError(f"{path.name}: {kind}" if kind == MISSING else f"{path.name}: is {kind}, not a model file")
    size = path.stat().st_size
    if size > MAX_ONNX_BYTES:
        raise ValueError(
            f"{path.name}: {size / 2**30:.1f} GiB, over the {MAX_ONNX_BYTES / 2**30:.0f} GiB an ONNX file "
            "can be (larger models keep their weights in external data); not read"
        )


def config_from_props(props: Mapping[str, str], source: Any = "model") -> dict[str, Any]:
    """The checkpoint config (``attnzoo.config``) from already-read metadata props.

    Raises:
        ValueError: the props hold no attnzoo config.
    """
    if "attnzoo.config" not in props:
        raise ValueError(f"{source}: no attnzoo.config in its metadata (not exported by attnzoo)")
    return json.loads(props["attnzoo.config"])


@dataclass(frozen=True)
class ModelContract:
    """One exported model as its consumers see it.

    Attributes:
        variant, task, arch: What the model is (``task``: ``cls`` or ``seg``).
        dtype: ``fp32`` or ``fp16`` (the graph's compute precision; its input/output stay float32).
        input_size: (H, W) the graph was exported at (fixed spatial size).
        class_names: Index = logit channel.
        mean, std: Input normalisation.
        eps: The projection's epsilon (``None`` for variants without one).
        checkpoint_sha256: The weights it came from ('' for a random init).
        config: The full checkpoint config (``attnzoo.config``).
        props: Every metadata entry, as stored.
        source: The file it was read from.
        input_style: How an image is converted before preprocessing (:data:`attnzoo.preprocess.INPUT_STYLES`;
            ``input_style`` metadata, else derived from the config, as older exports lack the entry).
    """

    variant: str
    task: str
    arch: str
    dtype: str
    input_size: tuple[int, int]
    class_names: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    eps: Any
    checkpoint_sha256: str
    config: dict[str, Any] = field(repr=False, hash=False, compare=False)
    props: dict[str, str] = field(repr=False, hash=False, compare=False)
    source: str = ""
    input_style: str = "rgb"

    @classmethod
    def from_props(cls, props: Mapping[str, str], source: Any = "model") -> ModelContract:
        """Parse already-read metadata props.

        Raises:
            ValueError: not an attnzoo export, or a required entry is missing or malformed; the config is checked
                by :func:`attnzoo.modelconfig.validate_config` and the input size against
                :data:`attnzoo.limits.MAX_SIDE`.
        """
        config = validate_config(config_from_props(props, source), source)
        try:
            size = json.loads(props["input_size"]) if "input_size" in props else [config["img_size"]] * 2
        except ValueError as exc:
            raise ValueError(f"{source}: malformed input_size metadata ({exc})") from None
        if not isinstance(size, list) or len(size) != 2:
            raise ValueError(f"{source}: input_size metadata must be [H, W], got {props.get('input_size')!r}")
        for side in size:
            check_side(side, f"{source}: input_size")
        style = props.get("input_style") or input_style_of(config)
        if style not in INPUT_STYLES:
            raise ValueError(f"{source}: unknown input_style {style!r}; valid: {', '.join(INPUT_STYLES)}")
        try:
            names = [str(c) for c in config.get("class_names") or range(int(config["num_classes"]))]
            eps = props.get("eps") or None
            return cls(
                variant=str(config["variant"]),
                task=str(config["task"]),
                arch=str(config.get("arch", "")),
                dtype=props.get("dtype", "fp32"),
                input_size=(int(size[0]), int(size[-1])),
                class_names=tuple(names),
                mean=tuple(float(v) for v in config.get("mean", DEFAULT_MEAN)),
                std=tuple(float(v) for v in config.get("std", DEFAULT_STD)),
                eps=float(eps) if eps is not None else None,
                checkpoint_sha256=props.get("checkpoint_sha256", ""),
                config=dict(config),
                props=dict(props),
                source=str(source),
                input_style=style,
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"{source}: malformed attnzoo metadata ({type(exc).__name__}: {exc})") from None

    @classmethod
    def from_onnx(cls, model: str | Path | Any) -> ModelContract:
        """Read the contract of an ONNX file (or proto) without loading its weights, or of an OpenVINO IR ``.xml``
        (:func:`metadata_props`)."""
        return cls.from_props(metadata_props(model), model if isinstance(model, (str, Path)) else "model")

    def input_shape(self, batch: int) -> tuple[int, int, int, int]:
        """The NCHW input shape at ``batch``."""
        return (int(batch), 3, *self.input_size)
