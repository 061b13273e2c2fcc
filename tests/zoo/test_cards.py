"""Model cards and the Hugging Face layout: the committed cards are what ``python -m attnzoo.zoo card`` writes and
huggingface_hub's own parser reads their metadata with the manifest's metrics; a card's deployability table follows
each report step's own state; a written folder loads with timm's ``local-dir:`` to the zoo model's logits (one model
here, every zoo model in the slow test), offline; a folder that fails its check replaces nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import timm
import torch
from huggingface_hub import ModelCard

from attnzoo import zoo
from attnzoo.errors import CommandExit
from attnzoo.fileio import sha256_file
from attnzoo.models import VARIANTS
from attnzoo.zoo import cards, hub
from attnzoo.zoo.__main__ import main

FASHION = hub.names(data="fashion")
ONE = "vit_micro_conv_belief2.fashion_mnist"


def test_the_committed_cards_are_the_30_fashion_models_and_what_the_command_writes():
    assert len(FASHION) == 30
    assert sorted(p.name for p in cards.CARDS_DIR.iterdir()) == sorted(FASHION)
    stale = [n for n in FASHION if cards.packaged_card(n) != cards.card_markdown(n)]
    assert stale == [], f"stale cards (python -m attnzoo.zoo card --all --readme-only --out zoo/cards): {stale}"
    assert main(["card", "--all", "--readme-only", "--check", "--out", str(cards.CARDS_DIR)]) == 0


def test_check_names_a_stale_card(tmp_path, capsys):
    shutil.copytree(cards.CARDS_DIR, tmp_path / "cards")
    card = tmp_path / "cards" / ONE / "README.md"
    card.write_text(card.read_text().replace("89.41", "99.41"))
    with pytest.raises(CommandExit) as exit_:
        main(["card", "--all", "--readme-only", "--check", "--out", str(tmp_path / "cards")])
    assert exit_.value.code == 1
    assert f"differ from what the zoo writes: {ONE}; run python -m attnzoo.zoo card {ONE}" in capsys.readouterr().err


@pytest.mark.parametrize("name", FASHION)
def test_a_committed_card_parses_with_huggingface_hub_and_carries_the_manifests_metric(name):
    e = hub.entry(name)
    card = ModelCard.load(cards.CARDS_DIR / name / "README.md")
    data = card.data
    assert data.library_name == "timm" and data.license == "apache-2.0" and data.model_name == name
    assert data.pipeline_tag == {"cls": "image-classification", "seg": "image-segmentation"}[e["task"]]
    assert data.datasets == ["zalando-datasets/fashion_mnist"] and "timm" in data.tags
    (result,) = data.eval_results
    assert result.metric_value == e["test_metric"] and result.dataset_split == "test"
    assert result.metric_type == {"top1": "accuracy", "miou": "mean_iou"}[e["metric_name"]]
    assert result.dataset_type == "zalando-datasets/fashion_mnist" and result.task_type == data.pipeline_tag
    body = card.text
    paper = VARIANTS[e["variant"]].paper
    assert f"[{paper.title}]({paper.url}), {paper.authors}, {paper.year}" in body.replace("\\", "")
    assert f"`zoo/{e['file']}`" in body and e["sha256"] in body
    assert f"results/variant-reports/{e['variant']}/report.json" in body


def _repo_with_report(tmp_path: Path, variant: str, edit) -> Path:
    """A copy of the card's sources (docs/variants.md, the variant's and standard's reports), the report edited."""
    for rel in ("docs/variants.md", *(f"results/variant-reports/{v}/report.json" for v in (variant, "standard"))):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cards.ROOT / rel, tmp_path / rel)
    path = tmp_path / "results" / "variant-reports" / variant / "report.json"
    report = json.loads(path.read_text())
    edit(report)
    path.write_text(json.dumps(report))
    return tmp_path


def test_the_deployability_table_reads_each_steps_own_state(tmp_path):
    """A failed step shows its reason, a built engine that ran says so, a skipped one why, a parity check that did not
    pass is FAILED, and a report of another checkpoint is said to be of another model."""

    def edit(r):
        steps = r["export"]["belief2"]
        steps["fp8"] = {"status": "failed", "reason": "FidelityError: no placement promises 0.99"}
        steps["tensorrt"].update(state="built and run", ran_on_gpu=True, not_run_reason=None)
        steps["openvino"] = {"status": "skipped", "reason": "not written with this budget"}
        steps["executorch"]["passed"] = False
        steps["source"]["checkpoint"] = "elsewhere.safetensors"
        r["environment"]["gpu"] = {"name": "NVIDIA H200"}

    text = cards.card_markdown(ONE, _repo_with_report(tmp_path, "belief2", edit))
    assert "| ONNX FP8 (Q/DQ) | failed: FidelityError: no placement promises 0.99 |" in text
    assert "| TensorRT engine | built and run | yes |" in text
    assert "| OpenVINO IR | skipped: not written with this budget |" in text
    assert "| ExecuTorch program | FAILED (max abs err 2.38e-06) | yes |" in text
    assert "| ONNX fp32 | passed (max abs err 2.38e-06) | yes |" in text
    assert (
        "NVIDIA H200" in text and "exported the variant's classifier (`elsewhere.safetensors`), not this model" in text
    )


def test_the_committed_tables_say_built_not_run_where_no_gpu_ran_the_engine():
    text = cards.packaged_card(ONE) or ""
    assert "| TensorRT engine | built, not run: no GPU on this machine" in text
    assert "| OpenVINO | 4 of 4 | 4 of 4 |" in text and "| TensorRT | not inspected: no CUDA GPU here" in text
    assert "| openvino fp32 | 44.25 | 55.50 | 1.25 [1.25, 1.26] |" in text  # results/variant-reports/belief2
    seg = cards.packaged_card("segmenter_vit_micro_conv_belief2.fashion_mnist") or ""
    assert "exported the variant's classifier (`belief2_cls_fashion.safetensors`), not this model" in seg


def test_a_card_without_its_sources_is_one_clear_error(tmp_path):
    (tmp_path / "docs").mkdir()
    shutil.copyfile(cards.ROOT / "docs" / "variants.md", tmp_path / "docs" / "variants.md")
    with pytest.raises(ValueError, match=r"no report-variant report of 'belief2' at .*belief2/report.json"):
        cards.card_markdown(ONE, tmp_path)


def _check_folder(folder: Path, name: str) -> None:
    """``folder`` is timm's layout of zoo model ``name``: it loads with ``local-dir:`` to the zoo model's logits."""
    e, cfg = hub.entry(name), hub.config(name)
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == name.split(".")[0] and config["num_classes"] == cfg["num_classes"]
    assert config["label_names"] == cfg["class_names"] and config["pretrained_cfg"]["tag"] == name.split(".")[1]
    assert "file" not in config["pretrained_cfg"]  # save_for_hf drops the source: the folder is the source
    assert sha256_file(folder / "model.safetensors") == e["sha256"]  # the zoo's own bytes
    size = cfg["img_size"]
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    reference, _ = zoo.load(e["variant"], e["task"], e["data"])
    with torch.no_grad():
        assert torch.equal(loaded(x), reference(x)), name
    assert ModelCard.load(folder / "README.md").data.eval_results[0].metric_value == e["test_metric"]


def test_a_folder_round_trips_through_timm_local_dir(tmp_path, offline):
    folder = cards.write_folder(ONE, tmp_path)
    assert folder == tmp_path / ONE and sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "config.json",
        "model.safetensors",
    ]
    _check_folder(folder, ONE)
    assert (folder / "README.md").read_text() == cards.packaged_card(ONE)


@pytest.mark.slow
@pytest.mark.parametrize("name", hub.names())
def test_every_zoo_model_round_trips_through_timm_local_dir(name, tmp_path, offline):
    _check_folder(cards.write_folder(name, tmp_path), name)


def test_a_folder_that_fails_its_check_replaces_nothing(tmp_path, monkeypatch):
    (tmp_path / ONE).mkdir()
    (tmp_path / ONE / "README.md").write_text("the card that was there\n")

    def fail(*args):
        raise ValueError("logits differ")

    monkeypatch.setattr(cards, "_verify", fail)
    with pytest.raises(ValueError, match="logits differ"):
        cards.write_folder(ONE, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [ONE]  # no staging folder left
    assert [p.name for p in (tmp_path / ONE).iterdir()] == ["README.md"]
    assert (tmp_path / ONE / "README.md").read_text() == "the card that was there\n"


def test_the_command_refuses_bad_requests_in_one_line(tmp_path, capsys):
    for argv, message in (
        (["card", "nope", "--out", str(tmp_path)], "error: no zoo model is named 'nope'; the zoo's timm names: "),
        (["card", ONE, "--all", "--out", str(tmp_path)], "error: name the models or give --all (not both)"),
        (["card", "--all", "--check", "--out", str(tmp_path)], "error: --check compares the cards alone"),
    ):
        with pytest.raises(CommandExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and capsys.readouterr().err.startswith(message), argv
    assert list(tmp_path.iterdir()) == []


def test_docs_zoo_md_links_every_committed_card():
    text = (cards.ROOT / "docs" / "zoo.md").read_text()
    assert f"<!-- zoo-names -->\n{cards.names_table()}\n<!-- /zoo-names -->" in text
    for name in FASHION:
        assert f"(../zoo/cards/{name}/README.md)" in text
