"""``python -m attnzoo.report.index``: a set of ``report-variant`` reports, one folder per variant, and the index
table that compares them.

:func:`build_reports` runs :func:`attnzoo.report.report_variant` for each variant whose folder lacks a complete
``report.json`` (one at a time; a finished report is kept, so a stopped run resumes where it stopped), and
:func:`write_index` writes the folder's ``README.md``: one row per report found, every cell read from that
report's ``report.json`` (docs/report-variant.md, "A set of reports").

Examples::

    python -m attnzoo.report.index --out results/variant-reports --run            # every variant (the default)
    python -m attnzoo.report.index --out /tmp/reports --run --quick --variants standard,belief2
    python -m attnzoo.report.index --out results/variant-reports                  # the index alone, from the reports

Errors: one ``error: ...`` line; exit 2 for a bad command line (an unknown variant lists the valid ones), 1 when a
report could not be written (the others are kept and indexed).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attnzoo.benchmarks.tables import markdown_table
from attnzoo.cli import add_debug_flag, entry_point, parse_names
from attnzoo.errors import CommandError, UsageError, first_line
from attnzoo.fileio import PathLike, atomic_write_text, read_json, writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.mdtext import code, fence, link, text
from attnzoo.runtime.fusion import FUSED

from .cells import (
    _get,
    _tokens,
    deploys_cell,
    fused_cells,
    int8_cosine_cell,
    int8_top1_cell,
    machine,
    overhead_cell,
    parity_cell,
    tensorrt_cell,
)
from .render import (
    RUNTIMES,
    entry_title,
    failures,
    report_formats,
    write_report,
)
from .variant import SCHEMA, report_variant

models = lazy_import("attnzoo.models")  # torch and timm: --help stays fast

__all__ = [
    "EXAMPLE_PLUGIN",
    "INDEX_NAME",
    "LEGEND",
    "default_variants",
    "read_report",
    "build_reports",
    "find_reports",
    "index_markdown",
    "deploys_cell",
    "write_index",
    "main",
]

#: The example plugin's variant (``examples/attnzoo-cosine``), reported beside the built-ins.
EXAMPLE_PLUGIN = "cosine"
EXAMPLE_INSTALL = "pip install ./examples/attnzoo-cosine"
#: The index file written into the reports' folder.
INDEX_NAME = "README.md"
#: What a cell says where its report has no figure, and why.
LEGEND = {
    "—": "the report has no such field",
    "not run": "the step was not run with the report's budget (`--quick` builds no FP8 graph, ...)",
    "unavailable": "the step cannot run on that machine (its reason is in report.md)",
    "failed": "the step ran and failed (its one-line reason is in report.md)",
    "absent": "the variant has no such form or data (its reason is in report.md)",
    "not inspected": "the runtime's graph could not be read there (TensorRT's layers need a GPU); shown, never "
    "counted as fused or not",
    "not measured": "the section ran but gave no latency ratio to `standard`",
    "not counted": "in deploys: the steps that did not run there (a TensorRT engine `built, not run` without a GPU, "
    "a step `unavailable` or `not run`); deploys rests only on the steps that ran and passed",
    "baseline": "`standard` itself, the baseline of every ratio",
}


# ------------------------------------------------------------------------------------------------ reading
def read_report(folder: PathLike) -> dict[str, Any] | None:
    """The report in ``folder`` if it is complete: ``report.json`` parses, has this schema and a verdict, and
    ``report.md`` is beside it (``report_variant`` writes each file whole, ``report.json`` first); else ``None``."""
    folder = Path(folder)
    try:
        report = read_json(folder / "report.json")
    except (OSError, ValueError):
        return None
    if (
        not isinstance(report, dict)
        or report.get("schema") != SCHEMA
        or not (report.get("verdict") or {}).get("line")
        or not (folder / "report.md").is_file()
    ):
        return None
    return report


def find_reports(out: PathLike) -> tuple[list[tuple[Path, dict[str, Any]]], list[Path]]:
    """The complete reports in ``out``'s sub-folders, in registry order (others after, by name), and the
    sub-folders holding an incomplete one (a run that stopped)."""
    out = Path(out)
    found, incomplete = [], []
    for folder in sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")) if out.is_dir() else []:
        report = read_report(folder)
        if report is not None:
            found.append((folder, report))
        elif (folder / "exports").is_dir() or (folder / "report.json").exists():  # what report_variant writes
            incomplete.append(folder)
    order = {name: i for i, name in enumerate(models.VARIANT_NAMES)}
    found.sort(key=lambda fr: (order.get(fr[1]["variant"], len(order)), fr[1]["variant"], fr[0].name))
    return found, incomplete


# ------------------------------------------------------------------------------------------------ running
def default_variants() -> list[str]:
    """Every built-in variant in registry order, then the example plugin's.

    Raises:
        UsageError: the example plugin is not installed (one line saying how to install it).
    """
    if EXAMPLE_PLUGIN not in models.VARIANT_NAMES:
        raise UsageError(
            f"the example plugin's variant {EXAMPLE_PLUGIN!r} is not registered: install it "
            f"({EXAMPLE_INSTALL}) or name the variants with --variants"
        )
    return [*models.BUILTIN_VARIANTS, EXAMPLE_PLUGIN]


def _report_command(variant: str, folder: Path, quick: bool) -> str:
    """The ``report-variant`` command that writes the same report."""
    return shlex.join(["report-variant", "--variant", variant, "--out", str(folder), *(["--quick"] if quick else [])])


def build_reports(
    out: PathLike,
    variants: Sequence[str] | None = None,
    quick: bool = False,
    *,
    progress: bool = True,
    index: bool = True,
) -> list[dict[str, Any]]:
    """Write ``out/<variant>/`` with :func:`attnzoo.report.report_variant` for each variant whose folder lacks a
    complete report of this budget; one at a time, a finished report kept.

    A stopped run leaves the reports it finished and no partial ``report.json`` (``report_variant`` writes it
    whole, at its end): the next run starts at the first variant without one.

    Args:
        out: The reports' folder.
        variants: Registered variant names (default :func:`default_variants`).
        quick: ``report-variant --quick``'s budget; a report of the other budget is measured again.
        progress: A progress bar over the variants, and each verdict line, on stderr.
        index: Rewrite ``out``'s index after each report written (:func:`write_index`).

    Returns:
        One entry per variant: ``variant``, ``folder``, ``state`` (``kept``, ``written`` or ``failed``), and
        ``verdict`` (kept, written) or ``reason`` (failed), ``seconds`` where it ran.

    Raises:
        UsageError: an unknown variant (the valid ones listed), or ``out`` not a writable folder.
    """
    names = (
        default_variants()
        if variants is None
        else parse_names(",".join(variants), models.canonical_name, "variant", ", ".join(models.VARIANT_NAMES))
    )
    out = writable_dir(Path(out), "--out folder")
    done: list[dict[str, Any]] = []
    bar = tqdm(names, desc="variant reports", unit="report", disable=not progress, file=sys.stderr)
    for name in bar:
        folder = out / name
        kept = read_report(folder)
        if kept is not None and kept.get("variant") == name and bool(kept.get("quick")) == quick:
            done.append({"variant": name, "folder": folder, "state": "kept", "verdict": kept["verdict"]["line"]})
            continue
        bar.set_postfix_str(name)
        t0 = time.monotonic()
        try:
            result = report_variant(name, out=folder, quick=quick, command=_report_command(name, folder, quick))
        except UsageError:
            raise
        except Exception as exc:  # one variant's failure is reported; the others still run
            done.append(
                {
                    "variant": name,
                    "folder": folder,
                    "state": "failed",
                    "reason": first_line(exc, typed=True),
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
            if progress:
                tqdm.write(f"{name}: failed: {done[-1]['reason']}", file=sys.stderr)
            continue
        done.append(
            {
                "variant": name,
                "folder": folder,
                "state": "written",
                "verdict": result.verdict,
                "seconds": round(time.monotonic() - t0, 1),
            }
        )
        if progress:
            tqdm.write(result.verdict, file=sys.stderr)
        if index:
            write_index(out)
    return done


# ------------------------------------------------------------------------------------------------ index
@dataclass(frozen=True)
class _IndexColumns:
    """The index table's columns, which depend on the reports: the runtimes their fusion audits name, the token
    counts of their latency ratios, and whether rows differ in budget or machine (then each row names its own)."""

    runtimes: list[str]
    first: list[int]
    most: list[int]
    per_row_budget: bool
    per_row_machine: bool

    def header(self) -> list[str]:
        """The table's header."""

        def over_header(tokens: list[int], what: str) -> str:
            return f"x standard at {tokens[0]:,} tokens" if len(tokens) == 1 else f"x standard, {what}"

        header = [
            "variant",
            "deploys",
            "fp32 parity (max err)",
            "fp16 parity (max err)",
            "int8 cosine, worst (placement)",
            "int8 top-1 agreement",
            "TensorRT",
            *[f"{entry_title(f)} parity (max err)" for f in report_formats()],
            *[f"fused: {RUNTIMES.get(k, k)}" for k in self.runtimes],
            over_header(self.first, "latency rows"),
            over_header(self.most, "most tokens"),
            "checks that did not pass",
        ]
        if self.per_row_budget:
            header.append("budget")
        if self.per_row_machine:
            header.append("machine")
        return header

    def row(self, folder: Path, report: Mapping[str, Any], out: Path) -> list[str]:
        """The row of ``report`` (in ``folder``, below ``out``), its variant linked to its ``report.md``."""
        name = report["variant"]
        side = _get(report, "export", name) or {}
        failed = failures(report)
        cells = [
            deploys_cell(report),
            parity_cell(side.get("fp32")),
            parity_cell(side.get("fp16")),
            int8_cosine_cell(side.get("int8")),
            int8_top1_cell(side.get("int8")),
            tensorrt_cell(side.get("tensorrt")),
            *[parity_cell(side.get(f)) for f in report_formats()],
            *fused_cells(report, self.runtimes),
            overhead_cell(report, "overhead_first", len(self.first) > 1),
            overhead_cell(report, "overhead_most_tokens", len(self.most) > 1),
            "; ".join(f"{f['check']}: {f['reason']}" for f in failed) or "none",
        ]
        if self.per_row_budget:
            cells.append("--quick" if report.get("quick") else "default")
        if self.per_row_machine:
            cells.append(machine(report))
        # every cell is read from a report.json, which anyone can edit: escaped, and the link only to its folder
        return [link(name, f"{folder.relative_to(out).as_posix()}/report.md"), *map(text, cells)]


def index_markdown(found: Sequence[tuple[Path, Mapping[str, Any]]], out: Path, incomplete: Sequence[Path] = ()) -> str:
    """The index page of the reports ``found`` (each a folder of ``out`` and its ``report.json``)."""
    reports = [r for _, r in found]
    seen = [x.get("runtime") for r in reports for x in (_get(r, "fusion", r["variant"], "audit", "runtimes") or [])]
    runtimes = [k for k in RUNTIMES if k in seen] + [k for k in dict.fromkeys(seen) if k and k not in RUNTIMES]
    machines = list(dict.fromkeys(machine(r) for r in reports))
    budgets = list(dict.fromkeys(bool(r.get("quick")) for r in reports))
    columns = _IndexColumns(
        runtimes,
        _tokens(reports, "overhead_first"),
        _tokens(reports, "overhead_most_tokens"),
        per_row_budget=len(budgets) > 1,
        per_row_machine=len(machines) > 1,
    )
    rows = [columns.row(folder, r, out) for folder, r in found]
    quick = budgets == [True]
    lines = [
        "# Variant reports",
        "",
        "One `report-variant` report per variant: whether it deploys, from the steps that ran (export parity, "
        "int8 fidelity, the other formats; a TensorRT engine built without a GPU is `built, not run` and not counted), "
        "whether each runtime fuses its attention core, and its latency against `standard`. Each row links its "
        "`report.md`; every cell is read from that folder's `report.json` (docs/report-variant.md has the "
        "schema and how each figure is measured).",
        "",
    ]
    if not found:
        lines += ["No complete report here yet."]
    else:
        lines += _index_table(columns, rows, machines, quick, reports)
    if incomplete:
        lines += [
            "",
            "Folders without a complete report (a run that stopped; the command below finishes them): "
            + ", ".join(code(p.name) for p in incomplete)
            + ".",
        ]
    lines += _index_commands(out, quick)
    if found:
        lines += _index_runs(reports)
    return "\n".join(lines) + "\n"


def _index_table(
    columns: _IndexColumns,
    rows: list[list[str]],
    machines: list[str],
    quick: bool,
    reports: Sequence[Mapping[str, Any]],
) -> list[str]:
    """The machine and budget the reports share, the table, how its ratios read and the legend of empty cells."""
    lines = []
    if not columns.per_row_machine:
        lines += [f"Machine: {text(machines[0])}.", ""]
    else:
        lines += ["The reports come from different machines: each row names its own.", ""]
    if not columns.per_row_budget:
        lines += [
            (
                "Budget: `--quick` (micro models, small sizes, short timing)."
                if quick
                else "Budget: the default `report-variant` run."
            ),
            "",
        ]
    lines += [
        markdown_table([text(h) for h in columns.header()], rows),
        "",
        "Ratios: the variant's latency over `standard`'s, batch 1, fp32 (`verdict.overhead_first`: the "
        "latency rows, on the variant's fastest CPU runtime; `verdict.overhead_most_tokens`: the most tokens "
        f"of the scaling sweep). Fused cores, of the variant's cores, where {text(FUSED)}. "
        + _inspected(reports, columns.runtimes),
        "",
        "Where a cell holds no figure:",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in LEGEND.items()]
    return lines


def _index_commands(out: Path, quick: bool) -> list[str]:
    """The command that builds (or finishes) the whole set, and where each report's exports went."""
    return [
        "",
        "## Commands",
        "",
        "The whole set (each variant's report is kept once written; a stopped run resumes at the first variant "
        "without one):",
        "",
        *fence(
            f"{EXAMPLE_INSTALL}   # the example plugin, in the default set\n"
            + shlex.join(
                ["python", "-m", "attnzoo.report.index", "--out", str(out), "--run", *(["--quick"] if quick else [])]
            ),
            "bash",
        ),
        "",
        "Each report's exports (`<variant>/exports/`: the ONNX files, TensorRT engine and Triton folder its "
        "tables name, about 16 MB a variant) are build outputs, not committed: `report-variant --variant NAME "
        "--out DIR` writes them again.",
        "",
    ]


def _index_runs(reports: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each report's command, wall and CPU seconds and load average, as its ``report.json`` records them."""
    lines = [
        "Each report, as its `report.json` records it (wall and CPU seconds of its run, load average at its start):",
        "",
    ]
    for r in reports:
        env = r.get("environment") or {}
        load = env.get("load_average")
        lines.append(
            f"- {code(r.get('command') or 'report_variant()')}: {text(_num(r.get('wall_time_s')))} s, "
            f"{text(_num(r.get('cpu_time_s')))} CPU s, load average {text(load if load is not None else '—')}"
        )
    return lines


def _num(value: Any) -> str:
    return "—" if value is None else f"{value:.0f}" if isinstance(value, (int, float)) else str(value)


def _inspected(reports: Sequence[Mapping[str, Any]], runtimes: Sequence[str]) -> str:
    """Which runtimes' graphs the reports read, and why the others were not (Markdown text)."""
    parts = []
    for name in runtimes:
        entries = [
            x
            for r in reports
            for x in (_get(r, "fusion", r["variant"], "audit", "runtimes") or [])
            if isinstance(x, Mapping) and x.get("runtime") == name
        ]
        seen = sum(bool(x.get("inspected")) for x in entries)
        why = next((x.get("reason") for x in entries if not x.get("inspected") and x.get("reason")), None)
        parts.append(
            f"{RUNTIMES.get(name, name)} inspected in {seen} of {len(entries)} reports" + (f" ({why})" if why else "")
        )
    return text("Runtimes: " + "; ".join(parts) + ".") if parts else ""


def write_index(out: PathLike) -> Path:
    """Write ``out/README.md``, the index of the complete reports in ``out``; returns its path."""
    out = Path(out)
    found, incomplete = find_reports(out)
    path = out / INDEX_NAME
    atomic_write_text(path, index_markdown(found, out, incomplete))
    return path


# ------------------------------------------------------------------------------------------------ command
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m attnzoo.report.index",
        description="A set of report-variant reports, one folder per variant, and the index table that compares them.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="docs/report-variant.md describes the reports and the index.",
    )
    parser.add_argument("--out", type=Path, required=True, help="the reports' folder (one sub-folder per variant)")
    parser.add_argument(
        "--run",
        action="store_true",
        help="write each variant's report whose folder lacks a complete one, then the index "
        "(without it: the index alone, from the reports there)",
    )
    parser.add_argument(
        "--variants",
        default=None,
        help="comma-separated variants for --run (default: every built-in, then the example plugin "
        f"{EXAMPLE_PLUGIN!r})",
    )
    parser.add_argument("--quick", action="store_true", help="--run with report-variant --quick's budget")
    parser.add_argument(
        "--render",
        action="store_true",
        help="write each complete report's verdict and report.md again from its report.json (nothing measured, "
        "plots kept), then the index",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or verdict lines on stderr")
    return add_debug_flag(parser)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnzoo.report.index``."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if not args.run and (args.variants is not None or args.quick):
        raise UsageError(
            "--variants and --quick choose what --run writes; add --run (without it only the index is written)"
        )
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out} is a file; it names the reports' folder")
    if args.render and args.run:
        raise UsageError("--render rewrites the reports there from their report.json; --run measures: choose one")
    failed = []
    if args.render:
        if not args.out.is_dir():
            raise UsageError(f"--out {args.out}: no such folder")
        for folder, report in find_reports(args.out)[0]:
            write_report(report, folder, replot=False)
    if args.run:
        variants = (
            None
            if args.variants is None
            else parse_names(args.variants, models.canonical_name, "variant", ", ".join(models.VARIANT_NAMES))
        )
        done = build_reports(args.out, variants, quick=args.quick, progress=not args.no_progress)
        failed = [d for d in done if d["state"] == "failed"]
    elif not args.out.is_dir():
        raise UsageError(f"--out {args.out}: no such folder (add --run to write the reports)")
    path = write_index(args.out)
    print(path, flush=True)
    if failed:
        raise CommandError(
            f"{len(failed)} report(s) not written: " + "; ".join(f"{d['variant']}: {d['reason']}" for d in failed)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
