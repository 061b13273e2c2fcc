"""The zoo builder: a fresh rebuild of part of the zoo retrains that part and keeps the rest of the manifest."""

import json
from pathlib import Path

from attnzoo.fileio import sha256_file
from attnzoo.training import zoo


def _fake_job(args):
    """Stand-in for training: logs the job, writes a model file, returns its manifest row."""
    job, out_dir = args
    with open(f"{out_dir}/log.jsonl", "a") as fh:
        fh.write(json.dumps(job) + "\n")
    path = Path(out_dir) / f"{job['variant']}_{job['task']}_{job['data']}.safetensors"
    path.write_text(f"{job} {path.stat().st_mtime_ns if path.exists() else 0}")  # new bytes on every build
    return {"variant": job["variant"], "task": job["task"], "data": job["data"], "file": path.name,
            "sha256": sha256_file(path), "metric_name": "m", "test_metric": 50.0, "train_time_s": 0.0}


def test_fresh_rebuild_of_the_segmenters_keeps_the_classifiers(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "_load_shared", lambda todo: None)
    monkeypatch.setattr(zoo, "_run_job_star", _fake_job)
    monkeypatch.setattr(zoo, "baselines", lambda: {})
    zoo.build(variants=["standard", "belief"], out_dir=tmp_path, data=["fashion"])
    before = {(e["variant"], e["task"]): e["sha256"]
              for e in json.loads((tmp_path / "manifest.json").read_text())["models"]}
    (tmp_path / "log.jsonl").unlink()
    rows = zoo.build(variants=["standard", "belief"], out_dir=tmp_path, data=["fashion"], tasks=["seg"],
                     resume=False)
    assert sorted((r["variant"], r["task"]) for r in rows) == sorted(before)
    rebuilt = [(e["variant"], e["task"]) for e in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines())]
    assert sorted(rebuilt) == [("belief", "seg"), ("standard", "seg")]
    after = {(e["variant"], e["task"]): e["sha256"]
             for e in json.loads((tmp_path / "manifest.json").read_text())["models"]}
    assert all(after[k] == before[k] for k in before if k[1] == "cls")
    assert all(after[k] != before[k] for k in before if k[1] == "seg")


def test_a_stopped_job_resumes_from_its_last_finished_epoch(tmp_path, monkeypatch):
    """A zoo job stopped after its first epoch (Ctrl-C, the machine stopped) keeps that epoch's state; the next
    build's job resumes from it (reports the epoch as done at once, trains only the second) and leaves no state."""
    import pytest

    monkeypatch.setitem(zoo.RECIPES, "shapes/cls", dict(arch="micro", img_size=16, epochs=2, batch_size=16,
                                                        lr=2e-3, weight_decay=0.05, warmup_epochs=0.25,
                                                        seed=0, train_size=32, val_size=16))
    monkeypatch.setitem(zoo.TEST_N, "shapes", 16)
    job = {"variant": "standard", "task": "cls", "data": "shapes"}
    zoo._load_shared([job])
    reports = []

    def stop_after_first(done, total):
        reports.append((done, total))
        if done == 1:
            raise KeyboardInterrupt  # what Ctrl-C raises in the worker once epoch 1 is on disk

    monkeypatch.setattr(zoo, "_epoch_reporter", lambda: stop_after_first)
    with pytest.raises(KeyboardInterrupt):
        zoo._run_job(job, str(tmp_path))
    state = json.loads((tmp_path / "standard_cls_shapes.state.json").read_text())
    assert state["epoch"] == 1 and reports == [(1, 2)]
    reports.clear()
    monkeypatch.setattr(zoo, "_epoch_reporter", lambda: lambda done, total: reports.append((done, total)))
    row = zoo._run_job(job, str(tmp_path))
    assert reports == [(1, 2), (2, 2)]  # epoch 1 resumed, not trained again
    saved = json.loads((tmp_path / "standard_cls_shapes.json").read_text())
    assert [h["epoch"] for h in saved["history"]] == [1, 2]
    assert saved["history"][0] == state["history"][0]
    assert row["epochs"] == 2 and not list(tmp_path.glob("*.state.*"))
