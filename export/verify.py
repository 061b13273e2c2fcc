"""Verification of every export: ONNX Runtime against eager PyTorch on real and random inputs.

Real inputs are ``shapes`` test images (``attnzoo.data.datasets.shapes_images``) normalised with the model's
mean/std by :func:`attnzoo.preprocess.normalize`; random inputs are standard normal. Batch sizes always include
1 and 3, which the export (traced at batch 2) never saw.

Tolerances: :data:`attnzoo.runtime.parity.TOLERANCES` (the one table), ``max |onnx - eager| <= tol * max(1,
max |logit|)`` with ``tol`` 1e-4 (fp32) or 1e-2 (fp16, compared with the fp32 eager model), and for fp32
classifiers the same top-1 class for every input; under fp16 top-1 agreement is reported, not required (ties
under fp16 rounding).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from attnzoo.data.datasets import shapes_images
from attnzoo.fileio import atomic_path, atomic_write_text, sha256_file
from attnzoo.preprocess import DEFAULT_MEAN, DEFAULT_STD, normalize
from attnzoo.runtime.backends import onnx_reference
from attnzoo.runtime.contract import BATCH_DIM, metadata_props
from attnzoo.runtime.parity import TOLERANCES, compare
from attnzoo.runtime.precision import PRECISIONS
from attnzoo.runtime.schemas import schema_checked
from attnzoo.runtime.sessions import read_report, report_file, verification_problem
from attnzoo.runtime.torch_export import fingerprint

from . import divergence
from . import onnx_export as onnx_export_module
from .check import block_prefix, check_extra_math
from .errors import ExportError
from .onnx_export import export_onnx, op_histogram

__all__ = [
    "EXTRA_BATCH_SIZES",
    "verify_onnx",
    "parity_vs_eager",
    "checked_batch_sizes",
    "block_divergence",
    "export_verified",
    "export_fingerprint",
    "adopt_verified",
    "report_path",
    "failed_report_path",
    "summary",
    "verdict_lines",
    "divergence_inputs",
    "VerificationError",
]

#: Batch sizes verified on top of the requested ones (the export traces batch 2).
EXTRA_BATCH_SIZES: tuple[int, ...] = (1, 3)


def checked_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    """The batch sizes parity is checked at: the requested ones and :data:`EXTRA_BATCH_SIZES`, sorted."""
    return sorted(set(int(b) for b in batch_sizes) | set(EXTRA_BATCH_SIZES))


class VerificationError(ExportError):
    """The exported graph does not match the eager model (or its extra-math check failed)."""


#: ``model.onnx`` -> ``model.report.json``, ``model.xml`` -> ``model.xml.json``: the report beside an exported file.
report_path = report_file


def failed_report_path(onnx_path: str | Path) -> Path:
    """``model.onnx`` -> ``model.failed.report.json``: the report of an export that failed verification, kept
    apart so that it never replaces the report of a good ``model.onnx`` already there."""
    return Path(onnx_path).with_suffix(".failed.report.json")


def _inputs(config: Mapping[str, Any], hw: tuple[int, int], n: int, seed: int) -> dict[str, np.ndarray]:
    """``real`` (normalised shapes test images, cropped to (H, W)) and ``random`` float32 NCHW batches."""
    h, w = hw
    images = shapes_images(n, img_size=max(h, w), split="test", seed=seed, task=config["task"])[0]
    real = normalize(images[:, :h, :w], config.get("mean", DEFAULT_MEAN), config.get("std", DEFAULT_STD))
    rand = np.random.default_rng(seed).standard_normal((n, 3, h, w)).astype(np.float32)
    return {"real": real, "random": rand}


def divergence_inputs(config: Mapping[str, Any], hw: tuple[int, int], seed: int = 0) -> np.ndarray:
    """One real and one random input, as the verification's smallest batch (:func:`_inputs`), for a per-block
    comparison run outside the verification (:mod:`attnzoo.export.divergence`)."""
    data = _inputs(config, hw, 1, seed)
    return np.concatenate([data["real"], data["random"]])


def block_divergence(
    model: nn.Module,
    proto: onnx.ModelProto,
    config: Mapping[str, Any],
    dtype: str,
    threads: int | None,
    record: divergence.BlockRecorder,
    values: Callable[[Sequence[str], np.ndarray], dict[str, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """The report's ``divergence`` entry, on the inputs the parity's smallest batch ran (``record`` kept their
    eager block outputs); a graph whose blocks cannot be read says why instead (the figures explain a verdict,
    they are not one). ``values``: the runtime that computes ``proto``'s tensors
    (:func:`~attnzoo.export.divergence.divergence_vs_eager`; default ONNX Runtime)."""
    try:
        x, refs = record.inputs, record.blocks
        return divergence.divergence_vs_eager(model, proto, config, x, dtype, threads, refs=refs, values=values)
    except Exception as exc:  # a diagnosis that cannot run never decides the verification
        return divergence.not_exposed(f"block outputs could not be compared: {type(exc).__name__}: {exc}")


def _compare(out: np.ndarray, ref: np.ndarray, dtype: str) -> dict[str, Any]:
    """Errors, tolerance and top-1 agreement (per image for cls, per pixel for seg)."""
    c = compare(out, ref, dtype)
    return {
        "max_abs_err": c["max_abs_err"],
        "mean_abs_err": c["mean_abs_err"],
        "max_abs_logit": c["max_abs_ref"],
        "finite": c["finite"],
        "top1_agree": c["top1_agree"],
        "error": c["error"],
        "tolerance": c["tolerance"] * max(1.0, c["max_abs_ref"]),
        "passed": c["passed"],
    }


def verify_onnx(
    model: nn.Module,
    path: str | Path,
    config: Mapping[str, Any],
    *,
    batch_sizes: Sequence[int] = (1, 8),
    dtype: str = "fp32",
    input_hw: tuple[int, int] | None = None,
    seed: int = 0,
    threads: int | None = None,
    record: divergence.BlockRecorder | None = None,
) -> dict[str, Any]:
    """Compare the ONNX file with the eager fp32 ``model``; returns the parity part of the report.

    The result has ``passed`` and ``failures``; nothing is raised for a mismatch. ``record``: see
    :func:`parity_vs_eager`.
    """
    hw = (input_hw[0], input_hw[1]) if input_hw else (int(config["img_size"]),) * 2
    sizes = checked_batch_sizes(batch_sizes)
    session = onnx_reference().session(path, threads).session  # fp32 without TF32: the fp32 tolerance holds
    batch_dim = session.get_inputs()[0].shape[0]
    name = session.get_inputs()[0].name
    parity = parity_vs_eager(
        model, lambda x: session.run(None, {name: x})[0], config, hw, sizes, dtype, seed=seed, record=record
    )
    if not isinstance(batch_dim, str):
        parity["failures"].insert(0, f"input batch dimension is fixed ({batch_dim}), not symbolic")
    return {
        "passed": not parity["failures"],
        "failures": parity["failures"],
        "batch_sizes": sizes,
        "batch_dim": batch_dim,
        "providers": session.get_providers(),
        "per_batch": parity["per_batch"],
        "max_abs_err": parity["max_abs_err"],
        "tolerance": parity["tolerance"],
    }


def parity_vs_eager(
    model: nn.Module,
    run: Callable[[np.ndarray], np.ndarray],
    config: Mapping[str, Any],
    hw: tuple[int, int],
    batch_sizes: Sequence[int],
    dtype: str,
    *,
    seed: int = 0,
    record: divergence.BlockRecorder | None = None,
) -> dict[str, Any]:
    """Compare ``run`` (float32 NCHW in, logits out: an exported model) with the eager fp32 ``model`` on real and
    random inputs at each of ``batch_sizes``, under the tolerance of ``dtype``; nothing is raised for a mismatch.

    ``record``: a :class:`~attnzoo.export.divergence.BlockRecorder` of ``model`` runs the eager forward of the
    smallest batch, keeping its inputs and block outputs for the per-block comparison (no second eager run).

    Returns:
        ``{"passed", "failures", "per_batch", "max_abs_err", "tolerance"}``.
    """
    sizes = sorted(set(int(b) for b in batch_sizes))
    failures: list[str] = []
    data = _inputs(config, hw, max(sizes), seed)
    model = model.float().eval()
    # ``dtype`` names a tolerance; where it is a precision whose arithmetic is exact, top-1 must agree everywhere
    same_top1 = dtype in PRECISIONS and PRECISIONS[dtype].same_top1
    rows = []
    for b in sizes:
        row: dict[str, Any] = {"batch": b}
        for kind, x in data.items():
            if record is not None and b == sizes[0]:
                ref = record(x[:b])
            else:
                with torch.no_grad():
                    ref = model(torch.from_numpy(x[:b])).numpy()
            out = np.asarray(run(x[:b]))
            if out.shape != ref.shape:
                failures.append(f"batch {b} {kind}: output shape {out.shape}, eager {ref.shape}")
                continue
            row[kind] = stats = _compare(out, ref, dtype)
            if not stats["finite"]:
                failures.append(f"batch {b} {kind}: non-finite logits")
            elif not stats["passed"]:
                failures.append(f"batch {b} {kind}: max abs err {stats['max_abs_err']:.3g} > {stats['tolerance']:.3g}")
            if same_top1 and config["task"] == "cls" and stats["top1_agree"] < 1.0:
                failures.append(f"batch {b} {kind}: top-1 differs on {1 - stats['top1_agree']:.1%} of inputs")
        rows.append(row)
    return {
        "passed": not failures,
        "failures": failures,
        "per_batch": rows,
        "max_abs_err": max((r[k]["max_abs_err"] for r in rows for k in data if k in r), default=float("nan")),
        "tolerance": {f"{dtype}_x_max(1,max|logit|)": TOLERANCES[dtype]},
    }


def _placed_if_verified(
    model: nn.Module,
    out: Path,
    config: Mapping[str, Any],
    write: Callable[[Path], tuple[str, dict[str, Any]]],
    *,
    batch_sizes: Sequence[int],
    checkpoint_sha256: str,
    threads: int | None,
) -> dict[str, Any]:
    """The report of the ONNX file ``write`` puts at a temporary path (returning its dtype and the report's own
    fields), checked by :func:`_check_and_place`: only a file that passes is renamed to ``out``, and then a stale
    failure report beside it, which no longer describes anything, is removed."""
    with atomic_path(out) as tmp:
        dtype, extra = write(tmp)
        report = _check_and_place(
            model,
            tmp,
            out,
            config,
            dtype=dtype,
            batch_sizes=batch_sizes,
            checkpoint_sha256=checkpoint_sha256,
            threads=threads,
            extra=extra,
        )
    failed_report_path(out).unlink(missing_ok=True)
    return report


def _check_and_place(
    model: nn.Module,
    tmp: Path,
    out: Path,
    config: Mapping[str, Any],
    *,
    dtype: str,
    batch_sizes: Sequence[int],
    checkpoint_sha256: str,
    threads: int | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """Check the extra math and the parity of the ONNX file ``tmp`` (inside ``atomic_path(out)``); write the report
    beside ``out`` when it passes, else the failure report, and raise :class:`VerificationError`."""
    proto = onnx.load(str(tmp))
    props = metadata_props(proto)
    hw = json.loads(props["input_size"])
    extra_math = check_extra_math(proto, dict(config), dtype)
    record = divergence.BlockRecorder(model, block_prefix(dict(config)))
    parity = verify_onnx(
        model, tmp, config, batch_sizes=batch_sizes, dtype=dtype, input_hw=hw, threads=threads, record=record
    )
    dim = proto.graph.input[0].type.tensor_type.shape.dim[0]
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    report = {
        "path": str(out),
        "variant": config["variant"],
        "task": config["task"],
        "arch": config["arch"],
        "dtype": dtype,
        "opset": opset,
        "input_size": hw,
        "batch_dim": dim.dim_param or dim.dim_value,
        "file_size": tmp.stat().st_size,
        "sha256": sha256_file(tmp),
        "checkpoint_sha256": checkpoint_sha256,
        **extra,
        "num_nodes": len(proto.graph.node),
        "op_histogram": op_histogram(proto),
        "extra_math": extra_math,
        "parity": parity,
        "divergence": block_divergence(model, proto, config, dtype, threads, record),
        "onnxruntime": __import__("onnxruntime").__version__,
        "torch": torch.__version__,
    }
    failures = list(parity["failures"]) + list(extra_math["failures"])
    if report["batch_dim"] != BATCH_DIM:
        failures.append(f"input batch dimension is {report['batch_dim']!r}, not {BATCH_DIM!r}")
    if props.get("checkpoint_sha256", "") != checkpoint_sha256:
        failures.append(
            f"checkpoint_sha256 metadata {props.get('checkpoint_sha256')!r} is not the checkpoint's "
            f"{checkpoint_sha256!r}"
        )
    report.update(passed=not failures, failures=failures)
    report = schema_checked(report)  # written through its schema (VerificationReport)
    if failures:
        atomic_write_text(failed_report_path(out), json.dumps(report, indent=2) + "\n")
        raise VerificationError(
            f"{out.name} failed verification ({'; '.join(failures[:3])}); "
            f"see {failed_report_path(out)}; {out.name} was not written"
        )
    atomic_write_text(report_path(out), json.dumps(report, indent=2) + "\n")
    return report


def export_fingerprint(
    model: nn.Module,
    config: Mapping[str, Any],
    *,
    opset: int,
    dtype: str,
    input_hw: tuple[int, int] | None,
    batch_sizes: Sequence[int],
) -> str:
    """sha256 of everything an :func:`export_verified` file depends on: the model's weights and buffers (names,
    dtypes, shapes, values), the source files of its modules, of the exporter and of this verifier (an edited
    forward is a new model at the same version), the config, the export arguments, and the versions of attnzoo,
    torch and ONNX Runtime."""
    from attnzoo import __version__

    head = {
        "config": dict(config),
        "opset": opset,
        "dtype": dtype,
        "input_hw": list(input_hw or ()),
        "batch_sizes": sorted(set(int(b) for b in batch_sizes)),
        "attnzoo": __version__,
        "torch": torch.__version__,
        "onnxruntime": __import__("onnxruntime").__version__,
    }
    return fingerprint(model, head, modules=(onnx_export_module.__name__, __name__))


def _reusable(
    model: nn.Module,
    out: Path,
    config: Mapping[str, Any],
    dtype: str,
    fingerprint: str,
    threads: int | None,
) -> dict[str, Any] | None:
    """The report of ``out`` when it was made for this ``fingerprint``, the file would be served
    (:func:`verification_problem`: its report passed, for this precision and this very file), and what the report
    says of the file is re-derived from it: its node count and op histogram, the extra-math check, and parity
    with the eager ``model`` (batch 1 and 3, real and random inputs). The report is not trusted on its word: a file
    swapped in with its report's sha256 rewritten to match (other weights, another graph) is exported again. The
    fingerprint is compared first: a stale file is refused without hashing it."""
    try:
        report = read_report(report_path(out))
    except ValueError:  # no report, or not one
        return None
    if report.get("fingerprint") != fingerprint or not out.is_file() or verification_problem(out, dtype) is not None:
        return None
    try:
        proto = onnx.load(str(out))
        if len(proto.graph.node) != report.get("num_nodes") or op_histogram(proto) != report.get("op_histogram"):
            return None
        if check_extra_math(proto, dict(config), dtype)["failures"]:
            return None
        hw = tuple(json.loads(metadata_props(proto)["input_size"]))
        parity = verify_onnx(model, out, config, batch_sizes=(1,), dtype=dtype, input_hw=hw, threads=threads)
    except Exception:  # a file that cannot even be checked is exported again
        return None
    return report if parity["passed"] else None


def export_verified(
    model: nn.Module,
    out: str | Path,
    config: Mapping[str, Any],
    *,
    opset: int = 20,
    dtype: str = "fp32",
    input_hw: tuple[int, int] | None = None,
    batch_sizes: Sequence[int] = (1, 8),
    checkpoint_sha256: str = "",
    threads: int | None = None,
    reuse: bool = False,
) -> dict[str, Any]:
    """Export, check the extra math, verify parity; only a passing model reaches ``out``.

    A passing export writes ``<out>.report.json`` and replaces ``out``. A failing one leaves ``out`` and its
    report untouched (a good model already there stays), writes its report to ``<out>.failed.report.json``
    and raises :class:`VerificationError`.

    Args:
        reuse: Keep ``out`` instead of exporting again when its report passed for the same
            :func:`export_fingerprint` (weights, config, export arguments, versions), the file still has the
            sha256 it was verified with, and its facts, extra math and parity re-derive (:func:`_reusable`); the
            report returned then has ``reused: true``. For caches that export
            the same seeded model more than once (a benchmark resumed batch by batch, a sweep beside it).
    """
    out = Path(out)
    fingerprint = export_fingerprint(
        model, config, opset=opset, dtype=dtype, input_hw=input_hw, batch_sizes=batch_sizes
    )
    if reuse:
        report = _reusable(model, out, config, dtype, fingerprint, threads)
        if report is not None:
            return {**report, "reused": True}

    def export(tmp: Path) -> tuple[str, dict[str, Any]]:
        start = time.perf_counter()
        export_onnx(
            model, tmp, config=config, opset=opset, dtype=dtype, input_hw=input_hw, checkpoint_sha256=checkpoint_sha256
        )
        return dtype, {"export_time_s": round(time.perf_counter() - start, 3), "fingerprint": fingerprint}

    return _placed_if_verified(
        model, out, config, export, batch_sizes=batch_sizes, checkpoint_sha256=checkpoint_sha256, threads=threads
    )


def adopt_verified(
    model: nn.Module,
    src: str | Path,
    out: str | Path,
    config: Mapping[str, Any],
    *,
    checkpoint_sha256: str,
    batch_sizes: Sequence[int] = (1, 8),
    threads: int | None = None,
) -> dict[str, Any]:
    """Copy an ONNX file exported earlier (the zoo's shipped exports) to ``out``, verified exactly as
    :func:`export_verified` verifies a fresh export, and its metadata checked to name ``checkpoint_sha256``:
    seconds instead of a torch export. Same report and failure behaviour."""

    def copy(tmp: Path) -> tuple[str, dict[str, Any]]:
        shutil.copyfile(src, tmp)
        dtype = metadata_props(onnx.load(str(tmp), load_external_data=False)).get("dtype", "fp32")
        return dtype, {"adopted_from": str(src)}

    return _placed_if_verified(
        model, Path(out), config, copy, batch_sizes=batch_sizes, checkpoint_sha256=checkpoint_sha256, threads=threads
    )


def verdict_lines(report: Mapping[str, Any], runtime: str, batches: str) -> list[str]:
    """The lines every verified file's summary ends with: its parity on ``runtime`` (``batches`` says how the batch
    is dynamic) or, for a file gated as a quantized graph is, its fidelity to fp32 and its test-split score; the
    extra-math nodes per block, and PASSED or what failed."""
    par, fid, acc, extra = report.get("parity"), report.get("fidelity"), report.get("accuracy"), report["extra_math"]
    lines = []
    if par:
        lines.append(
            f"  parity vs eager ({runtime}): batch sizes {par['batch_sizes']} ({batches}), max abs err "
            f"{par['max_abs_err']:.2e} (tolerance {next(iter(par['tolerance'].values())):g} x max(1, max|logit|))"
        )
    if fid and "cosine" in fid:
        lines.append(
            f"  fidelity to fp32 ({runtime}): worst output cosine {fid['cosine']['min']:.4f} (mean "
            f"{fid['cosine']['mean']:.4f}) on {fid['inputs']} held-out input(s), gate {fid['min_cosine']:g}"
        )
    if acc and acc.get("metrics"):
        m = acc["metrics"]
        lines.append(
            f"  {acc['metric_name']} on {acc['n_images']} {acc['data']} test images: {report['dtype']} "
            f"{m[report['dtype']]:.2f}, fp32 {m['fp32']:.2f} (drop {acc['drop']:.2f}, tolerance {acc['tolerance']:g})"
        )
    elif acc and acc.get("warning"):
        lines.append(f"  {acc['warning']}")
    if extra["blocks"]:
        lines.append(
            "  extra-math nodes per block: " + ", ".join(f"{b}={n}" for b, n in extra["nodes_per_block"].items())
        )
    where = divergence.verdict(report.get("divergence"), report["passed"])
    verdict = "PASSED" + (f" ({where})" if where else "")
    if not report["passed"]:
        verdict = "FAILED: " + "; ".join(report["failures"]) + (f"; {where}" if where else "")
    lines.append(f"  {verdict}")
    return lines


def summary(report: Mapping[str, Any]) -> str:
    """A few lines for the terminal: the file, then :func:`verdict_lines`."""
    head = (
        f"{report['path']}: {report['variant']} {report['task']} {report['arch']} {report['dtype']} "
        f"opset {report['opset']}, {report['num_nodes']} nodes, {report['file_size'] / 1e6:.2f} MB, "
        f"export {report['export_time_s']:.1f} s"
    )
    runtime = ", ".join(report["parity"]["providers"])
    return "\n".join([head, *verdict_lines(report, runtime, f"dynamic '{report['batch_dim']}'")])
