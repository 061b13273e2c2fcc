"""``python -m attnzoo.models``: print the variants, papers and extra-weights tables (markdown) from the registry.

The rows are the registry's: the 15 built-ins, then every variant an installed plugin package registered
(entry-point group ``attnzoo.variants``, marked with its package). The tables in ``README.md`` and
``docs/variants.md`` are this output for the built-ins, between ``<!-- NAME -->`` and ``<!-- /NAME -->``
markers: ``--update FILE ...`` rewrites them there, ``--check FILE ...`` exits 1 naming each file whose
tables are not the registry's.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from attnzoo import mdtext
from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.errors import CommandError, UsageError
from attnzoo.fileio import atomic_write_text

from .factory import count_params, create_model
from .registry import BUILTIN_VARIANTS, VARIANT_NAMES, VARIANTS, Paper

__all__ = ["variants_table", "papers_table", "extra_weights_table", "tables", "render_into", "main"]

#: Marker names of the generated tables in a markdown file.
TABLES = ("variants-table", "papers-table", "extra-weights-table")


def _names(builtin_only: bool) -> Sequence[str]:
    return BUILTIN_VARIANTS if builtin_only else VARIANT_NAMES


def _label(name: str) -> str:
    """A variant's cell: its name, aliases and, for a plugin's, the package (every value a plugin gave goes through
    :mod:`attnzoo.mdtext`: no raw HTML, link or table cell comes from it)."""
    spec = VARIANTS[name]
    label = mdtext.code(name) + "".join(f" (alias {mdtext.code(a)})" for a in spec.aliases)
    if not spec.builtin:
        label += f" (plugin {mdtext.text(spec.package)}{' ' + mdtext.text(spec.version) if spec.version else ''})"
    return label


def _cite(paper: Paper | str, short: bool) -> str:
    """A paper as a table cell: a built-in's linked title (``short``: authors and year), a plugin's citation string
    as text (an address in it autolinks only to a known host, :func:`attnzoo.mdtext.text`)."""
    if not isinstance(paper, Paper):
        return mdtext.text(paper)
    return mdtext.link(f"{paper.authors} {paper.year}" if short else paper.title, paper.url)


def _param_count(name: str, arch: str) -> int:
    """Parameters of a classifier of ``name`` (1000 classes), built on the meta device: counted, not allocated."""
    with torch.device("meta"):
        return count_params(create_model(name, arch=arch))


def variants_table(arch: str = "tiny", builtin_only: bool = False) -> str:
    """Markdown table: variant, paper, equations, extra-math scopes, extra parameters, parameter count of a ViT of
    ``arch`` (1000 classes) against ``standard``'s."""
    base = _param_count("standard", arch)
    rows = [
        "| variant | paper | equations | extra-math scopes (ONNX `blocks.N.attn.<scope>/...`) | "
        f"extra parameters per block | ViT-{arch} params (1000 classes) |",
        "|---|---|---|---|---|---|",
    ]
    for name in _names(builtin_only):
        spec = VARIANTS[name]
        n = _param_count(name, arch)
        scopes = ", ".join(mdtext.code(s) for s in spec.extra_scopes) or "none"
        rows.append(
            f"| {_label(name)} | {_cite(spec.paper, short=True)} | {mdtext.text(spec.equations or '-')} | {scopes} | "
            f"{mdtext.text(spec.extra_params or '-')} | {n / 1e6:.2f} M ({(n - base) / base:+.1%}) |"
        )
    return "\n".join(rows)


def papers_table(builtin_only: bool = False) -> str:
    """Markdown table of the papers the variants come from (a plugin's citation string as it gave it)."""
    papers: dict[Paper | str, list[str]] = {}
    for name in _names(builtin_only):
        papers.setdefault(VARIANTS[name].paper, []).append(name)
    rows = ["| paper | authors, year | variants |", "|---|---|---|"]
    for paper, names in papers.items():
        who = f"{mdtext.text(paper.authors)} {paper.year}" if isinstance(paper, Paper) else ""
        rows.append(f"| {_cite(paper, short=False)} | {who} | {', '.join(mdtext.code(n) for n in names)} |")
    return "\n".join(rows)


def extra_weights_table(builtin_only: bool = False) -> str:
    """Markdown table of the variants whose attention holds weights timm's ``Attention`` lacks (what a timm
    checkpoint leaves missing), as ``attn.<module>``."""
    rows = ["| variant | extra weights |", "|---|---|"]
    for name in _names(builtin_only):
        weights = VARIANTS[name].extra_weights
        if weights:
            rows.append(f"| {_label(name)} | {', '.join(mdtext.code(f'attn.{w}') for w in weights)} |")
    return "\n".join(rows)


def tables(builtin_only: bool = True) -> dict[str, str]:
    """The generated tables by marker name."""
    return {
        "variants-table": variants_table(builtin_only=builtin_only),
        "papers-table": papers_table(builtin_only=builtin_only),
        "extra-weights-table": extra_weights_table(builtin_only=builtin_only),
    }


def _between(match: re.Match[str], table: str) -> str:
    return match.group(1) + table + "\n" + match.group(2)


def render_into(text: str, generated: dict[str, str]) -> str:
    """``text`` with the content between each ``<!-- NAME -->`` / ``<!-- /NAME -->`` pair replaced by
    ``generated[NAME]``; markers absent from ``text`` are skipped."""
    for name, table in generated.items():
        pattern = re.compile(rf"(<!-- {re.escape(name)} -->\n)(?:.*?\n)?(<!-- /{re.escape(name)} -->)", re.S)
        text = pattern.sub(partial(_between, table=table), text)
    return text


def _marked(text: str) -> list[str]:
    return [name for name in TABLES if f"<!-- {name} -->" in text and f"<!-- /{name} -->" in text]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attnzoo.models", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--update",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="rewrite the built-in variants' tables between their markers in these markdown files",
    )
    group.add_argument(
        "--check", nargs="+", type=Path, metavar="FILE", help="exit 1 if these files' tables are not the registry's"
    )
    return add_debug_flag(parser)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """Print the tables, or update / check them in markdown files."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    files = args.update or args.check
    if not files:
        print(variants_table(), papers_table(), extra_weights_table(), sep="\n\n")
        return 0
    for path in files:  # every file readable and marked before any is written
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
        if not _marked(path.read_text()):
            raise UsageError(f"{path}: no table markers (<!-- {' -->, <!-- '.join(TABLES)} -->)")
    generated = tables()
    stale = []
    for path in files:
        text = path.read_text()
        new = render_into(text, generated)
        if new != text:
            stale.append(str(path))
            if args.update:
                atomic_write_text(path, new)
    if args.check and stale:
        raise CommandError(
            f"variant tables differ from the registry in {', '.join(stale)}; run "
            f"python -m attnzoo.models --update {' '.join(stale)}"
        )
    print(
        f"{'updated' if args.update else 'up to date'}: "
        f"{', '.join(stale if args.update else map(str, files)) or 'none'}"
    )
    return 0


if __name__ == "__main__":
    main()
