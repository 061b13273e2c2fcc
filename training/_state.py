"""A training run's resumable state: the model and AdamW moments as safetensors, everything else as JSON (never a
pickle), written atomically, and every fact of it checked against the run before a resume trains on it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from attnzoo.errors import first_line
from attnzoo.fileio import atomic_path, atomic_write_text, read_json

#: Largest ``<name>.state.json`` a resume reads (about 200 bytes per epoch of history, plus the settings).
MAX_STATE_JSON_BYTES = 16 * 2**20


def state_paths(out_dir: Path, name: str) -> tuple[Path, Path]:
    return out_dir / f"{name}.state.safetensors", out_dir / f"{name}.state.json"


def save_state(
    out_dir: Path,
    name: str,
    model,
    opt,
    sched,
    epoch: int,
    history,
    elapsed: float,
    config: dict[str, Any],
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
    st_path, js_path = state_paths(out_dir, name)
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
                "config": config,
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
    st_path, js_path = state_paths(out_dir, name)
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
    """Load the saved model, optimizer and scheduler state (checked by :func:`load_state`) into ``model``,
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


def load_state(
    out_dir: Path, name: str, model, opt, sched, config: dict[str, Any], epochs: int, steps_per_epoch: int
) -> dict[str, Any]:
    """Restore what :func:`save_state` wrote.

    Raises:
        ValueError: nothing to resume, one of the two state files missing, either of them damaged or
            truncated (a JSON over :data:`MAX_STATE_JSON_BYTES` or nested too deep, an epoch outside
            ``0..epochs`` or a history that does not match it, an optimizer or scheduler state this run
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
    problem = _state_problem(epoch, history, elapsed, epochs) or _step_problem(
        meta.setdefault("step", 0), meta.setdefault("losses", []), epoch, epochs, steps_per_epoch
    )
    if problem:
        raise ValueError(
            f"cannot resume: {js_path} is damaged ({problem}); delete it and its "
            f"{st_path.name} and run without --resume to start afresh"
        )
    now = {k: v for k, v in config.items() if k not in ("out", "threads", "epochs")}
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
