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
