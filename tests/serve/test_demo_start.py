"""A fresh serve-demo answers in seconds: the zoo ships verified ONNX exports of its best classifier and
segmenter, which are adopted after the same verification as a fresh export; every other model is exported on
its first use (or by a background thread); the best model is selected first."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnzoo import zoo
from attnzoo.export import VerificationError, adopt_verified, export_verified
from attnzoo.export.verify import failed_report_path, report_path
from attnzoo.models import create_model
from attnzoo.runtime.contract import metadata_props
from attnzoo.serve.loading import ServedModel, load_zoo_onnx, zoo_onnx_name


def _micro(seed: int):
    torch.manual_seed(seed)
    model = create_model("standard", task="cls", arch="micro", num_classes=3).eval()
    return model, {**model.attnzoo_config, "class_names": ["a", "b", "c"], "mean": [0.5] * 3, "std": [0.5] * 3}


def test_adopting_an_export_verifies_it_like_a_fresh_one(tmp_path):
    model, config = _micro(0)
    export_verified(model, tmp_path / "a.onnx", config, batch_sizes=(1,), checkpoint_sha256="abc")
    report = adopt_verified(
        model, tmp_path / "a.onnx", tmp_path / "b.onnx", config, batch_sizes=(1,), checkpoint_sha256="abc"
    )
    assert report["passed"] and report["adopted_from"] == str(tmp_path / "a.onnx")
    assert (tmp_path / "b.onnx").read_bytes() == (tmp_path / "a.onnx").read_bytes()
    assert report_path(tmp_path / "b.onnx").is_file()
    other, _ = _micro(1)  # the file does not compute this checkpoint's function: refused, nothing written
    with pytest.raises(VerificationError, match="max abs err"):
        adopt_verified(
            other, tmp_path / "a.onnx", tmp_path / "c.onnx", config, batch_sizes=(1,), checkpoint_sha256="abc"
        )
    assert not (tmp_path / "c.onnx").exists() and failed_report_path(tmp_path / "c.onnx").is_file()
    with pytest.raises(VerificationError, match="checkpoint_sha256 metadata 'abc'"):
        adopt_verified(
            model, tmp_path / "a.onnx", tmp_path / "d.onnx", config, batch_sizes=(1,), checkpoint_sha256="def"
        )
    assert not (tmp_path / "d.onnx").exists()


def test_the_zoo_ships_onnx_of_its_best_models_only():
    best = zoo.best_entries("fashion")
    for task, e in best.items():
        assert e["test_metric"] == max(
            r["test_metric"] for r in zoo.entries() if r["data"] == "fashion" and r["task"] == task
        )
    shipped = [e for e in zoo.entries() if e.get("onnx")]
    assert {(e["variant"], e["task"], e["data"]) for e in shipped} == {
        (e["variant"], e["task"], e["data"]) for e in best.values()
    }
    for e in shipped:
        path = zoo.shipped_onnx(e)
        assert path is not None and path.name == zoo.onnx_name(e["variant"], e["task"], e["data"])
        assert metadata_props(path)["checkpoint_sha256"] == e["sha256"]
    assert zoo.shipped_onnx({**shipped[0], "onnx": {**shipped[0]["onnx"], "sha256": "0" * 64}}) is None


def test_the_zoo_on_onnx_starts_with_the_best_models_and_loads_the_others_on_first_use(tmp_path):
    models = load_zoo_onnx("fashion", "onnxruntime", threads=1, cache_dir=tmp_path, prefetch=False)
    rows = [e for e in zoo.entries() if e["data"] == "fashion"]
    assert sorted((m.variant, m.task) for m in models) == sorted((e["variant"], e["task"]) for e in rows)
    assert all(m.score is not None and m.input_style == "gray-on-black" for m in models)
    folder = next(tmp_path.glob("onnx/*"))
    best = zoo.best_entries("fashion")
    assert sorted(p.name for p in folder.glob("*.onnx")) == sorted(
        zoo_onnx_name(e["variant"], e["task"]) for e in best.values()
    )  # adopted, not exported
    lazy = next(m for m in models if m.task == "cls" and m.variant != best["cls"]["variant"])
    out = lazy.run(np.zeros((2, 3, *lazy.input_size), np.float32))  # exported, verified, loaded now
    assert out.shape == (2, 10) and np.isfinite(out).all()
    assert (folder / zoo_onnx_name(lazy.variant, "cls")).is_file()
    model, _ = zoo.load(lazy.variant, "cls")
    x = np.random.default_rng(0).standard_normal((2, 3, *lazy.input_size)).astype(np.float32)
    with torch.inference_mode():
        np.testing.assert_allclose(lazy.run(x), model(torch.from_numpy(x)).numpy(), atol=1e-4)


def test_the_demo_selects_the_best_model_first():
    from attnzoo.serve.demo.app import DemoModels, _choice_label

    def served(name: str, score):
        return ServedModel(
            name=name,
            variant=name,
            task="cls",
            class_names=["a"],
            input_size=(8, 8),
            mean=(0.5,) * 3,
            std=(0.5,) * 3,
            fixed_size=True,
            run=lambda x: x,
            score=score,
            score_name="top1" if score is not None else "",
        )

    table = DemoModels([served("standard", 85.1), served("belief2", 86.2), served("vertical", 84.0)])
    assert table.default("cls") == "belief2" and table.default("seg") is None
    assert _choice_label(table.get("cls", "belief2")) == "belief2 (top-1 86.2 %)"
    assert DemoModels([served("x", None), served("y", None)]).default("cls") == "x"  # no metrics: the first


def test_a_replica_loads_verified_onnx_files_without_pytorch(tmp_path):
    """serve-models' replicas (and the demo's ONNX path) read the model contract, run the files and check their
    logits without importing PyTorch or timm: both cost seconds of CPU per replica start (the contract's config
    check and the logits check live in ``attnzoo.modelconfig``; the models' order comes from the zoo)."""
    import subprocess
    import sys

    from attnzoo.serve.loading import export_zoo

    best = zoo.best_entries("fashion")  # the shipped exports: adopted in seconds
    folder = [export_zoo("fashion", tmp_path, [e["variant"]], [task]) for task, e in best.items()][0]
    files = sorted(p.name for p in folder.glob("*.onnx"))
    assert len(files) == 2
    code = (
        "import sys; from pathlib import Path; from attnzoo.serve.loading import load_models; "
        f"m = load_models(Path({str(folder)!r}), 'ort-cpu', threads=1, only={files!r}); "
        "print(sorted((x.task, x.name) for x in m), 'torch' in sys.modules, 'timm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split("]")[0] + "]" == str(sorted((t, e["variant"]) for t, e in best.items()))
    assert out.strip().endswith("] False False"), out


def test_served_models_are_ordered_as_the_registry_orders_the_variants():
    """A replica orders its models by the zoo's variant order, to stay clear of PyTorch: that is the registry's."""
    from attnzoo.models import BUILTIN_VARIANTS, VARIANT_NAMES

    builtin = [v for v in VARIANT_NAMES if v in BUILTIN_VARIANTS]
    assert list(dict.fromkeys(e["variant"] for e in zoo.entries())) == builtin
