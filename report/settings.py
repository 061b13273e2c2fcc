"""What one ``report_variant()`` run is asked for and how its steps are recorded: its folder (:func:`out_problem`),
its sizes and time limits (:class:`Budget`: :data:`FULL`, ``--quick``'s :data:`QUICK`), what it returns
(:class:`ReportResult`), and each step's outcome (``ok``, ``failed`` or ``unavailable`` with its reason).

:data:`FULL` and :data:`QUICK` are made when first asked for (:func:`full_budget`, :func:`quick_budget`): their formats
are read from the export formats (:func:`~attnzoo.report.formats.report_formats`), which import every target's, so
that ``report-variant --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnzoo.errors import UsageError, first_line, quoted
from attnzoo.fileio import PathLike, read_json, writable_dir
from attnzoo.filekind import checkpoint_kind
from attnzoo.lazy import lazy_import
from attnzoo.modelconfig import check_variant, variant_names

from .formats import report_formats

models = lazy_import("attnzoo.models")  # torch and timm: a bad name is refused without them where no plugin is here

__all__ = [
    "SCHEMA",
    "OWN_ENTRIES",
    "out_problem",
    "BATCH_SIZES",
    "Budget",
    "full_budget",
    "quick_budget",
    "named_budget",
    "ReportResult",
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
            :func:`~attnzoo.report.formats.report_formats`; by default all of them), each verified as
            ``export-model --format NAME`` verifies it.
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
    formats: tuple[str, ...] = field(default_factory=report_formats)


#: The default run: ViT-Ti latency rows at 197 tokens without torch.compile (its compilation per shape and
#: precision does not fit the budget; ``bench-latency --backends compile`` times it), scaling 197 -> 577 -> 1,025
#: tokens on eager and ONNX Runtime (the Segmenter encoder at 4,097 tokens is the scaling benchmark's:
#: ``python -m attnzoo.benchmarks.scaling``), int8 scored on 2,000 test images, FP8 for the variant only. Designed
#: for at most 10 minutes on 2 cores (docs/report-variant.md has the measured runs).
def full_budget() -> Budget:
    """:data:`FULL`, its formats read from the export formats now."""
    return Budget(
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
#: the report's formats that run in ``--quick`` (not one whose export takes minutes on 2 cores).
def quick_budget() -> Budget:
    """:data:`QUICK`, its formats read from the export formats now."""
    return Budget(
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
        formats=report_formats(quick=True),
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


#: Runs one named section of a report and records its seconds: ``section(name, fn) -> fn()``.
_Section = Callable[[str, Callable[[], Any]], Any]


def named_budget(module: str, name: str) -> Budget:
    """``module``'s :data:`FULL` (:func:`full_budget`) or :data:`QUICK` (:func:`quick_budget`), made when asked for:
    the ``__getattr__`` of each module that offers them."""
    if name == "FULL":
        return full_budget()
    if name == "QUICK":
        return quick_budget()
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def __getattr__(name: str) -> Budget:
    return named_budget(__name__, name)
