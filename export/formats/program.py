"""The ``torch.export`` program step the formats written from the PyTorch model share (AOTInductor's ``aoti``,
ExecuTorch's ``executorch``): the variant's extra math counted in the program, how the program takes its batch, and
:class:`ProgramFormat`, what such a format's export, report and summary have in common. The formats call this
module, not each other."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

from attnzoo.limits import MAX_BATCH_SIZE
from attnzoo.runtime.contract import BATCH_DIM
from attnzoo.runtime.torch_export import TRACE_BATCH, module_path

from ..check import block_prefix, variant_spec, walk_extra_scopes
from .base import ExportFormat, ExportRequest, ExportResult, ModelSource, report_path, run_step, summary_text

__all__ = ["NO_MATH_TARGETS", "count_extra_math", "dynamic_batch", "ProgramFormat"]

#: ATen ops that only move, view or retype data: a scope of these alone holds no extra math.
NO_MATH_TARGETS = frozenset(
    {
        "getitem",
        "view",
        "reshape",
        "_unsafe_view",
        "expand",
        "permute",
        "transpose",
        "t",
        "unsqueeze",
        "squeeze",
        "contiguous",
        "clone",
        "alias",
        "detach",
        "_to_copy",
        "to",
        "type_as",
        "flatten",
        "unflatten",
        "split",
        "split_with_sizes",
        "chunk",
        "unbind",
        "select",
        "slice",
        "sym_size",
    }
)


def _target(node: Any) -> str:
    """``aten.mul.Tensor`` -> ``mul``; ``operator.getitem`` -> ``getitem``."""
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0]


def count_extra_math(program: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Count each block's extra-math nodes in an exported program (``torch.export``'s ``ExportedProgram``, or an
    FX ``Graph``): for each scope of :func:`attnzoo.export.check.expected_scopes`, the ``call_function`` nodes whose
    ``nn_module_stack`` holds that module. A scope with no node, or only nodes in :data:`NO_MATH_TARGETS`, fails.
    Never raises for a missing scope (see ``failures``).

    Returns:
        ``{"ok", "failures", "blocks": {scope: {"ops": {op: n}}}, "nodes_per_block", "depth"}``.
    """
    graph = getattr(program, "graph", program)
    prefix = block_prefix(config)
    block = re.compile(rf"^{re.escape(prefix)}\.(\d+)(\.|$)")
    by_scope: dict[str, Counter] = {}
    depth = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        for path, *_ in (node.meta.get("nn_module_stack") or {}).values():
            name = module_path(str(path))
            m = block.match(name)
            if m:
                depth = max(depth, int(m.group(1)) + 1)
            by_scope.setdefault(name, Counter())[_target(node)] += 1
    spec = variant_spec(config)

    def judge(scope: str) -> tuple[list[str], dict[str, Any], int]:
        ops = by_scope.get(scope, Counter())
        module = scope.split(".attn.", 1)[1]
        failures = []
        if not ops:
            failures.append(
                f"{scope}: no nodes of module {scope} in the exported program (variant {spec.name!r} declares extra "
                f"scope {module!r}; its ops are missing, folded away or renamed)"
            )
        elif all(op in NO_MATH_TARGETS for op in ops):
            failures.append(f"{scope}: only {', '.join(sorted(ops))} node(s), no op computes anything")
        return failures, {"ops": dict(ops)}, sum(ops.values())

    walk = walk_extra_scopes(config, depth, "modules in the graph's nn_module_stack", judge)
    return {
        "ok": not walk.failures,
        "failures": walk.failures,
        "blocks": walk.blocks,
        "nodes_per_block": dict(walk.nodes_per_block),
        "depth": depth,
    }


def dynamic_batch(report: dict[str, Any]) -> str:
    """How a program exported by ``torch.export`` takes its batch: ``dynamic 'batch' 1-N, traced at 2``."""
    lo, hi = report["batch_range"]
    return f"dynamic '{report['batch_dim']}' {lo}-{hi}, traced at {report['trace_batch']}"


class ProgramFormat(ExportFormat):
    """A format written from the PyTorch model as one ``torch.export`` program file, verified against eager PyTorch
    before it is written (:meth:`export_verified`): its report's common facts (:meth:`report_head`) and its summary
    (:meth:`report_text`, the file described by :meth:`head`)."""

    from_model = True
    #: What makes its file, as the line of a failed export names it (``AOTInductor export failed``).
    maker: str = ""

    def write_model(self, req: ExportRequest, source: ModelSource, result: ExportResult) -> None:
        result.report = run_step(self.export_verified, f"{self.maker} export failed", req, source, result.path)

    def export_verified(self, req: ExportRequest, source: ModelSource, out: Path) -> dict[str, Any]:
        """Export, check and write the file ``out``, renamed there only when every check passed; its report."""
        raise NotImplementedError

    def report_head(self, req: ExportRequest, source: ModelSource, out: Path) -> dict[str, Any]:
        """The facts every program's report starts with: the file and its format, the model, the precision, the
        input and how the program takes its batch (dynamic, traced at :data:`TRACE_BATCH`), the weights."""
        config = source.config
        return {
            "path": str(out),
            "format": self.name,
            "variant": config["variant"],
            "task": config["task"],
            "arch": config["arch"],
            "dtype": req.dtype,
            "input_size": [source.hw[0], source.hw[1]],
            "batch_dim": BATCH_DIM,
            "batch_range": [1, MAX_BATCH_SIZE],
            "trace_batch": TRACE_BATCH,
            "checkpoint_sha256": source.checkpoint_sha256,
        }

    def head(self, report: dict[str, Any]) -> str:
        """What the file of ``report`` is, after its model and precision (the summary's first line)."""
        raise NotImplementedError

    def report_text(self, report: dict[str, Any], path: Path | None = None) -> str:
        """A few lines for the terminal: the file, its parity, the extra math per block, the verdict."""
        what = f"{report['path']}: {report['variant']} {report['task']} {report['arch']} {report['dtype']}"
        return summary_text(f"{what} {self.head(report)}", report, dynamic_batch(report), path)

    def summary(self, result: ExportResult) -> list[str]:
        return self.report_text(result.report, report_path(result.path)).splitlines() if result.report else []
