"""What the study commands share: the zoo models they select, the ``--table`` reprint, and writing a report.

Each study writes ``<name>.json`` (every number, the command and the machine) and ``<name>.md`` (its tables) into
``--out``; ``--table FILE`` prints the markdown of an earlier ``<name>.json`` and runs nothing.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attnzoo.benchmarks.cli import variant_list
from attnzoo.errors import UsageError
from attnzoo.fileio import atomic_write_text
from attnzoo.lazy import lazy_import

zoo = lazy_import("attnzoo.zoo")  # its models and data load torch: the light studies' --table runs without them

__all__ = ["zoo_entries", "contended", "reprint", "require_out", "write_report", "add_zoo_selection"]


def zoo_entries(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Zoo entries of ``--data`` / ``--task`` / ``--variants``; ``UsageError`` naming what the zoo has otherwise."""
    have = [e for e in zoo.entries() if e["data"] == a.data and a.task in ("all", e["task"])]
    if not have:
        datasets = sorted({e["data"] for e in zoo.entries()})
        raise UsageError(f"the zoo has no {a.task} models for data {a.data!r}; it has data: {', '.join(datasets)}")
    if a.variants.strip() == "all":
        return have
    wanted = variant_list(a.variants)
    missing = [v for v in wanted if v not in {e["variant"] for e in have}]
    if missing:
        raise UsageError(f"the zoo has no {a.task} {a.data} model of {', '.join(missing)}")
    return [e for e in have if e["variant"] in wanted]


def contended(load_start: list[float], load_end: list[float], threads: int) -> bool:
    """Whether the 1-minute load average at the start or the end exceeds the study's own threads (+0.5)."""
    loads = [v[0] for v in (load_start, load_end) if v]
    return bool(loads) and max(loads) > threads + 0.5


def reprint(table: Path | None, markdown: Callable[[dict[str, Any]], str]) -> bool:
    """With ``--table FILE``, print ``markdown`` of that JSON report and return True (the command then ends)."""
    if table is None:
        return False
    if not table.is_file():
        raise UsageError(f"--table: no such file: {table}")
    print(markdown(json.loads(table.read_text())))
    return True


def require_out(out: Path | None, table_does: str = "print a report") -> Path:
    """``--out``, required unless ``--table`` is given."""
    if out is None:
        raise UsageError(f"--out is required (or --table to {table_does})")
    return out


def write_report(out: Path, name: str, result: Mapping[str, Any], md: str) -> None:
    """``<out>/<name>.json`` and ``<out>/<name>.md``, each written whole (atomically), then the markdown printed."""
    atomic_write_text(out / f"{name}.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / f"{name}.md", md)
    print(md)


def add_zoo_selection(p: argparse.ArgumentParser, task: str = "cls") -> None:
    """The flags that choose which zoo models a study scores and on how much of the test split.

    Args:
        p: The study's parser.
        task: ``--task``'s default (``cls``, ``seg`` or ``all``).
    """
    p.add_argument("--variants", default="all", help="'all' or comma-separated variant names")
    p.add_argument("--task", choices=("cls", "seg", "all"), default=task)
    p.add_argument("--data", default=zoo.DEFAULT_DATA, help="zoo data set (zoo/manifest.json)")
    p.add_argument("--limit", type=int, default=None, help="first N test images only (default: the whole split)")
