"""``python -m attnzoo.zoo``: the zoo's models in the Hugging Face layout, and their timm names.

    python -m attnzoo.zoo card vit_micro_conv_belief2.fashion_mnist --out hub  # hub/<name>/: config.json,
                                                                               # model.safetensors, README.md
    python -m attnzoo.zoo card --all --out hub                 # every Fashion-MNIST model (--data for another set)
    python -m attnzoo.zoo card --all --readme-only --out zoo/cards          # the committed cards
    python -m attnzoo.zoo card --all --readme-only --check --out zoo/cards  # exit 1 naming the stale ones
    python -m attnzoo.zoo names                                # the timm names, linked to their cards (docs/zoo.md)

A card is made from the repository (the variants' equations in docs/variants.md, the reports in
results/variant-reports/): run it from a checkout.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

import attnzoo.models  # noqa: F401 -- registers the zoo's timm names (attnzoo.zoo.hub)
from attnzoo import zoo
from attnzoo.cli import add_debug_flag, entry_point
from attnzoo.data.datasets import BUILTIN_DATA
from attnzoo.errors import CommandError, UsageError
from attnzoo.zoo import cards, hub


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m attnzoo.zoo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    card = add_debug_flag(sub.add_parser("card", help="write model folders (config.json, model.safetensors, card)"))
    card.add_argument("names", nargs="*", metavar="NAME", help="timm names of zoo models (python -m attnzoo.zoo names)")
    card.add_argument("--all", action="store_true", help="every zoo model of --data")
    card.add_argument("--data", default=zoo.DEFAULT_DATA, choices=BUILTIN_DATA, help="data set of --all")
    card.add_argument("--out", type=Path, required=True, help="folder of the model folders (OUT/NAME/)")
    card.add_argument("--readme-only", action="store_true", help="write only README.md (the committed cards)")
    card.add_argument("--check", action="store_true", help="with --readme-only: write nothing, exit 1 if stale")
    names = add_debug_flag(sub.add_parser("names", help="print the zoo's timm names, linked to their cards"))
    names.add_argument("--data", default=zoo.DEFAULT_DATA, choices=BUILTIN_DATA)
    return add_debug_flag(parser)


def _chosen(args: argparse.Namespace) -> list[str]:
    """The names to write, checked before any work starts."""
    if args.all == bool(args.names):
        raise UsageError("name the models or give --all (not both)")
    if args.check and not args.readme_only:
        raise UsageError("--check compares the cards alone: give --readme-only with it")
    chosen = hub.names(data=args.data) if args.all else list(dict.fromkeys(args.names))
    for name in chosen:
        try:
            hub.entry(name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not chosen:
        raise UsageError(f"the zoo has no models of {args.data!r}")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out}: not a folder")
    return chosen


def _check(markdown: dict[str, str], out: Path) -> int:
    """Exit 1 naming each card in ``out`` that is missing or differs from what the zoo writes."""
    stale = [
        n
        for n, text in markdown.items()
        if not (out / n / "README.md").is_file() or (out / n / "README.md").read_text(encoding="utf-8") != text
    ]
    if stale:
        raise CommandError(
            f"cards in {out} differ from what the zoo writes: {', '.join(stale)}; run python -m attnzoo.zoo card "
            f"{' '.join(stale)} --readme-only --out {out}"
        )
    print(f"up to date: {len(markdown)} cards in {out}")
    return 0


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    """Write (or check) model folders, or print the names table."""
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "names":
        print(cards.names_table(args.data))
        return 0
    markdown = {n: cards.card_markdown(n) for n in _chosen(args)}  # every card's sources read before a file is written
    if args.check:
        return _check(markdown, args.out)
    for name, text in tqdm(markdown.items(), desc="model folders", unit="model", disable=len(markdown) < 2):
        tqdm.write(str(cards.write_folder(name, args.out, text, readme_only=args.readme_only)))
    return 0


if __name__ == "__main__":
    main()
