"""Fixtures shared by the training tests."""

import pytest

from attnzoo.training import zoo


@pytest.fixture
def shapes_job(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A zoo build's job small enough to train in seconds: the standard micro classifier on 32 16-pixel shapes
    for 2 epochs (tested on 16), its shared data loaded; the recipe is restored after the test."""
    monkeypatch.setitem(
        zoo.RECIPES,
        "shapes/cls",
        dict(
            arch="micro",
            img_size=16,
            epochs=2,
            batch_size=16,
            lr=2e-3,
            weight_decay=0.05,
            warmup_epochs=0.25,
            seed=0,
            train_size=32,
            val_size=16,
        ),
    )
    monkeypatch.setitem(zoo.TEST_N, "shapes", 16)
    job = {"variant": "standard", "task": "cls", "data": "shapes"}
    zoo._load_shared([job])
    return job
