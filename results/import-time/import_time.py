"""Seconds to import modules of attnzoo from two (or more) source trees, best of N fresh interpreters.

Each tree's ``pyproject.toml`` package-dir is mapped onto ``attnzoo.*`` (as an editable install does), the module
is imported in a new interpreter and timed in-process; the trees are alternated so that a change in the machine's
load hits each alike. Prints, per module and tree, the best time, whether torch was imported and how many modules.

    python results/import-time/import_time.py N MODULE[,MODULE...] TREE [TREE...]
"""

from __future__ import annotations

import subprocess
import sys

DRIVER = """
import importlib, importlib.util, sys, time, tomllib
root, module = sys.argv[1], sys.argv[2]
folders = tomllib.loads(open(root + "/pyproject.toml").read())["tool"]["setuptools"]["package-dir"]
class Tree:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        folder = folders.get(name)
        if folder is None:
            return None
        init = f"{root}/{folder}/__init__.py"
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[f"{root}/{folder}"])
sys.meta_path.insert(0, Tree)
t = time.perf_counter()
m = importlib.import_module(module)
print(time.perf_counter() - t, "torch" in sys.modules, len(sys.modules), m.__file__)
"""


def main() -> None:
    n, modules, trees = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3:]
    best: dict[tuple[str, str], tuple[float, str, str]] = {}
    for _ in range(n):
        for module in modules:
            for tree in trees:
                out = subprocess.run(
                    [sys.executable, "-c", DRIVER, tree, module], capture_output=True, text=True, check=True
                ).stdout.split()
                assert out[3].startswith(tree), f"{module} came from {out[3]}, not {tree}"
                seconds = min(best.get((module, tree), (float("inf"),))[0], float(out[0]))
                best[(module, tree)] = (seconds, out[1], out[2])
    for (module, tree), (seconds, torch, count) in best.items():
        print(f"{module:30s} {tree:14s} {seconds:6.2f} s  torch={torch:5s} modules={count}")


if __name__ == "__main__":
    main()
