"""The export side of a report: every export of one model (``standard``'s or the variant's) by
:func:`attnzoo.export.export_model`, each an entry of ``report.json`` with its figures: fp32 (parity with eager,
the extra math, where it diverges), fp16, int8 and FP8 (fidelity, placement, accuracy), the TensorRT engine (built,
not run, without a GPU), the Triton configuration and every format of
:func:`~attnzoo.report.formats.report_formats`, each verified as ``export-model --format NAME`` verifies it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnzoo.fileio import PathLike
from attnzoo.lazy import lazy_import
from attnzoo.targets.triton.schema import TritonConfigCheck

from .formats import report_formats
from .settings import BATCH_SIZES, Budget, _attempt, _Section, _skipped, full_budget, quick_budget

if TYPE_CHECKING:
    from attnzoo.export.formats import ExportFormat

# report-variant --help loads without torch, onnx and timm: these import at their first use
torch = lazy_import("torch")
zoo = lazy_import("attnzoo.zoo")
export = lazy_import("attnzoo.export")
export_formats = lazy_import("attnzoo.export.formats")

__all__ = ["export_side", "export_sides", "SEED", "TEMPORARY"]


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
    ``steps`` and keys its entry in an export side, as a format of
    :func:`~attnzoo.report.formats.report_formats` does."""
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
    """The entry of each format of :func:`~attnzoo.report.formats.report_formats` in ``side``."""
    variant, folder, out, budget, steps, args = run.variant, run.folder, run.out, run.budget, run.steps, run.args
    for fmt in report_formats():
        if fmt not in steps:
            why = (
                "written for the variant only"
                if fmt in budget.formats
                else "--quick"
                if budget == quick_budget()
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
    :func:`~attnzoo.report.formats.report_formats`), each an entry with
    ``status`` (``ok``, ``failed``, ``unavailable``, ``skipped``) and its figures; ``args``: the model's
    :func:`_model_args` (built from ``source`` when not given)."""
    folder.mkdir(parents=True, exist_ok=True)
    args = _model_args(variant, source) if args is None else args
    side: dict[str, Any] = {"source": source}
    unbuilt = (
        "--quick"
        if budget == quick_budget()
        else "the default run builds it for the variant only"
        if budget == full_budget()
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
        **{fmt: (side[fmt].get("extra_math") or {}).get("ok") for fmt in report_formats()},
    }
    side["accuracy"] = _accuracy_entry(side, source, variant)
    return side


def export_sides(
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
