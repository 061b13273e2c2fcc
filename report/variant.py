"""``report_variant()``: does an attention variant deploy, and what does it cost against standard attention?

One call measures everything an attention paper's appendix needs, each figure in the same run, ``standard``
beside the variant where it compares, by the package's own library calls (nothing is re-implemented here):

- **identity**: the registry's paper, equations, extra-math scopes and extra parameters; parameters and FLOPs
  against ``standard`` (:func:`attnzoo.benchmarks.flops.count_variant`);
- **export**: :func:`attnzoo.export.export_model` at fp32 (its parity with eager and the extra-math check), fp16,
  int8 (fidelity to fp32, top-1 agreement, the placement it chose, accuracy on the test split where the model has
  one), FP8, a TensorRT engine (its network check; built, not run, without a GPU) and a Triton model
  configuration;
- **fusion**: :func:`attnzoo.runtime.fusion.audit` on the fp32 exports: whether each runtime runs each block's
  attention core as one kernel;
- **cost**: :func:`attnzoo.benchmarks.run.run_benchmark` (every backend, batch 1 and 8, fp32 and bf16 where the CPU
  has bf16 units, overhead against ``standard`` from A B A B pairs), :func:`attnzoo.benchmarks.scaling.run_scaling`
  (latency and memory against tokens), and the GPU plan's committed results where they exist (marked as such).

A step that fails is a finding, not a crash: its entry says ``failed`` with the reason, and one that cannot run
here says ``unavailable`` (or ``skipped``) with why. :func:`attnzoo.report.render.write_report` writes the folder.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from attnzoo.benchmarks.fusable import speedups, time_opsets
from attnzoo.fileio import PathLike
from attnzoo.lazy import lazy_import
from attnzoo.machine import environment
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.fusion import audit
from attnzoo.runtime.fusion import markdown as fusion_markdown

from .cost import gpu_rows, latency, scaling
from .exports import _format_summary as _format_summary
from .exports import _model_args, _rel, _source, _untemp, export_side, export_sides
from .render import write_report
from .settings import *  # noqa: F403 -- the request's public names are this module's too
from .settings import (
    SCHEMA,
    Budget,
    ReportResult,
    _attempt,
    _checked_request,
    _Section,
    _skipped,
    full_budget,
    named_budget,
    quick_budget,
)
from .settings import __all__ as _SETTINGS_NAMES

# report-variant --help and its usage errors load without torch, onnx and timm: these import at their first use
models = lazy_import("attnzoo.models")
export = lazy_import("attnzoo.export")
onnx_export = lazy_import("attnzoo.export.onnx_export")
bench_flops = lazy_import("attnzoo.benchmarks.flops")

__all__ = [
    *_SETTINGS_NAMES,
    "FULL",  # noqa: F405 -- made when asked for (module __getattr__)
    "QUICK",  # noqa: F405 -- made when asked for (module __getattr__)
    "report_variant",
    "identity",
    "export_side",
    "fusion",
    "latency",
    "scaling",
    "gpu_rows",
]


# ------------------------------------------------------------------------------------------------ identity
def identity(variant: str, arch: str, sizes: tuple[int, ...]) -> dict[str, Any]:
    """The registry's facts about ``variant``, its parameters and its FLOPs per image beside ``standard``'s (at
    ``arch``'s own size and each of ``sizes``)."""
    spec = models.VARIANTS[variant]

    def cost(name: str) -> dict[str, Any]:
        model = bench_flops.meta_model(name, "cls", arch)
        params = sum(p.numel() for p in model.parameters())
        own = model.attnzoo_config["img_size"]
        flops = {}
        for size in dict.fromkeys((own, *sizes)):
            c = bench_flops.count_variant(name, "cls", arch, img_size=size)
            flops[str(size)] = c.matrix_flops + c.vector_ops
        return {"params": params, "flops_per_image": flops}

    mine, std = cost(variant), cost("standard")
    return {
        "variant": variant,
        "paper": str(spec.paper),
        "equations": spec.equations,
        "extra_params": spec.extra_params,
        "extra_weights": list(spec.extra_weights),
        "extra_scopes": list(spec.extra_scopes),
        "package": spec.package,
        "version": spec.version,
        "pairwise_scores": spec.pairwise_scores,
        "cost_family": spec.cost_family,
        "arch": arch,
        "counter": "attnzoo.benchmarks.flops.count_variant (matrix FLOPs + pairwise vector ops, meta device)",
        "params": mine["params"],
        "standard_params": std["params"],
        "flops_per_image": mine["flops_per_image"],
        "standard_flops_per_image": std["flops_per_image"],
        "flops_ratio": {k: mine["flops_per_image"][k] / std["flops_per_image"][k] for k in mine["flops_per_image"]},
    }


# ------------------------------------------------------------------------------------------------ fusion
def fusion(paths: dict[str, str]) -> dict[str, Any]:
    """:func:`attnzoo.runtime.fusion.audit` of each side's fp32 ONNX, with its markdown table."""
    result = {}
    for side, path in paths.items():

        def one(path=path) -> dict[str, Any]:
            a = audit(path)
            return {"audit": a, "table": fusion_markdown(a)}

        result[side] = _attempt(one)
    return result


def fusable(
    variant: str, args: dict[str, Any], folder: Path, out: Path, side: dict[str, Any], budget: Budget, work: Path
) -> dict[str, Any]:
    """The variant exported at opset 23, where each dot-product core is one standard ``Attention`` op (verified,
    extra math checked), its fusion audit, and its speed against the opset-20 file on ONNX Runtime and OpenVINO
    (:mod:`attnzoo.benchmarks.fusable`: round-robin, batch 1, one thread, parity-checked first)."""
    if models.VARIANTS[models.canonical_name(variant)].pairwise_scores:
        return {
            "status": "absent",
            "reason": "its scores are a pairwise L1 distance, not a dot product: no attention "
            "op computes them, so there is no fusable form",
        }
    if side["fp32"]["status"] != "ok":
        return _skipped("the fp32 export did not pass")
    path20, path23 = Path(side["onnx_path"]), folder / f"{variant}_opset23.onnx"
    r = export.export_model(**args, out=path23, opset=23)  # the opset-20 file's model: the same weights
    found = audit(path23)
    ops = sum(1 for c in found["cores"] if c.get("op"))
    if not ops:
        path23.unlink(missing_ok=True)
        return {
            "status": "absent",
            "reason": f"its opset-23 export holds no Attention op ({len(found['cores'])} attention cores, none in "
            "the op's form), so there is no fusable form",
        }
    hw = onnx_export.config_hw(export.read_metadata(path20))
    x = np.random.default_rng(0).standard_normal((1, 3, *hw), dtype=np.float32)
    ref = onnx_reference().session(path20).run(x)
    times = time_opsets(
        {20: path20, 23: path23},
        x,
        ref,
        1,
        work / "fusable-cache",
        budget.fusable_rounds,
        reference="the opset-20 file on ONNX Runtime",
    )
    return {
        "status": "ok",
        "file": _rel(path23, out),
        "extra_math_kept": (r.report.get("extra_math") or {}).get("ok"),
        "attention_ops": ops,
        "fused": {
            e["runtime"]: {k: e.get(k) for k in ("fused", "cores", "inspected", "reason", "as_exported")}
            for e in found["runtimes"]
        },
        "speed": speedups(times),
        "rounds": budget.fusable_rounds,
    }


def report_variant(
    variant: str,
    checkpoint: PathLike | None = None,
    out: PathLike | None = None,
    quick: bool = False,
    *,
    budget: Budget | None = None,
    command: str = "",
    progress: bool = False,
) -> ReportResult:
    """Measure ``variant`` end to end and write its report folder: what ``report-variant`` does.

    Args:
        variant: A registered variant (built-in or plugin; aliases accepted).
        checkpoint: The author's own weights (a ``save_checkpoint`` file, or a plain state dict of a cls/micro
            model); default: the zoo's classifier of ``variant``, else a random init (accuracy marked absent).
        out: The report folder (default ``variant-reports/<variant>``).
        quick: Micro models, small sizes, short timing: a minute or two (:data:`QUICK`); default :data:`FULL`.
        budget: Sizes and limits (overrides ``quick``'s choice).
        command: The command line, for the report.
        progress: One line on stderr per section.

    Returns:
        :class:`ReportResult`.

    Raises:
        UsageError: an unknown variant (the valid ones listed), a checkpoint that is none (a directory, an ONNX
            model ...: named), an output path that is a file, or an output folder that is neither empty nor a
            report of ``variant`` (:func:`out_problem`); nothing is measured or written then.
    """
    variant, out = _checked_request(variant, checkpoint, out)
    budget = budget or (quick_budget() if quick else full_budget())
    started, cpu_started = time.time(), time.process_time()
    timings: dict[str, float] = {}
    section = _section_timer(variant, progress, timings)
    sizes = tuple(budget.scaling_sizes)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "variant": variant,
        "quick": quick,
        "command": command,
        "budget": asdict(budget),
        "environment": environment(),
    }
    report["identity"] = section("identity", lambda: _attempt(lambda: identity(variant, budget.latency_arch, sizes)))
    with tempfile.TemporaryDirectory(prefix="attnzoo-report-") as tmp:
        work = Path(tmp)
        src = _source(variant, checkpoint)
        args = _model_args(variant, src)  # one model for every file of the side, the opset-23 export included
        sides = export_sides(variant, src, args, out, budget, section)
        report["export"] = sides
        report["fusion"] = section(
            "fusion", lambda: fusion({k: s["onnx_path"] for k, s in sides.items() if s["fp32"]["status"] == "ok"})
        )
        report["fusable"] = section(
            "fusable export",
            lambda: _attempt(
                lambda: fusable(variant, args, out / "exports" / variant, out, sides[variant], budget, work)
            ),
        )
        for s in sides.values():
            s["onnx_path"] = _rel(Path(s["onnx_path"]), out)
        report["cost"] = {
            "latency": section("latency", lambda: _attempt(lambda: latency(variant, budget, work, command))),
            "scaling": section("scaling", lambda: _attempt(lambda: scaling(variant, budget, work, command, quick))),
            "gpu": gpu_rows(variant),
        }
        report.update(_untemp(report, work))
    report["section_times_s"] = timings
    report["wall_time_s"] = round(time.time() - started, 1)
    report["cpu_time_s"] = round(time.process_time() - cpu_started, 1)  # all threads: the work, apart from load
    files, verdict = write_report(report, out)
    return ReportResult(report=report, out=out, verdict=verdict, files=files)


def _section_timer(variant: str, progress: bool, timings: dict[str, float]) -> _Section:
    """A :data:`_Section` that records each section's seconds in ``timings`` (and, with ``progress``, names it on
    stderr as it starts)."""

    def section(name: str, fn: Callable[[], Any]) -> Any:
        if progress:
            print(f"report-variant {variant}: {name} ...", file=sys.stderr, flush=True)
        t0 = time.time()
        value = fn()
        timings[name] = round(time.time() - t0, 1)
        return value

    return section


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed (for the report)."""
    return "report-variant " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))


def __getattr__(name: str) -> Budget:
    """:data:`FULL` and :data:`QUICK` (:mod:`attnzoo.report.settings`), made when asked for."""
    return named_budget(__name__, name)
