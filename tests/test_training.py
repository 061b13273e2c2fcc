"""Training: a few steps on tiny data lower the loss and write a checkpoint that evaluate-model,
create_model and load_checkpoint read; resuming continues the run; the CLIs fail with one clear line."""

import json

import pytest
import torch

from attnzoo.checkpoint import load_checkpoint, load_state_dict_file
from attnzoo.models import create_model
from attnzoo.training import cli
from attnzoo.training.data import SHAPES_SEG_CLASSES, shapes
from attnzoo.training.train import TrainConfig, evaluate, evaluate_checkpoint, metrics_from_confusion, train


def _cfg(tmp_path, task="cls", **kw):
    base = dict(variant="belief2", task=task, data="shapes", epochs=2, batch_size=16, lr=3e-3,
                warmup_epochs=0.5, train_size=32, val_size=16, out=str(tmp_path), threads=1,
                options={"param_matched": True})
    base.update(kw)
    return TrainConfig(**base)


def test_short_run_lowers_the_loss_and_writes_a_loadable_checkpoint(tmp_path):
    torch.manual_seed(0)
    fixed = shapes("train", "cls", n=32)
    result = train(_cfg(tmp_path, epochs=8, train_size=None), progress=False, train_data=fixed,
                   val_data=shapes("val", "cls", n=16))
    hist = result["history"]
    assert len(hist) == 8 and hist[-1]["train_loss"] < hist[0]["train_loss"]
    path = tmp_path / "belief2_cls_shapes.safetensors"
    assert path.is_file() and not (tmp_path / "belief2_cls_shapes.state.json").exists()
    cfg = json.loads(path.with_suffix(".json").read_text())
    assert cfg["data"] == "shapes" and cfg["seed"] == 0 and cfg["epochs"] == 8
    assert cfg["options"]["param_matched"] is True and len(cfg["history"]) == 8
    model, config = load_checkpoint(path)
    rebuilt = create_model(config["variant"], config["task"], config["arch"], config["num_classes"],
                           config["img_size"], **config["options"])
    rebuilt.load_state_dict(load_state_dict_file(path))
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), rebuilt.eval()(x))
    res = evaluate_checkpoint(path, limit=20)
    assert res["n_images"] == 20 and 0.0 <= res["metric"] <= 100.0


def test_training_is_deterministic_and_resumable(tmp_path):
    full = train(_cfg(tmp_path / "a", task="seg"), progress=False)
    assert not (tmp_path / "a" / "belief2_seg_shapes.state.json").exists()  # finished: no state left
    cfg = _cfg(tmp_path / "b", task="seg")
    train(cfg, progress=False, max_steps=2)  # 32 images / 16 per batch: stops after epoch 1 of 2
    assert (tmp_path / "b" / "belief2_seg_shapes.state.safetensors").is_file()
    with pytest.raises(ValueError, match="different settings \\(lr\\)"):
        train(_cfg(tmp_path / "b", task="seg", lr=1e-3), resume=True, progress=False)
    resumed = train(cfg, resume=True, progress=False)
    assert [h["epoch"] for h in resumed["history"]] == [1, 2]
    assert resumed["history"][0] == full["history"][0]
    want, got = load_state_dict_file(full["path"]), load_state_dict_file(resumed["path"])
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_seg_metrics_are_miou_with_per_class_iou():
    conf = torch.tensor([[8, 2], [0, 2]])
    m = metrics_from_confusion(conf, "seg", ["background", "thing"])
    assert m["per_class_iou"] == {"background": 80.0, "thing": 50.0} and m["metric"] == 65.0
    assert metrics_from_confusion(conf, "cls", ["a", "b"])["metric"] == 83.33333333333333
    model = create_model("standard", "seg", num_classes=len(SHAPES_SEG_CLASSES))
    res = evaluate(model, shapes("test", "seg", n=4), "seg")
    assert set(res["per_class_iou"]) == set(SHAPES_SEG_CLASSES)


def test_cli_train_and_evaluate(tmp_path, capsys):
    assert cli.main(["--variant", "standard", "--task", "cls", "--data", "digits", "--epochs", "1",
                     "--train-size", "32", "--batch-size", "16", "--out", str(tmp_path), "--no-progress"]) == 0
    path = tmp_path / "standard_cls_digits.safetensors"
    assert cli.evaluate_main([str(path), "--limit", "10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert out["metric_name"] == "top1" and out["n_images"] == 10


@pytest.mark.parametrize("argv, message", [
    (["--variant", "nope"], "unknown variant"),
    (["--variant", "standard", "--data", "/no/such/folder"], "unknown data"),
    (["--variant", "standard", "--data", "digits", "--task", "seg"], "digits has no masks"),
    (["--variant", "standard", "--epochs", "0"], "--epochs"),
    (["--variant", "standard", "--option", "bogus=1"], "bogus"),
])
def test_cli_bad_input_is_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + ["--no-progress", "--train-size", "8"])
    assert str(exc.value).startswith("error: ") and message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_evaluate_cli_bad_checkpoint(tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"junk")
    with pytest.raises(SystemExit, match="error: .*x.safetensors"):
        cli.evaluate_main([str(bad)])
    with pytest.raises(SystemExit, match="error: "):
        cli.evaluate_main([str(tmp_path / "missing.safetensors")])
