"""The zoo's export cache: the trained zoo exported once to verified ONNX (and quantized once to verified int8) in
a cache folder keyed by the zoo manifest's hash, reused later; what the demo and serve-models serve by default.

A file is reused only when it was exported from this checkpoint and its extra-math scopes pass
:func:`attnzoo.export.check_extra_math`; an int8 copy only when its verification report is intact and made from
this fp32 file with the CPU Q/DQ placement. :func:`export_zoo_in_child` runs the same export in a child
interpreter at a low CPU priority, so that a torch export never holds a server's GIL.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attnzoo import zoo
from attnzoo.errors import first_line, quoted
from attnzoo.fileio import default_cache_dir, sha256_file
from attnzoo.lazy import lazy_import
from attnzoo.runtime.contract import metadata_props
from attnzoo.runtime.precision import get_precision
from attnzoo.runtime.schemas import QuantizationReport
from attnzoo.runtime.sessions import read_report, verification_problem
from attnzoo.zoo import DEFAULT_DATA

# imported on first use, so that the servers (their --help too) start without timm, onnx and the exporter, which
# only an export needs
registry = lazy_import("attnzoo.models")
export = lazy_import("attnzoo.export")
quantize = lazy_import("attnzoo.export.quantize")

__all__ = ["zoo_rows", "zoo_onnx_name", "zoo_onnx_folder", "export_zoo", "export_zoo_in_child"]


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def zoo_rows(data: str, variants: Sequence[str] | None = None, tasks: Sequence[str] | None = None) -> list[dict]:
    """Manifest rows trained on ``data`` (only ``variants`` / ``tasks`` when given; an unknown variant or a
    selection the zoo lacks is a ``ValueError`` naming what it has)."""
    rows = [e for e in zoo.entries() if e["data"] == data]
    if not rows:
        have = sorted({e["data"] for e in zoo.entries()})
        raise ValueError(
            f"the zoo has no models trained on {quoted(data)} (it has: {', '.join(have) or 'none'}); "
            "serve a folder of exported models with --models DIR"
        )
    names = {e["variant"] for e in rows}  # canonical already: the registry (PyTorch, timm) only for an alias
    wanted = None if variants is None else {v if v in names else registry.canonical_name(v) for v in variants}
    chosen = [e for e in rows if (wanted is None or e["variant"] in wanted) and (tasks is None or e["task"] in tasks)]
    if not chosen:
        have = sorted(f"{e['variant']}/{e['task']}" for e in rows)
        raise ValueError(
            f"the zoo has no {quoted(data)} model of {', '.join(sorted(wanted or ['any variant']))} for task "
            f"{', '.join(tasks or ['any'])}; it has: {', '.join(have)}"
        )
    return chosen


def zoo_onnx_name(variant: str, task: str, data: str = DEFAULT_DATA, dtype: str = "fp32") -> str:
    """File name of a zoo model's ONNX export (``dtype`` int8: its quantized copy) in :func:`export_zoo`'s folder."""
    return zoo.onnx_name(variant, task, data).replace(".onnx", f"{get_precision(dtype).file_tag}.onnx")


def zoo_onnx_folder(cache_dir: Path | None = None) -> Path:
    """The folder :func:`export_zoo` writes to: ``<cache>/onnx/<first 12 hex of the manifest's sha256>``."""
    digest = hashlib.sha256(json.dumps(zoo.manifest(), sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir or default_cache_dir()) / "onnx" / digest


def _quantize_zoo(fp32: Path, out: Path, config: dict, data: str) -> None:
    """The verified int8 copy of a zoo export (``export-model --dtype int8 --qdq-placement cpu``'s code: the
    demo and serve-models run it on the CPU; calibrated on the model's training images, scored on its test split,
    refused beyond the tolerance), unless the one at ``out`` is intact and made from this fp32 file so."""
    if out.is_file() and verification_problem(out, "int8") is None:  # its report then reads as a QuantizationReport
        made = QuantizationReport.from_dict(read_report(out.with_suffix(".report.json")))
        if (
            made.fp32_source.get("sha256") == sha256_file(fp32)
            and made.quantization.options.get("placement") == quantize.CPU_QDQ_PLACEMENT
        ):
            return
    calibration = quantize.calibration_images(
        config, quantize.DEFAULT_CALIBRATION_COUNT, quantize.DEFAULT_CALIBRATION_SEED
    )
    quantize.quantize_verified(
        fp32,
        out,
        config,
        dtype="int8",
        calibration=calibration,
        calibration_source=f"{len(calibration)} {data} training images",
        calibration_seed=quantize.DEFAULT_CALIBRATION_SEED,
        progress=True,
        placement=quantize.CPU_QDQ_PLACEMENT,
    )


def export_zoo(
    data: str = DEFAULT_DATA,
    cache_dir: Path | None = None,
    variants: Sequence[str] | None = None,
    tasks: Sequence[str] | None = None,
    dtype: str = "fp32",
) -> Path:
    """Export the zoo's models trained on ``data`` (only ``variants`` / ``tasks`` when given) to ONNX once;
    return the folder.

    The folder is ``<cache>/onnx/<first 12 hex of the manifest's sha256>``, so a new zoo gets a new folder; a
    file whose ``checkpoint_sha256`` metadata matches its checkpoint and whose extra-math scopes pass
    :func:`attnzoo.export.check_extra_math` is reused. A model the zoo ships as ONNX
    (:func:`attnzoo.zoo.shipped_onnx`) is copied in after the same verification as a fresh export (seconds);
    the others are exported. A tqdm bar shows the work. ``dtype="int8"`` also writes each model's verified int8
    copy (:func:`zoo_onnx_name`); a model whose int8 fails its verification is left out with a warning.
    """
    rows = zoo_rows(data, variants, tasks)
    folder = zoo_onnx_folder(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)

    def fresh(path: Path, sha: str) -> bool:
        """Exported from this checkpoint, and its extra-math scopes are the variant's (older code may have
        declared others)."""
        try:
            return (
                path.is_file()
                and metadata_props(path).get("checkpoint_sha256") == sha
                and export.check_extra_math(path)["ok"]
            )
        except Exception:  # a damaged file is exported again
            return False

    todo = [e for e in rows if not fresh(folder / zoo_onnx_name(e["variant"], e["task"], data), e["sha256"])]
    for e in tqdm(todo, desc=f"exporting zoo models to ONNX ({folder})", unit="model", disable=not todo):
        model, config = zoo.load(e["variant"], e["task"], data)
        out, shipped = folder / zoo_onnx_name(e["variant"], e["task"], data), zoo.shipped_onnx(e)
        # verified the way export-model verifies (a failing model is not left in the folder)
        if shipped is not None:
            export.adopt_verified(model, shipped, out, config, batch_sizes=(1,), checkpoint_sha256=e["sha256"])
        else:
            export.export_verified(model, out, config, batch_sizes=(1,), checkpoint_sha256=e["sha256"])
    if get_precision(dtype).quantized:
        for e in rows:
            fp32 = folder / zoo_onnx_name(e["variant"], e["task"], data)
            try:
                _quantize_zoo(
                    fp32,
                    folder / zoo_onnx_name(e["variant"], e["task"], data, dtype),
                    zoo.load(e["variant"], e["task"], data)[1],
                    data,
                )
            except Exception as exc:  # this model is not served in int8; say why, go on
                _warn(f"{e['variant']} {e['task']}: no {dtype} model: {first_line(exc)}")
    return folder


def export_zoo_in_child(
    data: str,
    cache_dir: Path | None,
    wanted: Sequence[tuple[str, str]],
    dtype: str = "fp32",
    while_running: Callable[[], None] | None = None,
    *,
    quiet: bool = False,
    nice: int = 19,
) -> int:
    """Export (verified, as :func:`export_zoo` does) the zoo models ``wanted`` (``(variant, task)`` pairs) in a
    child process at a lower CPU priority (``nice`` added to this one's; 19, the lowest, by default): its own
    interpreter, so a torch export never holds the caller's GIL while a request waits, or while Ray starts. Waits
    for it (calling ``while_running`` every 2 s meanwhile, e.g. to publish the models written so far) and returns
    its exit code; the child is ended when this process exits (a file is written whole or not at all). A failure
    is one ``error:`` line on the child's stderr; ``quiet``: nothing of the child is shown (its progress bars),
    and a failure raises ``ValueError`` with that line instead."""
    # the child lowers its own priority first: preexec_fn is not safe in a process with threads (Ray's, the
    # demo's server)
    code = (
        "import os, signal, sys, json\n"
        # Ctrl-C in the terminal reaches this child too: it ends quietly (exit 130), the parent says what happened
        "signal.signal(signal.SIGINT, lambda *_: sys.exit(130))\n"
        f"if hasattr(os, 'nice'): os.nice({int(nice)})\n"
        "from pathlib import Path; from attnzoo.errors import first_line\n"
        "from attnzoo.export.zoo_cache import export_zoo\n"
        "data, cache, wanted, dtype = json.loads(sys.argv[1])\n"
        "try:\n"
        "    for v, t in wanted:\n"
        "        export_zoo(data, Path(cache) if cache else None, variants=[v], tasks=[t], dtype=dtype)\n"
        "except Exception as exc:\n"
        "    sys.exit(f'error: {first_line(exc)}')\n"
    )
    args = json.dumps([data, str(cache_dir) if cache_dir else None, [list(w) for w in wanted], dtype])
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(tempfile.TemporaryFile("w+")) if quiet else None
        quiet_kw: dict[str, Any] = {"stderr": err} if quiet else {}  # a test's Popen passes its own stderr
        child = subprocess.Popen([sys.executable, "-c", code, args], stdout=subprocess.DEVNULL, **quiet_kw)
        atexit.register(child.terminate)
        while True:
            try:
                status = child.wait(timeout=None if while_running is None else 2.0)
                break
            except subprocess.TimeoutExpired:  # only with a timeout, i.e. a while_running
                assert while_running is not None
                while_running()
        if err is not None and status != 0:
            err.seek(0)
            lines = [ln.strip() for ln in err.read().splitlines() if ln.strip().startswith("error: ")]
            raise ValueError(lines[-1].removeprefix("error: ") if lines else f"the export exited with status {status}")
    return status
