"""Training: a few steps on tiny data lower the loss and write a checkpoint that evaluate-model,
create_model and load_checkpoint read; resuming continues the run; the CLIs fail with one clear line."""

import importlib
import json
import re

import numpy as np
import pytest
import torch

from attnzoo.data.datasets import SHAPES_SEG_CLASSES, shapes
from attnzoo.errors import CommandExit
from attnzoo.metrics import metrics_from_confusion, named_right
from attnzoo.models import create_model
from attnzoo.models.checkpoint import load_checkpoint, load_state_dict_file
from attnzoo.training import cli
from attnzoo.training.train import TrainConfig, evaluate, evaluate_checkpoint, train


def _cfg(tmp_path, task="cls", **kw):
    base = dict(
        variant="belief2",
        task=task,
        data="shapes",
        epochs=2,
        batch_size=16,
        lr=3e-3,
        warmup_epochs=0.5,
        train_size=32,
        val_size=16,
        out=str(tmp_path),
        threads=1,
        options={"param_matched": True},
    )
    base.update(kw)
    return TrainConfig(**base)


def test_short_run_lowers_the_loss_and_writes_a_loadable_checkpoint(tmp_path):
    torch.manual_seed(0)
    fixed = shapes("train", "cls", n=32)
    result = train(
        _cfg(tmp_path, epochs=8, train_size=None), progress=False, train_data=fixed, val_data=shapes("val", "cls", n=16)
    )
    hist = result["history"]
    assert len(hist) == 8 and hist[-1]["train_loss"] < hist[0]["train_loss"]
    path = tmp_path / "belief2_cls_shapes.safetensors"
    assert path.is_file() and not (tmp_path / "belief2_cls_shapes.state.json").exists()
    cfg = json.loads(path.with_suffix(".json").read_text())
    assert cfg["data"] == "shapes" and cfg["seed"] == 0 and cfg["epochs"] == 8
    assert cfg["options"]["param_matched"] is True and len(cfg["history"]) == 8
    model, config = load_checkpoint(path)
    rebuilt = create_model(
        config["variant"],
        config["task"],
        config["arch"],
        config["num_classes"],
        config["img_size"],
        **config["options"],
    )
    rebuilt.load_state_dict(load_state_dict_file(path))
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), rebuilt.eval()(x))
    res = evaluate_checkpoint(path, limit=20)
    test = shapes("test", "cls", n=20)  # the same 20 images, scored here without the package's evaluation code
    with torch.no_grad():
        pred = model(torch.from_numpy((test.images / 255.0 - 0.5) / 0.5).permute(0, 3, 1, 2).float()).argmax(1)
    assert res["n_images"] == 20
    assert res["metric"] == pytest.approx(100.0 * (pred.numpy() == test.labels).mean())


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


def test_a_run_stopped_mid_epoch_leaves_its_steps_and_resumes_there(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the middle of the first epoch: the state after the steps taken is saved (not lost with the epoch),
    and --resume finishes the run with the weights of an uninterrupted one."""
    full = train(_cfg(tmp_path / "a", train_size=64), progress=False)  # 4 steps an epoch
    clip, calls = torch.nn.utils.clip_grad_norm_, []

    def stop_at_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return clip(*args, **kwargs)

    cfg = _cfg(tmp_path / "b", train_size=64)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", stop_at_third)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, progress=False)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    state = json.loads((tmp_path / "b" / "belief2_cls_shapes.state.json").read_text())
    assert (state["epoch"], state["step"], len(state["losses"])) == (0, 2, 2)
    assert "after 2 of 4 steps" in capsys.readouterr().err
    resumed = train(cfg, resume=True, progress=False)
    assert [h["epoch"] for h in resumed["history"]] == [1, 2]
    assert resumed["history"][0]["losses_first_last"][0] == full["history"][0]["losses_first_last"][0]
    want, got = load_state_dict_file(full["path"]), load_state_dict_file(resumed["path"])
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_train_model_threads_default_to_one_for_the_micro_archs(tmp_path, monkeypatch):
    """The zoo's setting: on a busy 2-core machine two threads made a micro model's step several times slower."""
    seen = []
    monkeypatch.setattr(  # where it is defined: the command names it through a lazy module
        importlib.import_module("attnzoo.training.train"),
        "train",
        lambda cfg, **kw: seen.append(cfg.threads) or (_ for _ in ()).throw(SystemExit),
    )
    for arch in ("micro", "micro-conv", "tiny"):
        with pytest.raises(SystemExit):
            cli.main(["--variant", "standard", "--data", "shapes", "--arch", arch, "--out", str(tmp_path)])
    assert seen == [1, 1, None]
    assert cli.default_threads("small") is None


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run stopped after epoch 1 of 2: its state files (bytes), to be damaged by each test."""
    out = tmp_path_factory.mktemp("stopped")
    train(_cfg(out), progress=False, max_steps=2)  # 32 images / 16 per batch: stops after epoch 1 of 2
    return {p.name: p.read_bytes() for p in out.glob("*.state.*")}


def _resume(tmp_path, state, edit):
    for name, data in state.items():
        (tmp_path / name).write_bytes(data)
    js = tmp_path / "belief2_cls_shapes.state.json"
    js.write_text(edit(js.read_text()))
    with pytest.raises(ValueError) as info:
        train(_cfg(tmp_path), resume=True, progress=False)
    assert not (tmp_path / "belief2_cls_shapes.safetensors").exists()  # no "finished" checkpoint
    return str(info.value)


@pytest.mark.parametrize(
    "epoch, needle",
    [
        (10**12, "epoch 1000000000000, not within 0..2"),  # wrote a "finished" checkpoint after 1 of 2 epochs
        (-5, "epoch -5, not within 0..2"),  # trained from epoch -4
        (2, "a history of 1 epoch(s) for epoch 2"),
        ("1", 'epoch "1", not within 0..2'),
    ],
)
def test_a_resume_state_must_be_within_the_run(tmp_path, stopped_run, epoch, needle):
    """The state's epoch must be a whole number within 0..--epochs with one history entry per finished epoch:
    anything else is refused in one line naming the file, before any training."""

    def edit(text):
        meta = json.loads(text)
        meta["epoch"] = epoch
        return json.dumps(meta)

    message = _resume(tmp_path, stopped_run, edit)
    assert message.startswith(f"cannot resume: {tmp_path / 'belief2_cls_shapes.state.json'} is damaged (")
    assert needle in message and "\n" not in message


def _set(path: str, value):
    """An edit of the state JSON setting one dotted path (``param_groups.0.lr``)."""

    def edit(text):
        meta = json.loads(text)
        *head, last = path.split(".")
        node = meta
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
        return json.dumps(meta)

    return edit


@pytest.mark.parametrize(
    "path, value, needle",
    [
        ("scheduler.last_epoch", 10**12, "scheduler step 1000000000000, not within 0..2, the steps of 1 epoch(s)"),
        ("scheduler.last_epoch", -3, "scheduler step -3, not within 0..2"),
        ("param_groups.0.lr", 1e30, "optimizer learning rate 1e+30, not within 0..0.003"),
        ("param_groups.0.betas", [-0.9, 0.999], "optimizer betas [-0.9, 0.999] (this run: [0.9, 0.999])"),
        ("param_groups.0.weight_decay", -1.0, "optimizer weight_decay -1.0 (this run: 0.05)"),
    ],
)
def test_a_resume_optimizer_state_must_be_the_runs(tmp_path, stopped_run, path, value, needle):
    """An optimizer or scheduler state the run cannot have (it trained on to "loss became nan") is refused in one
    line naming the file, before any training."""
    message = _resume(tmp_path, stopped_run, _set(path, value))
    assert message.startswith(f"cannot resume: {tmp_path / 'belief2_cls_shapes.state.json'} is damaged (")
    assert needle in message and "\n" not in message, message


def test_a_resume_with_non_finite_or_negative_moments_is_refused(tmp_path, stopped_run):
    from safetensors.torch import load_file, save_file

    for name, data in stopped_run.items():
        (tmp_path / name).write_bytes(data)
    st = tmp_path / "belief2_cls_shapes.state.safetensors"
    tensors = load_file(str(st))
    key = next(k for k in tensors if k.endswith(".exp_avg_sq"))
    tensors[key] = -tensors[key] - 1
    save_file(tensors, str(st))
    with pytest.raises(ValueError) as info:
        train(_cfg(tmp_path), resume=True, progress=False)
    assert str(info.value).startswith(f"cannot resume: {st} is damaged ({key} is negative)")
    tensors[key] = torch.full_like(tensors[key], float("nan"))
    save_file(tensors, str(st))
    with pytest.raises(ValueError, match=f"{key} holds non-finite values"):
        train(_cfg(tmp_path), resume=True, progress=False)


def test_a_deep_or_huge_resume_state_is_refused_naming_the_file(tmp_path, stopped_run, monkeypatch):
    """A 100,000-deep state JSON: one line naming the file (was "maximum recursion depth exceeded" alone); a state
    over the size bound: refused from its size, before it is parsed."""
    import importlib

    state_mod = importlib.import_module("attnzoo.training._state")
    js = tmp_path / "belief2_cls_shapes.state.json"
    message = _resume(tmp_path, stopped_run, lambda text: "[" * 100_000 + "]" * 100_000)
    assert message == f"cannot resume: {js}: not readable JSON (JSON nested too deep)"
    monkeypatch.setattr(state_mod, "MAX_STATE_JSON_BYTES", 100)
    message = _resume(tmp_path, stopped_run, lambda text: text)
    assert message == f"cannot resume: {js}: not readable JSON (over the 100 bytes such a file can be)"


def test_train_model_resume_refuses_a_bad_state_in_one_line(tmp_path, stopped_run, capsys):
    for name, data in stopped_run.items():
        (tmp_path / name).write_bytes(data)
    js = tmp_path / "belief2_cls_shapes.state.json"
    js.write_text(js.read_text().replace('"epoch": 1,', '"epoch": 1000000000000,', 1))
    with pytest.raises(SystemExit) as info:
        cli.main(
            [
                "--variant",
                "belief2",
                "--task",
                "cls",
                "--data",
                "shapes",
                "--epochs",
                "2",
                "--batch-size",
                "16",
                "--lr",
                "0.003",
                "--warmup-epochs",
                "0.5",
                "--train-size",
                "32",
                "--val-size",
                "16",
                "--option",
                "param_matched=true",
                "--out",
                str(tmp_path),
                "--threads",
                "1",
                "--resume",
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 1 and len(err) == 1 and str(js) in err[0] and "not within 0..2" in err[0]


def test_seg_metrics_are_miou_with_per_class_iou():
    conf = torch.tensor([[8, 2], [0, 2]])
    m = metrics_from_confusion(conf, "seg", ["background", "thing"])
    assert m["per_class_iou"] == {"background": 80.0, "thing": 50.0} and m["metric"] == 65.0
    assert metrics_from_confusion(conf, "cls", ["a", "b"])["metric"] == 83.33333333333333
    model = create_model("standard", "seg", num_classes=len(SHAPES_SEG_CLASSES))
    res = evaluate(model, shapes("test", "seg", n=4), "seg")
    assert set(res["per_class_iou"]) == set(SHAPES_SEG_CLASSES)


def _named_by_hand(true: np.ndarray, pred: np.ndarray, background: int = 0):
    """The definition, a garment and a scene at a time: a garment class is named right when the class painted on
    most of its pixels is its own, strictly more than any other."""
    garments = right = scenes_right = 0
    for t, p in zip(true, pred, strict=False):
        all_right = True
        for c in sorted(set(t.ravel().tolist()) - {background}):
            painted = np.bincount(p[t == c], minlength=max(int(p.max()), c) + 1)
            others = np.delete(painted, c)
            ok = painted[c] > (others.max() if others.size else -1)
            garments, right, all_right = garments + 1, right + int(ok), all_right and ok
        scenes_right += int(all_right)
    return {"garments": garments, "garments_right": right, "scenes": len(true), "scenes_right": scenes_right}


def test_named_right_counts_garments_and_whole_scenes_as_the_definition_does():
    true = np.zeros((3, 6, 6), np.int64)
    true[:, :3, :3], true[:, 3:, 3:] = 3, 5  # two garments a scene
    pred = true.copy()
    pred[1, 3:, 3:] = 7  # scene 1: the coat painted as a shirt
    pred[2, :3, :3] = 0
    pred[2, 0, 0] = 3  # scene 2: the pullover painted mostly as background: not named
    pred[2, 3:, 3:5] = 5
    pred[2, 3:, 5] = 2  # ... the coat still mostly coat: named
    got = named_right(true, pred, 11)
    assert got == _named_by_hand(true, pred) == {"garments": 6, "garments_right": 4, "scenes": 3, "scenes_right": 1}
    tie = true[:1].copy()
    tie_pred = tie.copy()
    tie_pred[0, 3:, 3:] = np.array([[5, 5, 5], [6, 6, 6], [0, 0, 0]])  # coat 3, sandal 3: a tie is not a name
    assert named_right(tie, tie_pred, 11)["garments_right"] == _named_by_hand(tie, tie_pred)["garments_right"] == 1
    rng = np.random.default_rng(0)
    t, p = rng.integers(0, 4, (8, 5, 5)), rng.integers(0, 4, (8, 5, 5))
    assert named_right(t, p, 4) == _named_by_hand(t, p)
    res = evaluate(
        create_model("standard", "seg", num_classes=len(SHAPES_SEG_CLASSES)), shapes("test", "seg", n=4), "seg"
    )
    assert res["named"]["scenes"] == 4 and 0 <= res["named"]["garments_right"] <= res["named"]["garments"]


def test_cli_train_and_evaluate(tmp_path, capsys):
    assert (
        cli.main(
            [
                "--variant",
                "standard",
                "--task",
                "cls",
                "--data",
                "digits",
                "--epochs",
                "1",
                "--train-size",
                "32",
                "--batch-size",
                "16",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    path = tmp_path / "standard_cls_digits.safetensors"
    assert cli.evaluate_main([str(path), "--limit", "10", "--json", "--out", str(tmp_path / "eval.json")]) == 0
    out = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert out["metric_name"] == "top1" and out["n_images"] == 10
    # --out: the same result, with the command that wrote it, in a file
    written = json.loads((tmp_path / "eval.json").read_text())
    assert written.pop("command").startswith("evaluate-model " + str(path)) and written == out
    with pytest.raises(CommandExit):
        cli.evaluate_main([str(path), "--out", str(tmp_path / "no" / "such" / "eval.json")])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--variant", "nope"], "unknown variant"),
        (["--variant", "standard", "--data", "/no/such/folder"], "unknown data"),
        (["--variant", "standard", "--data", "digits", "--task", "seg"], "digits has no masks"),
        (["--variant", "standard", "--epochs", "0"], "--epochs"),
        (["--variant", "standard", "--option", "bogus=1"], "bogus"),
    ],
)
def test_cli_bad_input_is_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + ["--no-progress", "--train-size", "8"])
    assert str(exc.value).startswith("error: ") and message in str(exc.value)
    assert "\n" not in str(exc.value)
    assert exc.value.code == 2  # a bad command line (docs/errors.md), refused before any data is loaded


def test_evaluate_cli_bad_checkpoint(tmp_path):
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"junk")
    for path in (bad, tmp_path / "missing.safetensors"):  # a bad input file: exit 1 (docs/errors.md)
        with pytest.raises(SystemExit, match=f"^error: {re.escape(str(path))}: ") as exc:
            cli.evaluate_main([str(path)])
        assert exc.value.code == 1 and "\n" not in str(exc.value)


def _saved_classifier(tmp_path, variant="standard", img_size=32):
    from attnzoo.models.checkpoint import save_checkpoint

    torch.manual_seed(1)
    model = create_model(variant, "cls", "micro", num_classes=3, img_size=img_size)
    path = tmp_path / f"{variant}_cls.safetensors"
    save_checkpoint(model, path, class_names=["a", "b", "c"])
    return model, path


def test_segmenter_encoder_starts_from_the_classifier(tmp_path):
    from attnzoo.models.checkpoint import init_encoder, save_checkpoint

    cls_model, path = _saved_classifier(tmp_path, img_size=32)
    with torch.no_grad():  # a constant grid stays constant under any interpolation; the class token is kept
        cls_model.pos_embed[:, 1:] = 0.25
        cls_model.pos_embed[:, 0] = -1.0
    save_checkpoint(cls_model, path, class_names=["a", "b", "c"])
    seg = create_model("standard", "seg", "micro", num_classes=4, img_size=48)
    head_before = {k: v.clone() for k, v in seg.state_dict().items() if not k.startswith("encoder.")}
    copied = init_encoder(seg, path)
    src = cls_model.state_dict()
    enc = seg.encoder.state_dict()
    assert copied == len([k for k in enc if not k.startswith("head.")])
    for k in src:
        if k.startswith("head.") or k == "pos_embed":
            continue
        torch.testing.assert_close(enc[k], src[k], rtol=0, atol=0)
    assert src["pos_embed"].shape[1] == 8 * 8 + 1 and seg.encoder.pos_embed.shape[1] == 12 * 12 + 1  # patch 4
    torch.testing.assert_close(seg.encoder.pos_embed[:, 0], torch.full((1, src["pos_embed"].shape[-1]), -1.0))
    torch.testing.assert_close(seg.encoder.pos_embed[:, 1:], torch.full_like(seg.encoder.pos_embed[:, 1:], 0.25))
    for k, v in head_before.items():  # the decoder starts fresh
        torch.testing.assert_close(seg.state_dict()[k], v, rtol=0, atol=0)


def test_encoder_start_refuses_another_variant(tmp_path):
    from attnzoo.models.checkpoint import init_encoder

    _, path = _saved_classifier(tmp_path, variant="belief")
    seg = create_model("standard", "seg", "micro", num_classes=4, img_size=32)
    with pytest.raises(ValueError, match="variant is 'belief'; it cannot start a 'standard' encoder"):
        init_encoder(seg, path)
    with pytest.raises(SystemExit) as exc:  # checked before any data is loaded
        cli.main(["--variant", "standard", "--task", "seg", "--init-from", str(path), "--no-progress"])
    assert str(exc.value).startswith("error: ") and "cannot start a 'standard' encoder" in str(exc.value)


def test_train_with_init_from_starts_at_the_classifier(tmp_path):
    cls_model, path = _saved_classifier(tmp_path, variant="belief2")
    cfg = _cfg(tmp_path, task="seg", epochs=1, options={}, lr=1e-9, init_from=str(path))
    result = train(cfg, progress=False, max_steps=1)  # one step at lr 1e-9: the encoder is still the classifier's
    saved = load_state_dict_file(result["path"])
    assert result["recipe"]["init_from"] == str(path)
    torch.testing.assert_close(
        saved["encoder.blocks.0.attn.qkv.weight"], cls_model.state_dict()["blocks.0.attn.qkv.weight"], rtol=0, atol=1e-6
    )


@pytest.mark.parametrize(
    "state, needle",
    [
        ("[" * 100_000 + "]" * 100_000, "not readable JSON (JSON nested too deep)"),
        (
            json.dumps({"epoch": 10**12, "history": [], "elapsed": 0.0, "config": {}}),
            "epoch 1000000000000, not within 0..2",
        ),
    ],
)
def test_a_zoo_job_trains_afresh_from_a_bad_state_saying_which_file(
    tmp_path, monkeypatch, capsys, state, needle, shapes_job
):
    """A zoo build's job whose state JSON is 100,000 deep (was "maximum recursion depth exceeded" without the file)
    or claims an epoch past the run: one line naming the file, then the model is trained afresh through every
    epoch, and no state is left."""
    from attnzoo.training import zoo

    job = shapes_job
    js = tmp_path / "standard_cls_shapes.state.json"
    js.write_text(state)
    (tmp_path / "standard_cls_shapes.state.safetensors").write_bytes(b"never read: the JSON is refused first")
    epochs = []
    monkeypatch.setattr(zoo, "_epoch_reporter", lambda: lambda done, total: epochs.append(done))
    row = zoo._run_job(job, str(tmp_path))
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith(f"standard cls shapes: cannot resume: {js}") and needle in said[0]
    assert said[0].endswith("; training afresh"), said
    assert epochs == [1, 2] and row["epochs"] == 2 and not list(tmp_path.glob("*.state.*"))
    saved = json.loads((tmp_path / "standard_cls_shapes.json").read_text())
    assert [h["epoch"] for h in saved["history"]] == [1, 2]


def test_the_data_sets_old_path_under_training_warns_and_is_the_data_layers_object():
    import attnzoo.data
    import attnzoo.training

    with pytest.warns(DeprecationWarning, match="import it from attnzoo.data"):
        assert attnzoo.training.load_data is attnzoo.data.load_data
    assert "load_data" not in attnzoo.training.__all__
    with pytest.raises(AttributeError):
        attnzoo.training.no_such_name  # noqa: B018
