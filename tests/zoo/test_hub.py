"""The zoo through timm's own API: every zoo model has a timm name that ``timm.list_models(pretrained=True)`` lists
and ``timm.create_model(name, pretrained=True)`` builds with the packaged weights, offline; a classifier built so
gives the zoo model's logits and, through timm's own preprocessing of its ``pretrained_cfg``, the manifest's top-1
(on the first 200 test images here, on the whole official test split in the slow test); a segmenter comes through
timm's factory too."""

from __future__ import annotations

import socket

import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

from attnzoo import zoo
from attnzoo.data.datasets import load_data
from attnzoo.zoo import hub, names

CLASSIFIER = "vit_micro_conv_belief2.fashion_mnist"
SEGMENTER = "segmenter_vit_micro_conv_belief2.fashion_mnist"


def test_every_zoo_model_has_one_timm_name_that_timm_lists_as_pretrained():
    rows = zoo.entries()
    names = hub.names()
    assert len(names) == len(set(names)) == len(rows)
    assert [hub.entry(n)["file"] for n in names] == [e["file"] for e in rows]
    assert sorted(timm.list_models(names, pretrained=True)) == sorted(names)
    belief2 = timm.list_models("*belief2*", pretrained=True)
    assert CLASSIFIER in belief2 and SEGMENTER in belief2
    assert set(belief2) == {n for n in names if hub.entry(n)["variant"] == "belief2"}
    fashion_seg = hub.names(data="fashion", task="seg")
    assert len(fashion_seg) == 15 and all(n.startswith("segmenter_vit_micro_conv_") for n in fashion_seg)
    assert "vit_micro_conv_anti_wafe_mae.fashion_mnist" in names  # "-" spelled "_", as timm names are


def test_the_light_names_are_the_registered_ones():
    """``attnzoo.zoo.names`` (no torch: the demo reads it) names every zoo model as the hub registers it."""
    assert [names.entry_name(e) for e in zoo.entries()] == [hub.timm_name(e) for e in zoo.entries()] == hub.names()


def test_a_pretrained_cfg_describes_the_weights_it_names(offline):
    m = timm.create_model(CLASSIFIER, pretrained=True)
    cfg, config = m.pretrained_cfg, hub.config(CLASSIFIER)
    assert cfg["file"] == str(zoo.ZOO_DIR / "belief2_cls_fashion.safetensors") and cfg["tag"] == "fashion_mnist"
    assert cfg["num_classes"] == m.num_classes == 10 and list(cfg["label_names"]) == config["class_names"]
    assert cfg["paper_name"] == "Improved Belief-Attention in Vision Tasks" and cfg["paper_ids"] == "2606.00077"
    data = resolve_data_config({}, model=m)
    assert data["input_size"] == (3, 28, 28) and data["crop_pct"] == 1.0 and data["interpolation"] == "bilinear"
    assert data["mean"] == tuple(config["mean"]) and data["std"] == tuple(config["std"])
    seg = timm.create_model(SEGMENTER, pretrained=True)
    assert seg.pretrained_cfg["input_size"] == (3, 56, 56) and seg.pretrained_cfg["label_names"][0] == "background"
    # an architecture without a tag builds its default tag's shape, untrained
    plain = timm.create_model("vit_micro_conv_belief2")
    assert plain.num_classes == 10 and not torch.equal(plain.head.weight, m.head.weight)


def _zoo_logits(name: str, x: torch.Tensor) -> torch.Tensor:
    e = hub.entry(name)
    model, _ = zoo.load(e["variant"], e["task"], e["data"])
    with torch.no_grad():
        return model(x)


def test_create_model_pretrained_gives_the_zoo_models_logits(offline):
    torch.manual_seed(0)
    for name, size in ((CLASSIFIER, 28), (SEGMENTER, 56), ("vit_micro_standard.shapes", 32)):
        x = torch.randn(3, 3, size, size)
        with torch.no_grad():
            got = timm.create_model(name, pretrained=True).eval()(x)
        assert torch.equal(got, _zoo_logits(name, x)), name


def _timm_top1(name: str, n: int | None) -> tuple[float, int]:
    """Top-1 (%) of ``name`` built by timm on the first ``n`` official test images, each preprocessed by the
    transform timm makes from the model's ``pretrained_cfg`` (the images as RGB PIL images, as a timm user has)."""
    m = timm.create_model(name, pretrained=True).eval()
    transform = create_transform(**resolve_data_config({}, model=m))
    data = load_data("fashion", "test", "cls", 28, n)
    right = 0
    with torch.no_grad():
        for start in range(0, len(data), 500):
            batch = torch.stack([transform(Image.fromarray(img)) for img in data.images[start : start + 500]])
            right += int((m(batch).argmax(1).numpy() == data.labels[start : start + 500]).sum())
    return 100.0 * right / len(data), len(data)


def test_timm_preprocessing_reproduces_the_manifests_top1_on_the_first_test_images(offline):
    e = hub.entry(CLASSIFIER)
    top1, n = _timm_top1(CLASSIFIER, e["subset_n"])
    assert n == e["subset_n"] == 200
    assert top1 == pytest.approx(e["subset_metric"], abs=1e-9)


@pytest.mark.slow
def test_timm_preprocessing_reproduces_the_manifests_top1_on_the_official_test_split(offline):
    e = hub.entry(CLASSIFIER)
    top1, n = _timm_top1(CLASSIFIER, None)
    assert n == e["test_n"] == 10_000
    assert round(top1, 2) == e["test_metric"]


def test_timm_adapts_a_zoo_model_as_it_adapts_its_own(offline):
    """Another class count keeps every weight but the classifier's (timm drops the head its ``classifier`` names);
    options the package does not know, and inputs it cannot take, are one clear error."""
    zoo_model = timm.create_model(CLASSIFIER, pretrained=True)
    three = timm.create_model(CLASSIFIER, pretrained=True, num_classes=3)
    assert three.head.weight.shape == (3, 64)
    assert torch.equal(three.blocks[0].attn.qkv.weight, zoo_model.blocks[0].attn.qkv.weight)
    seg = timm.create_model(SEGMENTER, pretrained=True, num_classes=4)
    assert seg.decoder.head.weight.shape[0] == 4
    # a variant option given to timm overrides the zoo's (an untrained model of another build)
    assert timm.create_model(CLASSIFIER, phi="silu").attnzoo_config["options"]["phi"] == "silu"
    assert zoo_model.attnzoo_config["options"]["phi"] == "gelu"
    with pytest.raises(ValueError, match="takes 3-channel images"):
        timm.create_model(CLASSIFIER, in_chans=1)
    with pytest.raises(ValueError, match="unknown option"):
        timm.create_model(CLASSIFIER, no_such_option=1)


def test_an_unknown_zoo_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"no zoo model is named 'vit_micro_conv_nope'; the zoo's timm names: .*"):
        hub.entry("vit_micro_conv_nope")
    assert hub.entry("vit_micro_conv_belief2") == hub.entry(CLASSIFIER)  # an architecture: its default tag


def test_registration_leaves_out_an_unreadable_zoo_model_with_a_warning(monkeypatch, tmp_path):
    """A zoo file whose config cannot be read costs its own timm name, with a warning naming it, not the import."""
    before = hub.names()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not safetensors")
    good = zoo.entries()[0]
    monkeypatch.setattr(zoo, "ZOO_DIR", tmp_path)
    monkeypatch.setattr(zoo, "entries", lambda: [{**good, "file": "bad.safetensors"}])
    with pytest.warns(UserWarning, match="zoo model bad.safetensors is not registered with timm"):
        configs, rows, archs, cfgs = hub._register()
    assert configs == rows == archs == cfgs == {}
    assert hub.names() == before  # the registered names are untouched


def test_the_offline_fixture_refuses_a_connection(offline):
    """So the tests above that pass under it reached nothing."""
    with socket.socket() as s, pytest.raises(AssertionError, match="connected to"):
        s.connect(("192.0.2.1", 80))  # TEST-NET-1: refused before any packet is sent
    assert offline == [("192.0.2.1", 80)]
    offline.clear()
