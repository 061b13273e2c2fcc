"""What makes a zoo training step cheaper on this CPU, without changing what the recipe trains.

    python -m research.train_speed --out results/studies/train-speed [--variants standard wafe-mae]

Times optimisation steps of a zoo recipe (default: the Fashion-MNIST segmenters', as retrained:
``recipes(retrain=True)``) under each setting:
``eager-1t`` (the zoo's one thread per model), ``eager-2t`` (one model on two threads), ``channels-last``,
``compile`` (``torch.compile`` of the model; its compile time is reported apart) and ``pair-1t`` (two models at
once, one thread each: the zoo build's layout, reported as the time per step of each). Every setting starts from
the same weights and batches; the steps after ``--warmup`` are timed. ``loss_after`` shows the setting trains the
same thing (the same to float rounding).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from attnzoo.cli import entry_point
from attnzoo.data.datasets import TensorDataset, load_data
from attnzoo.errors import UsageError
from attnzoo.fileio import writable_dir
from attnzoo.lazy import lazy_import
from attnzoo.machine import cpu_summary, environment, load_average
from research.study import add_output_flags, command_line, parse_study, study_parser, write_report

# --help and --table load without timm: imported at their first use
models = lazy_import("attnzoo.models")
training_zoo = lazy_import("attnzoo.training.zoo")

__all__ = ["TrainSetting", "TRAIN_SETTINGS", "SETTINGS", "time_steps", "run", "markdown", "main"]


@dataclass(frozen=True)
class TrainSetting:
    """One setting of the study: how a training step runs, every other thing kept as the recipe has it.

    Attributes:
        name: Its ``--settings`` name, the rows' ``setting``.
        threads: Torch threads of the model.
        channels_last: Model and batches in the channels-last memory format.
        compiles: The model runs through ``torch.compile``; its first step is timed apart (``compile_s``).
        models_at_once: Models training at once on the two cores, for the throughput column.
        pair: Two ``eager-1t`` jobs run at once in two processes (the time per step of each: the slower's).
        alone: Timed one model at a time, the throughput then that of two at once (the table says so).
    """

    name: str
    threads: int = 1
    channels_last: bool = False
    compiles: bool = False
    models_at_once: int = 2
    pair: bool = False
    alone: bool = False


#: Every setting by name, in the study's order (the module docstring says what each is).
TRAIN_SETTINGS: dict[str, TrainSetting] = {
    s.name: s
    for s in (
        TrainSetting("eager-1t"),
        TrainSetting("eager-2t", threads=2, models_at_once=1),
        TrainSetting("channels-last", channels_last=True, alone=True),
        TrainSetting("compile", compiles=True, alone=True),
        TrainSetting("pair-1t", pair=True),
    )
}
SETTINGS = tuple(TRAIN_SETTINGS)


def _setting(name: str) -> TrainSetting:
    """The setting called ``name``; ``ValueError`` listing the valid ones (a row of a hand-made report)."""
    if name not in TRAIN_SETTINGS:
        raise ValueError(f"unknown train-speed setting {name!r}; valid: {', '.join(SETTINGS)}")
    return TRAIN_SETTINGS[name]


def _setup(variant: str, recipe: str, n_images: int):
    data, task = recipe.split("/")
    recipe_config = training_zoo.recipes(retrain=True)[recipe]
    images = load_data(data, "train", task, recipe_config["img_size"], n_images, scene=recipe_config.get("scene"))
    torch.manual_seed(0)
    seg_kw = {"decoder": "linear"} if task == "seg" else {}
    model = models.create_model(
        variant,
        task,
        recipe_config["arch"],
        num_classes=len(images.class_names),
        img_size=recipe_config["img_size"],
        **seg_kw,
        **training_zoo.VARIANT_OPTIONS.get(variant, {}),
    )
    return model, TensorDataset(images, task), recipe_config


def time_steps(variant: str, setting: str, steps: int, warmup: int, recipe: str = "fashion/seg") -> dict[str, Any]:
    """Mean seconds per step over ``steps`` steps after ``warmup`` untimed ones."""
    how = _setting(setting)
    torch.set_num_threads(how.threads)
    model, ds, recipe_config = _setup(variant, recipe, 4 * 64)
    x_all, y_all = ds.x, ds.y
    if how.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x_all = x_all.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe_config["lr"], weight_decay=recipe_config["weight_decay"])
    loss_fn = nn.CrossEntropyLoss()
    fwd = model
    compile_s = None
    if how.compiles:
        t0 = time.perf_counter()
        fwd = torch.compile(model)
    model.train()
    bs = recipe_config["batch_size"]
    times: list[float] = []
    loss = None
    for i in range(warmup + steps):
        j = (i % (len(ds) // bs)) * bs
        t0 = time.perf_counter() if not how.compiles or i > 0 else t0
        loss = loss_fn(fwd(x_all[j : j + bs]), y_all[j : j + bs])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if how.compiles and i == 0:
            compile_s = dt
        if i >= warmup:
            times.append(dt)
    assert loss is not None  # at least one step ran
    return {
        "variant": variant,
        "setting": setting,
        "steps": steps,
        "s_per_step": sum(times) / len(times),
        "compile_s": compile_s,
        "loss_after": float(loss.detach()),
    }


def _pair_worker(args):
    return time_steps(*args)


def run(
    variants: list[str], settings: list[str], steps: int, warmup: int, command: str = "", progress: bool = True
) -> dict[str, Any]:
    """Every setting for every variant; ``pair-1t`` runs two identical jobs in two processes at once.
    ``command``: the command line the result records."""
    rows = []
    load_start = load_average()
    for variant in variants:
        for setting in tqdm(settings, desc=variant, unit="setting", disable=not progress):
            if _setting(setting).pair:
                with mp.get_context("spawn").Pool(2) as pool:
                    pair = pool.map(_pair_worker, [(variant, "eager-1t", steps, warmup)] * 2)
                row = dict(pair[0], setting=setting, s_per_step=max(p["s_per_step"] for p in pair))
            else:
                row = time_steps(variant, setting, steps, warmup)
            rows.append(row)
    return {
        "command": command,
        "environment": environment(),
        "load_start": load_start,
        "load_end": load_average(),
        "steps": steps,
        "warmup": warmup,
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    """The table: per variant and setting, seconds per step, models per hour of both cores and the speed-up."""
    lines = [
        f"# Training step cost, {result['environment']['cpu'] and cpu_summary(result['environment']['cpu'])}",
        "",
        f"`{result['command']}` ({result['steps']} timed steps after {result['warmup']}; load average "
        f"{result['load_start'][:1]} at the start, {result['load_end'][:1]} at the end)",
        "",
        "| variant | setting | s / step | throughput of both cores vs eager-1t x 2 | compile s | loss after |",
        "|---|---|---:|---:|---:|---:|",
    ]
    base = {r["variant"]: r["s_per_step"] for r in result["rows"] if r["setting"] == "eager-1t"}
    for r in result["rows"]:
        how = _setting(r["setting"])
        ref = base.get(r["variant"])
        gain = "-" if ref is None else f"{(how.models_at_once / r['s_per_step']) / (2 / ref):.2f}x"
        if how.alone:
            gain += " (if two run at once)"
        comp = "-" if r.get("compile_s") is None else f"{r['compile_s']:.0f}"
        lines.append(
            f"| {r['variant']} | {r['setting']} | {r['s_per_step']:.3f} | {gain} | {comp} | {r['loss_after']:.4f} |"
        )
    return "\n".join(lines) + "\n"


COMMAND = "python -m research.train_speed"


def build_parser() -> argparse.ArgumentParser:
    parser = study_parser(COMMAND, __doc__)
    parser.add_argument("--variants", nargs="+", default=["standard"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    return add_output_flags(
        parser, "train_speed.json, train_speed.md", None, "print the markdown of a train_speed.json"
    )


@entry_point
def main(argv: list[str] | None = None) -> int:
    """``python -m research.train_speed``."""
    argv, args = parse_study(build_parser(), argv, markdown)
    if args is None:
        return 0
    try:
        variants = [models.canonical_name(v) for v in args.variants]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.steps < 1 or args.warmup < 1:
        raise UsageError("--steps and --warmup must be at least 1")
    writable_dir(args.out, "--out folder")
    command = command_line(COMMAND, argv)
    result = run(variants, args.settings, args.steps, args.warmup, command, progress=not args.no_progress)
    write_report(args.out, "train_speed", result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
