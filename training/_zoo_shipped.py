"""The shipped zoo's checks and ONNX copies: every file's sha256 and metric re-checked, and the verified ONNX
exports ``serve-demo`` adopts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from attnzoo import zoo
from attnzoo.data.datasets import ImageSet, load_data
from attnzoo.export import export_verified, report_path
from attnzoo.fileio import sha256_file
from attnzoo.models.checkpoint import load_checkpoint
from attnzoo.training._zoo_manifest import SUBSET_N, ZOO_DIR, _key, _write_manifest
from attnzoo.training.train import evaluate


def verify(limit: int = SUBSET_N, tolerance: float = 0.5) -> list[str]:
    """Check every zoo file's sha256 and re-evaluate it on the first ``limit`` test images; returns the
    problems found (empty when all is well)."""
    problems = []
    cache: dict[str, ImageSet] = {}
    for e in tqdm(zoo.entries(), desc="verify"):
        path = zoo.ZOO_DIR / e["file"]
        if not path.is_file():
            problems.append(f"{e['file']}: missing")
            continue
        if sha256_file(path) != e["sha256"]:
            problems.append(f"{e['file']}: sha256 does not match the manifest")
            continue
        if e.get("onnx") and zoo.shipped_onnx(e) is None:
            problems.append(f"zoo/{e['onnx']['file']}: missing, or its sha256 does not match the manifest")
        model, config = load_checkpoint(path)
        key = _key(e["data"], e["task"], "test")
        if key not in cache:  # the test scenes of the model's own recipe (scene options in its config)
            cache[key] = load_data(e["data"], "test", e["task"], config["img_size"], limit, scene=config.get("scene"))
        got = evaluate(model, cache[key], e["task"], config["mean"], config["std"])["metric"]
        n_eval = len(cache[key])
        if limit == e.get("subset_n"):
            want = e["subset_metric"]
        elif n_eval == e.get("test_n"):
            want = e["test_metric"]
        else:
            raise ValueError(
                f"--limit {limit} matches neither the recorded subset ({e.get('subset_n')} images) "
                f"nor the whole test set ({e.get('test_n')} images) of {e['file']}"
            )
        if abs(got - want) > tolerance:
            problems.append(f"{e['file']}: {e['metric_name']} {got:.2f} on {limit} test images, manifest {want:.2f}")
    return problems


def ship_onnx(data: str = "fashion", out_dir: Path = ZOO_DIR) -> list[dict[str, Any]]:
    """Export the best classifier and segmenter trained on ``data`` to ``<out_dir>/onnx/`` (verified as
    ``export-model`` verifies) and name them in the manifest rows' ``onnx`` entry; exports of other models are
    removed. ``serve-demo`` adopts these files after verifying them again, instead of a torch export."""
    if out_dir != ZOO_DIR:
        raise ValueError("ship_onnx writes into the package's zoo folder only")
    rows = zoo.entries()
    best = {(e["variant"], e["task"]) for e in zoo.best_entries(data).values()}
    if not best:
        raise ValueError(f"the zoo has no models trained on {data!r}")
    folder = out_dir / "onnx"
    folder.mkdir(exist_ok=True)
    for e in tqdm([e for e in rows if e["data"] == data], desc="zoo ONNX exports", unit="model"):
        name = zoo.onnx_name(e["variant"], e["task"], data)
        if (e["variant"], e["task"]) not in best:
            e.pop("onnx", None)
            (folder / name).unlink(missing_ok=True)
            continue
        model, config = zoo.load(e["variant"], e["task"], data)
        report = export_verified(model, folder / name, config, batch_sizes=(1,), checkpoint_sha256=e["sha256"])
        report_path(folder / name).unlink(missing_ok=True)  # the file's sha256 lives in the manifest
        e["onnx"] = {"file": f"onnx/{name}", "sha256": report["sha256"], "max_abs_err": report["parity"]["max_abs_err"]}
    _write_manifest(out_dir, rows)
    return [e for e in rows if "onnx" in e]
