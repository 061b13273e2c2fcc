"""Build, tabulate and verify the model zoo (``zoo/``): every variant x {cls, seg} on Fashion-MNIST (``fashion``)
and on the ``shapes`` smoke set, plus ``digits`` classifiers, each trained with the one recipe of its data and task.

    python -m attnzoo.training.zoo build --jobs 2      # trains everything, writes zoo/manifest.json
    python -m attnzoo.training.zoo build --retrain --out results/seg-retrain --data fashion --tasks seg  # apart
    python -m attnzoo.training.zoo progress results/seg-retrain            # ... its README table, as it grows
    python -m attnzoo.training.zoo adopt results/seg-retrain --tasks seg   # ... moved into the zoo once complete
    python -m attnzoo.training.zoo baselines           # chance and simple baselines, stored in the manifest
    python -m attnzoo.training.zoo table               # the README table (markdown)
    python -m attnzoo.training.zoo verify              # sha256 + re-evaluation of every zoo model
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from attnzoo import zoo
from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.data.datasets import ImageSet, load_data
from attnzoo.errors import CommandError, UsageError
from attnzoo.fileio import sha256_file
from attnzoo.machine import cpu_info, cpu_summary
from attnzoo.metrics import metric_name
from attnzoo.models import TASKS, VARIANT_NAMES, canonical_name
from attnzoo.models.checkpoint import load_checkpoint
from attnzoo.training._zoo_manifest import (
    DIGITS_VARIANTS,
    NEXT_RECIPES,
    NOTES,
    RECIPES,
    SUBSET_N,
    TEST_N,
    TRAIN_ORDER,
    VARIANT_OPTIONS,
    ZOO_DATA,
    ZOO_DIR,
    _key,
    _trained_with_recipe,
    _write_manifest,
    recipes,
)
from attnzoo.training._zoo_shipped import ship_onnx, verify
from attnzoo.training._zoo_tables import TABLE_BEGIN, TABLE_END, background_miou, baselines, progress, table
from attnzoo.training.train import TrainConfig, evaluate, has_state, train

__all__ = [
    "RECIPES",
    "NEXT_RECIPES",
    "recipes",
    "SUBSET_N",
    "DIGITS_VARIANTS",
    "VARIANT_OPTIONS",
    "TRAIN_ORDER",
    "jobs",
    "build",
    "adopt",
    "progress",
    "table",
    "verify",
    "main",
    # kept importable here: the zoo's data, its folder and the parts a build and the tables share
    "TEST_N",
    "ZOO_DATA",
    "ZOO_DIR",
    "NOTES",
    "TABLE_BEGIN",
    "TABLE_END",
    "background_miou",
    "baselines",
    "ship_onnx",
]

_SHARED: dict[str, ImageSet] = {}  # data loaded once in the parent, inherited by forked workers


def jobs(
    variants: Sequence[str] = VARIANT_NAMES, data: Sequence[str] = ZOO_DATA, tasks: Sequence[str] = TASKS
) -> list[dict[str, Any]]:
    """The zoo's training jobs: (variant, task, data), restricted to ``data`` and ``tasks``."""
    out = [dict(variant=v, task=t, data=d) for d in ("fashion", "shapes") for v in variants for t in TASKS]
    out += [dict(variant=v, task="cls", data="digits") for v in variants if v in DIGITS_VARIANTS]
    return [j for j in out if j["data"] in data and j["task"] in tasks]


def _load_shared(todo: list[dict[str, Any]]) -> None:
    """Generate / load every split the jobs need, once (each job carries its recipe, else :data:`RECIPES`')."""
    for (data, task), r in {(j["data"], j["task"]): _recipe_of(j) for j in todo}.items():
        sizes = {"train": r["train_size"], "val": r["val_size"], "test": TEST_N[data]}
        for split, n in sizes.items():
            _SHARED[_key(data, task, split)] = load_data(data, split, task, r["img_size"], n, scene=r.get("scene"))


#: In a build's worker processes: where each finished epoch is reported (the build's epoch bar).
_EPOCHS: Any | None = None


def _init_worker(epochs) -> None:
    """A build's worker: Ctrl-C is the build's to handle (it ends the pool, with one line; a worker raising it too
    printed its traceback), and the SIGTERM with which the pool ends its workers ends one at once, as the pool
    expects (the handler a worker inherits from a command raises instead: a traceback, or a worker the pool waits
    for). A job's state files are written through a rename, so a worker ended mid-epoch leaves its last epoch (and,
    ended in the middle of that write, a hidden ``.NAME.*.tmp`` beside it)."""
    global _EPOCHS
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _EPOCHS = epochs


def _epoch_reporter():
    """A job's ``on_epoch``: tells the build how many more epochs the job has finished."""
    last = [0]

    def report(done: int, total: int) -> None:
        if _EPOCHS is not None:
            _EPOCHS.put(done - last[0])
        last[0] = done

    return report


def _recipe_of(job: dict[str, Any]) -> dict[str, Any]:
    return job.get("recipe") or RECIPES[f"{job['data']}/{job['task']}"]


def _run_job(job: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """Train one zoo model (one thread), evaluate it on the test split, return its manifest row.

    A job stopped part-way (Ctrl-C, the machine stopped) left its state after its last finished epoch in
    ``out_dir``; the next build resumes it from there (state of other settings, or damaged, is trained afresh)."""
    torch.set_num_threads(1)
    variant, task, data = canonical_name(job["variant"]), job["task"], job["data"]
    r = _recipe_of(job)
    cfg = TrainConfig(
        variant=variant,
        task=task,
        data=data,
        options=dict(VARIANT_OPTIONS.get(variant, {})),
        out=out_dir,
        threads=1,
        **r,
    )
    kw = dict(
        progress=False,
        train_data=_SHARED[_key(data, task, "train")],
        val_data=_SHARED[_key(data, task, "val")],
        on_epoch=_epoch_reporter(),
    )
    resume = has_state(cfg)
    try:
        saved = train(cfg, resume=resume, **kw)
    except ValueError as exc:
        if not resume or "resume" not in str(exc):
            raise
        print(f"{variant} {task} {data}: {exc}; training afresh", file=sys.stderr, flush=True)
        saved = train(cfg, resume=False, **kw)
    model, config = load_checkpoint(saved["path"])
    test = _SHARED[_key(data, task, "test")]
    full = evaluate(model, test, task, config["mean"], config["std"])
    sub = evaluate(model, test.subset(SUBSET_N), task, config["mean"], config["std"])
    path = Path(saved["path"])
    return {
        "variant": variant,
        "task": task,
        "data": data,
        "arch": cfg.arch,
        "file": path.name,
        "sha256": sha256_file(path),
        "params": saved["params"],
        "metric_name": metric_name(task),
        "test_metric": round(full["metric"], 2),
        "test_n": full["n_images"],
        "subset_metric": round(sub["metric"], 2),
        "subset_n": sub["n_images"],
        "per_class_iou": full.get("per_class_iou"),
        "named": full.get("named"),
        "val_metric": round(saved["val_metric"], 2),
        "train_time_s": saved["train_time_s"],
        "machine": cpu_summary(cpu_info()),
        "epochs": cfg.epochs,
        "options": cfg.options,
        "note": "",
    }


def _count_epochs(epochs, epoch_bar) -> None:
    """The build's epoch bar, fed by its workers' ``on_epoch`` reports until a None ends it."""
    while True:
        n = epochs.get()
        if n is None:
            return
        epoch_bar.update(n)


def _run_job_star(args) -> dict[str, Any]:
    try:
        return _run_job(*args)
    except Exception as exc:  # report, do not kill the other jobs
        return {"error": f"{args[0]['variant']}/{args[0]['task']}/{args[0]['data']}: {type(exc).__name__}: {exc}"}


def build(
    variants: Sequence[str] = VARIANT_NAMES,
    n_jobs: int = 2,
    out_dir: Path = ZOO_DIR,
    resume: bool = True,
    data: Sequence[str] = ZOO_DATA,
    tasks: Sequence[str] = TASKS,
    retrain: bool = False,
) -> list[dict[str, Any]]:
    """Train the zoo (``n_jobs`` single-threaded processes) and write ``manifest.json`` as models finish.

    With ``resume``, models already in the manifest (same file and sha256) are kept; without it the selected
    ones are retrained. ``variants``, ``data`` and ``tasks`` select (e.g. only the Fashion-MNIST segmenters); the
    other models in the manifest stay.
    """
    out_dir = Path(out_dir)
    if retrain and out_dir.resolve() == ZOO_DIR.resolve():
        raise ValueError("a retrain is built apart from the shipped zoo: give it its own --out (then adopt it)")
    out_dir.mkdir(parents=True, exist_ok=True)
    used = recipes(retrain)
    old = json.loads((out_dir / "manifest.json").read_text())["models"] if (out_dir / "manifest.json").is_file() else []
    key = lambda j: (canonical_name(j["variant"]), j["task"], j["data"])  # noqa: E731
    valid = {
        key(e): e
        for e in old
        if (out_dir / e["file"]).is_file()
        and sha256_file(out_dir / e["file"]) == e["sha256"]
        and _trained_with_recipe(out_dir / e["file"], e, used)
    }
    todo = [
        dict(j, recipe=used[f"{j['data']}/{j['task']}"])
        for j in jobs([canonical_name(v) for v in variants], data, tasks)
        if not (resume and key(j) in valid)
    ]
    planned = {key(j) for j in todo}
    done = {k: e for k, e in valid.items() if k not in planned}  # kept as they are (other data, tasks, variants)
    rows = list(done.values())
    # cheapest first, so a build stopped part-way has finished (and can ship) as many models as it could, and
    # the models left in progress are never the long ones while cheap ones wait
    rank = {v: i for i, v in enumerate(TRAIN_ORDER)}
    todo.sort(key=lambda j: (j["data"] != "fashion", j["task"] != "cls", rank.get(j["variant"], len(rank))))
    _load_shared(todo)
    errors = []
    t0 = time.perf_counter()
    ctx = mp.get_context("fork")
    epochs = ctx.SimpleQueue()
    n_epochs = sum(j["recipe"]["epochs"] for j in todo)
    with (
        ctx.Pool(n_jobs, initializer=_init_worker, initargs=(epochs,)) as pool,
        tqdm(total=len(todo), desc="zoo", unit="model") as bar,
        tqdm(total=n_epochs, desc="epochs", unit="epoch") as epoch_bar,
    ):
        drain = threading.Thread(target=_count_epochs, args=(epochs, epoch_bar), daemon=True)
        drain.start()
        for row in pool.imap_unordered(_run_job_star, [(j, str(out_dir)) for j in todo]):
            bar.update(1)
            if "error" in row:
                errors.append(row["error"])
                tqdm.write(f"FAILED {row['error']}")
                continue
            rows.append(row)
            tqdm.write(
                f"{row['variant']:>20s} {row['task']} {row['data']}: {row['metric_name']} "
                f"{row['test_metric']:.2f}  ({row['train_time_s']:.0f} s)"
            )
            _write_manifest(out_dir, rows, recipes=used)
        epochs.put(None)
        drain.join()
    _write_manifest(out_dir, rows, baselines(used), recipes=used)
    print(f"zoo: {len(rows)} models, built {len(todo) - len(errors)} in {time.perf_counter() - t0:.0f} s wall")
    if errors:
        raise RuntimeError("some zoo models failed:\n" + "\n".join(errors))
    return rows


def adopt(
    staging: Path, data: Sequence[str] = ZOO_DATA, tasks: Sequence[str] = TASKS, out_dir: Path = ZOO_DIR
) -> list[dict[str, Any]]:
    """Move the models of a finished staging build (``build --out STAGING``) into the zoo.

    A retrain is built apart from the shipped zoo, so the zoo never mixes two recipes of one task while the
    retrain runs (over several sittings: each finished model is committed in the staging folder). Adopting
    takes every job of ``data`` x ``tasks``, or nothing: each must be in the staging manifest, its file's sha256
    must match and it must be trained with the current recipe; then the files are copied and their manifest
    rows replace the zoo's (the zoo's other rows stay).

    Raises:
        ValueError: the staging build is incomplete or does not check out, naming what is wrong.
    """
    staging = Path(staging)
    path = staging / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{path}: no staging manifest (run 'build --out {staging}' first)")
    rows = {(e["variant"], e["task"], e["data"]): e for e in json.loads(path.read_text())["models"]}
    wanted = [(j["variant"], j["task"], j["data"]) for j in jobs(VARIANT_NAMES, data, tasks)]
    missing = [k for k in wanted if k not in rows]
    if missing:
        raise ValueError(
            f"{staging}: {len(missing)} of {len(wanted)} models not built yet: "
            + ", ".join("/".join(k) for k in missing)
        )
    for k in wanted:
        e, f = rows[k], staging / rows[k]["file"]
        if not f.is_file() or sha256_file(f) != e["sha256"]:
            raise ValueError(f"{f}: missing, or its sha256 does not match {path}")
        if not _trained_with_recipe(f, e, recipes(retrain=True)):
            raise ValueError(
                f"{f}: trained with another recipe than NEXT_RECIPES['{e['data']}/{e['task']}'] (or RECIPES')"
            )
    for k in wanted:
        for suffix in (".safetensors", ".json"):
            src = (staging / rows[k]["file"]).with_suffix(suffix)
            shutil.copyfile(src, out_dir / src.name)
    kept = [
        e
        for e in json.loads((out_dir / "manifest.json").read_text())["models"]
        if (e["variant"], e["task"], e["data"]) not in set(wanted)
    ]
    new = kept + [rows[k] for k in wanted]
    _write_manifest(out_dir, new, baselines(recipes(True)), recipes=recipes(True))
    return [rows[k] for k in wanted]


def _parser() -> argparse.ArgumentParser:
    """The subcommands: build, adopt, progress, table, baselines, verify and onnx."""
    p = add_debug_flag(
        argparse.ArgumentParser(prog="python -m attnzoo.training.zoo", description=__doc__.splitlines()[0])
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="train the zoo")
    b.add_argument("--jobs", type=int, default=2, help="parallel single-threaded training processes")
    b.add_argument("--variants", nargs="+", default=list(VARIANT_NAMES))
    b.add_argument("--out", default=str(ZOO_DIR))
    b.add_argument("--fresh", action="store_true", help="retrain models already in the manifest")
    b.add_argument("--data", nargs="+", choices=ZOO_DATA, default=list(ZOO_DATA), help="data sets to build")
    b.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS), help="tasks to build")
    b.add_argument(
        "--retrain",
        action="store_true",
        help="train with NEXT_RECIPES (a retrain under way, into its own --out; adopt moves it in)",
    )
    a = sub.add_parser("adopt", help="move a finished staging build (build --out DIR) into the zoo")
    a.add_argument("staging", type=Path)
    a.add_argument("--data", nargs="+", choices=ZOO_DATA, default=["fashion"])
    a.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    g = sub.add_parser("progress", help="write the table of a retrain under way into its README.md")
    g.add_argument("staging", type=Path)
    sub.add_parser("table", help="print the markdown table of the zoo")
    sub.add_parser("baselines", help="compute the baselines and store them in the manifest")
    v = sub.add_parser("verify", help="check sha256s and re-evaluate every zoo model")
    v.add_argument("--limit", type=int, default=SUBSET_N)
    o = sub.add_parser(
        "onnx",
        help="ship verified ONNX exports of the best classifier and segmenter (serve-demo's "
        "first start adopts them instead of exporting)",
    )
    o.add_argument("--data", default="fashion")
    return p


def _command(args: argparse.Namespace) -> int:
    """Run the subcommand ``args.cmd``: 0, or 1 where ``verify`` found problems."""
    if args.cmd == "build":
        build(
            args.variants,
            args.jobs,
            Path(args.out),
            resume=not args.fresh,
            data=args.data,
            tasks=args.tasks,
            retrain=args.retrain,
        )
    elif args.cmd == "adopt":
        try:
            adopted = adopt(args.staging, args.data, args.tasks)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        print(
            f"zoo: adopted {len(adopted)} models from {args.staging}; now move their NEXT_RECIPES entries "
            "into RECIPES, regenerate the ONNX copies (python -m attnzoo.training.zoo onnx) and verify"
        )
    elif args.cmd == "baselines":
        refs = baselines()
        _write_manifest(ZOO_DIR, zoo.entries(), refs)
        print(json.dumps(refs, indent=1))
    elif args.cmd == "progress":
        if not (args.staging / "manifest.json").is_file():
            raise UsageError(f"{args.staging}: no manifest.json (a folder written by build --retrain --out)")
        print(progress(args.staging))
    elif args.cmd == "table":
        print(table())
    elif args.cmd == "onnx":
        for e in ship_onnx(args.data):
            print(
                f"zoo/{e['onnx']['file']}: {e['variant']} {e['task']} ({e['metric_name']} {e['test_metric']}), "
                f"verified against its checkpoint, max abs err {e['onnx']['max_abs_err']:.2g}"
            )
    else:
        problems = verify(args.limit)
        for line in problems:
            print(f"error: {line}")
        if problems:
            return 1
        print("zoo verified: all sha256s match and every model reproduces its metric")
    return 0


@entry_point
def main(argv: list[str] | None = None) -> int:
    """``python -m attnzoo.training.zoo``: errors exit non-zero with one ``error: ...`` line (attnzoo.cli)."""
    args = _parser().parse_args(argv)
    if args.cmd == "build":
        try:  # refused before any file is touched
            for variant in args.variants:
                canonical_name(variant)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    try:
        return _command(args)
    except RuntimeError as exc:  # failed training jobs / exports: their message says what failed
        raise CommandError(str(exc)) from exc


if __name__ == "__main__":
    sys.exit(main())
