"""Bad input gets one clear line (or a gr.Error) and loses nothing.

Memory-eating cases are tested through the up-front refusal only: the work they would start is replaced
by a sentinel that fails the test if it is ever reached.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from PIL import Image

import attnzoo.serve  # noqa: F401  (offline environment first)
from attnzoo import limits
from attnzoo.export import export_verified
from attnzoo.export import verify as verify_mod
from attnzoo.export.cli import main as export_main
from attnzoo.models import create_model, memory
from attnzoo.models.checkpoint import load_checkpoint, read_config, save_checkpoint
from attnzoo.preprocess import ImageTooLargeError, load_image
from attnzoo.runtime.parity import TOLERANCES
from attnzoo.serve.loading import load_models
from attnzoo.training import cli as train_cli
from attnzoo.training.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]


def _exit(fn, argv) -> SystemExit:
    with pytest.raises(SystemExit) as info:
        fn(argv)
    return info.value


def _never(*args, **kwargs):
    raise AssertionError("work started although the input should have been refused up front")


# ---------------------------------------------------------------------------------- 1: batch-size bound
def test_export_refuses_batch_sizes_over_the_bound_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(verify_mod, "export_verified", _never)
    out = tmp_path / "out"
    err = _exit(
        export_main,
        ["--variant", "belief2", "--random-init", "--batch-sizes", "1,100000", "--out", str(out / "m.onnx")],
    )
    assert err.code == 2
    assert str(err) == f"error: --batch-sizes: 100000 out of range; batch sizes must be in 1..{limits.MAX_BATCH_SIZE}"
    assert capsys.readouterr().err.strip().splitlines() == [str(err)]
    assert not out.exists()


def test_export_refuses_a_batch_that_would_not_fit_in_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(verify_mod, "export_verified", _never)
    err = _exit(
        export_main,
        [
            "--variant",
            "wafe-mae",
            "--random-init",
            "--task",
            "seg",
            "--input-size",
            "2048",
            "--batch-sizes",
            "8",
            "--out",
            str(tmp_path / "m.onnx"),
        ],
    )
    assert err.code == 2 and "GiB" in str(err) and "use smaller batch sizes" in str(err)
    assert list(tmp_path.iterdir()) == []


def test_forward_estimate_grows_with_batch_and_tokens():
    cfg = {"variant": "standard", "task": "cls", "arch": "micro", "num_classes": 3}
    one = memory.forward_bytes(cfg, (32, 32), 1)
    assert memory.forward_bytes(cfg, (32, 32), 8) == 8 * one
    assert memory.forward_bytes(cfg, (64, 64), 1) > 4 * one
    assert memory.forward_bytes({**cfg, "variant": "wafe-mae"}, (32, 32), 1) > one


# ------------------------------------------------------------------ 2, 6, 12: pixel cap, bombs and EXIF
def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG whose header claims width x height and whose pixel data is one empty deflate stream (a few
    hundred bytes, never decodable to that size)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )
    return path


def test_images_over_the_pixel_cap_are_refused_from_the_header(tmp_path):
    from attnzoo.serve.demo.app import _read_upload

    path = _png_header_only(tmp_path / "big.png", 12000, 12000)
    start = time.perf_counter()
    with pytest.raises(ImageTooLargeError, match="12000x12000 \\(144 MP\\), over the 40 MP limit"):
        load_image(path)
    with pytest.raises(ValueError) as info:
        _read_upload({"path": str(path), "orig_name": "big.png"}, [tmp_path])
    assert time.perf_counter() - start < 1.0
    assert "40 MP limit" in str(info.value) and "damaged" not in str(info.value)
    ok = _png_header_only(tmp_path / "ok.png", 10, 10)  # under the cap: decoding is tried (and fails)
    with pytest.raises(ValueError, match="cannot read image"):
        load_image(ok)


def test_decompression_bombs_are_named_as_such(tmp_path):
    from attnzoo.serve.demo.app import _read_upload

    path = _png_header_only(tmp_path / "bomb.png", 20000, 20000)  # past Pillow's own bomb limit
    with pytest.raises(ValueError) as info:
        _read_upload({"path": str(path), "orig_name": "bomb.png"}, [tmp_path])
    assert "decompression bomb" in str(info.value) and "damaged" not in str(info.value)


def test_over_the_cap_images_are_refused_without_a_pillow_warning(tmp_path, capsys):
    """40-179 MP: Pillow warns past its own 89 MP limit as it reads the header; our refusal comes first and alone.
    A bomb past Pillow's 179 MP error is still refused with one line."""
    import warnings

    for side, needle in (
        (10000, "10000x10000 (100 MP), over the 40 MP limit"),
        (13000, "13000x13000 (169 MP)"),
        (20000, "refused a decompression bomb"),
    ):
        path = _png_header_only(tmp_path / f"{side}.png", side, side)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ImageTooLargeError) as info:
                load_image(path)
            with pytest.raises(ImageTooLargeError):
                load_image(path.read_bytes())
        assert needle in str(info.value) and "\n" not in str(info.value)
        assert [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)] == [], side
    # outside load_image Pillow's own warning is untouched (the filter was scoped to the header read)
    with pytest.warns(Image.DecompressionBombWarning):
        Image.open(tmp_path / "10000.png")


def test_zoo_and_screenshot_commands_use_the_one_error_pattern(tmp_path, capsys):
    from attnzoo.errors import CommandExit
    from attnzoo.serve.demo import screenshot
    from attnzoo.training import zoo as zoo_cli

    errors = [
        _exit(zoo_cli.main, ["build", "--variants", "nosuch", "--out", str(tmp_path / "zoo")]),
        _exit(zoo_cli.main, ["onnx", "--data", "nosuch"]),
        _exit(screenshot.main, ["--models", str(tmp_path / "none"), "--out", str(tmp_path / "x.png")]),
    ]
    assert all(isinstance(e, CommandExit) for e in errors) and [e.code for e in errors] == [2, 1, 1]
    assert str(errors[0]).startswith("error: unknown variant 'nosuch'; valid variants: ")
    assert not (tmp_path / "zoo").exists()  # refused before anything was written
    assert str(errors[1]) == "error: the zoo has no models trained on 'nosuch'"
    assert str(errors[2]) == f"error: models folder not found: {tmp_path / 'none'}"
    assert capsys.readouterr().err.strip().splitlines() == [str(e) for e in errors]  # one line each, no traceback
    proc = subprocess.run(
        [sys.executable, "-m", "attnzoo.training.zoo", "onnx", "--data", "nosuch"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and proc.stderr.strip() == "error: the zoo has no models trained on 'nosuch'"


def test_exif_orientation_is_applied(tmp_path):
    pixels = np.zeros((2, 4, 3), np.uint8)
    pixels[:, :2] = (255, 0, 0)  # left half red, right half blue
    pixels[:, 2:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored image must be rotated 90 degrees clockwise to display upright
    path = tmp_path / "rotated.png"
    Image.fromarray(pixels).save(path, exif=exif)
    img = load_image(path)
    assert img.size == (2, 4)  # (width, height) swapped
    arr = np.asarray(img)
    assert tuple(arr[0, 0]) == (255, 0, 0) and tuple(arr[-1, 0]) == (0, 0, 255)  # red on top after rotating


# ----------------------------------------------------------------- 3, 9, 11: the demo's model folder
@pytest.fixture(scope="module")
def good_onnx(tmp_path_factory) -> Path:
    model = create_model("standard", "cls", "micro", num_classes=3)
    config = {**model.attnzoo_config, "class_names": ["a", "b", "c"], "mean": [0.5] * 3, "std": [0.5] * 3}
    path = tmp_path_factory.mktemp("good") / "good.onnx"
    export_verified(model.eval(), path, config, batch_sizes=(1,))
    return path


def _copy(src: Path, dst: Path) -> None:
    """A verified export and its report, as export-model leaves them."""
    shutil.copy(src, dst)
    shutil.copy(src.with_suffix(".report.json"), dst.with_suffix(".report.json"))


def _with_props(src: Path, dst: Path, reported: bool = False, **props: str) -> None:
    """``src`` with metadata ``props`` changed; ``reported``: with a report that covers the changed file (as if it
    had been verified), so what is checked after the report is reached."""
    from attnzoo.fileio import sha256_file

    proto = onnx.load(str(src))
    for p in proto.metadata_props:
        if p.key in props:
            p.value = props[p.key]
    onnx.save(proto, str(dst))
    if reported:
        report = json.loads(src.with_suffix(".report.json").read_text())
        dst.with_suffix(".report.json").write_text(json.dumps({**report, "sha256": sha256_file(dst)}))


def test_demo_skips_malformed_models_and_serves_the_rest(good_onnx, tmp_path, capsys):
    _copy(good_onnx, tmp_path / "good.onnx")
    _with_props(good_onnx, tmp_path / "empty_config.onnx", **{"attnzoo.config": "{}"})
    _with_props(good_onnx, tmp_path / "bad_size.onnx", input_size="[0, -5]")
    models = load_models(tmp_path)
    assert [Path(m.source).name for m in models] == ["good.onnx"]
    err = capsys.readouterr().err
    assert "warning: skipping empty_config.onnx: " in err and "missing variant" in err
    assert (
        "warning: skipping bad_size.onnx: " in err
        and "bad_size.onnx: input_size must be an integer in 1..2048, got 0" in err
    )


def test_demo_fails_only_when_nothing_is_servable(good_onnx, tmp_path):
    _with_props(good_onnx, tmp_path / "empty_config.onnx", **{"attnzoo.config": "{}"})
    with pytest.raises(ValueError, match="no servable models"):
        load_models(tmp_path)


def test_class_names_must_match_the_logits(good_onnx, tmp_path, capsys):
    props = {p.key: p.value for p in onnx.load(str(good_onnx)).metadata_props}
    cfg = json.loads(props["attnzoo.config"])
    short = {**cfg, "class_names": ["a", "b"], "num_classes": 2}  # consistent metadata, but 3 logits
    _copy(good_onnx, tmp_path / "good.onnx")
    _with_props(good_onnx, tmp_path / "short.onnx", reported=True, **{"attnzoo.config": json.dumps(short)})
    assert [Path(m.source).name for m in load_models(tmp_path)] == ["good.onnx"]
    assert (
        "skipping short.onnx: short.onnx: 2 class names but the model outputs 3 logits per image"
        in capsys.readouterr().err
    )

    ckpt = tmp_path / "ck" / "m.safetensors"
    save_checkpoint(create_model("standard", "cls", "micro", num_classes=3), ckpt, class_names="abc")
    _rewrite_config(ckpt, class_names=["a", "b"])
    with pytest.raises(ValueError, match="2 class names for 3 classes"):
        load_checkpoint(ckpt)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_named_onnx_is_skipped_not_opened(good_onnx, tmp_path, capsys):
    _copy(good_onnx, tmp_path / "good.onnx")
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    result = {}
    worker = threading.Thread(target=lambda: result.update(models=load_models(tmp_path)), daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # blocked opening the FIFO: release it, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
        pytest.fail("loading the models folder hung on a FIFO")
    assert [Path(m.source).name for m in result["models"]] == ["good.onnx"]
    assert "warning: skipping pipe.onnx: is a FIFO, not a regular file" in capsys.readouterr().err


def test_file_kind_names_what_a_path_is(tmp_path, good_onnx):
    """The words an error line uses for a path given as a model: from the file system (a FIFO is never opened) and
    the format's own first bytes."""
    import pickle

    import torch

    from attnzoo.filekind import file_kind

    (tmp_path / "folder.onnx").mkdir()
    os.mkfifo(tmp_path / "pipe.onnx")
    (tmp_path / "empty.onnx").write_bytes(b"")
    (tmp_path / "notes.onnx").write_text("hello, I am not a model\n")
    (tmp_path / "noise.bin").write_bytes(bytes(range(256)) * 2)
    torch.save({"w": torch.zeros(2)}, tmp_path / "zip.pt")
    torch.save({"w": torch.zeros(2)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"w": 1}))
    kinds = {
        "missing.onnx": "no such file",
        "folder.onnx": "a directory",
        "pipe.onnx": "a FIFO",
        "empty.onnx": "an empty file",
        "notes.onnx": "a text file",
        "noise.bin": "binary data",
        "zip.pt": "a zip archive",
        "legacy.pt": "a pickle",
        "plain.pkl": "a pickle",
    }
    assert {name: file_kind(tmp_path / name) for name in kinds} == kinds
    assert file_kind(good_onnx) == "an ONNX model"
    assert file_kind(ROOT / "zoo" / "belief_cls_fashion.safetensors") == "a safetensors file"
    assert file_kind(ROOT / "serve" / "examples" / "fashion_cls_0.png") == "a PNG image"


def test_a_model_path_that_is_no_model_is_named_for_what_it_is(tmp_path, good_onnx, capsys):
    """A directory, a text file named ``.onnx``, an ONNX model or a FIFO where a checkpoint belongs
    (``evaluate-model``, ``export-model --checkpoint``, ``train-model --init-from``, ``report-variant
    --checkpoint``), and a folder of models
    (``serve-demo --models``) that is a file: one line that says what the path is, never "no attnzoo config"; a
    text file among a folder's ``.onnx`` files is skipped as a text file."""
    from attnzoo.errors import CommandExit
    from attnzoo.report.cli import main as report_main

    folder, notes, pipe = tmp_path / "runs", tmp_path / "notes.onnx", tmp_path / "pipe.safetensors"
    folder.mkdir()
    notes.write_text("hello, I am not a model\n")
    os.mkfifo(pipe)
    forms = "not a checkpoint (a .safetensors checkpoint from train-model, or a PyTorch state dict)"
    cases = [
        (train_cli.evaluate_main, [str(folder)], f"error: {folder}: is a directory, {forms}"),
        (train_cli.evaluate_main, [str(notes)], f"error: {notes}: is a text file, {forms}"),
        (train_cli.evaluate_main, [str(good_onnx)], f"error: {good_onnx}: is an ONNX model, {forms}"),
        (train_cli.evaluate_main, [str(pipe)], f"error: {pipe}: is a FIFO, {forms}"),
        (
            export_main,
            ["--checkpoint", str(folder), "--out", str(tmp_path / "x.onnx")],
            f"error: {folder}: is a directory, {forms}",
        ),
        (
            export_main,
            ["--checkpoint", str(notes), "--variant", "belief", "--out", str(tmp_path / "x.onnx")],
            f"error: {notes}: is a text file, {forms}",
        ),
        (
            train_cli.main,
            ["--variant", "belief", "--init-from", str(folder), "--out", str(tmp_path / "r")],
            f"error: {folder}: is a directory, {forms}",
        ),
        (
            report_main,
            ["--variant", "belief", "--checkpoint", str(good_onnx), "--out", str(tmp_path / "r")],
            f"error: --checkpoint {good_onnx}: is an ONNX model, {forms}",
        ),
    ]
    for fn, argv, line in cases:
        err = _exit(fn, argv)
        assert isinstance(err, CommandExit) and err.code in (1, 2) and str(err) == line, (argv, str(err))
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "r").exists()
    with pytest.raises(ValueError, match=f"^{notes}: is a text file, not a folder \\(--models takes a folder"):
        load_models(notes)
    capsys.readouterr()
    _copy(good_onnx, folder / "good.onnx")
    shutil.copy(notes, folder / "notes.onnx")
    assert [Path(m.source).name for m in load_models(folder, "ort-cpu")] == ["good.onnx"]
    assert "warning: skipping notes.onnx: notes.onnx: is a text file, not an ONNX model file" in capsys.readouterr().err


# ------------------------------------------------------------------------------- 4, 12: bench-latency
def test_bench_checks_out_is_writable_before_measuring(tmp_path, monkeypatch):
    from attnzoo.benchmarks import cli as bench_cli
    from attnzoo.benchmarks import run as bench_run

    monkeypatch.setattr(bench_run, "run_benchmark", _never)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    err = _exit(
        bench_cli.main,
        [
            "--variants",
            "standard",
            "--backends",
            "eager",
            "--arch",
            "micro",
            "--batch-sizes",
            "1",
            "--out",
            str(blocker / "results"),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
    )
    assert (
        err.code == 1
        and str(err).startswith("error: cannot create the --out folder ")
        and "Not a directory" in str(err)
    )


def test_bench_uses_the_attnzoo_cache(tmp_path, monkeypatch):
    from attnzoo.benchmarks.cli import parse_settings

    monkeypatch.setenv("ATTNZOO_CACHE", str(tmp_path / "cache"))
    assert parse_settings(["--backends", "eager"]).cache_dir == tmp_path / "cache" / "bench-latency"


def test_bench_refuses_batch_sizes_over_the_bound():
    from attnzoo.benchmarks import cli as bench_cli

    err = _exit(bench_cli.main, ["--backends", "eager", "--batch-sizes", "100000"])
    assert err.code == 2 and f"1..{limits.MAX_BATCH_SIZE}" in str(err)


# ------------------------------------------------------------------------ 5: failed export keeps the old
@pytest.mark.slow
def test_failed_export_keeps_the_good_model_and_its_report(tmp_path, monkeypatch):
    model = create_model("belief", "cls", "micro", num_classes=3).eval()
    out = tmp_path / "m.onnx"
    verify_mod.export_verified(model, out, model.attnzoo_config, batch_sizes=(1,))
    good_model, good_report = out.read_bytes(), verify_mod.report_path(out).read_text()
    with monkeypatch.context() as patch:
        patch.setitem(TOLERANCES, "fp32", -1.0)  # no export can pass
        with pytest.raises(verify_mod.VerificationError, match="m.onnx was not written"):
            verify_mod.export_verified(
                create_model("belief", "cls", "micro", num_classes=3), out, model.attnzoo_config, batch_sizes=(1,)
            )
    assert out.read_bytes() == good_model and verify_mod.report_path(out).read_text() == good_report
    assert json.loads(verify_mod.failed_report_path(out).read_text())["passed"] is False
    verify_mod.export_verified(model, out, model.attnzoo_config, batch_sizes=(1,))
    assert not verify_mod.failed_report_path(out).exists()  # a stale failure report is removed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.report.json"]


# ------------------------------------------------------------------ 7, 8: checkpoints and --resume
def _rewrite_config(path: Path, **config_changes) -> None:
    """A checkpoint written with ``config_changes`` in its own config (the safetensors metadata its sha256 covers)
    and in the JSON beside it, as a hostile file would be: the checks on the values, not the JSON's agreement with
    the checkpoint, are what refuse it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from attnzoo.models.checkpoint import CONFIG_KEY

    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    stored = json.loads(meta[CONFIG_KEY])
    meta[CONFIG_KEY] = json.dumps({**stored, **{k: v for k, v in config_changes.items() if k in stored}})
    save_file(tensors, str(path), metadata=meta)
    side = path.with_suffix(".json")
    side.write_text(json.dumps({**json.loads(side.read_text()), **config_changes}))


def _checkpoint(tmp_path: Path, **config_changes) -> Path:
    path = tmp_path / "m.safetensors"
    save_checkpoint(create_model("standard", "cls", "micro", num_classes=3), path, class_names="abc")
    _rewrite_config(path, **config_changes)
    return path


def test_checkpoint_with_a_huge_img_size_is_refused_before_building(tmp_path, monkeypatch):
    import attnzoo.models

    path = _checkpoint(tmp_path, img_size=100000)
    monkeypatch.setattr(attnzoo.models, "create_model", _never)  # building it would allocate ~160 GB
    with pytest.raises(ValueError, match="img_size must be an integer in 1..2048, got 100000"):
        load_checkpoint(path)
    err = _exit(train_cli.evaluate_main, [str(path)])
    assert err.code == 1 and "img_size" in str(err) and "\n" not in str(err)


@pytest.mark.parametrize("text", ["3", "null", "[1, 2]", '"a string"'])
def test_checkpoint_config_that_is_not_an_object(tmp_path, text):
    path = _checkpoint(tmp_path)
    path.with_suffix(".json").write_text(text)
    with pytest.raises(ValueError, match="not an object"):
        read_config(path)


def test_checkpoint_config_nested_too_deep_names_its_file(tmp_path):
    path = _checkpoint(tmp_path)
    side = path.with_suffix(".json")
    side.write_text("[" * 100_000 + "]" * 100_000)  # json's decoder recursed into a RecursionError, no file named
    with pytest.raises(ValueError, match=f"{side}: cannot read the checkpoint config \\(JSON nested too deep\\)"):
        read_config(path)


def _partial_run(tmp_path: Path) -> TrainConfig:
    """Epoch 1 of 2 of the run ``_TRAIN_ARGV`` describes (train-model's defaults), leaving its state."""
    from attnzoo.data.datasets import shapes

    cfg = TrainConfig(
        variant="standard",
        epochs=2,
        batch_size=16,
        lr=2e-3,
        warmup_epochs=0.5,
        train_size=32,
        out=str(tmp_path),
        threads=1,
    )
    train(cfg, progress=False, max_steps=2, train_data=shapes("train", n=32), val_data=shapes("val", n=16))
    return cfg


_TRAIN_ARGV = [
    "--variant",
    "standard",
    "--epochs",
    "2",
    "--batch-size",
    "16",
    "--train-size",
    "32",
    "--threads",
    "1",
    "--no-progress",
    "--resume",
]


def test_resume_from_a_truncated_state_is_one_line(tmp_path, capsys):
    _partial_run(tmp_path)
    state = tmp_path / "standard_cls_shapes.state.safetensors"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    err = _exit(train_cli.main, _TRAIN_ARGV + ["--out", str(tmp_path)])
    assert err.code == 1 and f"cannot resume: {state} is damaged or truncated" in str(err)
    assert capsys.readouterr().err.strip().splitlines()[-1] == str(err)


def test_resume_without_state_json_names_the_missing_file(tmp_path):
    cfg = _partial_run(tmp_path)
    (tmp_path / "standard_cls_shapes.state.json").unlink()
    with pytest.raises(ValueError, match="standard_cls_shapes.state.json is missing"):
        train(cfg, resume=True, progress=False)
    for p in tmp_path.glob("standard_cls_shapes.state.*"):
        p.unlink()
    with pytest.raises(ValueError, match="nothing to resume"):
        train(cfg, resume=True, progress=False)


# ------------------------------------------------------------------------------------ 10: --out suffix
@pytest.mark.parametrize(
    "fmt, name, needle",
    [
        ("onnx", "x.engine", "names a TensorRT engine but --format is onnx"),
        (None, "x.txt", "must end in .pt2 (PyTorch AOTInductor package) or "),
    ],
)
def test_export_out_suffix_must_match_the_format(tmp_path, monkeypatch, fmt, name, needle):
    from attnzoo.export.formats import formats

    monkeypatch.setattr(verify_mod, "export_verified", _never)
    argv = ["--variant", "belief2", "--random-init", "--out", str(tmp_path / name)]
    err = _exit(export_main, argv + (["--format", fmt] if fmt else []))
    assert err.code == 2 and needle in str(err)
    if fmt is None:  # every file format is listed with its suffix
        assert all(f"{p.suffixes[0]} ({p.title})" in str(err) for p in formats().values() if p.suffixes), str(err)
    assert list(tmp_path.iterdir()) == []


def test_export_out_without_a_suffix_writes_onnx_there_with_the_suffix(tmp_path, monkeypatch):
    """--help: the format comes from the --out suffix, else ONNX; ``--out m`` writes ``m.onnx`` (``m.engine`` with
    --format tensorrt); a folder is refused before any work."""
    from attnzoo.export.pipeline import _with_suffix

    seen = []

    def capture(model, out, *args, **kwargs):
        seen.append(Path(out))
        raise KeyboardInterrupt  # stop before the export itself

    monkeypatch.setattr(verify_mod, "export_verified", capture)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        export_main(["--variant", "standard", "--random-init", "--out", str(tmp_path / "nc-int8")])
    assert seen and seen[0].name.startswith("nc-int8") and seen[0].suffix == ".onnx"
    assert _with_suffix("tensorrt", tmp_path / "m") == tmp_path / "m.engine"
    assert _with_suffix("triton", tmp_path / "repo") == tmp_path / "repo"
    err = _exit(export_main, ["--variant", "standard", "--random-init", "--out", str(tmp_path)])
    assert err.code == 2 and "is a folder" in str(err)


def test_export_format_is_inferred_from_the_out_suffix():
    from attnzoo.export.pipeline import output_format as _format

    assert _format(None, Path("m.engine")) == "tensorrt" and _format(None, Path("m.onnx")) == "onnx"
    assert _format(None, None) == "onnx"


# --------------------------------------------------------------------------- 12: --debug, signals
def test_debug_shows_the_traceback(monkeypatch, capsys):
    monkeypatch.setattr(verify_mod, "export_verified", _never)
    argv = ["--variant", "belief2", "--random-init", "--batch-sizes", "0"]
    assert _exit(export_main, argv).code == 2
    assert "Traceback" not in capsys.readouterr().err
    assert _exit(export_main, argv + ["--debug"]).code == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: --batch-sizes")


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, code, line", [(signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted (Ctrl-C)")]
)
def test_signal_during_export_leaves_no_temporary_file(tmp_path, sig, code, line):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnzoo.export.cli",
            "--variant",
            "belief",
            "--random-init",
            "--batch-sizes",
            "1",
            "--out",
            str(out / "m.onnx"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 240
        while not any(out.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the export has opened its temporary file
        assert proc.poll() is None, "the export ended before it could be interrupted"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code
    assert "Traceback" not in err and err.strip().splitlines()[-1] == line
    assert list(out.iterdir()) == []
