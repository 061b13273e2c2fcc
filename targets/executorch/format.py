"""``--format executorch``: an ExecuTorch program (``.pte``): ``torch.export`` of the model with a dynamic batch
dimension, lowered to the XNNPACK delegate (:mod:`attnzoo.targets.executorch.program`), at fp32 or dynamic int8
(``--dtype int8``: the Linear layers int8, activations quantized at run time, the variant's extra math fp32; no
calibration). It runs without the model's Python code (ExecuTorch's runtime, in Python or C++) and is what
``bench-latency --backends executorch`` times.

Written from the PyTorch model, not from the ONNX (no ONNX is written), and verified before it is written, as every
export is: the program is lowered and serialized under a temporary name beside ``--out``, then

- the variant's extra math must be in the lowered graph: for each block and each of the variant's
  ``extra_scopes``, the nodes whose ``nn_module_stack`` holds ``<blocks>.N.attn.<scope>`` are counted, inside the
  XNNPACK delegates (each delegate's own graph) and outside them (ExecuTorch's portable kernels), as
  :func:`attnzoo.export.formats.program.count_extra_math` counts them; under int8 none of them may be
  quantized;
- the program, loaded by ExecuTorch's runtime, must match eager fp32 PyTorch on real and random inputs at the
  requested batch sizes and :data:`attnzoo.export.verify.EXTRA_BATCH_SIZES`, none of which it was traced with
  (:data:`attnzoo.runtime.torch_export.TRACE_BATCH`), under the tolerance of its precision
  (:data:`attnzoo.runtime.parity.TOLERANCES`: ``int8`` for dynamic int8).

A variant the converter cannot carry (an op it refuses) fails with that op's error in one line. Only a program that
passes is renamed to ``--out``, with its report ``<out>.json`` (which holds the model contract's metadata,
``metadata``); a failing one leaves ``--out`` as it was and writes ``<out>.failed.json``.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from attnzoo.errors import UsageError, first_line
from attnzoo.export.check import variant_spec
from attnzoo.export.divergence import not_exposed
from attnzoo.export.formats.base import ExportRequest, ModelSource, keep_report
from attnzoo.export.formats.program import ProgramFormat, count_extra_math
from attnzoo.export.onnx_export import contract_metadata
from attnzoo.export.verify import checked_batch_sizes
from attnzoo.fileio import atomic_path
from attnzoo.runtime.torch_export import module_path

from . import program as et  # called through the module: tests replace its functions there

__all__ = ["ExecuTorchFormat", "FORMAT", "count_lowered_extra_math", "refusal", "summary"]


def count_lowered_extra_math(edge: Any, config: dict[str, Any]) -> dict[str, Any]:
    """:func:`~attnzoo.export.formats.program.count_extra_math` over the lowered program's nodes
    (:func:`attnzoo.targets.executorch.program.graph_nodes`), each scope's count split by where it runs
    (``xnnpack``: inside a delegate; ``portable``: ExecuTorch's own kernels); a quantize / dequantize node in a
    scope fails (the extra math stays fp32)."""
    placed = list(et.graph_nodes(edge))
    found = count_extra_math(SimpleNamespace(nodes=[n for _, n in placed]), config)
    where: dict[str, Counter] = {scope: Counter() for scope in found["blocks"]}
    for kind, node in placed:
        for path, *_ in (node.meta.get("nn_module_stack") or {}).values():
            scope = module_path(str(path))
            if scope in where:
                where[scope][kind] += 1
    for scope, counts in where.items():
        found["blocks"][scope]["runs_in"] = dict(counts)
        quantized = sorted(op for op in found["blocks"][scope]["ops"] if "quantize" in op)
        if quantized:
            found["failures"].append(f"{scope}: quantized ({', '.join(quantized)}); the extra math must stay fp32")
    found["ok"] = not found["failures"]
    found["delegated_nodes"] = sum(1 for kind, _ in placed if kind == "xnnpack")
    found["portable_nodes"] = sum(1 for kind, _ in placed if kind == "portable")
    return found


def refusal(exc: BaseException, variant: str) -> str:
    """One line: the converter refused ``variant``, the op it names (an ``aten`` op in its message) and why."""
    line = first_line(exc)
    ops = re.findall(r"aten[.:]+[A-Za-z_0-9]+(?:\.[A-Za-z_0-9]+)?", str(exc))
    op = f" op {ops[0]}" if ops else ""
    return f"ExecuTorch cannot carry {variant}:{op} ({type(exc).__name__}: {line})"


class ExecuTorchFormat(ProgramFormat):
    """``model.pte``, an ExecuTorch program (XNNPACK) verified against eager PyTorch, and its report
    ``model.pte.json``."""

    name = "executorch"
    title = "ExecuTorch program"
    suffixes = (".pte",)
    maker = "ExecuTorch"
    in_variant_report = "full"  # its lowering to XNNPACK alone takes minutes on 2 cores: not in --quick
    dynamic_int8 = True

    def check(self, req: ExportRequest) -> None:
        super().check(req)
        reason = et.executorch_problem(req.dtype)
        if reason:
            raise UsageError(f"--format executorch: {reason}")

    def export_verified(self, req: ExportRequest, source: ModelSource, out: Path) -> dict[str, Any]:
        """Export, lower, count the extra math, serialize, load, check parity; rename to ``out`` only when all
        passed."""
        config, hw = source.config, (source.hw[0], source.hw[1])
        sizes = checked_batch_sizes(req.batch_sizes)
        report: dict[str, Any] = {
            **self.report_head(req, source, out),
            "quantization": "dynamic int8 (Linear layers; extra math fp32)" if req.dtype == "int8" else None,
            "delegate": "XnnpackBackend",
            "metadata": contract_metadata(config, hw, req.dtype, source.checkpoint_sha256),
            "torch": torch.__version__,
            "executorch": et.executorch_version(),
            "divergence": not_exposed(
                "an ExecuTorch program returns the logits only: the block outputs live inside the XNNPACK delegates "
                "(reading them would take a second program lowered with them as outputs)"
            ),
        }
        start = time.perf_counter()
        try:
            program, edge = et.lower_program(
                source.model, hw, dtype=req.dtype, keep_fp32=variant_spec(config).extra_scopes
            )
        except Exception as exc:  # the converter refused an op: the report says which, in one line
            return self.fail(out, report, [refusal(exc, config["variant"])])
        report["lower_time_s"] = round(time.perf_counter() - start, 3)
        report["num_nodes"] = sum(1 for n in program.graph.nodes if n.op == "call_function")
        report["extra_math"] = count_lowered_extra_math(edge, config)
        if not report["extra_math"]["ok"]:
            return self.fail(out, report, list(report["extra_math"]["failures"]))
        with atomic_path(out) as tmp:
            try:
                report["serialize_time_s"] = round(et.write_program(edge, tmp), 3)
            except Exception as exc:
                return self.fail(out, report, [refusal(exc, config["variant"])])
            method = et.load_method(tmp)

            def run(x: np.ndarray) -> np.ndarray:
                return method.execute([torch.from_numpy(np.ascontiguousarray(x))])[0].float().numpy()

            runtime = "executorch.runtime (XNNPACK, cpu)"
            self.check_parity(out, report, source, run, dtype=req.dtype, sizes=sizes, runtime=runtime, files=[tmp])
        report.update(passed=True, failures=[])
        return keep_report(out, report)

    def head(self, report: dict[str, Any]) -> str:
        em = report["extra_math"]
        return (
            f"ExecuTorch program (XNNPACK), {em['delegated_nodes']} delegated + {em['portable_nodes']} portable nodes, "
            f"{report['file_size'] / 1e6:.2f} MB, lower {report['lower_time_s']:.1f} s + serialize "
            f"{report['serialize_time_s']:.1f} s"
        )


FORMAT = ExecuTorchFormat()
#: A few lines for the terminal: the program, its parity, the extra math per block, the verdict.
summary = FORMAT.report_text
