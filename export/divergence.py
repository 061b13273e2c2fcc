"""Where an export diverges: the error at each attention block's output, and inside the first block over the
tolerance, the op that adds the most error.

Block outputs are read through the module scopes the exported graph keeps in its node names
(``blocks.N/<Op>``, ``encoder.blocks.N/...`` in a Segmenter, :func:`attnzoo.export.check.block_prefix`): block
N's output is the last tensor produced inside scope ``blocks.N`` that a node outside every block, or of a later
block, reads (the block's final residual ``Add``). Only those tensors, one per block, are added as outputs of an
in-memory copy of the graph, which ONNX Runtime's CPU session (``onnx_reference().session``) runs once on a few inputs
(the verification's smallest batch, whose eager block outputs its own forward kept); nothing else is marked.
The reference is the eager model's block outputs (forward hooks on each block) for fp32 and fp16 exports, and the
verified fp32 graph's own tensors of the same names for int8 / fp8 Q/DQ graphs.

Per block: ``max_abs_err`` (``max |out - ref|``), ``rel_err`` (that over ``max(1, max |ref|)``, the measure of
:data:`attnzoo.runtime.parity.TOLERANCES`) and ``cosine`` (the outputs flattened). A block is over the tolerance
when its ``rel_err`` exceeds the precision's tolerance (fp32, fp16), or its cosine falls below the fidelity gate
(int8, fp8, whose export is gated on the cosine); the first such block is ``first_diverging_block``.

Inside that block only, every op is compared where a reference exists: against eager, the output of each module
scope inside the block (``blocks.1.attn.proj``, ``blocks.1.mlp.fc1``, ...; the last tensor of the scope that a
node outside it reads) with the output of the eager sub-module of that name (forward hooks); against the fp32 graph,
every float output of every node of the block, by tensor name. ``worst_op`` is the op whose output error grows most
over the largest error measured before it in the block (the block's input, the previous block's output, included):
the op that adds the most error, not one that only carries an error made upstream.

A runtime's own model converted from the graph that keeps its tensor names (an OpenVINO IR) is compared the same
way, with that runtime computing the named tensors (:func:`divergence_vs_eager` ``values``).
:func:`eager_block_outputs` and :func:`block_errors` are the two halves another runtime's export uses when it can
return its block outputs as arrays.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.parity import TOLERANCES

from .check import block_prefix

__all__ = [
    "DIVERGENCE_INPUTS",
    "block_output_names",
    "BlockRecorder",
    "eager_block_outputs",
    "block_errors",
    "first_over",
    "divergence_vs_eager",
    "divergence_vs_onnx",
    "not_exposed",
    "verdict",
]

#: Inputs of an int8 / fp8 graph's comparison: the first held-out inputs of its fidelity gate. (An fp32 / fp16
#: export's are the verification's own smallest batch, one real and one random input: :class:`BlockRecorder`.)
DIVERGENCE_INPUTS = 4
#: Ops whose outputs are not compared inside a block: they only move or hold data.
_SKIP_OPS = ("Constant", "Shape", "QuantizeLinear", "DequantizeLinear")


def _scope(node_name: str) -> str:
    """``blocks.1.attn.proj/MatMul_2`` -> ``blocks.1.attn.proj``."""
    return node_name.rsplit("/", 1)[0] if "/" in node_name else ""


def _block_of(scope: str, prefix: str) -> int | None:
    """``blocks.3.attn`` -> 3 (``None`` outside the blocks)."""
    m = re.match(rf"^{re.escape(prefix)}\.(\d+)(\.|$)", scope)
    return int(m.group(1)) if m else None


def _in(scope: str, root: str) -> bool:
    return scope == root or scope.startswith(root + ".")


def _scope_output(nodes: Sequence[onnx.NodeProto], outputs: set[str], inside) -> tuple[int, str] | None:
    """The last tensor (graph-order index of its node, name) produced by a node ``inside`` that a node not inside
    (and not an unscoped node added after the export, such as a quantizer's Q/DQ) reads, or a graph output."""
    consumers: dict[str, list[str]] = {}
    for node in nodes:
        for i in node.input:
            consumers.setdefault(i, []).append(_scope(node.name))
    found = None
    for k, node in enumerate(nodes):
        if node.op_type in _SKIP_OPS or not inside(_scope(node.name)):
            continue
        for o in node.output:
            readers = consumers.get(o, [])
            if o in outputs or any(s and not inside(s) for s in readers):
                found = (k, o)
    return found


def block_output_names(proto: onnx.ModelProto, prefix: str = "blocks") -> list[str]:
    """Each block's output tensor, block by block, found from the node names' module scopes (see the module
    docstring); a block whose output cannot be found is ``""``."""
    nodes = list(proto.graph.node)
    outputs = {o.name for o in proto.graph.output}
    depth = 1 + max((b for b in (_block_of(_scope(n.name), prefix) for n in nodes) if b is not None), default=-1)
    names = []
    for i in range(depth):
        found = _scope_output(nodes, outputs, lambda s, i=i: _block_of(s, prefix) == i)
        names.append(found[1] if found else "")
    return names


def _op_points(proto: onnx.ModelProto, root: str, every_node: bool) -> list[dict[str, Any]]:
    """The tensors inside scope ``root`` to compare, in graph order: each module scope's output
    (``every_node=False``) or every output of every node (``True``); ``{"tensor", "node", "op_type", "scope"}``."""
    nodes = list(proto.graph.node)
    outputs = {o.name for o in proto.graph.output}
    points: dict[str, dict[str, Any]] = {}
    if every_node:
        for node in nodes:
            if node.op_type not in _SKIP_OPS and _in(_scope(node.name), root):
                for o in node.output:
                    points[o] = {"tensor": o, "node": node.name, "op_type": node.op_type, "scope": _scope(node.name)}
        return list(points.values())
    scopes: set[str] = set()
    for node in nodes:
        s = _scope(node.name)
        while _in(s, root) and s != root:
            scopes.add(s)
            s = s.rsplit(".", 1)[0]
    by_node = {i: n for i, n in enumerate(nodes)}
    found = []
    for s in scopes:
        hit = _scope_output(nodes, outputs, lambda x, s=s: _in(x, s))
        if hit:
            found.append((hit[0], len(s), s, hit[1]))
    for k, _, s, tensor in sorted(found, key=lambda t: (t[0], -t[1])):  # the deepest scope names a shared tensor
        if tensor not in points:
            points[tensor] = {"tensor": tensor, "node": by_node[k].name, "op_type": by_node[k].op_type, "scope": s}
    return list(points.values())


def _run(proto: onnx.ModelProto, names: Sequence[str], x: np.ndarray, threads: int | None) -> dict[str, np.ndarray]:
    """``names`` computed by ``proto`` on ``x``: an in-memory copy with those tensors added as graph outputs, one
    ONNX Runtime CPU run."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    have = {o.name for o in copy.graph.output}
    copy.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names) if n and n not in have)
    sess = onnx_reference().session(copy, threads).session
    wanted = [n for n in dict.fromkeys(names) if n]
    values = sess.run(wanted, {sess.get_inputs()[0].name: x})
    return dict(zip(wanted, values, strict=True))


def _hooked(model: nn.Module, names: Sequence[str], x: np.ndarray) -> dict[str, np.ndarray]:
    """The outputs of ``model``'s sub-modules ``names`` (those that return one tensor) on ``x``, fp32 eager."""
    return _forward(model, names, x)[1]


def _forward(model: nn.Module, names: Sequence[str], x: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """``model``'s output on ``x`` and the outputs of its sub-modules ``names`` (those returning one tensor)."""
    got: dict[str, np.ndarray] = {}
    handles = []
    modules = dict(model.named_modules())
    for name in names:
        if name in modules:

            def hook(_m, _i, out, name=name):
                if isinstance(out, torch.Tensor):
                    got[name] = out.detach().float().cpu().numpy()

            handles.append(modules[name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(np.ascontiguousarray(x)))
    finally:
        for h in handles:
            h.remove()
    return out.numpy(), got


class BlockRecorder:
    """Runs the eager model as the verification does and keeps each block's output on the way (forward hooks), so
    that the per-block comparison reuses the parity's own eager forward: calling it returns the logits, and
    :attr:`inputs` / :attr:`blocks` are then every input it ran and each block's output on them."""

    def __init__(self, model: nn.Module, prefix: str) -> None:
        self.model, self.prefix = model, prefix
        try:
            depth = len(model.get_submodule(prefix))  # type: ignore[arg-type]
        except (AttributeError, TypeError):  # no block list there: nothing recorded, the report says so
            depth = 0
        self.names = [f"{prefix}.{i}" for i in range(depth)]
        self._inputs: list[np.ndarray] = []
        self._blocks: list[list[np.ndarray]] = []

    def __call__(self, x: np.ndarray) -> np.ndarray:
        logits, got = _forward(self.model, self.names, x)
        self._inputs.append(x)
        self._blocks.append([got[n] for n in self.names])
        return logits

    @property
    def inputs(self) -> np.ndarray:
        return np.concatenate(self._inputs)

    @property
    def blocks(self) -> list[np.ndarray]:
        return [np.concatenate([run[i] for run in self._blocks]) for i in range(len(self.names))]


def eager_block_outputs(model: nn.Module, x: np.ndarray, prefix: str | None = None) -> list[np.ndarray]:
    """Each block's output of the eager fp32 ``model`` on ``x`` (float32 NCHW), block by block: forward hooks on
    ``model.<prefix>[i]`` (``prefix``: ``blocks``, or ``encoder.blocks`` in a Segmenter; default from the
    model's config)."""
    prefix = prefix or block_prefix(dict(getattr(model, "attnzoo_config", {"task": "cls"})))
    blocks = model.get_submodule(prefix)
    names = [f"{prefix}.{i}" for i in range(len(blocks))]  # type: ignore[arg-type]
    got = _hooked(model.float().eval(), names, x)
    return [got[n] for n in names]


def _error(out: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """``max_abs_err``, ``rel_err`` (over ``max(1, max |ref|)``) and ``cosine`` of two arrays."""
    o, r = np.asarray(out, np.float64).reshape(-1), np.asarray(ref, np.float64).reshape(-1)
    if o.shape != r.shape:
        return {"max_abs_err": float("inf"), "rel_err": float("inf"), "rel_l2": float("inf"), "cosine": 0.0}
    if not np.isfinite(o).all():
        return {"max_abs_err": float("nan"), "rel_err": float("inf"), "rel_l2": float("inf"), "cosine": 0.0}
    err = float(np.abs(o - r).max(initial=0.0))
    norm_o, norm_r = float(np.linalg.norm(o)), float(np.linalg.norm(r))
    cosine = float(o @ r / (norm_o * norm_r)) if norm_o * norm_r > 0 else float(np.array_equal(o, r))
    return {
        "max_abs_err": err,
        "rel_err": err / max(1.0, float(np.abs(r).max(initial=0.0))),
        "rel_l2": float(np.linalg.norm(o - r)) / norm_r if norm_r > 0 else (float("inf") if err > 0 else 0.0),
        "cosine": cosine,
    }


def block_errors(outputs: Sequence[np.ndarray], references: Sequence[np.ndarray]) -> list[dict[str, Any]]:
    """Per block: ``{"block", "max_abs_err", "rel_err", "cosine"}`` of ``outputs[i]`` against ``references[i]``
    (any runtime's block outputs against :func:`eager_block_outputs`); a missing output (``None``) is skipped."""
    return [
        {"block": i, **_error(o, r)}
        for i, (o, r) in enumerate(zip(outputs, references, strict=True))
        if o is not None and r is not None
    ]


def first_over(
    blocks: Sequence[Mapping[str, Any]], *, tolerance: float | None = None, min_cosine: float | None = None
) -> int | None:
    """The first block whose ``rel_err`` exceeds ``tolerance`` or whose ``cosine`` is below ``min_cosine``."""
    for b in blocks:
        if (tolerance is not None and not b["rel_err"] <= tolerance) or (
            min_cosine is not None and not b["cosine"] >= min_cosine
        ):
            return int(b["block"])
    return None


def _worst(points: Sequence[dict[str, Any]], before: float) -> dict[str, Any] | None:
    """The point whose relative L2 error (``rel_l2``, free of the tensor's scale: a LayerNorm's output is not
    judged against the residual stream's) grows most over the largest measured before it (``before``: the
    block's input's)."""
    best, seen = None, before
    for p in points:
        p["added_err"] = p["rel_l2"] - seen
        if best is None or p["added_err"] > best["added_err"]:
            best = p
        seen = max(seen, p["rel_l2"])
    return best


def _result(
    blocks: list[dict[str, Any]],
    first: int | None,
    prefix: str,
    reference: str,
    n: int,
    criterion: str,
    measure: str = "rel_err",
) -> dict[str, Any]:
    """``measure``: what the criterion reads, ``rel_err`` (worst: the largest) or ``cosine`` (the smallest)."""
    if measure == "cosine":
        worst = min(blocks, key=lambda b: b["cosine"], default=None)
    else:
        worst = max(blocks, key=lambda b: b["rel_err"], default=None)
    return {
        "reference": reference,
        "inputs": n,
        "criterion": criterion,
        "measure": measure,
        "prefix": prefix,
        "blocks": blocks,
        "worst_block": None if worst is None else worst["block"],
        "first_diverging_block": first,
        "worst_op": None,
        "ops": [],
    }


def _inputs_error(blocks: Sequence[Mapping[str, Any]], first: int) -> float:
    return next((b["rel_l2"] for b in blocks if b["block"] == first - 1), 0.0)


def divergence_vs_eager(
    model: nn.Module,
    proto: onnx.ModelProto,
    config: Mapping[str, Any],
    x: np.ndarray,
    dtype: str,
    threads: int | None = None,
    refs: Sequence[np.ndarray] | None = None,
    values: Callable[[Sequence[str], np.ndarray], dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Block errors of the ONNX graph ``proto`` (fp32 or fp16) against the eager fp32 ``model`` on ``x``, under
    ``TOLERANCES[dtype]``; in the first block over it, the module scopes' errors and the worst op. ``refs``: the
    eager block outputs on ``x`` when already computed (:class:`BlockRecorder`). ``values``: what computes the
    named tensors of ``proto`` on ``x`` (default: ONNX Runtime on ``proto`` itself; a runtime's own model converted
    from it, such as an OpenVINO IR, names the same tensors); a tensor it does not return is not compared."""
    if values is None:

        def values(names: Sequence[str], x: np.ndarray) -> dict[str, np.ndarray]:
            return _run(proto, names, x, threads)

    prefix = block_prefix(dict(config))
    names = block_output_names(proto, prefix)
    refs = list(refs) if refs is not None else eager_block_outputs(model, x, prefix)
    if not names or len(names) != len(refs) or not all(names):
        return not_exposed(
            f"the graph's {prefix}.N scopes name {len(names)} block output(s), the model has {len(refs)}"
        )
    got = values(names, x)
    if not all(n in got for n in names):
        missing = [n for n in names if n not in got]
        return not_exposed(f"the runtime's model does not keep the block output tensor(s) {', '.join(missing)}")
    blocks = block_errors([got[n] for n in names], refs)
    tol = TOLERANCES[dtype]
    first = first_over(blocks, tolerance=tol)
    result = _result(
        blocks,
        first,
        prefix,
        "eager fp32 PyTorch (forward hooks)",
        len(x),
        f"rel_err > {tol:g} (TOLERANCES[{dtype!r}])",
    )
    if first is not None:
        points = _op_points(proto, f"{prefix}.{first}", every_node=False)
        modules = _hooked(model, [p["scope"] for p in points], x)
        got = values([p["tensor"] for p in points if p["scope"] in modules], x)
        ops = [{**p, **_error(got[p["tensor"]], modules[p["scope"]])} for p in points if p["tensor"] in got]
        result["ops"] = [p for p in ops if np.isfinite(p["rel_err"]) or p["max_abs_err"] != float("inf")]
        result["worst_op"] = _worst(result["ops"], _inputs_error(blocks, first))
    return result


def divergence_vs_onnx(
    proto: onnx.ModelProto,
    reference: onnx.ModelProto,
    config: Mapping[str, Any],
    x: np.ndarray,
    *,
    min_cosine: float,
    threads: int | None = None,
    values: Callable[[Sequence[str], np.ndarray], dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Block errors of a quantized graph (``proto``, runnable by ONNX Runtime's CPU provider) against the fp32
    graph it was quantized from, tensor by tensor of the same names; a block is over when its cosine is below
    ``min_cosine``. In the first such block, every node output's error and the worst op. ``values``: what
    computes the named tensors of ``proto`` on ``x`` (default: ONNX Runtime on ``proto``; a runtime's own model
    converted from it, such as an int8 OpenVINO IR, names the same tensors); a tensor it does not return is not
    compared."""
    if values is None:

        def values(names: Sequence[str], x: np.ndarray) -> dict[str, np.ndarray]:
            return _run(proto, names, x, threads)

    prefix = block_prefix(dict(config))
    names = block_output_names(reference, prefix)
    produced = {o for n in proto.graph.node for o in n.output}
    if not names or not all(n in produced for n in names):
        return not_exposed("the quantized graph does not keep the fp32 graph's block output tensors")
    got, refs = values(names, x), _run(reference, names, x, threads)
    if not all(n in got for n in names):
        missing = [n for n in names if n not in got]
        return not_exposed(f"the runtime's model does not keep the block output tensor(s) {', '.join(missing)}")
    blocks = block_errors([got[n] for n in names], [refs[n] for n in names])
    first = first_over(blocks, min_cosine=min_cosine)
    result = _result(
        blocks,
        first,
        prefix,
        "the verified fp32 ONNX graph (same tensors)",
        len(x),
        f"cosine < {min_cosine:g} (the fidelity gate)",
        "cosine",
    )
    if first is not None:
        points = [
            p
            for p in _op_points(proto, f"{prefix}.{first}", every_node=True)
            if p["tensor"] in {o for n in reference.graph.node for o in n.output}
        ]
        tensors = [p["tensor"] for p in points]
        a, b = values(tensors, x), _run(reference, tensors, x, threads)
        result["ops"] = [
            {**p, **_error(a[p["tensor"]], b[p["tensor"]])}
            for p in points
            if p["tensor"] in a and np.issubdtype(np.asarray(b[p["tensor"]]).dtype, np.floating)
        ]
        result["worst_op"] = _worst(result["ops"], _inputs_error(blocks, first))
    return result


def not_exposed(reason: str) -> dict[str, Any]:
    """The report's entry for a format (or graph) whose block outputs cannot be read: no figures, and why."""
    return {"blocks": [], "first_diverging_block": None, "worst_op": None, "not_exposed": reason}


def verdict(divergence: Mapping[str, Any] | None, passed: bool) -> str:
    """The words the one-line verdict gets: the first diverging block and its worst op when it failed, the worst
    block's error when it passed; ``""`` when there are no block figures."""
    if not divergence or not divergence.get("blocks"):
        return ""
    prefix, blocks = divergence.get("prefix", "blocks"), {b["block"]: b for b in divergence["blocks"]}
    measure = divergence.get("measure", "rel_err")

    def figure(block: int) -> str:
        value = blocks[block][measure]
        return f"cosine {value:.4f}" if measure == "cosine" else f"rel err {value:.2g}"

    first = divergence.get("first_diverging_block")
    if first is not None:
        op = divergence.get("worst_op")
        return f"first diverging block {prefix}.{first} ({figure(first)})" + (f", worst op {op['node']}" if op else "")
    if not passed:
        return "every block within tolerance: it diverges after the last block"
    worst = divergence.get("worst_block")
    return "" if worst is None else f"worst block {worst} {figure(worst)}"
