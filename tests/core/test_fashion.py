"""Fashion-MNIST: the IDX reader, the splits, the composed segmentation scenes, the missing-data error, and the
official files shipped with the package (the same bytes as Debian's, read when Debian's are absent).

Most tests read the committed 600/300-image subset (tests/data/fashion-mnist); the full-size checks read the
package's copy, and Debian's ``dataset-fashion-mnist`` where it is installed.
"""

import filecmp
import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest

from attnzoo.data import fashion as fm
from attnzoo.data.datasets import load_data

SUBSET = Path(__file__).parents[1] / "data" / "fashion-mnist"


@pytest.fixture(autouse=True)
def subset(monkeypatch):
    monkeypatch.setenv("ATTNZOO_FASHION_MNIST", str(SUBSET))
    fm._CACHE.clear()
    yield
    fm._CACHE.clear()


def test_idx_reader_reads_the_subset():
    images = fm.read_idx(SUBSET / "t10k-images-idx3-ubyte.gz")
    labels = fm.read_idx(SUBSET / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (300, 28, 28) and images.dtype == np.uint8 and labels.shape == (300,)
    assert set(np.unique(labels)) == set(range(10))
    assert images.max() == 255 and images[:, 0, 0].mean() < 5  # white garments on black


def test_truncated_idx_is_refused(tmp_path):
    raw = gzip.open(SUBSET / "t10k-images-idx3-ubyte.gz").read()
    bad = tmp_path / "bad-idx3-ubyte"
    bad.write_bytes(raw[:-100])
    with pytest.raises(ValueError, match="truncated"):
        fm.read_idx(bad)
    bad.write_bytes(b"PK\x03\x04" + raw[4:])
    with pytest.raises(ValueError, match="not an IDX file"):
        fm.read_idx(bad)


def test_missing_data_names_the_folder_and_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNZOO_FASHION_MNIST", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"Fashion-MNIST not found in {tmp_path} .*point ATTNZOO_FASHION_MNIST"):
        load_data("fashion", "test", "cls", 28)
    monkeypatch.delenv("ATTNZOO_FASHION_MNIST")  # a broken install: neither Debian's nor the package's copy
    monkeypatch.setattr(fm, "DEFAULT_ROOT", tmp_path / "debian")
    monkeypatch.setattr(fm, "PACKAGED_ROOT", tmp_path)
    with pytest.raises(FileNotFoundError, match="the package's copy is incomplete: reinstall attnzoo"):
        fm.fashion_root()


def test_splits_are_disjoint_and_cover_the_training_file():
    train_x, train_y = fm.fashion_arrays("train")
    val_x, val_y = fm.fashion_arrays("val")
    all_x, _ = fm._official("train", None)
    assert len(val_y) == 600 // fm.VAL_EVERY and len(train_y) + len(val_y) == 600
    rows = {im.tobytes() for im in train_x}
    assert not rows & {im.tobytes() for im in val_x}
    assert rows | {im.tobytes() for im in val_x} == {im.tobytes() for im in all_x}
    test_x, _ = fm.fashion_arrays("test")
    assert len(test_x) == 300
    with pytest.raises(ValueError, match="valid: train, val, test"):
        fm.fashion_arrays("holdout")


def test_classification_set_is_gray_in_three_channels():
    ds = load_data("fashion", "test", "cls", 28, n=50)
    assert ds.images.shape == (50, 28, 28, 3) and ds.masks is None and ds.class_names == fm.FASHION_CLASSES
    assert (ds.images[..., 0] == ds.images[..., 2]).all()
    assert load_data("fashion", "test", "cls", 32, n=4).images.shape == (4, 32, 32, 3)


def test_scenes_follow_the_garments_pixels_and_classes():
    gray, labels = fm.fashion_arrays("test")
    images, top, masks = fm.compose_scenes(gray, labels, 40, size=48, split="test", seed=0)
    assert images.shape == (40, 48, 48, 3) and masks.shape == (40, 48, 48)
    # a mask pixel is on exactly where a garment's pixel beat the threshold
    assert ((masks > 0) == (images[..., 0] > fm.MASK_THRESHOLD)).all()
    assert masks.max() <= 10
    for i in range(40):  # the scene label is the garment class with the most pixels
        counts = np.bincount(masks[i].ravel(), minlength=11)[1:]
        assert top[i] == counts.argmax() and counts.sum() > 0
    # one class in the source -> only that class (+1) in the masks
    _, _, only3 = fm.compose_scenes(gray, np.full_like(labels, 3), 5, size=48)
    assert set(np.unique(only3)) <= {0, 4}


def test_scenes_are_deterministic_and_split_dependent():
    a = load_data("fashion", "test", "seg", 48, n=6)
    b = load_data("fashion", "test", "seg", 48, n=6)
    assert (a.images == b.images).all() and (a.masks == b.masks).all()
    assert a.class_names == fm.FASHION_SEG_CLASSES
    gray, labels = fm.fashion_arrays("test")
    other = fm.compose_scenes(gray, labels, 6, size=48, split="val")[0]
    assert not (other == a.images).all()


def test_most_scenes_show_several_garments():
    gray, labels = fm.fashion_arrays("test")
    images, _, masks = fm.compose_scenes(gray, labels, 30, size=48)
    # the overlap cap leaves room: most scenes show two or more garment classes
    multi = np.mean([len(np.unique(m)) >= 3 for m in masks])
    assert multi > 0.5


def test_native_size_garments_are_pasted_unresized_and_overlap_ranges_reach_heavy_overlap():
    gray, labels = fm.fashion_arrays("test")
    images, _, masks = fm.compose_scenes(gray, labels, 20, size=56, garment_px=(28, 28), overlap=1.0)
    assert images.shape == (20, 56, 56, 3)
    assert ((masks > 0) == (images[..., 0] > fm.MASK_THRESHOLD)).all()
    # native size: every garment pixel in the scene is a pixel value some 28x28 source image holds unresized
    one = fm.compose_scenes(gray[:1], labels[:1], 1, size=56, per_scene=(1, 1), garment_px=(28, 28))[0][0, ..., 0]
    ys, xs = np.nonzero(one)
    crop = one[ys.min() : ys.min() + 28, xs.min() : xs.min() + 28]
    on = gray[0] > fm.MASK_THRESHOLD
    assert sorted(crop[crop > fm.MASK_THRESHOLD].tolist()) == sorted(gray[0][on].tolist())
    free = fm.compose_scenes(gray, labels, 40, size=56, garment_px=(28, 28), overlap=1.0)[2]
    capped = fm.compose_scenes(gray, labels, 40, size=56, garment_px=(28, 28), overlap=0.0)[2]
    drawn = fm.compose_scenes(gray, labels, 40, size=56, garment_px=(28, 28), overlap=(0.0, 1.0))[2]
    assert not (free == capped).all() and not (drawn == free).all()
    again = fm.compose_scenes(gray, labels, 40, size=56, garment_px=(28, 28), overlap=(0.0, 1.0))[2]
    np.testing.assert_array_equal(drawn, again)
    # the defaults draw exactly what they drew before the options existed (the cap as one number)
    np.testing.assert_array_equal(
        fm.compose_scenes(gray, labels, 8)[2], fm.compose_scenes(gray, labels, 8, overlap=fm.MAX_OVERLAP)[2]
    )


def test_scene_options_are_checked_and_reach_load_data():
    assert fm.check_scene_options({"garment_px": (28, 28), "overlap": (0, 1)}) == {
        "garment_px": [28, 28],
        "overlap": [0.0, 1.0],
    }
    assert fm.check_scene_options({"overlap": 0.5, "fraction": None}) == {"overlap": 0.5}
    for bad in ({"garments": (2, 4)}, {"overlap": (1, 0)}, {"fraction": (0.5, 1.5)}, {"garment_px": (0, 28)}):
        with pytest.raises(ValueError):
            fm.check_scene_options(bad)
    ds = load_data("fashion", "test", "seg", 56, n=3, scene={"garment_px": [28, 28], "overlap": 1.0})
    assert ds.images.shape == (3, 56, 56, 3)
    with pytest.raises(ValueError, match="scene options"):
        load_data("fashion", "test", "cls", 28, n=3, scene={"overlap": 1.0})


def _no_debian(monkeypatch, tmp_path):
    """As on a machine without Debian's package: no folder given, Debian's folder absent."""
    monkeypatch.delenv("ATTNZOO_FASHION_MNIST", raising=False)
    monkeypatch.setattr(fm, "DEFAULT_ROOT", tmp_path / "no-debian-package")


def test_the_shipped_files_are_debians_official_files():
    """The package's copy: the checksums committed beside it, and byte for byte Debian's files where installed."""
    sums = dict(line.split()[::-1] for line in (fm.PACKAGED_ROOT / "SHA256SUMS").read_text().splitlines())
    names = [f"{name}.gz" for pair in fm._FILES.values() for name in pair]
    assert sorted(sums) == sorted(names)
    for name in names:
        assert hashlib.sha256((fm.PACKAGED_ROOT / name).read_bytes()).hexdigest() == sums[name], name
        debian = fm.DEFAULT_ROOT / name
        assert not debian.is_file() or filecmp.cmp(debian, fm.PACKAGED_ROOT / name, shallow=False), name
    licence = (fm.PACKAGED_ROOT / "LICENSE").read_text()
    assert "MIT License" in licence and "Zalando SE" in licence


def test_without_debians_package_the_shipped_files_are_read(monkeypatch, tmp_path):
    _no_debian(monkeypatch, tmp_path)
    assert fm.fashion_root() == fm.PACKAGED_ROOT
    assert [len(fm.fashion_arrays(s)[1]) for s in ("train", "val", "test")] == [55000, 5000, 10000]
    # Debian's folder, where it holds the files, comes first (a stand-in folder here: links to the same files)
    debian = tmp_path / "debian"
    debian.mkdir()
    for f in fm.PACKAGED_ROOT.glob("*-ubyte.gz"):
        (debian / f.name).symlink_to(f)
    monkeypatch.setattr(fm, "DEFAULT_ROOT", debian)
    assert fm.fashion_root() == debian


def test_debian_and_shipped_files_give_the_same_images_and_scenes(monkeypatch, tmp_path):
    """The package's copy reproduces what the committed numbers were measured on (Debian's files, or the same
    bytes by their checksums): images, labels and composed scenes."""
    monkeypatch.delenv("ATTNZOO_FASHION_MNIST")
    fm._CACHE.clear()
    first = {s: fm.fashion_arrays(s) for s in ("val", "test")}
    scenes = fm.fashion("test", "seg", 48, n=20).masks
    fm._CACHE.clear()
    _no_debian(monkeypatch, tmp_path)
    for split, (x, y) in first.items():
        x2, y2 = fm.fashion_arrays(split)
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(scenes, fm.fashion("test", "seg", 48, n=20).masks)


def test_evaluating_the_zoo_and_int8_calibration_work_without_debians_package(monkeypatch, tmp_path, capsys):
    """Two of the jobs that read Fashion-MNIST, on the shipped files only: evaluate-model on a zoo model (the test
    split) and the int8 export's calibration draw (the training split), each the same as from Debian's folder
    where that is installed."""
    from attnzoo import zoo
    from attnzoo.export.quantize import calibration_images
    from attnzoo.training.cli import evaluate_main

    model = str(zoo.ZOO_DIR / "standard_cls_fashion.safetensors")
    config = zoo.load("standard", "cls", "fashion")[1]
    monkeypatch.delenv("ATTNZOO_FASHION_MNIST")
    runs = []
    for hide in (False, True):
        if hide:
            _no_debian(monkeypatch, tmp_path)
            assert fm.fashion_root() == fm.PACKAGED_ROOT
        fm._CACHE.clear()
        assert evaluate_main([model, "--limit", "300"]) == 0
        runs.append((capsys.readouterr().out, calibration_images(config, 8, seed=1)))
    assert "top1" in runs[1][0] and "300 test images of fashion" in runs[1][0]
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
