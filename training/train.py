"""Training and evaluation: AdamW, cosine schedule with linear warm-up, a held-out evaluation each epoch,
deterministic with a seed and resumable from a safetensors + JSON state (never a pickle).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from attnzoo.data.datasets import BUILTIN_DATA, ImageSet, TensorDataset, load_data
from attnzoo.errors import first_line
from attnzoo.fileio import atomic_path, atomic_write_text, read_json
from attnzoo.metrics import confusion_matrix, metric_name, metrics_from_confusion, named_right
from attnzoo.models import canonical_name, count_params, create_model
from attnzoo.models.checkpoint import init_encoder, load_checkpoint, save_checkpoint
from attnzoo.preprocess import DATA_INPUT_STYLE, DEFAULT_MEAN, DEFAULT_STD
from attnzoo.signals import Interrupted, Terminated, signals_deferred

__all__ = [
    "TrainConfig",
    "train",
    "has_state",
    "evaluate",
    "evaluate_checkpoint",
    "checkpoint_name",
    "MAX_STATE_JSON_BYTES",
]

#: Largest ``<name>.state.json`` a resume reads (about 200 bytes per epoch of history, plus the settings).
MAX_STATE_JSON_BYTES = 16 * 2**20


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


def _state_paths(out_dir: Path, name: str) -> tuple[Path, Path]:
    return out_dir / f"{name}.state.safetensors", out_dir / f"{name}.state.json"


def _save_state(
    out_dir: Path,
    name: str,
    model,
    opt,
    sched,
    epoch: int,
    history,
    elapsed: float,
    cfg: TrainConfig,
    step: int = 0,
    losses: list[float] | None = None,
) -> None:
    """Resumable state: model + AdamW moments as safetensors, everything else as JSON; atomic writes. ``epoch``
    finished epochs, then ``step`` steps of the next one (a run stopped part-way through an epoch) with their
    ``losses``."""
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    opt_sd = opt.state_dict()
    for idx, st in opt_sd["state"].items():
        for key, val in st.items():
            tensors[f"opt.{idx}.{key}"] = (
                torch.as_tensor(val).detach().contiguous().reshape(-1) if key == "step" else val.detach().contiguous()
            )
    st_path, js_path = _state_paths(out_dir, name)
    with atomic_path(st_path) as tmp:
        save_file(tensors, str(tmp))
    sched_sd = {k: v for k, v in sched.state_dict().items() if k != "lr_lambdas"}
    atomic_write_text(
        js_path,
        json.dumps(
            {
                "epoch": epoch,
                "step": step,
                "losses": list(losses or []) if step else [],
                "history": history,
                "elapsed": elapsed,
                "param_groups": opt_sd["param_groups"],
                "scheduler": sched_sd,
                "config": asdict(cfg),
            },
            indent=1,
        ),
    )


def _state_problem(epoch: Any, history: Any, elapsed: float, epochs: int) -> str | None:
    """Why a state's progress cannot be this run's (``None`` when it can): its epoch must be a whole number of
    epochs within ``0..epochs``, its history one entry per finished epoch, in order, its elapsed time finite."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch <= epochs:
        return f"epoch {json.dumps(epoch)[:40]}, not within 0..{epochs}, the run's --epochs"
    if not isinstance(history, list) or len(history) != epoch:
        return f"a history of {len(history) if isinstance(history, list) else 'no'} epoch(s) for epoch {epoch}"
    if any(not isinstance(h, dict) or h.get("epoch") != i + 1 for i, h in enumerate(history)):
        return "its history is not one entry per epoch, in order"
    if not math.isfinite(elapsed) or elapsed < 0:
        return f"elapsed {elapsed}"
    return None


def _step_problem(step: Any, losses: Any, epoch: int, epochs: int, steps_per_epoch: int) -> str | None:
    """Why a state's steps into its unfinished epoch cannot be this run's (``None`` when they can): a whole number
    within ``0..steps_per_epoch - 1`` (none once every epoch is done), with one finite loss per step."""
    top = 0 if epoch == epochs else steps_per_epoch - 1
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= top:
        return f"step {json.dumps(step)[:40]} of epoch {epoch + 1}, not within 0..{top}"
    if not isinstance(losses, list) or len(losses) != step:
        return f"{len(losses) if isinstance(losses, list) else 'no'} loss(es) for {step} step(s)"
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in losses):
        return "a loss that is not a finite number"
    return None


def _optimizer_problem(meta: dict[str, Any], opt, epoch: int, steps_per_epoch: int) -> str | None:
    """Why a state's optimizer and scheduler cannot be this run's (``None`` when they can).

    They are facts of the run, not free values: the scheduler's step ``last_epoch`` an integer within the steps
    ``epoch`` epochs can have taken; one parameter group whose hyper-parameters (betas, eps, weight decay, initial
    lr, ...) are the ones this run's settings give, with a finite learning rate within ``0..initial lr`` (the
    schedule never rises above it).
    """
    sched = meta.get("scheduler")
    if not isinstance(sched, dict):
        return "no scheduler state"
    last, done = sched.get("last_epoch"), epoch * steps_per_epoch + meta.get("step", 0)
    if not isinstance(last, int) or isinstance(last, bool) or not 0 <= last <= done:
        return f"scheduler step {json.dumps(last)[:40]}, not within 0..{done}, the steps of {epoch} epoch(s)"
    fresh = json.loads(json.dumps(opt.state_dict()["param_groups"]))  # tuples as lists, as the state file has them
    groups = meta.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(fresh) or not all(isinstance(g, dict) for g in groups):
        return f"optimizer parameter groups {json.dumps(groups)[:60]}, not this model's {len(fresh)}"
    for got, want in zip(groups, fresh, strict=True):
        diff = sorted(k for k in want.keys() & got.keys() if k != "lr" and got[k] != want[k])
        if diff:
            shown = ", ".join(f"{k} {json.dumps(got[k])[:40]} (this run: {json.dumps(want[k])[:40]})" for k in diff)
            return f"optimizer {shown}"
        lr, top = got.get("lr"), want.get("initial_lr", want["lr"])
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not 0 <= lr <= top:
            return f"optimizer learning rate {json.dumps(lr)[:40]}, not within 0..{top}"
    return None


def _tensor_problem(tensors: dict[str, torch.Tensor]) -> str | None:
    """Why saved weights and optimizer moments cannot be resumed: a non-finite value, a negative second moment or
    step count (``None`` when they can)."""
    for key, val in tensors.items():
        if val.is_floating_point() and not bool(torch.isfinite(val).all()):
            return f"{key} holds non-finite values"
        if key.startswith("opt.") and key.endswith((".exp_avg_sq", ".step")) and bool((val < 0).any()):
            return f"{key} is negative"
    return None


def _resumable_state(out_dir: Path, name: str) -> tuple[Path, Path]:
    """The two state files of a run to resume (tensors, JSON); a ``ValueError`` naming what is missing when
    either is."""
    st_path, js_path = _state_paths(out_dir, name)
    present = [p for p in (st_path, js_path) if p.is_file()]
    if not present:
        done = out_dir / f"{name}.safetensors"
        finished = f"; {done.name} is there (a finished run keeps no state)" if done.is_file() else ""
        raise ValueError(
            f"nothing to resume in {out_dir}: no {st_path.name} or {js_path.name}{finished}; "
            "run without --resume to start afresh"
        )
    if len(present) == 1:
        missing = js_path if present[0] == st_path else st_path
        raise ValueError(
            f"cannot resume: {missing} is missing ({present[0].name} is there); delete "
            f"{present[0].name} and run without --resume to start afresh"
        )
    return st_path, js_path


def _restore(model, opt, sched, tensors: dict[str, torch.Tensor], meta: dict[str, Any], st_path: Path) -> None:
    """Load the saved model, optimizer and scheduler state (checked by :func:`_load_state`) into ``model``,
    ``opt`` and ``sched``; a ``ValueError`` when it does not fit this model."""
    try:
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, val in tensors.items():
            if key.startswith("opt."):
                _, idx, sub = key.split(".", 2)
                state.setdefault(int(idx), {})[sub] = val.reshape(()) if sub == "step" else val
        opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        sd = sched.state_dict()  # only the step is read: the rest (base and last lr) follows from it and the run
        sd.update(last_epoch=meta["scheduler"]["last_epoch"], _step_count=meta["scheduler"]["last_epoch"] + 1)
        sd["_last_lr"] = [group["lr"] for group in opt.param_groups]
        sched.load_state_dict(sd)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot resume: {st_path} does not match this model ({first_line(exc)})") from None


def _load_state(out_dir: Path, name: str, model, opt, sched, cfg: TrainConfig, steps_per_epoch: int) -> dict[str, Any]:
    """Restore what :func:`_save_state` wrote.

    Raises:
        ValueError: nothing to resume, one of the two state files missing, either of them damaged or
            truncated (a JSON over :data:`MAX_STATE_JSON_BYTES` or nested too deep, an epoch outside
            ``0..cfg.epochs`` or a history that does not match it, an optimizer or scheduler state this run
            cannot have: :func:`_optimizer_problem`, :func:`_tensor_problem`), or saved with different settings --
            one line naming the file, before any training.
    """
    st_path, js_path = _resumable_state(out_dir, name)
    try:
        meta = read_json(js_path, MAX_STATE_JSON_BYTES)
    except ValueError as exc:
        raise ValueError(f"cannot resume: {exc}") from None
    try:
        saved = {k: v for k, v in meta["config"].items() if k not in ("out", "threads", "epochs")}
        epoch, history, elapsed = meta["epoch"], meta["history"], float(meta["elapsed"])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"cannot resume: {js_path} is damaged ({type(exc).__name__}: {exc})") from None
    problem = _state_problem(epoch, history, elapsed, cfg.epochs) or _step_problem(
        meta.setdefault("step", 0), meta.setdefault("losses", []), epoch, cfg.epochs, steps_per_epoch
    )
    if problem:
        raise ValueError(
            f"cannot resume: {js_path} is damaged ({problem}); delete it and its "
            f"{st_path.name} and run without --resume to start afresh"
        )
    now = {k: v for k, v in asdict(cfg).items() if k not in ("out", "threads", "epochs")}
    if saved != now:
        diff = sorted(k for k in now if saved.get(k) != now[k])
        raise ValueError(f"cannot resume {st_path}: it was trained with different settings ({', '.join(diff)})")
    problem = _optimizer_problem(meta, opt, epoch, steps_per_epoch)
    if problem:
        raise ValueError(
            f"cannot resume: {js_path} is damaged ({problem}); delete it and its "
            f"{st_path.name} and run without --resume to start afresh"
        )
    try:
        tensors = load_file(str(st_path))
    except Exception as exc:  # safetensors raises its own error type for a truncated or damaged file
        raise ValueError(f"cannot resume: {st_path} is damaged or truncated ({first_line(exc)})") from None
    problem = _tensor_problem(tensors)
    if problem:
        raise ValueError(
            f"cannot resume: {st_path} is damaged ({problem}); delete it and its {js_path.name} and run without "
            "--resume to start afresh"
        )
    _restore(model, opt, sched, tensors, meta, st_path)
    return {**meta, "epoch": epoch, "history": history, "elapsed": elapsed}


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
    return all(p.is_file() for p in _state_paths(Path(cfg.out), checkpoint_name(cfg)))


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
    name = checkpoint_name(cfg)
    history, start_epoch, elapsed, start_step, losses = [], 0, 0.0, 0, []
    if resume:
        meta = _load_state(out_dir, name, model, opt, sched, cfg, steps_per_epoch)
        history, start_epoch, elapsed = meta["history"], meta["epoch"], meta["elapsed"]
        start_step, losses = meta["step"], [float(x) for x in meta["losses"]]
        if on_epoch is not None and start_epoch:
            on_epoch(start_epoch, cfg.epochs)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    estimate = _Estimate(
        steps_per_epoch * (cfg.epochs - start_epoch) - start_step,
        cfg.epochs - start_epoch,
        math.ceil(len(val_data) / cfg.batch_size),
    )
    for epoch in range(start_epoch, cfg.epochs):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(cfg.seed * 1000 + epoch))
        first = start_step if epoch == start_epoch else 0
        bar = tqdm(
            range(first, steps_per_epoch),
            desc=f"{name} {epoch + 1}/{cfg.epochs}",
            disable=not progress,
            leave=False,
            mininterval=2.0,
            initial=first,
            total=steps_per_epoch,
        )
        losses = losses if epoch == start_epoch else []
        i = first
        try:
            for i in bar:
                idx = order[i * cfg.batch_size : (i + 1) * cfg.batch_size]
                loss = loss_fn(model(ds.x[idx]), ds.y[idx])
                if not torch.isfinite(loss):
                    raise RuntimeError(f"{name}: loss became {loss.item()} at epoch {epoch + 1} step {i}")
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                losses.append(loss.item())
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
                step += 1
                if progress and estimate.tick():
                    tqdm.write(estimate.line())
                if max_steps is not None and step >= max_steps:
                    break
        except (KeyboardInterrupt, Interrupted, Terminated):  # keep the steps taken: --resume continues there
            done = len(losses)
            if done:
                with signals_deferred():
                    bar.close()
                    spent = elapsed + time.perf_counter() - t0
                    _save_state(out_dir, name, model, opt, sched, epoch, history, spent, cfg, done, losses)
                print(
                    f"stopped in epoch {epoch + 1}/{cfg.epochs} after {done} of {steps_per_epoch} steps: the state "
                    f"is in {_state_paths(out_dir, name)[1]} (the same command with --resume continues there)",
                    file=sys.stderr,
                    flush=True,
                )
            raise
        val = evaluate(model, val_data, cfg.task)
        elapsed += time.perf_counter() - t0
        history.append(
            {
                "epoch": epoch + 1,
                "train_loss": float(np.mean(losses)),
                "val": val["metric"],
                "lr": sched.get_last_lr()[0],
                "losses_first_last": [losses[0], losses[-1]],
            }
        )
        if progress:
            tqdm.write(
                f"{name} epoch {epoch + 1}/{cfg.epochs} loss {history[-1]['train_loss']:.4f} "
                f"val {val['metric_name']} {val['metric']:.2f}"
            )
        _save_state(out_dir, name, model, opt, sched, epoch + 1, history, elapsed, cfg)
        if on_epoch is not None:
            on_epoch(epoch + 1, cfg.epochs)
        if max_steps is not None and step >= max_steps:
            break
    data_source = cfg.data if cfg.data in BUILTIN_DATA else str(Path(cfg.data).resolve())
    extra = {
        "data": data_source,
        "data_seed": 0,
        **({"scene": dict(cfg.scene)} if cfg.scene else {}),
        "seed": cfg.seed,
        "epochs": cfg.epochs,
        "train_size": len(train_data),
        "recipe": asdict(cfg),
        "history": history,
        "val_metric": history[-1]["val"] if history else None,
        "metric_name": metric_name(cfg.task),
        "train_time_s": round(elapsed, 1),
        "params": count_params(model),
    }
    path = out_dir / f"{name}.safetensors"
    saved = save_checkpoint(
        model, path, class_names=train_data.class_names, input_style=DATA_INPUT_STYLE.get(cfg.data, "rgb"), extra=extra
    )
    if history and history[-1]["epoch"] == cfg.epochs:  # the run is complete: nothing left to resume
        for p in _state_paths(out_dir, name):
            p.unlink(missing_ok=True)
    saved["path"] = str(path)
    return saved
