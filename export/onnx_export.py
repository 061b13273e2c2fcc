"""ONNX export: dynamo exporter, module-path node names, the metadata contract, optional fp16 graph.

The exported graph keeps every op ordinary ONNX (attention decomposes into MatMul/Softmax/MatMul at opset
20; the orthogonal projection stays Mul/ReduceSum/Add/Div/Mul/Sub, and a variant's ``extra_scopes`` keep their
ops, computed in fp32 also in an fp16 graph). Each node is renamed from the module
path the exporter records in its ``pkg.torch.onnx.name_scopes`` metadata, e.g.
``blocks.3.attn.projection/Div``, so profilers and graph viewers show where an op comes from.

Metadata (``metadata_props``, all strings): ``attnzoo.config`` (JSON of the checkpoint config) and the flat
keys ``variant``, ``task``, ``arch``, ``options``, ``class_names``, ``input_size``, ``mean``, ``std``, ``eps``,
``attnzoo_version``, ``checkpoint_sha256``, ``dtype``. Input ``image`` (batch, 3, H, W) float32, output
``logits`` float32, for both dtypes (an fp16 graph casts at its input and output).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import json
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import onnx
import timm.layers.pos_embed as pos_embed
import torch
import torch.nn.functional as F
from torch import nn

from attnzoo import __version__
from attnzoo.fileio import atomic_path
from attnzoo.models import VARIANTS
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, input_style_of
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.contract import BATCH_DIM, INPUT_NAME, OUTPUT_NAME, config_from_props, metadata_props
from attnzoo.runtime.precision import PRECISIONS, TRACED

__all__ = [
    "export_onnx",
    "contract_metadata",
    "make_session",
    "read_metadata",
    "config_hw",
    "op_histogram",
    "SUPPORTED_OPSETS",
    "DTYPES",
]

#: Opsets the torch dynamo exporter and ONNX Runtime both handle for these models.
SUPPORTED_OPSETS: tuple[int, ...] = (18, 19, 20, 21, 22, 23)
#: The precisions a model is traced at (the quantized ones start from the verified fp32 graph).
DTYPES: tuple[str, ...] = TRACED
#: Protobuf's hard limit: bigger models keep their weights in an external data file.
_PROTO_LIMIT = 2**31 - 1
_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
_DROP_NODE_METADATA = ("pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node")


def _module_path(node: onnx.NodeProto) -> str:
    """Deepest module path of a node from its ``name_scopes`` metadata ('' at the root)."""
    for prop in node.metadata_props:
        if prop.key == _SCOPES_KEY:
            scopes = ast.literal_eval(prop.value)  # a list literal written by the exporter
            modules = [s for s in scopes[:-1] if s and not s.startswith("_")]  # last entry: the fx node
            return modules[-1] if modules else ""
    return ""


def _rename_nodes(graph: onnx.GraphProto) -> None:
    """Name every node ``<module path>/<OpType>[_k]`` and drop bulky per-node metadata (stack traces)."""
    seen: Counter = Counter()
    for node in graph.node:
        base = f"{_module_path(node)}/{node.op_type}"
        node.name = base if not seen[base] else f"{base}_{seen[base]}"
        seen[base] += 1
        keep = [p for p in node.metadata_props if p.key not in _DROP_NODE_METADATA]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)


class _FP32LayerNorm(nn.Module):
    """LayerNorm computed in fp32 inside an fp16 model: Cast -> LayerNormalization (fp32) -> Cast."""

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.normalized_shape = tuple(norm.normalized_shape)
        self.eps = norm.eps
        self.weight = None if norm.weight is None else nn.Parameter(norm.weight.detach().float().clone())
        self.bias = None if norm.bias is None else nn.Parameter(norm.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), self.normalized_shape, self.weight, self.bias, self.eps).to(x.dtype)


def _keep_fp32(module: nn.Module) -> None:
    """Make ``module`` (an extra-math scope) compute in fp32 inside an fp16 model, keeping its module path.

    Its parameters become fp32, and its class is swapped for a subclass whose ``forward`` casts floating inputs
    to fp32 and floating outputs back to the first input's dtype (``Cast`` nodes inside the scope).
    """
    base = type(module)
    if getattr(base, "_attnzoo_fp32", False):
        return

    def to(value: Any, dtype: torch.dtype) -> Any:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(dtype)
        if isinstance(value, (tuple, list)):
            return type(value)(to(v, dtype) for v in value)
        return value

    def forward(self, *args, **kwargs):
        floats = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        out_dtype = floats[0].dtype if floats else torch.float32
        out = base.forward(self, *to(args, torch.float32), **{k: to(v, torch.float32) for k, v in kwargs.items()})
        return to(out, out_dtype)

    module.float()
    module.__class__ = type(
        base.__name__, (base,), {"forward": forward, "_attnzoo_fp32": True, "__module__": base.__module__}
    )


def _fp16_model(model: nn.Module, extra_scopes: Sequence[str] = ()) -> nn.Module:
    """A half-precision copy of ``model`` whose LayerNorms and extra-math scopes (``<...>.attn.<scope>``, the
    variant's ``extra_scopes``) run in fp32, with ``model``'s own fp32 parameters (not fp16-rounded ones)."""
    half = copy.deepcopy(model).half().eval()
    for name, module in list(half.named_modules()):
        if isinstance(module, nn.LayerNorm):
            parent, _, attr = name.rpartition(".")
            setattr(
                half.get_submodule(parent) if parent else half,
                attr,
                _FP32LayerNorm(cast(nn.LayerNorm, model.get_submodule(name))),
            )
    for name, module in list(half.named_modules()):
        if any(name == f"attn.{scope}" or name.endswith(f".attn.{scope}") for scope in extra_scopes):
            _keep_fp32(module)
            module.load_state_dict(model.get_submodule(name).state_dict())  # exact fp32 values
    return half


def _cast(name: str, src: str, dst: str, to: int) -> onnx.NodeProto:
    return onnx.helper.make_node("Cast", [src], [dst], name=name, to=to)


def _fp32_softmax_and_io(graph: onnx.GraphProto) -> None:
    """Wrap every Softmax in Cast-to-fp32 / Cast-to-fp16, and give the fp16 graph fp32 input and output."""
    fp32, fp16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    inp, out = graph.input[0], graph.output[0]
    nodes = [_cast("input/Cast", inp.name, f"{inp.name}_fp16", fp16)]
    for node in graph.node:
        node.input[:] = [f"{inp.name}_fp16" if i == inp.name else i for i in node.input]
        if node.op_type == "Softmax":
            x, y = node.input[0], node.output[0]
            nodes.append(_cast(f"{node.name}_cast_in", x, f"{x}_fp32", fp32))
            node.input[0], node.output[0] = f"{x}_fp32", f"{y}_fp32"
            nodes += [node, _cast(f"{node.name}_cast_out", f"{y}_fp32", y, fp16)]
            continue
        node.output[:] = [f"{out.name}_fp16" if o == out.name else o for o in node.output]
        nodes.append(node)
    nodes.append(_cast("output/Cast", f"{out.name}_fp16", out.name, fp32))
    inp.type.tensor_type.elem_type = fp32
    out.type.tensor_type.elem_type = fp32
    del graph.node[:]
    graph.node.extend(nodes)
    for info in [v for v in graph.value_info if v.name in (inp.name, out.name)]:
        graph.value_info.remove(info)


def _full_attention_masks(graph: onnx.GraphProto) -> None:
    """Give every standard ``Attention`` op (opset 23) with a mask the mask at its full ``(batch, heads, queries,
    keys)`` shape: the exporter writes a per-key bias (``wafe-mse``'s ``-||k||^2/d``) as ``(batch, heads, 1, keys)``,
    which the ONNX standard broadcasts but ONNX Runtime's CPU kernel refuses ("inconsistent q_sequence_length").
    One ``Expand`` per op, to ``Shape(Q)[:3] + Shape(K)[2:3]``; the op stays one fused core."""
    nodes = []
    for node in graph.node:
        if node.op_type == "Attention" and node.domain in ("", "ai.onnx") and len(node.input) > 3 and node.input[3]:
            q, k, mask, name = node.input[0], node.input[1], node.input[3], node.name
            nodes += [
                onnx.helper.make_node("Shape", [q], [f"{name}/q_shape"], name=f"{name}/QShape", start=0, end=3),
                onnx.helper.make_node("Shape", [k], [f"{name}/k_len"], name=f"{name}/KShape", start=2, end=3),
                onnx.helper.make_node(
                    "Concat",
                    [f"{name}/q_shape", f"{name}/k_len"],
                    [f"{name}/mask_shape"],
                    name=f"{name}/MaskShape",
                    axis=0,
                ),
                onnx.helper.make_node(
                    "Expand", [mask, f"{name}/mask_shape"], [f"{name}/full_mask"], name=f"{name}/MaskExpand"
                ),
            ]
            node.input[3] = f"{name}/full_mask"
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def contract_metadata(
    config: Mapping[str, Any], input_hw: tuple[int, int], dtype: str, checkpoint_sha256: str
) -> dict[str, str]:
    """The metadata_props contract shared with the benchmarks and the demo (an ExecuTorch program's report holds the
    same entries: :class:`attnzoo.runtime.contract.ModelContract` reads either)."""
    config = dict(config)
    config.setdefault("class_names", [str(i) for i in range(int(config["num_classes"]))])
    config.setdefault("mean", list(DEFAULT_MEAN))
    config.setdefault("std", list(DEFAULT_STD))
    options = dict(config.get("options", {}))
    eps = options.get("eps") if _extra_scopes(config) else None  # the eps of the extra math (projections)
    return {
        "attnzoo.config": json.dumps(config),
        "variant": str(config["variant"]),
        "task": str(config["task"]),
        "arch": str(config["arch"]),
        "options": json.dumps(options),
        "class_names": json.dumps(list(config["class_names"])),
        "input_size": json.dumps([int(input_hw[0]), int(input_hw[1])]),
        "mean": json.dumps([float(m) for m in config["mean"]]),
        "std": json.dumps([float(s) for s in config["std"]]),
        "eps": "" if eps is None else repr(float(eps)),
        "attnzoo_version": __version__,
        "checkpoint_sha256": checkpoint_sha256,
        "dtype": dtype,
        "input_style": input_style_of(config),
    }


def _extra_scopes(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The variant's registered ``extra_scopes`` (none for an unregistered variant name)."""
    spec = VARIANTS.get(str(config["variant"]))
    return spec.extra_scopes if spec is not None else ()


def config_hw(config: Mapping[str, Any]) -> tuple[int, int]:
    """The config's input (H, W): ``img_size`` is an int (square) or an [H, W] pair."""
    size = config["img_size"]
    return (int(size), int(size)) if isinstance(size, (int, float)) else (int(size[0]), int(size[1]))


def _save_atomic(proto: onnx.ModelProto, path: Path) -> None:
    """Save through a temporary file and a rename; weights go to ``<name>.data`` only past 2 GB."""
    external = proto.ByteSize() > _PROTO_LIMIT
    with atomic_path(path) as tmp:
        if external:
            onnx.save_model(
                proto, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True, location=f"{path.name}.data"
            )
        else:
            onnx.save_model(proto, str(tmp))


@contextlib.contextmanager
def _fixed_size_pos_embed():
    """Let timm skip resampling a position embedding to the size it already has while exporting.

    timm keeps that (identity) bicubic, antialiased Resize in exported graphs so that they are not specialised to
    the example's size (``timm.layers.pos_embed.resample_abs_pos_embed``). Our exports fix H and W (only the batch
    is dynamic), so the early-out is right, and it keeps an op out of the graph that TensorRT cannot parse
    (antialiased Resize). A model exported at another size than its grid still gets its resample.
    """
    original = pos_embed.is_exporting
    pos_embed.is_exporting = lambda: False
    try:
        yield
    finally:
        pos_embed.is_exporting = original


def export_onnx(
    model: nn.Module,
    path: str | Path,
    *,
    config: Mapping[str, Any] | None = None,
    opset: int = 20,
    dtype: str = "fp32",
    input_hw: tuple[int, int] | None = None,
    checkpoint_sha256: str = "",
) -> Path:
    """Export ``model`` to ``path`` as ONNX with a dynamic batch dimension and the attnzoo metadata.

    Args:
        model: A model from ``attnzoo.models.create_model``, ``convert_to_belief2`` or a loaded checkpoint;
            exported in eval mode.
        path: Output ``.onnx`` file (written through a temporary file and a rename).
        config: The checkpoint config (variant, options, task, arch, num_classes, img_size, class_names,
            mean, std ...); stored as metadata. Default: the model's ``attnzoo_config`` (a converted timm ViT
            carries its own mean/std and input size; missing mean/std/class names get the defaults).
        opset: ONNX opset (``SUPPORTED_OPSETS``).
        dtype: ``fp32`` or ``fp16`` (LayerNorm, softmax and the variant's extra scopes stay fp32 via Cast nodes).
        input_hw: Input (H, W); default the config's ``img_size`` (an int, or [H, W]). Segmenters take
            non-square sizes.
        checkpoint_sha256: sha256 of the source checkpoint ('' for a fresh model).

    Returns:
        The written path.

    Raises:
        ValueError: unsupported opset or dtype, no config (given or on the model), or the exporter failed.
    """
    if opset not in SUPPORTED_OPSETS:
        raise ValueError(f"unsupported opset {opset}; supported: {', '.join(map(str, SUPPORTED_OPSETS))}")
    precision = PRECISIONS.get(dtype)
    if precision is None or precision.quantized:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    if config is None:
        config = getattr(model, "attnzoo_config", None)
        if config is None:
            raise ValueError(
                "the model has no attnzoo_config; pass config= (variant, task, arch, num_classes, "
                "img_size, options ...)"
            )
    path = Path(path)
    hw = (input_hw[0], input_hw[1]) if input_hw else config_hw(config)
    model = _fp16_model(model, _extra_scopes(config)) if precision.half else model.eval()
    example = torch.randn(2, 3, *hw, dtype=torch.float16 if precision.half else torch.float32)
    from .onnx_l1 import TRANSLATIONS  # onnxscript, as torch's exporter: imported by an export only

    with torch.no_grad(), warnings.catch_warnings(), _fixed_size_pos_embed():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                model,
                (example,),
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_shapes=({0: torch.export.Dim(BATCH_DIM, min=1, max=65536)},),
                opset_version=opset,
                dynamo=True,
                optimize=True,
                verbose=False,
                report=False,
                custom_translation_table=TRANSLATIONS,  # attnzoo::l1_attention as one Loop (WAFE-MAE)
            )
        except Exception as exc:  # the exporter raises many types; report one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"torch.onnx.export failed at opset {opset}: {first}") from exc
    assert program is not None  # dynamo=True always returns the ONNXProgram
    proto = program.model_proto
    _rename_nodes(proto.graph)
    _full_attention_masks(proto.graph)
    if precision.half:
        _fp32_softmax_and_io(proto.graph)
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, contract_metadata(config, hw, dtype, checkpoint_sha256))
    proto.doc_string = f"attnzoo {config['variant']} ({config['task']}, {config['arch']}), {dtype}"
    _save_atomic(proto, path)
    return path


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The checkpoint config stored in an attnzoo ONNX file (``attnzoo.config``), parsed.

    Raises:
        ValueError: the file has no attnzoo metadata.
    """
    return config_from_props(metadata_props(path), path)


def make_session(path: str | Path, threads: int | None = None):
    """The ``onnxruntime.InferenceSession`` every export is verified on: the ``ort-cpu`` backend's untuned session
    (:meth:`~attnzoo.runtime.backends.OnnxReference.session`)."""
    return onnx_reference().session(path, threads).session


def op_histogram(proto: onnx.ModelProto) -> dict[str, int]:
    """Op type -> count, most frequent first."""
    return dict(Counter(n.op_type for n in proto.graph.node).most_common())
