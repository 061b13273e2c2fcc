"""The GPU plan: ``bench-latency`` on one GPU (planned for an H100 SXM) in parts that each end within a time limit.

The headline first -- the one command to run on an H100 (torch with CUDA, triton, timm, onnx; nothing else)::

    python benchmarks/gpu_plan.py --part headline --out results/gpu-h100

``headline``: every variant, ViT-S classifier at 224 px, batch 1 and 64, at fp16: eager PyTorch, ``torch.compile``
(Inductor, CUDA graphs; compiled once per variant with the batch dimension dynamic) and AOTInductor (``aoti``: one
``.pt2`` package per variant, compiled ahead of time, any batch), each row parity-checked against eager fp32 and
paired A B A B with eager fp16 and with ``standard`` (the variant's overhead). It runs in three stages over one row
log -- eager for every variant, then ``torch.compile``, then AOTInductor -- so that a run stopped by its time
limit still leaves whole columns; the same command measures the rest. Its table (``headline.md``) and the overhead
picture are written into ``<out>/headline-vit-s-224``; ``--render`` writes every results folder again from its
``results.json`` (on a machine with matplotlib, for the pictures)::

    python -m attnzoo.benchmarks.gpu_plan --render --out results/gpu-h100

The older parts, after it:

- ViT-S classifier, 224 px, batch 1, 8, 64 and 256, every variant: eager at fp32 (IEEE, TF32 off), tf32, fp16 and
  bf16 (autocast, extra math fp32), and ``torch.compile`` at bf16 (CUDA graphs); each row paired A B A B with eager
  at its own precision, its overhead over ``standard`` on the same backend, precision and batch, and its roofline
  fraction (:mod:`attnzoo.benchmarks.roofline`);
- the Segmenter (ViT-S encoder, linear decoder) at 512 px, batch 1 and 8, the same precisions and compile;
- ``ort-cuda``, ``ort-trt`` and ``tensorrt`` once, so that the results say whether they run on the machine (a
  skipped row with its reason where it lacks ``onnxruntime-gpu`` or TensorRT).

Each part is one command that ends within about 10 minutes: it starts no new row after ``--time-limit`` (default
480 s), writes its results, and the same command again measures what is left (the rows are kept in ``rows.jsonl``).
Parts share one results folder per model (``<out>/vit-s-224``, ``<out>/segmenter-512``), so together they make one
table.

It also runs from a source tree without ``pip install`` (a GPU machine with torch, timm and onnx but without this
package): started as a file, it first maps the package folders of ``pyproject.toml`` onto ``attnzoo.*``
(:func:`bootstrap`), before its own imports of ``attnzoo``. ``--copy-to DIR`` copies the results folders to a
folder you name after the parts ran (to take them off the machine)::

    python benchmarks/gpu_plan.py --part eager-a --out results/gpu-h100 --copy-to /path/to/copy
    python -m attnzoo.benchmarks.gpu_plan --list      # installed: the parts and what each measures

The commands to run, in order, are in ``results/gpu-h100/README.md``.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "bootstrap",
    "PARTS",
    "MODELS",
    "EAGER_DTYPES",
    "COMPILE_DTYPES",
    "NOT_THERE",
    "HEADLINE_STAGES",
    "part_settings",
    "run_part",
    "headline_table",
    "render",
    "status",
    "main",
]

#: The repository root (this file is ``benchmarks/gpu_plan.py``).
ROOT = Path(__file__).resolve().parent.parent


class _SourceTree(importlib.abc.MetaPathFinder):
    """Finds the packages ``pyproject.toml`` maps to folders (``attnzoo.models`` -> ``models/``)."""

    def __init__(self, root: Path, folders: dict[str, str]) -> None:
        self.root, self.folders = root, folders

    def find_spec(self, fullname, path=None, target=None):
        folder = self.folders.get(fullname)
        if folder is None:
            return None
        init = self.root / folder / "__init__.py"
        return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(init.parent)])


def bootstrap(root: Path = ROOT) -> bool:
    """Make ``attnzoo.*`` importable from the source tree at ``root`` when the package is not installed: the
    package folders of ``[tool.setuptools.package-dir]`` in ``pyproject.toml`` mapped onto their names (as an
    editable install does). Returns whether it had to."""
    here = Path(__file__).resolve().parent  # on sys.path when started as a file: its modules would shadow others
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        if importlib.util.find_spec("attnzoo.benchmarks") is not None:  # installed (or mapped already)
            return False
    except ImportError:  # not even attnzoo: a bare source tree
        pass
    # the standard library from Python 3.11 (the package supports 3.10, the checker's target); a bare source tree only
    import tomllib  # type: ignore[import-not-found, unused-ignore]

    folders = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    sys.path.insert(0, str(root))
    sys.meta_path.insert(0, _SourceTree(root, folders))
    return True


if __name__ == "__main__" and __package__ in (None, ""):  # started as a file from a source tree: map attnzoo first
    bootstrap()

# after bootstrap(): a bare source tree imports these through the mapping above
from attnzoo.benchmarks.rowlog import LOG_NAME, read_log  # noqa: E402
from attnzoo.benchmarks.tables import write_outputs  # noqa: E402
from attnzoo.cli import add_debug_flag, entry_point  # noqa: E402
from attnzoo.errors import UsageError  # noqa: E402
from attnzoo.fileio import atomic_write_text, default_cache_dir  # noqa: E402
from attnzoo.lazy import lazy_import  # noqa: E402
from attnzoo.machine import load_average  # noqa: E402
from attnzoo.runtime.backends import reference_backend  # noqa: E402
from attnzoo.targets.aoti import package as aoti  # noqa: E402  -- the compile timed on its own

# --list, --help and report-variant (which reads MODELS) load without torch and timm: imported at first use
models = lazy_import("attnzoo.models")
bench_run = lazy_import("attnzoo.benchmarks.run")
torch = lazy_import("torch")


#: The models of the plan: name -> (task, arch, input side, batch sizes).
MODELS: dict[str, dict[str, Any]] = {
    "vit-s-224": {"task": "cls", "arch": "small", "img_size": 224, "batch_sizes": (1, 8, 64, 256)},
    "segmenter-512": {"task": "seg", "arch": "small", "img_size": 512, "batch_sizes": (1, 8)},
}
#: Eager's precisions: IEEE fp32 (TF32 off), TF32, fp16, bf16 autocast.
EAGER_DTYPES = ("fp32", "tf32", "fp16", "bf16")
#: ``torch.compile``'s precision in the plan (the one a GPU deployment of these models would use).
COMPILE_DTYPES = ("bf16",)
#: Backends listed (once) as not running on the GPU machine, each with its reason.
NOT_THERE = ("ort-cuda", "ort-trt", "tensorrt")
#: Seconds per measurement (>= 10 iterations too), the same in every part (a resumed part must match it).
MIN_TIME = 0.3
#: Seconds after which a part starts no new row: the longest row (a compile) then still ends within 10 minutes.
TIME_LIMIT = 480.0
#: Seconds of ``torch.compile`` a part may spend: more than any part's time, so no compile row is skipped for it
#: (the time limit ends a part instead, and the same command compiles the rest).
COMPILE_BUDGET = 24 * 3600.0


#: The headline's stages, in order: the backends each adds (one row log; a stage keeps the rows before it).
HEADLINE_STAGES: tuple[tuple[str, ...], ...] = (("eager",), ("eager", "compile"), ("eager", "compile", "aoti"))


def _halves() -> list[list[str]]:
    rest = [v for v in models.VARIANT_NAMES if v != "standard"]
    return [rest[: len(rest) // 2], rest[len(rest) // 2 :]]


def _quarters() -> list[list[str]]:
    rest = [v for v in models.VARIANT_NAMES if v != "standard"]
    n = -(-len(rest) // 4)
    return [rest[i : i + n] for i in range(0, len(rest), n)]


#: The parts, in the order to run them: name -> model, backends, precisions and which variants (``standard`` is
#: always added: the overhead baseline). Eager first: every variant and precision before any compilation.
PARTS: dict[str, dict[str, Any]] = {
    "headline": {
        "model": "vit-s-224",
        "folder": "headline-vit-s-224",
        "backends": HEADLINE_STAGES[-1],
        "dtypes": ("fp16",),
        "batch_sizes": (1, 64),
        "variants": None,
        "dynamic_batch": True,
    },
    "eager-a": {"model": "vit-s-224", "backends": ("eager", *NOT_THERE), "dtypes": EAGER_DTYPES, "variants": 0},
    "eager-b": {"model": "vit-s-224", "backends": ("eager",), "dtypes": EAGER_DTYPES, "variants": 1},
    "seg-eager": {"model": "segmenter-512", "backends": ("eager",), "dtypes": EAGER_DTYPES, "variants": None},
    **{
        f"compile-{i + 1}": {
            "model": "vit-s-224",
            "backends": ("eager", "compile"),
            "dtypes": COMPILE_DTYPES,
            "variants": ("quarter", i),
        }
        for i in range(4)
    },
    "seg-compile-a": {
        "model": "segmenter-512",
        "backends": ("eager", "compile"),
        "dtypes": COMPILE_DTYPES,
        "variants": 0,
    },
    "seg-compile-b": {
        "model": "segmenter-512",
        "backends": ("eager", "compile"),
        "dtypes": COMPILE_DTYPES,
        "variants": 1,
    },
}


def _variants(spec: Any) -> list[str]:
    if spec is None:
        return list(models.VARIANT_NAMES)
    if isinstance(spec, tuple):
        return ["standard", *_quarters()[spec[1]]]
    return ["standard", *_halves()[spec]]


def part_settings(
    part: str,
    out: Path,
    *,
    variants: Sequence[str] | None = None,
    arch: str | None = None,
    img_size: int | None = None,
    batch_sizes: Sequence[int] | None = None,
    min_time: float = MIN_TIME,
    time_limit: float | None = TIME_LIMIT,
    device: str = "auto",
    threads: int | None = None,
    cache_dir: Path | None = None,
    dtypes: Sequence[str] | None = None,
    backends: Sequence[str] | None = None,
    flags: Sequence[str] = (),
):
    """The :class:`attnzoo.benchmarks.run.Settings` of ``part`` (the overrides shrink it: ``--variants`` a subset,
    ``--arch``/``--img-size``/``--batch-sizes`` a smaller model, ``--dtypes`` other precisions, as the CPU test
    does; ``backends``: a stage of the part; ``flags``: the command line's other flags, recorded with the part).

    Raises:
        ValueError: an unknown part (the valid ones named).
    """
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; valid: {', '.join(PARTS)}")
    spec = PARTS[part]
    model = MODELS[spec["model"]]
    chosen = _variants(spec["variants"])
    if variants:
        chosen = [v for v in chosen if v in variants]
    command = ["python", "benchmarks/gpu_plan.py", "--part", part, *flags]
    return bench_run.Settings(
        variants=list(dict.fromkeys(["standard", *chosen])),
        backends=list(backends or spec["backends"]),
        dtypes=list(dtypes or spec["dtypes"]),
        batch_sizes=list(batch_sizes or spec.get("batch_sizes") or model["batch_sizes"]),
        task=model["task"],
        arch=arch or model["arch"],
        img_size=img_size or model["img_size"],
        threads=threads or len(os.sched_getaffinity(0)),
        min_time=min_time,
        out=Path(out) / spec.get("folder", spec["model"]),
        cache_dir=cache_dir or default_cache_dir() / "bench-latency",
        device=device,
        compile_budget=COMPILE_BUDGET,
        ceiling_size=0,
        time_limit=time_limit,
        progress=False,
        command=shlex.join(command),
        dynamic_batch=bool(spec.get("dynamic_batch")),
    )


def run_part(part: str, out: Path, **overrides: Any) -> dict[str, Any]:
    """Run ``part`` (resuming its rows in ``out``), write its model's results; return the result. The headline
    runs its :data:`HEADLINE_STAGES` one after the other within the one time limit."""
    if part != "headline":
        settings = part_settings(part, out, **overrides)
        result = bench_run.run_benchmark(settings)
        write_outputs(result, settings.out)
        return result
    limit = overrides.pop("time_limit", TIME_LIMIT)
    start = time.monotonic()
    for stage in HEADLINE_STAGES:
        left = None if limit is None else max(limit - (time.monotonic() - start), 1e-3)
        settings = part_settings(part, out, time_limit=left, backends=stage, **overrides)
        result = bench_run.run_benchmark(settings)
        write_outputs(result, settings.out)
        write_headline(result, settings.out)
        if result["interrupted"]:
            break
    return result


def headline_table(result: dict[str, Any]) -> str:
    """The headline as markdown: per variant and batch, the median latency of eager, ``torch.compile`` and
    AOTInductor at the run's precision (fp16 on the GPU), each one's overhead over ``standard`` on the same
    backend (A B A B pairs), and compile's and AOTInductor's speed-up over eager; a row that did not run says
    why."""
    # the run's precision: eager fp32, the reference, comes first (fp16 when nothing ran yet)
    dtype = ([*dict.fromkeys(r["dtype"] for r in result["results"])] or ["fp16"])[-1]
    rows = {(r["variant"], r["backend"], r["batch"]): r for r in result["results"] if r["dtype"] == dtype}
    over = {(o["variant"], o["backend"], o["batch"]): o for o in result.get("overheads", []) if o["dtype"] == dtype}
    backends = [b for b in HEADLINE_STAGES[-1] if any(k[1] == b for k in rows)]
    head = ["variant", "batch"]
    for b in backends:
        head += [f"{b} {dtype} ms", f"{b} x standard"]
    head += [f"{b} x eager" for b in backends if b != reference_backend()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for v in dict.fromkeys(k[0] for k in rows):
        for n in sorted({k[2] for k in rows if k[0] == v}):
            cells = [f"`{v}`", str(n)]
            for b in backends:
                r = rows.get((v, b, n))
                if r is None or r["status"] != "ok":
                    why = "not run" if r is None else f"{r['status']}: {r['reason']}"
                    cells += [why.replace("|", "/")[:90], "-"]
                    continue
                o = over.get((v, b, n))
                cells += [
                    f"{r['median_ms']:.2f}",
                    "1" if v == "standard" else (f"{o['ratio_median']:.2f}" if o else "-"),
                ]
            for b in backends:
                if b == reference_backend():
                    continue
                r = rows.get((v, b, n))
                x = None if r is None else (r.get("speedup_pair_median") or r.get("speedup_vs_eager"))
                cells.append(f"{x:.2f}" if x else "-")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_headline(result: dict[str, Any], folder: Path) -> Path:
    """``headline.md`` in ``folder``: :func:`headline_table` of ``result`` under a line naming the run."""
    env = result.get("environment") or {}
    gpu = (env.get("gpu") or {}).get("name") or (env.get("cpu") or {}).get("model") or "this machine"
    note = ""
    if result.get("interrupted"):
        note = f"\n**Not finished:** {result['interrupted']['note']}.\n"
    text = (
        f"# Headline: eager vs torch.compile vs AOTInductor on {gpu}\n\n"
        f"Command: `{result.get('command', '')}`; torch {(env.get('versions') or {}).get('torch')}. `ms`: median "
        "latency; `x standard`: the variant's latency over `standard`'s on the same backend, precision and batch "
        "(median of A B A B pairs); `x eager`: speed-up over eager at the same precision (pairs).\n"
        f"{note}\n{headline_table(result)}"
    )
    path = Path(folder) / "headline.md"
    atomic_write_text(path, text)
    return path


def compile_times(
    arch: str = "small", img_size: int = 224, device: str = "cpu", dtype: str = "fp32", variant: str = "standard"
) -> dict[str, Any]:
    """What one variant's compiles cost on this machine (what sizes the headline): the first call of a
    ``torch.compile``d model (the compile), ``torch.export`` and ``aoti_compile_and_package`` of the same model, and
    loading the package; seconds, with the load average before and after."""
    torch.manual_seed(0)
    model = models.create_model(variant, "cls", arch, img_size=img_size).eval()
    dt = getattr(torch, {"fp32": "float32", "fp16": "float16"}[dtype])
    x = torch.zeros(aoti.TRACE_BATCH, 3, img_size, img_size, device=device, dtype=dt)
    times: dict[str, Any] = {"variant": variant, "arch": arch, "img_size": img_size, "device": device, "dtype": dtype}
    times["load_average_before"] = load_average()
    start = time.perf_counter()
    compiled = torch.compile(model.to(device=device, dtype=dt))
    with torch.inference_mode():
        compiled(x)
    times["torch_compile_first_call_s"] = round(time.perf_counter() - start, 2)
    model = model.float().cpu()
    start = time.perf_counter()
    program = aoti.export_program(model, (img_size, img_size), device=device, dtype=dtype)
    times["torch_export_s"] = round(time.perf_counter() - start, 2)
    with tempfile.TemporaryDirectory() as folder:
        with aoti.temporary_package(Path(folder) / "model.pt2") as tmp:
            times["aoti_compile_s"] = round(aoti.compile_package(program, tmp), 2)
            start = time.perf_counter()
            aoti.load_package(tmp)
            times["aoti_load_s"] = round(time.perf_counter() - start, 2)
            times["package_mb"] = round(tmp.stat().st_size / 1e6, 1)
    times["load_average_after"] = load_average()
    times["torch"] = torch.__version__
    return times


def render(out: Path) -> list[Path]:
    """Write every results folder in ``out`` again from its ``results.json`` (tables, CSVs, the pictures where
    matplotlib is installed; the headline's ``headline.md``): what a GPU machine without matplotlib could not draw."""
    written = []
    for folder in sorted({*(spec.get("folder", spec["model"]) for spec in PARTS.values())}):
        path = Path(out) / folder / "results.json"
        if path.is_file():
            result = json.loads(path.read_text())
            write_outputs(result, path.parent)
            if folder == PARTS["headline"]["folder"]:
                write_headline(result, path.parent)
            written.append(path.parent)
    return written


def status(out: Path, **overrides: Any) -> list[dict[str, Any]]:
    """Per part: the rows it asks for, how many of them are in the results in ``out`` (measured, failed, built or
    skipped with their reason: nothing left to do) and how many were measured (``ok``)."""
    lines = []
    for part in PARTS:
        settings = part_settings(part, out, **overrides)
        wanted = {
            (v, b, d, n)
            for v in settings.variants
            for b in settings.backends
            for d in settings.dtypes
            for n in settings.batch_sizes
        }
        written, ok = set(), set()
        log = Path(settings.out) / LOG_NAME
        for record in read_log(log)[0] if log.is_file() else []:
            row = record["row"] if record["kind"] == "row" else None
            if row and "--compile-budget" not in row["reason"]:
                key = (row["variant"], row["backend"], row["dtype"], row["batch"])
                written.add(key)
                if row["status"] == "ok":
                    ok.add(key)
        lines.append(
            {
                "part": part,
                "model": PARTS[part].get("folder", PARTS[part]["model"]),
                "rows": len(wanted),
                "done": len(wanted & written),
                "ok": len(wanted & ok),
            }
        )
    return lines


def _copy(out: Path, to: Path) -> None:
    """Copy the results folders to ``to`` (``--copy-to``: a folder the user names)."""
    for folder in dict.fromkeys(spec.get("folder", spec["model"]) for spec in PARTS.values()):
        src = out / folder
        if src.is_dir():
            shutil.copytree(
                src, to / out.name / folder, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".results-*")
            )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu_plan", description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", default=[], help="a part to run (repeatable); --list names them")
    parser.add_argument("--list", action="store_true", help="print the parts and how much of each is finished in --out")
    parser.add_argument(
        "--render", action="store_true", help="write the results folders in --out again from their results.json"
    )
    parser.add_argument(
        "--compile-times",
        action="store_true",
        help="measure one ViT-S torch.compile and one AOTInductor compile here (--device, default cpu at fp32, "
        "cuda at fp16) and print them as JSON: what sizes the headline",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("results/gpu-h100"), help="results folder (one per model in it)"
    )
    parser.add_argument("--copy-to", type=Path, default=None, help="copy the results folders there afterwards")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, help="start no new row after this many seconds")
    parser.add_argument("--variants", default=None, help="only these variants of each part (comma-separated)")
    parser.add_argument("--arch", default=None, help="another ViT size (the CPU test: micro)")
    parser.add_argument("--img-size", type=int, default=None, help="another input side")
    parser.add_argument("--batch-sizes", default=None, help="other batch sizes (comma-separated)")
    parser.add_argument("--dtypes", default=None, help="other precisions (comma-separated; the CPU test: fp32)")
    parser.add_argument("--min-time", type=float, default=MIN_TIME, help="seconds per measurement")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: the usable cores)")
    return parser


def _other_flags(argv: list[str]) -> list[str]:
    """``argv`` without its ``--part`` options: what each part's recorded command carries besides its own part."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--part":
            skip = True
        elif not arg.startswith("--part="):
            out.append(arg)
    return out


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """Run the parts asked for, one after the other; print what is finished."""
    args = add_debug_flag(build_parser()).parse_args(argv)
    overrides = {
        "variants": args.variants.split(",") if args.variants else None,
        "arch": args.arch,
        "img_size": args.img_size,
        "min_time": args.min_time,
        "device": args.device,
        "threads": args.threads,
        "batch_sizes": [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else None,
        "dtypes": args.dtypes.split(",") if args.dtypes else None,
    }
    bad = [p for p in args.part if p not in PARTS]
    if args.compile_times:
        device = "cpu" if args.device == "auto" else args.device
        print(
            json.dumps(
                compile_times(
                    args.arch or "small", args.img_size or 224, device, "fp16" if device == "cuda" else "fp32"
                )
            )
        )
        return 0
    if args.render and not bad:
        for folder in render(args.out):
            print(f"written: {folder}")
        if not args.part:
            return 0
    if bad or not (args.part or args.list):
        raise UsageError(f"unknown part {', '.join(map(repr, bad)) or '(none given)'}; valid: {', '.join(PARTS)}")
    flags = _other_flags(list(sys.argv[1:] if argv is None else argv))
    for part in args.part:
        print(f"part {part}", flush=True)
        result = run_part(part, args.out, time_limit=args.time_limit, flags=flags, **overrides)
        if result["interrupted"]:
            print(f"part {part} not finished: {result['interrupted']['note']}", flush=True)
            if result["interrupted"]["signal"]:
                break
    for line in status(args.out, **overrides):
        print(
            f"{line['part']:>14}  {line['model']:<14} {line['done']:>4} / {line['rows']:<4} rows done, "
            f"{line['ok']} measured"
        )
    if args.copy_to is not None:
        _copy(args.out, args.copy_to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
