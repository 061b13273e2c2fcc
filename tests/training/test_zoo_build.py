"""The zoo builder: a fresh rebuild of part of the zoo retrains that part and keeps the rest of the manifest."""

import json
from pathlib import Path

import pytest

from attnzoo.fileio import sha256_file
from attnzoo.training import _zoo_tables, zoo


def _fake_job(args):
    """Stand-in for training: logs the job, writes a model file, returns its manifest row."""
    job, out_dir = args
    with open(f"{out_dir}/log.jsonl", "a") as fh:
        fh.write(json.dumps(job) + "\n")
    path = Path(out_dir) / f"{job['variant']}_{job['task']}_{job['data']}.safetensors"
    path.write_text(f"{job} {path.stat().st_mtime_ns if path.exists() else 0}")  # new bytes on every build
    recipe = job.get("recipe") or zoo.RECIPES[f"{job['data']}/{job['task']}"]  # kept by a later build
    path.with_suffix(".json").write_text(json.dumps({"recipe": recipe}))
    return {
        "variant": job["variant"],
        "task": job["task"],
        "data": job["data"],
        "file": path.name,
        "sha256": sha256_file(path),
        "metric_name": "m",
        "test_metric": 50.0,
        "train_time_s": 0.0,
    }


def test_fresh_rebuild_of_the_segmenters_keeps_the_classifiers(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "_load_shared", lambda todo: None)
    monkeypatch.setattr(zoo, "_run_job_star", _fake_job)
    monkeypatch.setattr(zoo, "baselines", lambda *recipes: {})
    zoo.build(variants=["standard", "belief"], out_dir=tmp_path, data=["fashion"])
    before = {
        (e["variant"], e["task"]): e["sha256"] for e in json.loads((tmp_path / "manifest.json").read_text())["models"]
    }
    (tmp_path / "log.jsonl").unlink()
    rows = zoo.build(variants=["standard", "belief"], out_dir=tmp_path, data=["fashion"], tasks=["seg"], resume=False)
    assert sorted((r["variant"], r["task"]) for r in rows) == sorted(before)
    rebuilt = [(e["variant"], e["task"]) for e in map(json.loads, (tmp_path / "log.jsonl").read_text().splitlines())]
    assert sorted(rebuilt) == [("belief", "seg"), ("standard", "seg")]
    after = {
        (e["variant"], e["task"]): e["sha256"] for e in json.loads((tmp_path / "manifest.json").read_text())["models"]
    }
    assert all(after[k] == before[k] for k in before if k[1] == "cls")
    assert all(after[k] != before[k] for k in before if k[1] == "seg")


def test_a_stopped_job_resumes_from_its_last_finished_epoch(tmp_path, monkeypatch, shapes_job):
    """A zoo job stopped after its first epoch (Ctrl-C, the machine stopped) keeps that epoch's state; the next
    build's job resumes from it (reports the epoch as done at once, trains only the second) and leaves no state."""
    import pytest

    job = shapes_job
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


BUILD = """
import sys
from attnzoo.training import zoo
zoo.RECIPES["shapes/cls"] = dict(arch="micro", img_size=16, epochs=10_000, batch_size=16, lr=2e-3, weight_decay=0.05,
                                 warmup_epochs=0.25, seed=0, train_size=32, val_size=16)
zoo.TEST_N["shapes"] = 16
sys.exit(zoo.main(["build", "--out", sys.argv[1], "--data", "shapes", "--tasks", "cls", "--variants", "standard",
                   "belief", "--jobs", "2"]))
"""


@pytest.mark.slow  # a zoo build started and stopped in a subprocess (about 10 s)
def test_ctrl_c_in_a_build_is_one_line_and_exit_130(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while both workers train: the build ends
    with its one line and 130, no worker prints a traceback (one did in 4 of 6 runs), and no process is left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", BUILD, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        states = [tmp_path / f"{v}_cls_shapes.state.json" for v in ("standard", "belief")]
        while time.time() < deadline and proc.poll() is None and not all(p.is_file() for p in states):
            time.sleep(0.1)
        assert proc.poll() is None and all(p.is_file() for p in states), "the workers never finished an epoch"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted (Ctrl-C)", err[-2000:]
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)  # a worker still alive in the build's group
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a worker outlived the build")


def test_adopt_moves_a_complete_staging_build_into_the_zoo_and_refuses_a_partial_one(tmp_path, monkeypatch):
    """A retrain is built apart (``build --out STAGING``) and adopted whole: the zoo's rows of that task are
    replaced, its other rows kept; a staging build missing a model, or a file that changed, adopts nothing."""
    import pytest

    monkeypatch.setattr(zoo, "_load_shared", lambda todo: None)
    monkeypatch.setattr(zoo, "_run_job_star", _fake_job)
    monkeypatch.setattr(zoo, "baselines", lambda *recipes: {})
    monkeypatch.setattr(zoo, "VARIANT_NAMES", ("standard", "belief"))
    monkeypatch.setitem(zoo.NEXT_RECIPES, "fashion/seg", dict(zoo.RECIPES["fashion/seg"], epochs=2))  # a retrain
    shipped, staging = tmp_path / "zoo", tmp_path / "staging"
    zoo.build(variants=["standard", "belief"], out_dir=shipped, data=["fashion"])
    before = {(e["variant"], e["task"]): e for e in json.loads((shipped / "manifest.json").read_text())["models"]}
    with pytest.raises(ValueError, match="built apart from the shipped zoo"):
        zoo.build(variants=["standard"], out_dir=zoo.ZOO_DIR, data=["fashion"], tasks=["seg"], retrain=True)
    zoo.build(variants=["standard"], out_dir=staging, data=["fashion"], tasks=["seg"], retrain=True)
    with pytest.raises(ValueError, match=r"1 of 2 models not built yet: belief/seg/fashion"):
        zoo.adopt(staging, ["fashion"], ["seg"], out_dir=shipped)
    zoo.build(variants=["belief"], out_dir=staging, data=["fashion"], tasks=["seg"], retrain=True)
    (staging / "belief_seg_fashion.safetensors").write_text("changed after the build")
    with pytest.raises(ValueError, match="belief_seg_fashion.safetensors: missing, or its sha256 does not match"):
        zoo.adopt(staging, ["fashion"], ["seg"], out_dir=shipped)
    assert json.loads((shipped / "manifest.json").read_text())["models"] == list(before.values())  # untouched
    zoo.build(variants=["belief"], out_dir=staging, data=["fashion"], tasks=["seg"], resume=False, retrain=True)
    adopted = zoo.adopt(staging, ["fashion"], ["seg"], out_dir=shipped)
    assert sorted(e["variant"] for e in adopted) == ["belief", "standard"]
    after = {(e["variant"], e["task"]): e for e in json.loads((shipped / "manifest.json").read_text())["models"]}
    staged = {(e["variant"], e["task"]): e for e in json.loads((staging / "manifest.json").read_text())["models"]}
    assert set(after) == set(before)
    for (variant, task), e in after.items():
        assert e == (before if task == "cls" else staged)[(variant, task)]
        assert sha256_file(shipped / e["file"]) == e["sha256"]
    assert after[("belief", "seg")]["sha256"] != before[("belief", "seg")]["sha256"]  # the retrained file
    recipe = json.loads((shipped / "belief_seg_fashion.json").read_text())["recipe"]
    assert recipe == zoo.NEXT_RECIPES["fashion/seg"] != zoo.RECIPES["fashion/seg"]


def test_progress_writes_the_retrain_table_between_its_markers_and_refuses_a_changed_file(tmp_path, monkeypatch):
    """``zoo progress``: finished models best first with the scenes they name right (evaluated from the file once,
    and kept in the manifest, where the row predates that figure), the machine, the validation curve, and what is
    still to train; the README's other text is kept, a second run replaces the table, and a file whose sha256
    changed is refused."""
    import pytest

    rows = []
    for variant, metric, named in (("standard", 55.5, {"scenes": 4, "scenes_right": 1}), ("belief", 56.0, None)):
        path = tmp_path / f"{variant}_seg_fashion.safetensors"
        path.write_text(variant)
        path.with_suffix(".json").write_text(json.dumps({"history": [{"val": 20.0}, {"val": 54.25}]}))
        rows.append(
            {
                "variant": variant,
                "task": "seg",
                "data": "fashion",
                "file": path.name,
                "sha256": sha256_file(path),
                "test_metric": metric,
                **({"named": named} if named else {}),
            }
        )
    (tmp_path / "manifest.json").write_text(json.dumps({"models": rows}))
    (tmp_path / "README.md").write_text("# The retrain\n\nprose kept\n")
    evaluated = []
    monkeypatch.setattr(
        _zoo_tables,  # where progress reads it
        "evaluate_checkpoint",
        lambda path: evaluated.append(Path(path).name) or {"named": {"scenes": 4, "scenes_right": 3}},
    )
    assert zoo.main(["progress", str(tmp_path)]) == 0
    assert zoo.main(["progress", str(tmp_path)]) == 0
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# The retrain\n\nprose kept\n") and readme.count(zoo.TABLE_BEGIN) == 1
    table = readme[readme.index(zoo.TABLE_BEGIN) :]
    assert table.index("| belief | 56.00 | 3 of 4 (75.0 %) | not recorded | 20.0 54.2 |") < table.index(
        "| standard | 55.50 | 1 of 4 (25.0 %) |"
    )
    assert evaluated == ["belief_seg_fashion.safetensors"]  # once: the figure is kept in the manifest
    kept = {r["variant"]: r for r in json.loads((tmp_path / "manifest.json").read_text())["models"]}
    assert kept["belief"]["named"] == {"scenes": 4, "scenes_right": 3}
    left = [v for v in zoo.TRAIN_ORDER if v not in ("standard", "belief")]
    assert f"Still to train (the build's order): {', '.join(left)}." in table
    (tmp_path / "belief_seg_fashion.safetensors").write_text("changed")
    with pytest.raises(ValueError, match="belief_seg_fashion.safetensors: its sha256 is not the manifest's"):
        zoo.progress(tmp_path)
