"""Data sets: the shapes generator is deterministic and its masks agree with its labels; digits; the
folder loaders on small folders written here, including empty folders, unreadable files and bad masks."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from attnzoo.data.datasets import (
    SHAPES_CLASSES,
    SHAPES_SEG_CLASSES,
    TensorDataset,
    ade_folder,
    digits,
    imagefolder,
    load_data,
    shapes,
    shapes_images,
)


@pytest.mark.parametrize("task", ["cls", "seg"])
def test_shapes_deterministic_and_split_disjoint(task):
    a = shapes_images(12, 32, "test", seed=3, task=task)
    b = shapes_images(12, 32, "test", seed=3, task=task)
    for x, y in zip(a, b, strict=False):
        np.testing.assert_array_equal(x, y)
    # image i does not depend on how many images are drawn
    np.testing.assert_array_equal(shapes_images(4, 32, "test", seed=3, task=task)[0], a[0][:4])
    other_split = shapes_images(12, 32, "train", seed=3, task=task)[0]
    other_seed = shapes_images(12, 32, "test", seed=4, task=task)[0]
    assert not any((other_split[i] == a[0][i]).all() for i in range(12))
    assert not any((other_seed[i] == a[0][i]).all() for i in range(12))
    images, labels, masks = a
    assert images.dtype == np.uint8 and images.shape == (12, 32, 32, 3)
    assert labels.dtype == np.int64 and masks.dtype == np.uint8 and masks.shape == (12, 32, 32)


@pytest.mark.parametrize("task", ["cls", "seg"])
def test_shapes_masks_agree_with_labels(task):
    images, labels, masks = shapes_images(60, 32, "val", seed=0, task=task)
    assert masks.max() <= len(SHAPES_CLASSES) and labels.max() < len(SHAPES_CLASSES)
    for label, mask in zip(labels, masks, strict=False):
        counts = np.bincount(mask.ravel(), minlength=len(SHAPES_SEG_CLASSES))
        assert counts[label + 1] > 0 and counts[1:].argmax() == label  # label = largest object
        assert counts[0] > 0  # some background is visible
    if task == "cls":  # one dominant object covers a clear share of the image
        share = np.array([(m == label + 1).mean() for label, m in zip(labels, masks, strict=False)])
        assert share.min() > 0.05
    else:  # several objects per image
        assert np.mean([len(np.unique(m)) - 1 for m in masks]) > 1.5
    # every class occurs, object pixels differ from the background around them
    assert set(labels.tolist()) == set(range(len(SHAPES_CLASSES)))
    fg = images[masks > 0].astype(float).mean()
    bg = images[masks == 0].astype(float).mean()
    assert fg > bg + 30


def test_shapes_other_sizes_and_bad_arguments():
    images, _, masks = shapes_images(2, 64, "train", task="seg")
    assert images.shape == (2, 64, 64, 3) and masks.shape == (2, 64, 64)
    with pytest.raises(ValueError, match="unknown split"):
        shapes_images(2, split="holdout")
    with pytest.raises(ValueError, match="unknown task"):
        shapes_images(2, task="det")


def test_tensor_dataset_uses_the_shared_normalisation():
    data = shapes("test", "seg", n=3)
    ds = TensorDataset(data, "seg")
    x, y = ds[0]
    assert x.shape == (3, 32, 32) and y.shape == (32, 32)
    np.testing.assert_allclose(x.numpy(), (np.moveaxis(data.images[0], -1, 0) / 255.0 - 0.5) / 0.5, atol=1e-6)
    with pytest.raises(ValueError, match="no masks"):
        TensorDataset(digits("test", n=2), "seg")


def test_digits_splits():
    train, val, test = (digits(s) for s in ("train", "val", "test"))
    assert len(train) + len(val) + len(test) == 1797
    assert train.images.shape[1:] == (32, 32, 3) and train.images.dtype == np.uint8
    assert set(test.labels.tolist()) == set(range(10))
    assert train.images.max() > 200 and train.images.min() == 0


def _write_png(path: Path, size=(10, 12), value=0, mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "RGB":
        Image.new("RGB", size, (value, 255 - value, 30)).save(path)
    else:
        Image.new(mode, size, value).save(path)


def test_imagefolder(tmp_path):
    for k, cls in enumerate(["cat", "dog"]):
        for i in range(10):
            _write_png(tmp_path / cls / f"{i}.png", value=100 * k + i)
    sets = {s: imagefolder(tmp_path, s, img_size=16) for s in ("train", "val", "test")}
    assert sum(len(d) for d in sets.values()) == 20
    assert sets["train"].class_names == ["cat", "dog"] and sets["train"].images.shape[1:] == (16, 16, 3)
    assert load_data(str(tmp_path), "test", img_size=16).labels.tolist() == sets["test"].labels.tolist()
    with pytest.raises(ValueError, match="no masks"):
        imagefolder(tmp_path, "train", task="seg")


def test_imagefolder_bad_cases(tmp_path):
    with pytest.raises(ValueError, match="no class sub-folders"):
        imagefolder(tmp_path, "train")
    (tmp_path / "cat").mkdir()
    _write_png(tmp_path / "dog" / "0.png")
    with pytest.raises(ValueError, match="empty class folder"):
        imagefolder(tmp_path, "train")
    for i in range(5):
        _write_png(tmp_path / "cat" / f"{i}.png")
        _write_png(tmp_path / "dog" / f"{i}.png")
    (tmp_path / "cat" / "broken.png").write_bytes(b"not an image at all")
    with pytest.raises(ValueError, match="broken.png.*cannot read image"):
        for split in ("train", "val", "test"):
            imagefolder(tmp_path, split)
    with pytest.raises(ValueError, match="unknown data"):
        load_data(str(tmp_path / "missing"), "train")


def _ade(root: Path, n=6, mask_size=(12, 10)):
    """An ADE20K-layout folder: 12x10 images and index-PNG masks (classes 1..3 in the top-left corner)."""
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        _write_png(root / "images" / f"img{i}.png", size=(12, 10), value=i)
        mask = np.zeros(mask_size[::-1], np.uint8)
        mask[: 3 + i % 3, :4] = 1 + i % 3
        Image.fromarray(mask, mode="L").save(root / "annotations" / f"img{i}.png")


def test_ade_folder(tmp_path):
    _ade(tmp_path, n=10)
    data = [ade_folder(tmp_path, s, img_size=8) for s in ("train", "val", "test")]
    assert sum(len(d) for d in data) == 10
    d = data[0]
    assert d.masks.shape[1:] == (8, 8) and d.images.shape[1:] == (8, 8, 3)
    assert d.class_names == ["background", "class_1", "class_2", "class_3"]
    for label, mask in zip(d.labels, d.masks, strict=False):
        assert np.bincount(mask.ravel(), minlength=4)[1:].argmax() + 1 == label  # indexes class_names
        assert d.class_names[label] != "background"
    (tmp_path / "classes.txt").write_text("other\nsky\ntree\nroad\ncar\n")
    assert load_data(str(tmp_path), "train", "seg", 8).class_names == ["other", "sky", "tree", "road", "car"]


def test_ade_folder_bad_cases(tmp_path):
    with pytest.raises(ValueError, match="images/ and annotations/"):
        ade_folder(tmp_path, "train")
    (tmp_path / "images").mkdir()
    (tmp_path / "annotations").mkdir()
    with pytest.raises(ValueError, match="no images found"):
        ade_folder(tmp_path, "train")
    bad = tmp_path / "bad"
    _ade(bad, n=6, mask_size=(5, 5))
    with pytest.raises(ValueError, match="mask size 5x5 does not match its image 12x10"):
        for split in ("train", "val", "test"):
            ade_folder(bad, split)
    unreadable = tmp_path / "unreadable"
    _ade(unreadable, n=6)
    for name in ("images", "annotations"):
        (unreadable / name / "img0.png").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="img0.png.*cannot read"):
        for split in ("train", "val", "test"):
            ade_folder(unreadable, split)


def test_folders_with_split_subfolders(tmp_path):
    for split, n in (("train", 4), ("val", 2)):
        for cls in ("a", "b"):
            for i in range(n):
                _write_png(tmp_path / "cls" / split / cls / f"{i}.png")
        _ade(tmp_path / "stage" / split, n=n)  # flat layout, moved into training/ and validation/
        for kind in ("images", "annotations"):
            dst = tmp_path / "ade" / kind / {"train": "training", "val": "validation"}[split]
            dst.parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "stage" / split / kind).rename(dst)
    assert len(imagefolder(tmp_path / "cls", "train")) == 8
    assert len(imagefolder(tmp_path / "cls", "test")) == 4  # no test/: falls back to val/
    assert len(ade_folder(tmp_path / "ade", "train")) == 4
    assert len(ade_folder(tmp_path / "ade", "val")) == 2
