"""Which exported files are served, and at which ``--dtype``: the verification report beside a file, read and
checked.

Exported files are served only when :func:`verification_problem` finds their verification report intact: written
by the export's checks, for exactly this file (its SHA-256); a quantized one also scored on the test split within
the tolerance of fp32. (ONNX Runtime's session settings and provider lists are its target's:
:mod:`attnzoo.targets.onnxruntime.sessions`.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnzoo.fileio import sha256_file

from .precision import QUANTIZED
from .schemas import JsonReport, exported_report_type

__all__ = [
    "SERVED_DTYPES",
    "MAX_REPORT_BYTES",
    "served_precision",
    "serves",
    "IR_SUFFIX",
    "read_report",
    "report_file",
    "verified_report",
    "verified_file",
    "verification_problem",
]


#: What the demo's and serve-models' ``--dtype`` select: ``fp32``, the unquantized exports (fp32 and fp16
#: graphs, both with fp32 input and output), ``int8``, verified int8 Q/DQ graphs (:func:`served_precision`), or
#: ``bf16``, the fp32 exports run by OpenVINO at bf16 on a CPU with bf16 units, each verified on its test split
#: first (:mod:`attnzoo.targets.openvino.bf16`).
SERVED_DTYPES: tuple[str, ...] = ("fp32", "int8", "bf16")


def served_precision(graph_dtype: str) -> str:
    """The ``--dtype`` that serves a graph of ``graph_dtype``: ``fp32`` for fp32 and fp16 exports, else the
    quantized precision itself (``int8``; ``fp8`` graphs are TensorRT's, served by neither CPU command). An fp32
    graph is also served by ``--dtype bf16`` (:func:`serves`)."""
    return graph_dtype if graph_dtype in QUANTIZED else "fp32"


def serves(dtype: str, graph_dtype: str) -> bool:
    """Whether ``--dtype dtype`` serves a graph of ``graph_dtype``: bf16 runs fp32 graphs at a bf16 precision;
    otherwise :func:`served_precision`."""
    return graph_dtype == "fp32" if dtype == "bf16" else served_precision(graph_dtype) == dtype


#: Largest verification report read (a report is a few kB; anything far larger is not one).
MAX_REPORT_BYTES = 16 * 2**20


def read_report(path: str | Path) -> dict[str, Any]:
    """A verification report (JSON object) read with bounds: ``ValueError`` naming the file when it is missing,
    not a regular file, over :data:`MAX_REPORT_BYTES`, not JSON, nested too deep to parse, or not an object."""
    path = Path(path)
    try:
        if not path.is_file():
            raise ValueError("missing or not a regular file")
        if path.stat().st_size > MAX_REPORT_BYTES:
            raise ValueError(
                f"{path.stat().st_size / 2**20:.0f} MiB, over the {MAX_REPORT_BYTES / 2**20:.0f} MiB a report can be"
            )
        report = json.loads(path.read_text())
    except RecursionError:
        raise ValueError(f"{path.name} is not a verification report (JSON nested too deep)") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path.name} is not a readable verification report ({exc})") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path.name} is not a verification report (not a JSON object)")
    return report


#: The suffix of an OpenVINO IR's graph (``model.xml``, its weights in ``model.bin`` beside it).
IR_SUFFIX = ".xml"


def report_file(path: str | Path) -> Path:
    """Where ``export-model`` writes the verification report of the model file ``path``: ``model.onnx`` ->
    ``model.report.json``; a file of another format (``model.xml``, ``model.pt2``, ``model.pte``) ->
    ``model.xml.json``."""
    path = Path(path)
    return path.with_suffix(".report.json") if path.suffix == ".onnx" else Path(f"{path}.json")


def verified_report(path: str | Path, dtype: str, fmt: str | None = None, device: str | None = None) -> JsonReport:
    """The report (:func:`report_file`) of the exported model ``path`` (graph precision ``dtype``), read through
    its schema, when it says the file passed its verification: written by ``export-model`` after its checks (the
    extra math counted, parity with eager PyTorch), for this precision, for a file of format ``fmt`` when given
    (``aoti``, ``executorch``, ``openvino``), for this very file (its SHA-256; an OpenVINO IR's ``.bin`` too) and,
    ``device`` given, for a file compiled for that device (``cpu``, ``cuda``: an AOTInductor package's report says).

    Raises:
        ValueError: one line saying why not (no report, unreadable, another schema or format, not passed, another
            precision, another file, another device).
    """
    path = Path(path)
    report = report_file(path)
    if not report.exists():
        flag = f" --dtype {dtype}" if dtype != "fp32" else ""
        how = f" --format {fmt}{flag}" if fmt else (" --format openvino" if path.suffix == IR_SUFFIX else flag)
        raise ValueError(f"no verification report {report.name} beside it (export it with export-model{how})")
    rep = read_report(report)
    try:
        typed = exported_report_type(rep).from_dict(rep)  # read through its schema
    except ValueError as exc:
        raise ValueError(f"{report.name} is not a report export-model writes ({exc})") from None
    if fmt is not None and rep.get("format") != fmt:
        raise ValueError(f"{report.name} is the report of a {rep.get('format') or 'onnx'} file, not of a {fmt} one")
    if not rep.get("passed"):
        raise ValueError(f"{report.name} does not say the {dtype} model passed its verification")
    if rep.get("dtype", "fp32") != dtype:
        raise ValueError(f"{report.name} is for a {rep.get('dtype')} model, the file is {dtype}")
    if rep.get("sha256") != sha256_file(path):
        raise ValueError(f"{path.name} differs from the file its report {report.name} verified (SHA-256 mismatch)")
    if path.suffix == IR_SUFFIX:
        weights = path.with_suffix(".bin")
        if not weights.is_file():
            raise ValueError(f"no weights file {weights.name} beside it")
        if getattr(typed, "bin_sha256", None) != sha256_file(weights):  # an IR's report (OpenVINO's schema) has it
            raise ValueError(
                f"{weights.name} differs from the weights its report {report.name} verified (SHA-256 mismatch)"
            )
    compiled_for = getattr(typed, "device", None)  # a report of a file compiled for one device (AOTInductor's)
    if device is not None and compiled_for is not None and compiled_for != device:
        raise ValueError(f"it was compiled for {compiled_for}, not {device}")
    return typed


def verified_file(
    backend: str, model: str | Path, dtype: str, *, fmt: str, title: str, device: str | None = None
) -> Path:
    """The exported file ``model`` (a ``title``, format ``fmt``) that ``backend`` loads by path: there, and
    verified for ``dtype`` (and ``device``) by its report (:func:`verified_report`).

    Raises:
        ValueError: ``<title> not found: <path>``, or ``<backend>: <path> is not loaded: <why>``.
    """
    path = Path(model)
    if not path.is_file():
        raise ValueError(f"{title} not found: {path}")
    try:
        verified_report(path, dtype, fmt=fmt, device=device)
    except ValueError as exc:
        raise ValueError(f"{backend}: {path} is not loaded: {exc}") from None
    return path


def verification_problem(path: str | Path, dtype: str) -> str | None:
    """Why the exported model ``path`` (graph precision ``dtype``) must not be served (one line), or ``None``.

    Served only when its report is one :func:`verified_report` accepts -- written by ``export-model`` (and the
    zoo's export) after its checks: the extra math as named fp32 ops, parity with eager PyTorch, for a quantized
    graph also the Q/DQ placement, finite outputs and test-split accuracy next to fp32 -- saying it passed, naming
    this precision and matching the file's SHA-256 (an OpenVINO IR's ``.bin`` too). A quantized model must also
    have been scored on the whole test split within the tolerance (a drop accepted with ``--accept-accuracy-drop``,
    one scored with ``--eval-limit``, or an unscored ``--random-init`` model is not served).
    """
    path = Path(path)
    try:
        typed = verified_report(path, dtype)
    except ValueError as exc:
        return str(exc)
    report = report_file(path)
    if dtype not in QUANTIZED:  # a quantized file must also have been scored on a test split
        return None
    acc = getattr(typed, "accuracy", None)  # a quantized ONNX file's report and an int8 IR's (OpenVINO's) have it
    if acc is None:
        return f"{report.name} does not say how the {dtype} model scores next to fp32"
    if not acc.get("metrics"):
        return f"{path.name} was not scored on a test set ({acc.get('warning') or acc.get('reason') or 'no accuracy'})"
    if acc.get("limit"):
        return (
            f"{path.name} was scored on only {acc.get('n_images')} test images (--eval-limit); export it without "
            "--eval-limit to serve it"
        )
    if not acc.get("within_tolerance"):
        return (
            f"{path.name} is {acc.get('drop', float('nan')):.2f} points below fp32 (tolerance "
            f"{acc.get('tolerance')}; written with --accept-accuracy-drop)"
        )
    return None
