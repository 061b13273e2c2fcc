"""What an export format is: :class:`ExportFormat`, the part :func:`attnzoo.export.export_model` runs after the
verified ONNX is written, :class:`ExportRequest`, the checked arguments every part sees, and :class:`ExportResult`,
what the export wrote, which each part fills in and which holds its format."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

from attnzoo.errors import UsageError, first_line
from attnzoo.fileio import atomic_write_text, no_space_problem, sha256_file, writable_dir
from attnzoo.runtime.schemas import schema_checked
from attnzoo.runtime.targets import FormatOption

from ..check import block_prefix
from ..divergence import BlockRecorder
from ..errors import DiskFullError, ExportError
from ..quantize.record import summary as quantize_summary
from ..verify import VerificationError, parity_vs_eager, report_path, verdict_lines
from ..verify import summary as verify_summary

__all__ = [
    "ExportFormat",
    "ExportRequest",
    "ExportResult",
    "FormatOption",
    "ModelSource",
    "Step",
    "run_step",
    "report_path",
    "failed_report_path",
    "keep_report",
    "record_failure",
    "summary_text",
]


@dataclass
class ExportRequest:
    """The arguments of one :func:`attnzoo.export.export_model` call, checked."""

    format: str
    dtype: str
    out: Path | None
    opset: int
    batch_sizes: list[int]
    quantize: Any  #: the quantization options (int8 / fp8), as :mod:`attnzoo.export.quantize` takes them
    #: The format's own options that were given (:attr:`ExportFormat.options`), by name; :meth:`option` reads one.
    options: dict[str, Any] = field(default_factory=dict)

    def option(self, option: FormatOption) -> Any:
        """The value of one of the format's own options: as given, else its default."""
        return self.options.get(option.name, option.default)


@dataclass
class ModelSource:
    """What a format written from the PyTorch model (:attr:`ExportFormat.from_model`) starts from."""

    model: Any  #: the eager model (fp32, CPU, eval mode): the export's source and its parity reference
    config: dict[str, Any]
    checkpoint_sha256: str
    hw: tuple[int, int]  #: the input's height and width
    threads: int | None


_P = TypeVar("_P")


@dataclass
class ExportResult:
    """What :func:`export_model` wrote.

    Attributes:
        path: The output: the ``.onnx`` file, the engine, the Triton model folder, or the AOTInductor package.
        onnx_path: The verified ONNX file (the output itself, beside the engine, or in the Triton folder); ``None``
            for a format written from the PyTorch model (``aoti``).
        report: The ONNX file's report (``<onnx>.report.json``): its verification, or for int8 / fp8 its
            quantization, accuracy and fidelity.
        format, dtype: As exported.
        fp32_report: int8 / fp8: the verification report of the fp32 graph it was quantized from.
        parts: What the format's parts wrote besides ``path``, each a typed record of its own (the TensorRT engine
            part's :class:`~attnzoo.targets.tensorrt.engine_step.EngineOutput`, Triton's
            :class:`~attnzoo.targets.triton.schema.TritonConfigCheck`); read one with :meth:`part`.
        warnings: What the export warned about (also issued as :class:`ExportWarning`).
        writer: The :class:`ExportFormat` called ``format``, which wrote it: the lines and files of its own
            are its.
        replaced: What the export replaced, one line each (a file that was at the output path, or a symbolic link
            there, which the new file replaced while the file it pointed to was left as it was); the summary's last
            lines.
    """

    path: Path
    onnx_path: Path | None
    report: dict[str, Any]
    format: str
    dtype: str
    #: The :class:`ExportFormat` called ``format``, which wrote it (its files and summary lines are its).
    writer: ExportFormat = field(repr=False, compare=False, kw_only=True)
    fp32_report: dict[str, Any] | None = None
    parts: list[Any] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)

    def part(self, kind: type[_P]) -> _P | None:
        """The record of type ``kind`` a format part wrote (``result.part(EngineOutput)``), or ``None``."""
        return next((p for p in self.parts if isinstance(p, kind)), None)

    @property
    def files(self) -> list[Path]:
        """Every file written: the ONNX and its report, then its format's (the engine and its report, the Triton
        config, the AOTInductor package and its report)."""
        onnx = [] if self.onnx_path is None else [self.onnx_path, report_path(self.onnx_path)]
        return [*onnx, *self.writer.files(self)]

    def summary(self) -> str:
        """The lines ``export-model`` prints."""
        if self.onnx_path is None:  # written from the model: the format's own lines
            lines = []
        elif self.fp32_report is None:
            lines = [verify_summary(self.report)]
        else:
            par = self.fp32_report["parity"]
            lines = [
                f"fp32 source verified: parity vs eager max abs err {par['max_abs_err']:.2e} at batch sizes "
                f"{par['batch_sizes']}",
                quantize_summary(self.report),
                f"  report: {report_path(self.onnx_path)}",
            ]
        return "\n".join(lines + self.writer.summary(self) + self.replaced)


#: One step of a format: its name on the progress bar, and what writes it (``result.path`` is the output,
#: ``result.onnx_path`` the verified ONNX already written).
Step = tuple[str, Callable[[ExportRequest, ExportResult], None]]


def run_step(fn: Callable[..., Any], what: str, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``; a failure that is not one of ours becomes one :class:`ExportError` line, and one
    that a full disk caused (:func:`attnzoo.fileio.no_space_problem`) a :class:`DiskFullError` that says so."""
    try:
        return fn(*args, **kwargs)
    except ExportError:
        raise
    except Exception as exc:  # ONNX Runtime / exporter / TensorRT errors: one line (the cause is chained)
        full = no_space_problem(exc)
        if full:
            raise DiskFullError(f"{what}: {full}") from exc
        if isinstance(exc, (ValueError, OSError)):
            raise
        raise ExportError(f"{what}: {type(exc).__name__}: {first_line(exc)}") from exc


def failed_report_path(out: str | Path) -> Path:
    """``model.pt2`` -> ``model.pt2.failed.json``: the report of a file that failed, never replacing a good one's."""
    return Path(str(out) + ".failed.json")


def keep_report(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Write the report of ``out``, which passed, beside it through its schema (:func:`schema_checked`; a failed
    report left by an earlier try goes); the report as written."""
    written = schema_checked(report)
    atomic_write_text(report_path(out), json.dumps(written, indent=2) + "\n")
    failed_report_path(out).unlink(missing_ok=True)
    return written


def record_failure(out: Path, report: dict[str, Any], failures: list[str]) -> str:
    """Record ``failures`` in ``report`` and write it as ``out``'s failed report; the one line that says so
    (nothing is written at ``out``)."""
    report.update(passed=False, failures=failures)
    atomic_write_text(failed_report_path(out), json.dumps(schema_checked(report), indent=2) + "\n")
    return (
        f"{out.name} failed verification ({'; '.join(failures[:3])}); see {failed_report_path(out)}; "
        f"{out.name} was not written"
    )


def summary_text(head: str, report: dict[str, Any], batches: str, path: Path | None = None) -> str:
    """A file written from the model, for the terminal: ``head`` (what the file is), its parity (``batches``: how
    its batch is dynamic), the extra math per block, the verdict, and where its report is."""
    runtime = (report.get("parity") or report.get("fidelity") or {}).get("runtime", "")
    lines = [head, *verdict_lines(report, runtime, batches)]
    return "\n".join(lines + ([f"  report: {path}"] if path is not None else []))


class ExportFormat:
    """One output format of ``export-model``: what it checks, where it writes, what it writes, its summary.

    A format starts from the verified ONNX (fp32 / fp16, or int8 / fp8 Q/DQ) that the pipeline writes first at
    :meth:`onnx_path`, and its :meth:`steps` then write its own files from it; or, :attr:`from_model`, from the
    PyTorch model itself (:meth:`write_model`: AOTInductor). A module of
    :mod:`attnzoo.export.formats` that defines ``FORMAT``, an instance, adds the format.

    Attributes:
        name: ``--format`` value.
        title: What its output is called in messages (``"TensorRT engine"``).
        suffixes: Output file suffixes, the first the default (the format is inferred from them); empty for a
            format that writes a folder, named only with an explicit ``--format``.
    """

    name: str = ""
    title: str = ""
    suffixes: tuple[str, ...] = ()
    #: Written from the PyTorch model itself by :meth:`write_model` (its own export, checks and verification), not
    #: from the verified ONNX: no ONNX file is written and :meth:`steps` is not used.
    from_model: bool = False
    #: ``--dtype int8`` is quantized by the format itself, dynamically (activations at run time): no ModelOpt and
    #: no calibration, whose flags it refuses.
    dynamic_int8: bool = False
    #: Its output is a TensorRT engine built from the verified ONNX: a quantized export wants TensorRT's Q/DQ
    #: placement.
    builds_engine: bool = False
    #: The options it has of its own (:class:`FormatOption`); one given for a format that lacks it is refused.
    options: tuple[FormatOption, ...] = ()
    #: Whether ``report-variant`` writes it for every variant, verified as ``export-model --format NAME`` verifies
    #: it (its parity and extra math in the report's export table and verdict): ``"quick"`` in every run,
    #: ``--quick`` included; ``"full"`` in the full run only (its export takes minutes); ``None``: never.
    in_variant_report: Literal["quick", "full"] | None = None

    def check(self, req: ExportRequest) -> None:
        """Refuse, with a :class:`UsageError`, arguments this format cannot work with here, before any work."""

    def mismatch(self, out: Path, implied: ExportFormat) -> str:
        """The line refusing ``--format NAME --out FILE`` when FILE's suffix is ``implied``'s."""
        return (
            f"--out {out} names a {implied.title} but --format is {self.name}; use --out "
            f"{out.with_suffix(self.suffixes[0])}, or --format {implied.name}"
        )

    def out_path(self, req: ExportRequest, stem: str) -> Path:
        """The output (``req.out``, else ``exports/<stem><suffix>``); its folder is created and must be writable."""
        out = req.out or Path("exports") / f"{stem}{self.suffixes[0]}"
        if out.is_dir():
            raise UsageError(f"--out {out} is a directory; give a file name")
        writable_dir(out.parent)
        return out

    def onnx_path(self, req: ExportRequest, out: Path) -> Path:
        """Where the verified ONNX goes: beside the output, by default."""
        return out.with_suffix(".onnx")

    def steps(self, req: ExportRequest) -> list[Step]:
        """What this format writes once the verified ONNX is there, step by step."""
        return []

    def write_model(self, req: ExportRequest, source: ModelSource, result: ExportResult) -> None:
        """A :attr:`from_model` format: export ``source``, verify it and write it to ``result.path`` (its report in
        ``result.report``); nothing at ``result.path`` when it fails (:class:`ExportError`)."""
        raise NotImplementedError(f"{self.name} is written from the verified ONNX")

    def files(self, result: ExportResult) -> list[Path]:
        """The files its steps wrote (besides the ONNX and its report); a :attr:`from_model` format's: its output
        and its :func:`report_path`."""
        return [result.path, report_path(result.path)] if self.from_model and result.report else []

    def summary(self, result: ExportResult) -> list[str]:
        """Its lines of ``export-model``'s summary (after the ONNX's)."""
        return []

    @staticmethod
    def fail(out: Path, report: dict[str, Any], failures: list[str]) -> NoReturn:
        """Refuse ``out`` (a :attr:`from_model` format's output): its failed report written
        (:func:`record_failure`), the one line raised as a :class:`~attnzoo.export.verify.VerificationError`."""
        raise VerificationError(record_failure(out, report, failures))

    def check_parity(
        self,
        out: Path,
        report: dict[str, Any],
        source: ModelSource,
        run: Callable[[Any], Any],
        *,
        dtype: str,
        sizes: Sequence[int],
        runtime: str,
        files: Sequence[Path],
        divergence: Callable[[BlockRecorder], dict[str, Any]] | None = None,
    ) -> None:
        """The file written for ``out`` (``files``: its parts, the first the one ``sha256`` names), run by ``run``,
        against the eager fp32 model at ``sizes`` under ``dtype``'s tolerance: the parity (run on ``runtime``), the
        files' size and the hash go into ``report``, and a failed parity refuses ``out`` (:meth:`fail`).

        ``divergence``: the per-block comparison of a format whose block outputs can be read, given the parity's
        smallest batch with the eager block outputs kept on the way (:class:`BlockRecorder`); its entry goes into
        ``report["divergence"]`` before the verdict, so that a failed parity names its first diverging block."""
        record = BlockRecorder(source.model, block_prefix(source.config)) if divergence is not None else None
        parity = parity_vs_eager(source.model, run, source.config, source.hw, list(sizes), dtype, record=record)
        report["parity"] = {**parity, "batch_sizes": list(sizes), "runtime": runtime}
        if divergence is not None and record is not None:
            report["divergence"] = divergence(record)
        report.update(file_size=sum(f.stat().st_size for f in files), sha256=sha256_file(files[0]))
        if parity["failures"]:
            self.fail(out, report, list(parity["failures"]))

    @contextlib.contextmanager
    def cleanup(self, out: Path) -> Iterator[None]:
        """Around the whole export: what a failure must not leave behind at ``out``."""
        yield
