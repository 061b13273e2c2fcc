"""``report-variant``: one command that says whether an attention variant deploys and what it costs.

The command parses its flags, calls :func:`attnzoo.report.report_variant` (which measures everything and writes
the folder) and prints the one-line verdict.

Examples::

    report-variant --variant belief2                       # the zoo's belief2: at most 10 minutes on 2 cores
    report-variant --variant belief2 --quick               # micro models, small sizes: a minute or two
    report-variant --variant mine --checkpoint runs/mine_cls_fashion.safetensors --out reports/mine

Errors: one ``error: ...`` line; exit 2 for a bad command line (an unknown variant lists the valid ones), 1 for
a failure (see :mod:`attnzoo.cli`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from attnzoo.cli import add_debug_flag, entry_point

from .variant import command_line, report_variant

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="report-variant",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="docs/report-variant.md describes the report and its JSON schema.",
    )
    parser.add_argument("--variant", required=True, help="a registered variant (built-in or plugin)")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="your weights (default: the zoo's classifier of the variant, else a random init with "
        "accuracy marked absent)",
    )
    parser.add_argument("--out", type=Path, default=None, help="report folder (default variant-reports/VARIANT)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="micro models, small sizes, short timing: a minute or two instead of up to 10",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the verdict (no section progress on stderr)")
    return add_debug_flag(parser)


@entry_point
def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(arguments)
    result = report_variant(
        args.variant,
        checkpoint=args.checkpoint,
        out=args.out,
        quick=args.quick,
        command=command_line([x for x in arguments if x != "--debug"]),
        progress=not args.quiet,
    )
    print(result.verdict, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
