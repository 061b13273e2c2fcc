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

import contextlib
import io
import json
import shlex
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from attnzoo.benchmarks.fusable import speedups, time_opsets
from attnzoo.benchmarks.gpu_plan import MODELS, ROOT
from attnzoo.errors import UsageError, first_line, quoted
from attnzoo.fileio import PathLike, read_json, writable_dir
from attnzoo.filekind import checkpoint_kind
from attnzoo.lazy import lazy_import
from attnzoo.machine import bf16_problem, environment
from attnzoo.modelconfig import check_variant, variant_names
from attnzoo.runtime.backends import backend_names, onnx_reference
from attnzoo.runtime.fusion import audit
from attnzoo.runtime.fusion import markdown as fusion_markdown
from attnzoo.signals import Interrupted, Terminated
from attnzoo.targets.triton.schema import TritonConfigCheck

from .render import REPORT_FORMATS, write_report

if TYPE_CHECKING:
    from attnzoo.export.formats import ExportFormat

# report-variant --help and its usage errors load without torch, onnx and timm: these import at their first use
torch = lazy_import("torch")
models = lazy_import("attnzoo.models")
zoo = lazy_import("attnzoo.zoo")
export = lazy_import("attnzoo.export")
export_formats = lazy_import("attnzoo.export.formats")
onnx_export = lazy_import("attnzoo.export.onnx_export")
bench_flops = lazy_import("attnzoo.benchmarks.flops")
bench_run = lazy_import("attnzoo.benchmarks.run")
scaling_bench = lazy_import("attnzoo.benchmarks.scaling")

__all__ = [
    "SCHEMA",
    "OWN_ENTRIES",
    "out_problem",
    "BATCH_SIZES",
    "Budget",
    "FULL",
    "QUICK",
    "ReportResult",
    "report_variant",
    "identity",
    "export_side",
    "fusion",
    "latency",
    "scaling",
    "gpu_rows",
]

#: ``report.json``'s ``schema`` field (docs/report-variant.md describes this version).
SCHEMA = "attnzoo.report-variant/1"
#: Every entry report-variant writes in its folder; ``exports`` is written first, the rest last, ``report.json``
#: before ``report.md``.
OWN_ENTRIES = frozenset(
    {"report.json", "report.md", "latency.png", "overhead.png", "scaling.png", "block-errors.png", "exports"}
)


def out_problem(out: Path, variant: str) -> str | None:
    """Why ``out`` must not be the report folder of ``variant`` (one line), or ``None``: it is new or empty, holds
    only ``exports`` (a run stopped before its report), or holds a previous report of the same variant (whose
    :data:`OWN_ENTRIES` a run replaces; other files there are never written). A folder of anything else is
    refused, so that no user's file is overwritten."""
    if not out.is_dir():
        return None
    names = sorted(p.name for p in out.iterdir())
    if "report.json" in names:
        try:
            previous = read_json(out / "report.json", max_bytes=64 * 2**20)
        except ValueError:
            previous = None
        if not isinstance(previous, dict) or previous.get("schema") != SCHEMA:
            return (
                f"--out {out} holds a report.json that report-variant did not write; choose a new or empty folder "
                "(report-variant overwrites only its own reports)"
            )
        if previous.get("variant") != variant:
            return (
                f"--out {out} holds the report of variant {str(previous.get('variant'))[:80]!r}, not {variant!r}; "
                "choose another folder"
            )
        return None
    others = [n for n in names if n != "exports"]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return (
            f"--out {out} is not empty and holds no report of {variant!r} ({shown}); choose a new or empty folder "
            "(report-variant overwrites only its own reports)"
        )
    return None


@dataclass(frozen=True)
class Budget:
    """Sizes and time limits of one run.

    Attributes:
        latency_arch: ViT of the latency rows (seeded random init, as ``bench-latency``).
        latency_min_time: Seconds per measurement (still at least 10 iterations).
        latency_time_limit: Seconds after which no new latency row starts.
        compile_budget: Seconds of ``torch.compile`` the latency rows may spend (0: compile rows skipped, said so).
        scaling_arch, scaling_sizes, seg_sizes: The scaling sweeps' ViT and input sides (classifier; Segmenter).
        scaling_min_time: Seconds per scaling measurement.
        scaling_backends: The backends of the scaling sweep.
        max_call_s: A scaling call predicted to take longer is skipped with the reason.
        int8: Extra :func:`attnzoo.export.export_model` arguments of the int8 export (smaller sets in --quick).
        standard_exports: Export steps also run for ``standard`` (of fp32, fp16, int8, fp8, tensorrt, triton; fp32
            always: the fusion audit's baseline).
        fp8: Build the FP8 graph.
        fusable_rounds: Timed rounds of the opset-20 against the opset-23 file (round-robin, batch 1).
        formats: The CPU and on-device formats written for the variant (of
            :data:`~attnzoo.report.render.REPORT_FORMATS`), each verified as ``export-model --format NAME`` verifies
            it.
    """

    latency_arch: str
    latency_min_time: float
    latency_time_limit: float
    compile_budget: float
    scaling_arch: str
    scaling_sizes: tuple[int, ...]
    seg_sizes: tuple[int, ...]
    scaling_min_time: float
    max_call_s: float
    scaling_backends: tuple[str, ...] = ("eager", "ort-cpu")
    int8: dict[str, Any] = field(default_factory=dict)
    standard_exports: tuple[str, ...] = ("fp32", "fp16", "int8", "fp8", "tensorrt", "triton")
    fp8: bool = True
    fusable_rounds: int = 15
    formats: tuple[str, ...] = REPORT_FORMATS


#: The default run: ViT-Ti latency rows at 197 tokens without torch.compile (its compilation per shape and
#: precision does not fit the budget; ``bench-latency --backends compile`` times it), scaling 197 -> 577 -> 1,025
#: tokens on eager and ONNX Runtime (the Segmenter encoder at 4,097 tokens is the scaling benchmark's:
#: ``python -m attnzoo.benchmarks.scaling``), int8 scored on 2,000 test images, FP8 for the variant only. Designed
#: for at most 10 minutes on 2 cores (docs/report-variant.md has the measured runs).
FULL = Budget(
    latency_arch="tiny",
    latency_min_time=0.3,
    latency_time_limit=420.0,
    compile_budget=0.0,
    scaling_arch="tiny",
    scaling_sizes=(224, 384, 512),
    seg_sizes=(),
    scaling_min_time=0.3,
    max_call_s=10.0,
    int8=dict(eval_limit=2000),
    standard_exports=("fp32", "fp16", "int8", "tensorrt", "triton"),
)
#: ``--quick``: micro models at small sizes, short timing, small int8 sets with the CPU placement (no placement
#: search), no compile, no FP8, scaling on eager only, ``standard`` exported at fp32 only (the fusion baseline),
#: the OpenVINO IR but no ExecuTorch program (its lowering to XNNPACK alone takes minutes on 2 cores).
QUICK = Budget(
    latency_arch="micro",
    latency_min_time=0.02,
    latency_time_limit=60.0,
    compile_budget=0.0,
    scaling_arch="micro",
    scaling_sizes=(32, 64),
    seg_sizes=(),
    scaling_min_time=0.02,
    max_call_s=5.0,
    scaling_backends=("eager",),
    fusable_rounds=3,
    int8=dict(calibration_count=64, fidelity_count=32, eval_limit=200, qdq_placement="cpu"),
    standard_exports=("fp32",),
    fp8=False,
    formats=("openvino",),
)
#: Batch sizes of the latency rows.
BATCH_SIZES = (1, 8)


@dataclass
class ReportResult:
    """What :func:`report_variant` measured and wrote.

    Attributes:
        report: The ``report.json`` content.
        out: The report folder.
        verdict: The one-line verdict (also ``report["verdict"]["line"]``).
        files: Every file written in ``out`` (``report.md``, ``report.json``, the PNG plots).
    """

    report: dict[str, Any]
    out: Path
    verdict: str
    files: list[Path] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ steps
def _attempt(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``fn()`` with ``status: ok`` added; a usage error (the step cannot run here) is ``unavailable`` and any other
    failure ``failed``, each with its one-line reason."""
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            result = {"status": "ok", **fn()}
    except UsageError as exc:
        result = {"status": "unavailable", "reason": first_line(exc)}
    except Exception as exc:  # a failed step is a finding of the report, not its end
        result = {"status": "failed", "reason": first_line(exc, typed=True)}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    return result


def _skipped(reason: str) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason}


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


# ------------------------------------------------------------------------------------------------ export
def _source(variant: str, checkpoint: PathLike | None, like: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model an export side starts from: ``checkpoint``, else the zoo's classifier, else a random init (the
    arch of ``like``, the variant side's source, for ``standard`` beside a checkpoint of another arch)."""
    if checkpoint is not None:
        return {"kind": "checkpoint", "checkpoint": str(checkpoint)}
    try:
        path = zoo.checkpoint_path(variant, "cls")
    except ValueError:
        path = None
    same = like is None or (like.get("arch") in (None, _zoo_arch(variant)) and like.get("task") in (None, "cls"))
    if path is not None and same:
        return {"kind": "zoo", "checkpoint": path.name, "arch": _zoo_arch(variant)}  # the zoo's file, by name
    arch = (like or {}).get("arch") or "micro"
    return {"kind": "random-init", "arch": arch, "task": (like or {}).get("task", "cls")}


def _zoo_arch(variant: str) -> str | None:
    return next(
        (
            e.get("arch")
            for e in zoo.entries()
            if e["variant"] == variant and e["task"] == "cls" and e["data"] == zoo.DEFAULT_DATA
        ),
        None,
    )


#: The seed of a random-init side's one model (the benchmark's ``Settings.seed``).
SEED = 0


def _model_args(variant: str, source: dict[str, Any]) -> dict[str, Any]:
    """:func:`attnzoo.export.export_model`'s model arguments of one side. A random init is built once here, seeded,
    and passed as the model object, so every file of the side (fp32, fp16, int8, FP8, TensorRT, Triton, the
    opset-23 export) holds the same weights."""
    if source["kind"] == "random-init":
        torch.manual_seed(SEED)
        model, config, _ = export.load_for_export(variant, source.get("task"), source["arch"], random_init=True)
        model.attnzoo_config = config  # untrained, with its class names: export_model reads them from the model
        return {"model": model}
    if source["kind"] == "checkpoint":
        return {"checkpoint": source["checkpoint"]}
    return {"variant": variant}  # the zoo's


#: What stands for the report's temporary folder in the paths it records (its caches are removed with it).
TEMPORARY = "<temporary>"


def _untemp(obj: Any, work: Path) -> Any:
    """``obj`` with every string path inside ``work`` (the report's temporary folder, removed when it ends) written
    from :data:`TEMPORARY`: the file names stay, a path nobody can open again does not."""
    if isinstance(obj, dict):
        return {k: _untemp(v, work) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_untemp(v, work) for v in obj]
    if isinstance(obj, str) and (obj == str(work) or obj.startswith(f"{work}/")):
        return TEMPORARY + obj[len(str(work)) :]
    return obj


def _rel(path: Path, out: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path)


def _fp32_summary(report: dict[str, Any], out: Path, onnx_path: Path) -> dict[str, Any]:
    par, extra = report["parity"], report["extra_math"]
    return {
        "file": _rel(onnx_path, out),
        "passed": report["passed"],
        "opset": report.get("opset"),
        "max_abs_err": par["max_abs_err"],
        "tolerance": par["tolerance"],
        "batch_sizes": par["batch_sizes"],
        "top1_agree": min(
            (r[k]["top1_agree"] for r in par["per_batch"] for k in ("real", "random") if k in r), default=None
        ),
        "extra_math": {
            "ok": extra["ok"],
            "scopes": len(extra["blocks"]),
            "nodes_per_block": extra.get("nodes_per_block", {}),
            "failures": extra["failures"],
        },
        "nodes": report.get("num_nodes"),
        "file_size": report.get("file_size"),
        **_divergence(report),
    }


def _format_summary(report: dict[str, Any], out: Path, path: Path) -> dict[str, Any]:
    """An OpenVINO IR's or an ExecuTorch program's entry: the fp32 entry's fields (its parity with eager fp32, the
    extra math counted from the format's own graph, where it diverges), the runtime its parity ran on, and why its
    block outputs are not exposed where they are not."""
    summary = _fp32_summary(report, out, path)
    del summary["opset"]
    summary["nodes"] = report.get("num_nodes", report.get("num_ops"))
    summary["dtype"] = report.get("dtype")
    summary["runtime"] = report["parity"].get("runtime")
    summary["blocks_not_exposed"] = (report.get("divergence") or {}).get("not_exposed")
    return summary


def _divergence(report: dict[str, Any]) -> dict[str, Any]:
    """Where an export's report says it diverges: ``blocks`` (``{block, rel_err, cosine}`` each),
    ``first_diverging_block`` and ``worst_op`` (its node's name), from its ``divergence`` entry."""
    d = report.get("divergence") or {}
    op = d.get("worst_op") or {}
    return {
        "blocks": [{k: b[k] for k in ("block", "rel_err", "cosine")} for b in d.get("blocks", [])],
        "first_diverging_block": d.get("first_diverging_block"),
        "worst_op": op.get("node"),
    }


def _int8_summary(report: dict[str, Any]) -> dict[str, Any]:
    fid = report.get("fidelity") or {}
    q = report.get("quantization") or {}
    options = q.get("options") or {}
    auto = options.get("auto") or {}
    kept = [g for g, d in (auto.get("groups") or {}).items() if not d.get("quantized", True)]
    scope = report.get("extra_math_scope_check") or {}
    qdq = q.get("qdq") or {}
    return {
        "passed": report.get("passed"),
        "cosine_min": (fid.get("cosine") or {}).get("min"),
        "cosine_mean": (fid.get("cosine") or {}).get("mean"),
        "top1_agreement": fid.get("top1_agreement"),
        "fidelity_inputs": fid.get("n_inputs"),
        "fidelity_source": fid.get("source"),
        "placement": options.get("placement"),
        "kept_fp32": kept,
        "quantized_ops": qdq.get("quantized_ops"),
        "total_ops": qdq.get("total_ops"),
        "extra_math_kept": not scope.get("quantized") if scope else None,
        "quantizer": q.get("quantizer"),
        "calibration": q.get("calibration"),
        "accuracy": report.get("accuracy"),
        **_divergence(report),
    }


def _engine_format() -> ExportFormat:
    """The export format of the engine step: the one whose output is a TensorRT engine
    (:attr:`~attnzoo.export.formats.ExportFormat.builds_engine`, ``--format tensorrt``); its name is the step's in
    ``steps`` and keys its entry in an export side, as a format of :data:`~attnzoo.report.render.REPORT_FORMATS`'s
    does."""
    return next(part for part in export_formats.formats().values() if part.builds_engine)


def _engine_entry(built: Any, out: Path) -> dict[str, Any]:
    """The engine step's entry of an export side, from the engine part ``built`` of its export."""
    e = built.report
    return {
        "status": "ok",
        "engine": _rel(built.path, out),
        "state": e.status,
        "ran_on_gpu": e.ran_on_gpu,
        "not_run_reason": e.not_run_reason,
        "network_check": {k: (e.network_check or {}).get(k) for k in ("ok", "failures", "layers", "extra_math_scopes")},
        "library": f"{e.library} {e.library_version}",
        "compute_capability": e.compute_capability,
        "parity": e.parity,
        "latency": e.latency,
    }


@dataclass(frozen=True)
class _SideRun:
    """What every export of one model's side shares: the variant, its exports' folder, the report folder (an entry's
    paths are relative to it), the budget, the steps asked for, :func:`_model_args`'s keywords and why a step the
    budget leaves out was not built."""

    variant: str
    folder: Path
    out: Path
    budget: Budget
    steps: tuple[str, ...]
    args: dict[str, Any]
    unbuilt: str


def _fp32_and_engine_sides(side: dict[str, Any], run: _SideRun, engine_fmt: ExportFormat) -> Path:
    """The fp32 ONNX entry and the entry of ``engine_fmt`` in ``side``: the engine's export writes the ONNX file
    too; without an engine (not asked for, no TensorRT here, or its build failed) the ONNX is exported alone.
    Returns the ONNX file's path."""
    variant, folder, out, steps, args, unbuilt = run.variant, run.folder, run.out, run.steps, run.args, run.unbuilt
    onnx_path = folder / f"{variant}.onnx"

    def fp32_and_engine() -> dict[str, Any]:
        r = export.export_model(
            **args, out=folder / f"{variant}{engine_fmt.suffixes[0]}", format=engine_fmt.name, batch_sizes=BATCH_SIZES
        )
        from attnzoo.targets.tensorrt.engine_step import EngineOutput  # torch and onnx: at the step, not at --help

        built = r.part(EngineOutput)
        if built is None:
            raise RuntimeError(f"export_model(format={engine_fmt.name!r}) returned no engine report")
        side[engine_fmt.name] = _engine_entry(built, out)
        return _fp32_summary(r.report, out, r.onnx_path)

    engine_wanted = engine_fmt.name in steps
    side["fp32"] = _attempt(fp32_and_engine) if engine_wanted else {"status": "skipped"}
    if side["fp32"]["status"] != "ok":  # no engine (no TensorRT here, or its build failed): the ONNX alone
        engine = side["fp32"]
        side["fp32"] = _attempt(
            lambda: _fp32_summary(export.export_model(**args, out=onnx_path).report, out, onnx_path)
        )
        side[engine_fmt.name] = engine if engine_wanted else _skipped(f"not built with this budget ({unbuilt})")
    return onnx_path


def _precision_sides(side: dict[str, Any], run: _SideRun) -> None:
    """The fp16, int8 and fp8 ONNX entries of ``side``, each exported where ``steps`` (and the budget's fp8) ask."""
    variant, folder, out, budget, steps, args, unbuilt = (
        run.variant,
        run.folder,
        run.out,
        run.budget,
        run.steps,
        run.args,
        run.unbuilt,
    )
    if "fp16" in steps:
        path16 = folder / f"{variant}_fp16.onnx"
        side["fp16"] = _attempt(
            lambda: _fp32_summary(export.export_model(**args, out=path16, dtype="fp16").report, out, path16)
        )
    else:
        side["fp16"] = _skipped(f"not exported with this budget ({unbuilt})")
    for dtype, wanted in (("int8", "int8" in steps), ("fp8", "fp8" in steps and budget.fp8)):
        if not wanted:
            side[dtype] = _skipped(f"not built with this budget ({unbuilt})")
            continue
        path = folder / f"{variant}_{dtype}.onnx"

        def quantized(path: Path = path, dtype: str = dtype) -> dict[str, Any]:
            report = export.export_model(**args, out=path, dtype=dtype, **budget.int8).report
            return {"file": _rel(path, out), **_int8_summary(report)}

        side[dtype] = _attempt(quantized)


def _triton_side(run: _SideRun) -> dict[str, Any]:
    """The Triton repository's entry: its folder, its config and the config's check."""
    folder, out, steps, args = run.folder, run.out, run.steps, run.args
    if "triton" not in steps:
        return _skipped("not written with this budget (--quick)")

    def triton() -> dict[str, Any]:
        r = export.export_model(**args, out=folder / "triton", format="triton")
        return {
            "folder": _rel(r.path, out),
            "config": _rel(r.path / "config.pbtxt", out),
            **(check.to_dict() if (check := r.part(TritonConfigCheck)) else {}),
        }

    return _attempt(triton)


def _format_sides(side: dict[str, Any], run: _SideRun) -> None:
    """The entry of each format of :data:`~attnzoo.report.render.REPORT_FORMATS` in ``side``."""
    variant, folder, out, budget, steps, args = run.variant, run.folder, run.out, run.budget, run.steps, run.args
    for fmt in REPORT_FORMATS:
        if fmt not in steps:
            why = (
                "written for the variant only"
                if fmt in budget.formats
                else "--quick"
                if budget == QUICK
                else "not in its formats"
            )
            side[fmt] = _skipped(f"not written with this budget ({why})")
            continue

        def written(fmt: str = fmt) -> dict[str, Any]:
            path = folder / f"{variant}{export_formats.get_format(fmt).suffixes[0]}"
            r = export.export_model(**args, out=path, format=fmt, batch_sizes=BATCH_SIZES)
            return _format_summary(r.report, out, path)

        side[fmt] = _attempt(written)


def _accuracy_entry(side: dict[str, Any], source: dict[str, Any], variant: str) -> dict[str, Any]:
    """The test-split accuracy the int8 export measured, or why there is none."""
    acc = side["int8"].get("accuracy") if side["int8"]["status"] == "ok" else None
    if acc:
        return {"status": "ok", **acc}
    if source["kind"] == "random-init":
        return {
            "status": "absent",
            "reason": f"the zoo has no trained {variant} classifier: random init, no test split to score",
        }
    return {
        "status": "absent",
        "reason": "the int8 export measured no test-split accuracy"
        + (
            f" ({side['int8'].get('reason')})"
            if side["int8"].get("reason")
            else " (the model has no labelled test split)"
        ),
    }


def export_side(
    variant: str,
    source: dict[str, Any],
    folder: Path,
    out: Path,
    budget: Budget,
    steps: tuple[str, ...],
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Every export of one model (the ``steps`` of fp32, fp16, int8, fp8, tensorrt, triton, and the formats of
    :data:`~attnzoo.report.render.REPORT_FORMATS`), each an entry with
    ``status`` (``ok``, ``failed``, ``unavailable``, ``skipped``) and its figures; ``args``: the model's
    :func:`_model_args` (built from ``source`` when not given)."""
    folder.mkdir(parents=True, exist_ok=True)
    args = _model_args(variant, source) if args is None else args
    side: dict[str, Any] = {"source": source}
    unbuilt = (
        "--quick"
        if budget == QUICK
        else "the default run builds it for the variant only"
        if budget == FULL
        else "not in its standard_exports, or fp8 off"
    )
    run = _SideRun(variant, folder, out, budget, steps, args, unbuilt)
    engine_fmt = _engine_format()
    side["onnx_path"] = str(_fp32_and_engine_sides(side, run, engine_fmt))
    _precision_sides(side, run)
    side["triton"] = _triton_side(run)
    _format_sides(side, run)
    engine = engine_fmt.name
    side["extra_math_kept"] = {
        "fp32": (side["fp32"].get("extra_math") or {}).get("ok"),
        "fp16": (side["fp16"].get("extra_math") or {}).get("ok"),
        "int8": side["int8"].get("extra_math_kept"),
        engine: ((side.get(engine) or {}).get("network_check") or {}).get("ok"),
        **{fmt: (side[fmt].get("extra_math") or {}).get("ok") for fmt in REPORT_FORMATS},
    }
    side["accuracy"] = _accuracy_entry(side, source, variant)
    return side


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


# ------------------------------------------------------------------------------------------------ cost
def latency(variant: str, budget: Budget, work: Path, command: str) -> dict[str, Any]:
    """:func:`attnzoo.benchmarks.run.run_benchmark` of ``variant`` (``standard`` added by it) on every backend,
    batch 1 and 8, fp32 and bf16 where this CPU has bf16 units.

    One batch size at a time, resuming the same row log: the benchmark measures ``standard`` (the baseline) before
    the variant, so a run over both batch sizes that reached its time limit would keep standard's batch-8 rows and
    lose the variant's own. Batch by batch, the variant's batch-1 rows are measured before any batch-8 row.

    Raises:
        Terminated, Interrupted: SIGTERM / Ctrl-C arrived while it measured (the benchmark returns the rows it
            kept; the report stops there, as on a signal in any other step).
    """
    bf16 = bf16_problem()
    started, interrupted = time.monotonic(), None
    r: dict[str, Any] = {}  # the last batch's benchmark result (the first batch always runs)
    for i, batch in enumerate(BATCH_SIZES):
        left = budget.latency_time_limit - (time.monotonic() - started)
        if i and left <= 0:
            interrupted = {
                "signal": None,
                "during": f"batch {batch}",
                "rows_kept": len(r["results"]),
                "note": f"stopped at the latency time limit ({budget.latency_time_limit:g} s) before "
                f"batch {', '.join(map(str, BATCH_SIZES[i:]))}",
            }
            break
        s = bench_run.Settings(
            variants=[variant],
            backends=list(backend_names()),
            dtypes=["fp32"] + ([] if bf16 else ["bf16"]),
            batch_sizes=[batch],
            arch=budget.latency_arch,
            threads=1,
            min_time=budget.latency_min_time,
            out=work / "bench",
            cache_dir=work / "bench-cache",
            compile_budget=budget.compile_budget,
            ceiling_size=0,
            progress=False,
            pair_eager=False,
            time_limit=max(left, 0.0),
            command=command,
        )
        r = bench_run.run_benchmark(s)
        if (r["interrupted"] or {}).get("signal"):  # the benchmark keeps its rows on a signal; the report stops
            raise Terminated() if r["interrupted"]["signal"] == "SIGTERM" else Interrupted()
        if r["interrupted"]:
            interrupted = r["interrupted"]
            break
    return {
        "settings": r["settings"],
        "bf16": {"rows": bf16 is None, "reason": bf16},
        "rows": r["results"],
        "overheads": r["overheads"],
        "fastest_cpu": r["fastest_cpu"],
        "interrupted": interrupted,
        "note": r["note"],
        "wall_time_s": time.monotonic() - started,
    }


def scaling(variant: str, budget: Budget, work: Path, command: str, quick: bool) -> dict[str, Any]:
    """:func:`attnzoo.benchmarks.scaling.run_scaling` of ``standard`` and ``variant``: latency and peak memory against
    tokens (classifier; a Segmenter encoder where ``budget.seg_sizes``), batch 1.

    Its exports share :func:`latency`'s cache: the seeded model at the latency rows' size is exported once for both
    (``export_verified(reuse=True)``), which is most of the time of a variant whose export is slow."""
    settings = scaling_bench.Settings(
        variants=list(dict.fromkeys(["standard", variant])),
        backends=budget.scaling_backends,
        arch=budget.scaling_arch,
        sizes=budget.scaling_sizes,
        seg_sizes=budget.seg_sizes,
        batch_sizes=(),
        threads=1,
        min_time=budget.scaling_min_time,
        max_call_s=budget.max_call_s,
        out=work / "scaling",
        cache_dir=work / "bench-cache",
        progress=False,
        command=command,
        quick=quick,
    )
    return scaling_bench.run_scaling(settings)


def gpu_rows(variant: str) -> dict[str, Any]:
    """Rows of ``variant`` and ``standard`` from the GPU plan's committed results (``results/gpu-h100/<model>/
    results.json``), each marked with the file it comes from; ``status: absent`` where none are committed."""
    found = []
    for model in MODELS:
        path = ROOT / "results" / "gpu-h100" / model / "results.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        gpu = ((result.get("environment") or {}).get("gpu") or {}).get("name")
        over = {
            (o["backend"], o["dtype"], o["batch"]): o
            for o in result.get("overheads", [])
            if o.get("variant") == variant
        }
        for r in result.get("results", []):
            # the variant's measured and failed rows (a failed parity check is what its author needs to see),
            # standard's measured rows beside them; skipped rows (a backend not on that machine) are left out
            mine = r.get("variant") == variant and r.get("status") in ("ok", "failed")
            if mine or (r.get("variant") == "standard" and r.get("status") == "ok"):
                o = over.get((r["backend"], r["dtype"], r["batch"])) if r["variant"] == variant else None
                found.append(
                    {
                        "from": str(path.relative_to(ROOT)),
                        "model": model,
                        "gpu": gpu,
                        "variant": r["variant"],
                        "backend": r["backend"],
                        "dtype": r["dtype"],
                        "batch": r["batch"],
                        "status": r["status"],
                        "median_ms": r.get("median_ms") if r["status"] == "ok" else None,
                        "reason": r.get("reason") or "",
                        "overhead": o.get("ratio_median") if o else None,
                    }
                )
    if not any(r["variant"] == variant for r in found):
        return {
            "status": "absent",
            "reason": f"the GPU plan's committed results (results/gpu-h100/) hold no row of {variant} yet",
            "rows": [],
        }
    return {"status": "ok", "note": "from the GPU plan's committed results, not measured in this run", "rows": found}


# ------------------------------------------------------------------------------------------------ the call
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
    budget = budget or (QUICK if quick else FULL)
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
        sides = _export_sides(variant, src, args, out, budget, section)
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


def _checked_request(variant: str, checkpoint: PathLike | None, out: PathLike | None) -> tuple[str, Path]:
    """The variant's canonical name and the report folder (made), each refused with a :class:`UsageError` before
    anything is measured or written (:func:`report_variant`'s ``Raises``)."""
    try:  # without torch where no plugin is installed: a bad name is refused at once
        variant = check_variant(variant) or models.canonical_name(variant)
    except ValueError:
        valid = variant_names() or models.VARIANT_NAMES
        raise UsageError(f"unknown variant {quoted(variant)}; valid: {', '.join(valid)}") from None
    if checkpoint is not None:
        try:
            checkpoint_kind(checkpoint)
        except ValueError as exc:
            raise UsageError(f"--checkpoint {exc}") from None
    out = Path(out) if out is not None else Path("variant-reports") / variant
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file; it names the report folder")
    problem = out_problem(out, variant)
    if problem:
        raise UsageError(problem)
    writable_dir(out, "report folder")
    return variant, out


#: Runs one named section of a report and records its seconds: ``section(name, fn) -> fn()``.
_Section = Callable[[str, Callable[[], Any]], Any]


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


def _export_sides(
    variant: str, src: dict[str, Any], args: dict[str, Any], out: Path, budget: Budget, section: _Section
) -> dict[str, dict[str, Any]]:
    """The variant's export side (every step), then, for another variant, ``standard``'s (its standard exports,
    of the same arch and task)."""
    sides = {
        variant: section(
            "export",
            lambda: export_side(
                variant,
                src,
                out / "exports" / variant,
                out,
                budget,
                ("fp32", "fp16", "int8", "fp8", "tensorrt", "triton", *budget.formats),
                args,
            ),
        )
    }
    if variant != "standard":
        std_src = _source("standard", None, like=_side_model(sides[variant], src))
        sides["standard"] = section(
            "export (standard)",
            lambda: export_side(
                "standard", std_src, out / "exports" / "standard", out, budget, budget.standard_exports
            ),
        )
    return sides


def _side_model(side: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """The arch and task the variant side exported (for ``standard`` to match)."""
    path = side.get("onnx_path")
    if path and Path(path).is_file():
        with contextlib.suppress(Exception):
            config = export.read_metadata(path)
            return {"arch": config.get("arch"), "task": config.get("task")}
    return {"arch": source.get("arch"), "task": source.get("task", "cls")}


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed (for the report)."""
    return "report-variant " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
