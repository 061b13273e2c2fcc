"""``--format aoti``: an AOTInductor package (``.pt2``): ``torch.export`` of the model with a dynamic batch dimension,
compiled ahead of time by Inductor (:mod:`attnzoo.targets.aoti.package`), for the CUDA GPU present (fp32 or fp16),
else for the CPU (fp32). It runs without the model's Python code (``torch._inductor.aoti_load_package``, or C++'s
``AOTIModelPackageLoader``) and is what ``bench-latency --backends aoti`` times.

Written from the PyTorch model, not from the ONNX (no ONNX is written), and verified before it is written, as every
export is: the package is compiled under a temporary name beside ``--out``, then

- the variant's extra math must be in the exported program: for each block and each of the variant's
  ``extra_scopes``, the graph's nodes whose ``nn_module_stack`` holds ``<blocks>.N.attn.<scope>`` are counted
  (:func:`count_extra_math`; the ONNX check counts the named ops the same way), and a scope with no node that
  computes anything fails -- before anything is compiled;
- the loaded package must match eager fp32 PyTorch on real and random inputs at the requested batch sizes and
  :data:`attnzoo.export.verify.EXTRA_BATCH_SIZES`, none of which is the batch it was traced with
  (:data:`attnzoo.runtime.torch_export.TRACE_BATCH`), under the tolerance of its precision
  (:data:`attnzoo.runtime.parity.TOLERANCES`).

Only a package that passes is renamed to ``--out``, with its report ``<out>.json``; a failing one leaves ``--out``
as it was and writes ``<out>.failed.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnzoo.errors import UsageError
from attnzoo.export.divergence import not_exposed
from attnzoo.export.formats.base import ExportRequest, ModelSource, keep_report
from attnzoo.export.formats.program import ProgramFormat, count_extra_math
from attnzoo.export.verify import checked_batch_sizes
from attnzoo.runtime.backends import TORCH_DTYPES
from attnzoo.runtime.device import fp32_math

from . import package as aoti

__all__ = [
    "AotiFormat",
    "FORMAT",
    "package_device",
    "summary",
]


def package_device() -> str:
    """The device ``--format aoti`` compiles for here: the CUDA GPU when one is visible, else the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


class AotiFormat(ProgramFormat):
    """``model.pt2``, an AOTInductor package verified against eager PyTorch, and its report ``model.pt2.json``."""

    name = "aoti"
    title = "PyTorch AOTInductor package"
    suffixes = (".pt2",)
    maker = "AOTInductor"

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

    def export_verified(self, req: ExportRequest, source: ModelSource, out: Path) -> dict[str, Any]:
        """Export, count the extra math, compile, load, check parity; rename to ``out`` only when all passed."""
        device, config, hw = package_device(), source.config, (source.hw[0], source.hw[1])
        sizes = checked_batch_sizes(req.batch_sizes)
        start = time.perf_counter()
        program = aoti.export_program(source.model, hw, device=device, dtype=req.dtype)
        report: dict[str, Any] = {
            **self.report_head(req, source, out),
            "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
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

    def head(self, report: dict[str, Any]) -> str:
        return (
            f"AOTInductor package for {report['gpu'] or report['device']}, {report['num_nodes']} graph nodes, "
            f"{report['file_size'] / 1e6:.2f} MB, export {report['export_time_s']:.1f} s + compile "
            f"{report['compile_time_s']:.1f} s"
        )


FORMAT = AotiFormat()
#: A few lines for the terminal: the package, its parity, the extra math per block, the verdict.
summary = FORMAT.report_text
