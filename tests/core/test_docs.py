"""The documentation points only at what exists, and its generated tables are the registry's.

Checked in README.md, docs/*.md and results/**/README.md: every relative link (and its #section, when it names
one) and every backticked repository path, which must resolve from the page's folder or the repository root. A
backticked token is a path when it names a folder (ends with ``/``), starts with ``../``, or starts with a
top-level entry of the repository (``models/wafe.py``) or of the page's folder; placeholders (``<variant>``,
``*``, ``...``) and command lines are not paths.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from attnzoo.models.__main__ import main as models_main

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "results").rglob("README.md")])
#: Top-level entries a root-relative path may start with: what the repository tracks, not run outputs (runs/,
#: exports/) that a command writes.
TOP_LEVEL = {p.name for p in ROOT.iterdir() if not p.name.startswith(".") or p.name == ".ci"} - {
    "attnzoo.egg-info",
    "test-artifacts",
    ".venv",
}
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_PLACEHOLDER = re.compile(r"[<>*?{}$~|]")


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def _prose(text: str) -> str:
    """``text`` without fenced code blocks."""
    return _FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(page: Path) -> set:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", _prose(page.read_text()), re.M)}


def _links(page: Path) -> Iterator[tuple[str, Path, str]]:
    """(link as written, file it names, #section or '') of every relative link of ``page``."""
    for target in _LINK.findall(_prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        yield target, (page.parent / path if path else page), anchor


def _repo_paths(page: Path) -> Iterator[str]:
    """Every backticked repository path of ``page``, as written."""
    own = {p.name for p in page.parent.iterdir()}
    for token in _CODE.findall(_prose(page.read_text())):
        token = re.sub(r":\d+(-\d+)?$", "", token.strip())  # file.py:335 -> file.py
        if " " in token or "..." in token or _PLACEHOLDER.search(token):
            continue
        first = token.split("/", 1)[0]
        if (
            token.endswith("/")
            or token.startswith("../")
            or (first in own | TOP_LEVEL and ("/" in token or (ROOT / token).is_file()))
        ):
            yield token


@cache
def _tracked() -> frozenset[Path] | None:
    """Every file git tracks and every folder above one, or None outside a git checkout (an unpacked sdist)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    files = [ROOT / name for name in listed.decode().split("\0") if name]
    return frozenset(files + [parent for f in files for parent in f.parents])


def _ignored(page: Path, tokens: list[str]) -> set[str]:
    """The ``tokens`` of ``page`` that git ignores, read from the page's folder or the root: a tool's output
    (``.mypy_cache/``, ``runs/``), not a repository path."""
    asked = {
        os.path.relpath((base / token).resolve(), ROOT) + ("/" if token.endswith("/") else ""): token
        for token in tokens
        for base in (page.parent, ROOT)
    }
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(asked),
        capture_output=True,
        text=True,
    )
    return {asked[line] for line in done.stdout.splitlines() if line in asked}


def _exists(page: Path, token: str) -> bool:
    """A path resolves from the page's folder or from the repository root to something the checkout holds as
    a fresh clone does: a tracked file or a folder holding one, never a file a tool or a test left behind."""
    tracked = _tracked()
    candidates = [(page.parent / token).resolve(), (ROOT / token).resolve()]
    if tracked is None:
        return any(path.exists() for path in candidates)
    return any(path in tracked for path in candidates)


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_relative_link_resolves(page):
    broken = []
    for target, path, anchor in _links(page):
        if not path.exists():
            broken.append(f"{target}: no such file or folder")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target}: {path.name} has no section #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_backticked_repository_path_exists(page):
    tokens = list(_repo_paths(page))
    paths = set(tokens) - _ignored(page, tokens)
    missing = sorted({token for token in paths if not _exists(page, token)})
    assert not missing, (
        f"{page.relative_to(ROOT)} names paths a fresh clone does not hold (a new file: git add it): "
        + ", ".join(missing)
    )


def test_the_checks_catch_a_broken_link_and_path(tmp_path):
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n\nSee [x](missing.md), [y](README.md#nowhere), [z](README.md#title) and "
        "`results/no-such-run/` or `models/wafe.py`.\n```\n`results/in-a-code-block/`\n```\n"
    )
    assert [(t, a) for t, _, a in _links(page)] == [
        ("missing.md", ""),
        ("README.md#nowhere", "nowhere"),
        ("README.md#title", "title"),
    ]
    assert "nowhere" not in _anchors(page) and "title" in _anchors(page)
    assert [(t, _exists(page, t)) for t in _repo_paths(page)] == [
        ("results/no-such-run/", False),
        ("models/wafe.py", True),
    ]


def test_a_path_counts_only_as_a_fresh_clone_holds_it(tmp_path):
    """A file a run left in the checkout (untracked) is not a repository path, and a tool's ignored cache is not
    checked at all, so the result is the same in a fresh clone and after mypy, pytest or a command has run."""
    left = ROOT / "results" / f"left-by-a-run-{tmp_path.name}.md"
    left.write_text("x")
    try:
        assert left.exists() and not _exists(tmp_path / "README.md", str(left.relative_to(ROOT)))
    finally:
        left.unlink()
    page = ROOT / "docs" / "contributing.md"
    assert _ignored(page, [".mypy_cache/", "runs/", "models/"]) == {".mypy_cache/", "runs/"}
    assert _exists(page, "models/")


def test_variant_tables_are_the_registrys(capsys):
    """README.md and docs/variants.md carry ``python -m attnzoo.models``' tables for the built-ins."""
    assert models_main(["--check", str(ROOT / "README.md"), str(ROOT / "docs" / "variants.md")]) == 0
    assert "up to date" in capsys.readouterr().out


def test_the_readme_links_every_docs_page():
    linked = {path.resolve() for _, path, _ in _links(ROOT / "README.md")}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md links no docs page named {', '.join(unlinked)}"
