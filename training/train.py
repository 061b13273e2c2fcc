"""Training and evaluation: AdamW, cosine schedule with linear warm-up, a held-out evaluation each epoch,
deterministic with a seed and resumable from a safetensors + JSON state (never a pickle).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from attnzoo.data.datasets import BUILTIN_DATA, ImageSet, TensorDataset, load_data
from attnzoo.metrics import confusion_matrix, metric_name, metrics_from_confusion, named_right
from attnzoo.models import canonical_name, count_params, create_model
from attnzoo.models.checkpoint import init_encoder, load_checkpoint, save_checkpoint
from attnzoo.preprocess import DATA_INPUT_STYLE, DEFAULT_MEAN, DEFAULT_STD
from attnzoo.signals import Interrupted, Terminated, signals_deferred
from attnzoo.training._state import MAX_STATE_JSON_BYTES, load_state, save_state, state_paths

__all__ = [
    "TrainConfig",
    "train",
    "has_state",
    "evaluate",
    "evaluate_checkpoint",
    "checkpoint_name",
    "MAX_STATE_JSON_BYTES",
]


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved in the checkpoint's JSON)."""

    variant: str
    task: str = "cls"
    data: str = "shapes"
    arch: str = "micro"
    img_size: int | None = None
    epochs: int = 10
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    min_lr_ratio: float = 0.01
    seed: int = 0
    train_size: int | None = None  # images in the train split (None: the data set's default / all)
    val_size: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    out: str = "runs"
    threads: int | None = None
    init_from: str | None = None  # a checkpoint of the same variant and arch whose encoder starts the model
    decoder: str = "linear"  # segmentation decoder: linear or mask
    scene: dict[str, Any] = field(default_factory=dict)  # Fashion-MNIST scene options (compose_scenes); {} = defaults


def data_tag(data: str) -> str:
    """Short name of a data source for file names: ``shapes``, ``digits`` or the folder's name."""
    return data if data in BUILTIN_DATA else Path(data).resolve().name


def checkpoint_name(cfg: TrainConfig) -> str:
    """``<variant>_<task>_<data>``."""
    return f"{canonical_name(cfg.variant)}_{cfg.task}_{data_tag(cfg.data)}"


# ---------------------------------------------------------------------------------------------- metrics
@torch.no_grad()
def _confusion(
    model: nn.Module, ds: TensorDataset, num_classes: int, batch_size: int, named: dict[str, int] | None = None
) -> torch.Tensor:
    """Confusion matrix (true x predicted) over a data set; pixels for seg, images for cls. For seg, ``named``
    (when given) adds up :func:`attnzoo.metrics.named_right`'s counts."""
    conf = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    model.eval()
    for start in range(0, len(ds), batch_size):
        x, y = ds.x[start : start + batch_size], ds.y[start : start + batch_size]
        pred = model(x).argmax(1)
        conf += confusion_matrix(y, pred, num_classes)
        if named is not None:
            for key, count in named_right(y, pred, num_classes).items():
                named[key] = named.get(key, 0) + count
    return conf


def evaluate(
    model: nn.Module, data: ImageSet, task: str, mean=DEFAULT_MEAN, std=DEFAULT_STD, batch_size: int = 256
) -> dict[str, Any]:
    """Top-1 / mIoU of ``model`` on ``data`` (``metric`` in percent, plus per-class IoU for seg and ``named``: how
    many garments and whole scenes it names right, :func:`attnzoo.metrics.named_right`)."""
    ds = TensorDataset(data, task, mean, std)
    k = len(data.class_names)
    named: dict[str, int] | None = {} if task == "seg" else None
    out = metrics_from_confusion(_confusion(model, ds, k, batch_size, named), task, data.class_names)
    out["n_images"] = len(data)
    if named is not None:
        out["named"] = named
    return out


def evaluate_checkpoint(
    path, data: str | None = None, limit: int | None = None, split: str = "test", batch_size: int = 256
) -> dict[str, Any]:
    """Re-evaluate a checkpoint on ``split`` of its own training data (or ``data``), from the file alone."""
    model, config = load_checkpoint(path)
    source = data or config.get("data")
    if not source:
        raise ValueError(f"{path}: the checkpoint does not record its data; pass --data")
    scene = config.get("scene") if source == config.get("data") else None  # the scenes it was trained on
    ds = load_data(
        source, split, config["task"], config["img_size"], n=limit, seed=int(config.get("data_seed", 0)), scene=scene
    )
    if len(ds.class_names) != config["num_classes"]:
        raise ValueError(f"data {source!r} has {len(ds.class_names)} classes, the checkpoint {config['num_classes']}")
    result = evaluate(model, ds, config["task"], config["mean"], config["std"], batch_size)
    result.update(checkpoint=str(path), data=source, split=split)
    return result


# --------------------------------------------------------------------------------------------- training


def _lr_lambda(total_steps: int, warmup_steps: int, min_ratio: float):
    def fn(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

    return fn


class _Estimate:
    """How long the rest of a run takes, from its first steps: :meth:`tick` is true once, after
    :attr:`MEASURED` steps past the first (which pays for warm-up); :meth:`line` says it."""

    MEASURED = 5

    def __init__(self, steps_left: int, epochs_left: int, val_batches: int) -> None:
        self.steps_left, self.epochs_left, self.val_batches = steps_left, epochs_left, val_batches
        self.count, self.t0, self.per_step = 0, 0.0, 0.0

    def tick(self) -> bool:
        self.count += 1
        if self.count == 1:
            self.t0 = time.perf_counter()
        elif self.count == 1 + self.MEASURED:
            self.per_step = (time.perf_counter() - self.t0) / self.MEASURED
            return True
        return False

    def seconds(self) -> float:
        """The steps left at the measured pace, plus an evaluation per epoch left (a forward pass over the
        validation batches: about a third of a training step each)."""
        return self.per_step * (self.steps_left + self.epochs_left * self.val_batches / 3)

    def line(self) -> str:
        seconds = self.seconds()
        took = f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
        return (
            f"estimate: about {took} for {self.steps_left} steps in {self.epochs_left} epoch(s) ({self.per_step:.2f} "
            f"s a step over steps 2-{1 + self.MEASURED}, {torch.get_num_threads()} thread(s); fewer --epochs for less)"
        )


def has_state(cfg: TrainConfig) -> bool:
    """Whether ``cfg.out`` holds both resumable state files of ``cfg``'s run (an interrupted run)."""
    return all(p.is_file() for p in state_paths(Path(cfg.out), checkpoint_name(cfg)))


@dataclass
class _Run:
    """A training run under way: its model, optimiser and data, and the state a resume restores."""

    cfg: TrainConfig
    model: nn.Module
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    ds: TensorDataset
    train_data: ImageSet
    val_data: ImageSet
    out_dir: Path
    name: str
    steps_per_epoch: int
    history: list[dict[str, Any]] = field(default_factory=list)
    start_epoch: int = 0
    elapsed: float = 0.0
    start_step: int = 0
    losses: list[float] = field(default_factory=list)
    step: int = 0  # optimisation steps this process took


def _setup(cfg: TrainConfig, resume: bool, train_data: ImageSet | None, val_data: ImageSet | None) -> _Run:
    """Seed, load the splits, build the model, optimiser and schedule, and restore the state when resuming."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    variant = canonical_name(cfg.variant)
    img_size = cfg.img_size or 32
    if train_data is None:
        train_data = load_data(cfg.data, "train", cfg.task, img_size, cfg.train_size, seed=0, scene=cfg.scene)
    if val_data is None:
        val_data = load_data(cfg.data, "val", cfg.task, img_size, cfg.val_size, seed=0, scene=cfg.scene)
    seg_kw: dict[str, Any] = {"decoder": cfg.decoder} if cfg.task == "seg" else {}
    model = create_model(
        variant, cfg.task, cfg.arch, num_classes=len(train_data.class_names), img_size=img_size, **seg_kw, **cfg.options
    )
    if cfg.init_from and not resume:
        init_encoder(model, cfg.init_from)
    ds = TensorDataset(train_data, cfg.task)
    steps_per_epoch = math.ceil(len(ds) / cfg.batch_size)
    total = steps_per_epoch * cfg.epochs
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, _lr_lambda(total, max(1, int(cfg.warmup_epochs * steps_per_epoch)), cfg.min_lr_ratio)
    )
    out_dir = Path(cfg.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = _Run(cfg, model, opt, sched, ds, train_data, val_data, out_dir, checkpoint_name(cfg), steps_per_epoch)
    if resume:
        meta = load_state(out_dir, run.name, model, opt, sched, asdict(cfg), cfg.epochs, steps_per_epoch)
        run.history, run.start_epoch, run.elapsed = meta["history"], meta["epoch"], meta["elapsed"]
        run.start_step, run.losses = meta["step"], [float(x) for x in meta["losses"]]
    return run


def _train_epoch(run: _Run, epoch: int, progress: bool, max_steps: int | None, estimate: _Estimate) -> float:
    """One epoch's optimisation steps (from the resumed step in a resumed epoch); ``run.losses`` holds the
    epoch's losses. Stopped by Ctrl-C or a signal, it saves the steps taken and re-raises. Returns its start time."""
    cfg, name = run.cfg, run.name
    t0 = time.perf_counter()
    run.model.train()
    order = torch.randperm(len(run.ds), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
    first = run.start_step if epoch == run.start_epoch else 0
    bar = tqdm(
        range(first, run.steps_per_epoch),
        desc=f"{name} {epoch + 1}/{cfg.epochs}",
        disable=not progress,
        leave=False,
        mininterval=2.0,
        initial=first,
        total=run.steps_per_epoch,
    )
    if epoch != run.start_epoch:
        run.losses = []
    losses, loss_fn = run.losses, nn.CrossEntropyLoss()
    try:
        for i in bar:
            idx = order[i * cfg.batch_size : (i + 1) * cfg.batch_size]
            loss = loss_fn(run.model(run.ds.x[idx]), run.ds.y[idx])
            if not torch.isfinite(loss):
                raise RuntimeError(f"{name}: loss became {loss.item()} at epoch {epoch + 1} step {i}")
            run.opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
            run.opt.step()
            run.sched.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
            run.step += 1
            if progress and estimate.tick():
                tqdm.write(estimate.line())
            if max_steps is not None and run.step >= max_steps:
                break
    except (KeyboardInterrupt, Interrupted, Terminated):  # keep the steps taken: --resume continues there
        _save_stopped(run, epoch, bar, t0)
        raise
    return t0


def _save_stopped(run: _Run, epoch: int, bar: tqdm, t0: float) -> None:
    """Save the steps an interrupted epoch took (if any) and say where they are."""
    done = len(run.losses)
    if not done:
        return
    with signals_deferred():
        bar.close()
        spent = run.elapsed + time.perf_counter() - t0
        save_state(
            run.out_dir,
            run.name,
            run.model,
            run.opt,
            run.sched,
            epoch,
            run.history,
            spent,
            asdict(run.cfg),
            done,
            run.losses,
        )
    print(
        f"stopped in epoch {epoch + 1}/{run.cfg.epochs} after {done} of {run.steps_per_epoch} steps: the state "
        f"is in {state_paths(run.out_dir, run.name)[1]} (the same command with --resume continues there)",
        file=sys.stderr,
        flush=True,
    )


def _end_epoch(run: _Run, epoch: int, t0: float, progress: bool) -> None:
    """Evaluate the epoch's model on the validation split, record it and save the resumable state."""
    cfg, losses = run.cfg, run.losses
    val = evaluate(run.model, run.val_data, cfg.task)
    run.elapsed += time.perf_counter() - t0
    run.history.append(
        {
            "epoch": epoch + 1,
            "train_loss": float(np.mean(losses)),
            "val": val["metric"],
            "lr": run.sched.get_last_lr()[0],
            "losses_first_last": [losses[0], losses[-1]],
        }
    )
    if progress:
        tqdm.write(
            f"{run.name} epoch {epoch + 1}/{cfg.epochs} loss {run.history[-1]['train_loss']:.4f} "
            f"val {val['metric_name']} {val['metric']:.2f}"
        )
    save_state(run.out_dir, run.name, run.model, run.opt, run.sched, epoch + 1, run.history, run.elapsed, asdict(cfg))


def _finish(run: _Run) -> dict[str, Any]:
    """Save the checkpoint with its record, and drop the resumable state once the run is complete."""
    cfg, history = run.cfg, run.history
    data_source = cfg.data if cfg.data in BUILTIN_DATA else str(Path(cfg.data).resolve())
    extra = {
        "data": data_source,
        "data_seed": 0,
        **({"scene": dict(cfg.scene)} if cfg.scene else {}),
        "seed": cfg.seed,
        "epochs": cfg.epochs,
        "train_size": len(run.train_data),
        "recipe": asdict(cfg),
        "history": history,
        "val_metric": history[-1]["val"] if history else None,
        "metric_name": metric_name(cfg.task),
        "train_time_s": round(run.elapsed, 1),
        "params": count_params(run.model),
    }
    path = run.out_dir / f"{run.name}.safetensors"
    input_style = DATA_INPUT_STYLE.get(cfg.data, "rgb")
    saved = save_checkpoint(
        run.model, path, class_names=run.train_data.class_names, input_style=input_style, extra=extra
    )
    if history and history[-1]["epoch"] == cfg.epochs:  # the run is complete: nothing left to resume
        for p in state_paths(run.out_dir, run.name):
            p.unlink(missing_ok=True)
    saved["path"] = str(path)
    return saved


def train(
    cfg: TrainConfig,
    resume: bool = False,
    progress: bool = True,
    train_data: ImageSet | None = None,
    val_data: ImageSet | None = None,
    max_steps: int | None = None,
    on_epoch: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Train one model and save it as ``<out>/<variant>_<task>_<data>.safetensors`` (+ ``.json``).

    Args:
        cfg: The run's settings.
        resume: Continue from ``<name>.state.*`` in ``cfg.out``; ``ValueError`` when they are missing or damaged.
        progress: Show a tqdm bar.
        train_data, val_data: Pre-loaded splits (the zoo builder shares them); loaded from ``cfg.data``
            when None.
        max_steps: Stop after this many optimisation steps (tests).
        on_epoch: Called with ``(epochs done, epochs)`` once the run's state is on disk: after each epoch, and
            at the start with the epochs a resumed run already has.

    Returns:
        The saved config (with history, validation metric, train time and the file's path).
    """
    run = _setup(cfg, resume, train_data, val_data)
    if resume and on_epoch is not None and run.start_epoch:
        on_epoch(run.start_epoch, cfg.epochs)
    estimate = _Estimate(
        run.steps_per_epoch * (cfg.epochs - run.start_epoch) - run.start_step,
        cfg.epochs - run.start_epoch,
        math.ceil(len(run.val_data) / cfg.batch_size),
    )
    for epoch in range(run.start_epoch, cfg.epochs):
        t0 = _train_epoch(run, epoch, progress, max_steps, estimate)
        _end_epoch(run, epoch, t0, progress)
        if on_epoch is not None:
            on_epoch(epoch + 1, cfg.epochs)
        if max_steps is not None and run.step >= max_steps:
            break
    return _finish(run)
