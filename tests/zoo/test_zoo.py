"""The model zoo: every file matches its manifest sha256, every model loads by variant and task and
reproduces its recorded metric on the first ``subset_n`` (200) test images, ``subset_metric`` (the whole test
split's ``test_metric`` is not recomputed here: ``python -m attnzoo.training.zoo verify --limit N``, N the split's
size, does that); the zoo is complete, has learned, and explains its weak models."""

import pytest
import torch

from attnzoo import zoo
from attnzoo.data.datasets import load_data
from attnzoo.fileio import sha256_file
from attnzoo.models import VARIANT_NAMES
from attnzoo.training.train import evaluate
from attnzoo.training.zoo import DIGITS_VARIANTS, RECIPES, SUBSET_N, background_miou

ENTRIES = zoo.entries()
_DATA = {}


def _test_subset(data: str, task: str, n: int):
    """The first ``n`` test images (or scenes) of a zoo data set, at the recipe's size and scene options
    (Fashion-MNIST: the official files, Debian's or the package's copy)."""
    key = (data, task, n)
    if key not in _DATA:
        recipe = RECIPES[f"{data}/{task}"]
        _DATA[key] = load_data(data, "test", task, recipe["img_size"], n, scene=recipe.get("scene"))
    return _DATA[key]


def _id(e):
    return f"{e['variant']}-{e['task']}-{e['data']}"


def test_zoo_is_complete_and_small():
    assert ENTRIES, f"{zoo.ZOO_DIR / 'manifest.json'} is missing or lists no models"
    have = {(e["variant"], e["task"], e["data"]) for e in ENTRIES}
    want = {(v, t, d) for v in VARIANT_NAMES for t in ("cls", "seg") for d in ("fashion", "shapes")}
    want |= {(v, "cls", "digits") for v in DIGITS_VARIANTS}
    assert want <= have, f"missing: {sorted(want - have)}"
    size = sum((zoo.ZOO_DIR / e["file"]).stat().st_size for e in ENTRIES)
    assert size < 80e6
    recipe = zoo.manifest()["recipe"]
    for e in ENTRIES:  # one recipe per task: same epochs for all variants
        assert e["epochs"] == recipe["recipes"][f"{e['data']}/{e['task']}"]["epochs"]
    assert zoo.available("seg") == [v for v in VARIANT_NAMES if (v, "seg", zoo.DEFAULT_DATA) in have]
    assert zoo.available("seg", "shapes") == [v for v in VARIANT_NAMES if (v, "seg", "shapes") in have]
    opts = {e["variant"]: e["options"] for e in ENTRIES}
    assert opts["belief2"]["param_matched"] is True


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_zoo_file_matches_manifest_and_reproduces_metric(entry):
    path = zoo.checkpoint_path(entry["variant"], entry["task"], entry["data"])
    assert sha256_file(path) == entry["sha256"]
    model, config = zoo.load(entry["variant"], entry["task"], entry["data"])
    assert config["variant"] == entry["variant"] and config["task"] == entry["task"]
    assert sum(p.numel() for p in model.parameters()) == entry["params"]
    data = _test_subset(entry["data"], entry["task"], entry["subset_n"])
    with torch.no_grad():
        got = evaluate(model, data, entry["task"], config["mean"], config["std"])["metric"]
    assert got == pytest.approx(entry["subset_metric"], abs=0.5)
    # the subset is a fair sample of the full test split
    assert abs(entry["subset_metric"] - entry["test_metric"]) < 12


@pytest.mark.parametrize("entry", ENTRIES, ids=_id)
def test_zoo_model_has_learned(entry):
    k = len(_test_subset(entry["data"], entry["task"], SUBSET_N).class_names)
    if entry["task"] == "cls":
        assert entry["test_metric"] > 2.5 * 100.0 / k, "classifier not far above chance"
    else:  # must beat predicting background everywhere
        baseline = background_miou(_test_subset(entry["data"], "seg", SUBSET_N).masks, k)
        assert entry["test_metric"] > baseline + 8, f"mIoU {entry['test_metric']} vs all-background {baseline}"


def test_weak_models_carry_a_note():
    ref = {(e["task"], e["data"]): e["test_metric"] for e in ENTRIES if e["variant"] == "standard"}
    for e in ENTRIES:
        base = ref.get((e["task"], e["data"]))
        if base is not None and base - e["test_metric"] > 10:
            assert e["note"].strip(), f"{_id(e)} is >10 points below standard without a note"


def test_unknown_zoo_model_is_a_clear_error():
    with pytest.raises(ValueError, match="no 'seg' model of 'belief2' trained on 'digits'; it has:"):
        zoo.checkpoint_path("belief2", "seg", "digits")
