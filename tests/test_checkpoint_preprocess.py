"""Shared pieces: checkpoint config reading, the preprocessing path and atomic writes."""

import os
import stat

import numpy as np
import pytest
import torch

from attnzoo.checkpoint import NoConfigError, load_checkpoint, read_config, save_checkpoint
from attnzoo.fileio import atomic_path, atomic_write_text
from attnzoo.models import create_model
from attnzoo.preprocess import load_image, preprocess


def test_read_config_tells_a_plain_state_dict_from_a_broken_config(tmp_path):
    ckpt = tmp_path / "x.pt"
    torch.save(create_model("standard", num_classes=3).state_dict(), ckpt)
    with pytest.raises(NoConfigError):
        read_config(ckpt)
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the checkpoint config") as info:
        read_config(ckpt)
    assert not isinstance(info.value, NoConfigError)
    (tmp_path / "x.json").write_text('{"foo": 1}')
    with pytest.raises(ValueError, match="not an attnzoo model config \\(missing variant"):
        read_config(ckpt)


def test_checkpoint_round_trip_without_the_json_beside_it(tmp_path):
    model = create_model("belief2", num_classes=3, param_matched=True).eval()
    path = tmp_path / "m.safetensors"
    save_checkpoint(model, path, class_names=["a", "b", "c"])
    (tmp_path / "m.json").unlink()  # the safetensors metadata alone must rebuild the model
    loaded, config = load_checkpoint(path)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    assert config["class_names"] == ["a", "b", "c"] and config["options"]["param_matched"] is True


def test_nan_and_inf_arrays_become_finite_images():
    arr = np.full((4, 5, 3), np.nan, dtype=np.float32)
    arr[0, 0] = np.inf
    img = load_image(arr)
    assert img.size == (5, 4) and img.mode == "RGB"
    assert np.isfinite(preprocess(arr, size=8)).all()


def test_atomic_path_leaves_nothing_on_failure_and_normal_permissions_on_success(tmp_path):
    target = tmp_path / "out.txt"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    atomic_write_text(target, "done")
    assert target.read_text() == "done"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
