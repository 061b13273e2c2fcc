"""``--format aoti``: an AOTInductor package (``.pt2``): ``torch.export`` of the model with a dynamic batch dimension,
compiled ahead of time by Inductor (:mod:`attnzoo.runtime.aoti`), for the CUDA GPU present (fp32 or fp16), else for
the CPU (fp32). It runs without the model's Python code (``torch._inductor.aoti_load_package``, or C++'s
``AOTIModelPackageLoader``) and is what ``bench-latency --backends aoti`` times.

Written from the PyTorch model, not from the ONNX (no ONNX is written), and verified before it is written, as every
export is: the package is compiled under a temporary name beside ``--out``, then

- the variant's extra math must be in the exported program: for each block and each of the variant's
  ``extra_scopes``, the graph's nodes whose ``nn_module_stack`` holds ``<blocks>.N.attn.<scope>`` are counted
  (:func:`count_extra_math`; the ONNX check counts the named ops the same way), and a scope with no node that
  computes anything fails -- before anything is compiled;
- the loaded package must match eager fp32 PyTorch on real and random inputs at the requested batch sizes and
  :data:`attnzoo.export.verify.EXTRA_BATCH_SIZES`, none of which is the batch it was traced with
  (:data:`attnzoo.runtime.aoti.TRACE_BATCH`), under the tolerance of its precision
  (:data:`attnzoo.runtime.parity.TOLERANCES`).

Only a package that passes is renamed to ``--out``, with its report ``<out>.json``; a failing one leaves ``--out``
as it was and writes ``<out>.failed.json``.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnzoo.errors import UsageError
from attnzoo.limits import MAX_BATCH_SIZE
from attnzoo.runtime import aoti
from attnzoo.runtime.backends.eager import TORCH_DTYPES
from attnzoo.runtime.contract import BATCH_DIM
from attnzoo.runtime.device import fp32_math

from ..check import block_prefix, expected_scopes, variant_spec
from ..divergence import not_exposed
from ..verify import checked_batch_sizes
from .base import ExportFormat, ExportRequest, ModelSource, keep_report, report_path, run_step, summary_text

__all__ = [
    "AotiFormat",
    "FORMAT",
    "NO_MATH_TARGETS",
    "count_extra_math",
    "dynamic_batch",
    "package_device",
    "summary",
]

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


def package_device() -> str:
    """The device ``--format aoti`` compiles for here: the CUDA GPU when one is visible, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


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
            name = aoti.module_path(str(path))
            m = block.match(name)
            if m:
                depth = max(depth, int(m.group(1)) + 1)
            by_scope.setdefault(name, Counter())[_target(node)] += 1
    spec = variant_spec(config)
    failures: list[str] = []
    if depth == 0 and spec.extra_scopes:
        failures.append(f"no {prefix}.N modules in the graph's nn_module_stack (blocks missing or renamed)")
    blocks: dict[str, Any] = {}
    per_block: Counter = Counter()
    for scope in expected_scopes(config, depth):
        ops = by_scope.get(scope, Counter())
        module = scope.split(".attn.", 1)[1]
        if not ops:
            failures.append(
                f"{scope}: no nodes of module {scope} in the exported program (variant {spec.name!r} declares extra "
                f"scope {module!r}; its ops are missing, folded away or renamed)"
            )
        elif all(op in NO_MATH_TARGETS for op in ops):
            failures.append(f"{scope}: only {', '.join(sorted(ops))} node(s), no op computes anything")
        blocks[scope] = {"ops": dict(ops)}
        per_block[scope.split(".attn.")[0]] += sum(ops.values())
    return {
        "ok": not failures,
        "failures": failures,
        "blocks": blocks,
        "nodes_per_block": dict(per_block),
        "depth": depth,
    }


class AotiFormat(ExportFormat):
    """``model.pt2``, an AOTInductor package verified against eager PyTorch, and its report ``model.pt2.json``."""

    name = "aoti"
    title = "PyTorch AOTInductor package"
    suffixes = (".pt2",)
    from_model = True

    def check(self, req: ExportRequest) -> None:
        super().check(req)
        device = package_device()
        if req.dtype not in aoti.AOTI_DTYPES["cuda"]:
            raise UsageError(f"--format aoti compiles fp32 or fp16 (CUDA), not {req.dtype}")
        if device == "cpu" and req.dtype == "fp16":
            raise UsageError(
                "--format aoti --dtype fp16 compiles for a CUDA GPU and none is visible; here the package is "
                "compiled for the CPU at fp32 (leave --dtype out)"
            )
        reason = aoti.aoti_problem(device, req.dtype)
        if reason:
            raise UsageError(f"--format aoti: {reason}")

    def write_model(self, req: ExportRequest, source: ModelSource, result) -> None:
        result.report = run_step(self.export_verified, "AOTInductor export failed", req, source, result.path)

    def export_verified(self, req: ExportRequest, source: ModelSource, out: Path) -> dict[str, Any]:
        """Export, count the extra math, compile, load, check parity; rename to ``out`` only when all passed."""
        device, config, hw = package_device(), source.config, (source.hw[0], source.hw[1])
        sizes = checked_batch_sizes(req.batch_sizes)
        start = time.perf_counter()
        program = aoti.export_program(source.model, hw, device=device, dtype=req.dtype)
        report: dict[str, Any] = {
            "path": str(out),
            "format": "aoti",
            "variant": config["variant"],
            "task": config["task"],
            "arch": config["arch"],
            "dtype": req.dtype,
            "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "input_size": list(hw),
            "batch_dim": BATCH_DIM,
            "batch_range": [1, MAX_BATCH_SIZE],
            "trace_batch": aoti.TRACE_BATCH,
            "checkpoint_sha256": source.checkpoint_sha256,
            "export_time_s": round(time.perf_counter() - start, 3),
            "num_nodes": sum(1 for n in program.graph.nodes if n.op == "call_function"),
            "extra_math": count_extra_math(program, config),
            "divergence": not_exposed(
                "an AOTInductor package returns the logits only: the block outputs are compiled away (reading them "
                "would take a second package compiled with them as outputs)"
            ),
            "torch": torch.__version__,
        }
        if not report["extra_math"]["ok"]:  # refused before the compile
            return self.fail(out, report, list(report["extra_math"]["failures"]))
        with aoti.temporary_package(out) as tmp:
            metadata = {
                "attnzoo.config": json.dumps(config, sort_keys=True, default=str),
                "checkpoint_sha256": source.checkpoint_sha256,
                "input_size": json.dumps(list(hw)),
                "dtype": req.dtype,
            }
            report["compile_time_s"] = round(aoti.compile_package(program, tmp, metadata=metadata), 3)
            start = time.perf_counter()
            runner = aoti.load_package(tmp)
            report["load_time_s"] = round(time.perf_counter() - start, 3)
            dtype = getattr(torch, TORCH_DTYPES[req.dtype])

            def run(x: np.ndarray) -> np.ndarray:
                with torch.inference_mode(), fp32_math(False):
                    y = runner(torch.from_numpy(np.ascontiguousarray(x)).to(device, dtype))
                return y.float().cpu().numpy()

            runtime = f"aoti_load_package ({device})"
            self.check_parity(out, report, source, run, dtype=req.dtype, sizes=sizes, runtime=runtime, files=[tmp])
        report.update(passed=True, failures=[])
        return keep_report(out, report)

    def summary(self, result) -> list[str]:
        return summary(result.report, report_path(result.path)).splitlines() if result.report else []


def summary(report: dict[str, Any], path: Path | None = None) -> str:
    """A few lines for the terminal: the package, its parity, the extra math per block, the verdict."""
    head = (
        f"{report['path']}: {report['variant']} {report['task']} {report['arch']} {report['dtype']} AOTInductor "
        f"package for {report['gpu'] or report['device']}, {report['num_nodes']} graph nodes, "
        f"{report['file_size'] / 1e6:.2f} MB, export {report['export_time_s']:.1f} s + compile "
        f"{report['compile_time_s']:.1f} s"
    )
    return summary_text(head, report, dynamic_batch(report), path)


def dynamic_batch(report: dict[str, Any]) -> str:
    """How a program exported by ``torch.export`` takes its batch: ``dynamic 'batch' 1-N, traced at 2``."""
    lo, hi = report["batch_range"]
    return f"dynamic '{report['batch_dim']}' {lo}-{hi}, traced at {report['trace_batch']}"


FORMAT = AotiFormat()
