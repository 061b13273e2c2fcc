"""``python -m attnzoo.runtime``: print the deployment targets and the backend registry (markdown): each target with
its backends and formats and whether its library is installed; each backend's one name, its aliases, what it runs,
and whether it runs here and if not why -- as ``python -m attnzoo.models`` prints the variants."""

from __future__ import annotations

import argparse
import sys

from attnzoo.lazy import lazy_import

from .backends import describe, get_backend
from .targets import targets

torch = lazy_import("torch")


def backends_table(dtype: str = "fp32", device: str | None = None) -> str:
    """Markdown table of :func:`attnzoo.runtime.backends.describe` at ``dtype`` (``device``: the PyTorch device
    of eager / compile; default CUDA when a GPU is visible, else the CPU)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [
        "| backend | aliases | takes | computes on | precisions | " + f"runs {dtype} here |",
        "|---|---|---|---|---|---|",
    ]
    for r in describe(dtype, device):
        where = get_backend(r["name"]).row_device(device)
        here = "yes" if r["runs_here"] else f"no: {r['reason']}"
        rows.append(
            f"| `{r['name']}` | {', '.join(f'`{a}`' for a in r['aliases']) or '-'} | "
            f"{'the PyTorch model' if r['takes'] == 'module' else 'verified ONNX'} | {where} | "
            f"{', '.join(r['dtypes'])} | {here} |"
        )
    return "\n".join(rows)


def targets_table() -> str:
    """Markdown table of the deployment targets (:func:`attnzoo.runtime.targets.targets`)."""
    rows = ["| target | what | backends | export formats | installed here |", "|---|---|---|---|---|"]
    for t in targets():
        reason = t.unavailable_reason()
        rows.append(
            f"| `{t.name}` | {t.summary} | {', '.join(f'`{b.name}`' for b in t.backends) or '-'} | "
            f"{', '.join(f'`{f}`' for f in t.formats) or '-'} | {'yes' if reason is None else f'no: {reason}'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnzoo.runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp32", help="the precision to check (default fp32)")
    parser.add_argument("--device", default=None, choices=("cpu", "cuda"), help="PyTorch device of eager / compile")
    args = parser.parse_args(argv)
    print(targets_table() + "\n\n" + backends_table(args.dtype, args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
