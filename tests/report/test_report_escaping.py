"""Pages written from untrusted values: a forged ``report.json`` (variant, reasons, GPU name, command) and a plugin's
registry metadata (``paper``, ``equations``, ``extra_params``) render as text in ``report.md`` and the index: no raw
HTML, no link but to the report's own folder or a known host, no table cell or row added, no code fence closed."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from attnzoo import mdtext
from attnzoo.report import render
from attnzoo.report.index import write_index

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = (
    "x|y <script>alert(1)</script> <img src=x onerror=alert(1)> [click](javascript:alert(1)) "
    "![i](https://evil.example/p.png) http://evil.example/a www.evil.example ``` `tick`\n| injected | row |\r\n# h"
)


def _forged(base: str = "horizontal") -> dict:
    """A committed report with the hostile text in every field a page shows."""
    r = json.loads((ROOT / "results" / "variant-reports" / base / "report.json").read_text())
    r = copy.deepcopy(r)
    name = HOSTILE.split()[0] + "-v"
    for section in ("export", "fusion"):
        r[section][name] = r[section].pop(base)
    r["variant"] = name
    r["command"] = HOSTILE
    r["environment"]["gpu"] = {"name": HOSTILE}
    r["environment"]["cpu"]["model"] = HOSTILE
    r["identity"].update(paper=HOSTILE, equations=HOSTILE, extra_params=HOSTILE, extra_scopes=[HOSTILE])
    side = r["export"][name]
    side["fp16"] = {"status": "failed", "reason": HOSTILE}
    side["int8"]["placement"] = HOSTILE
    side["source"] = {"kind": "checkpoint", "checkpoint": HOSTILE}
    r["fusable"] = {"status": "failed", "reason": HOSTILE}
    r["fusion"][name]["audit"]["runtimes"][-1]["reason"] = HOSTILE
    r["cost"]["gpu"] = {"status": "absent", "reason": HOSTILE, "rows": []}
    return r


def _outside_code(md: str) -> str:
    """The page without its fenced blocks and code spans (their content renders as literal text)."""
    out, fence = [], None
    for line in md.splitlines():
        m = re.match(r"^(`{3,})", line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and line == fence:
            fence = None
        elif fence is None:
            out.append(re.sub(r"(?<![`\\])(`+)(?!`).*?(?<!`)\1(?!`)", "CODE", line))
    return "\n".join(out)


def _check_page(md: str) -> None:
    text = _outside_code(md)
    low = text.lower()
    assert "<script" not in low and "<img" not in low
    for target in re.findall(r"(?<!\\)\]\(([^)]*)\)", text):  # every link: the folder, a plot, a known host
        assert not re.match(r"(?i)\s*(javascript|data|vbscript):", target), target
        assert "://" not in target or mdtext._known(target), target
    assert "http://evil.example" not in text and "www.evil.example" not in text  # no autolink to an unknown host
    assert "CODE" not in md  # (the marker is free to use)
    lines = text.splitlines()
    assert not any(line.startswith("| injected") or line.startswith("# h") for line in lines)
    # every table row has its header's cells: no value split one with a pipe
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|(-+\|)+$", lines[i + 1]):
            cells = len(re.findall(r"(?<!\\)\|", lines[i]))
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                assert len(re.findall(r"(?<!\\)\|", lines[j])) == cells, lines[j]
                j += 1
            i = j
        else:
            i += 1
    # fenced blocks close with their own fence: the hostile ``` inside one is content
    fences = [line for line in lines if re.match(r"^`{3,}", line)]
    assert len(fences) % 2 == 0 and all(
        fences[k].rstrip("abcdefghijklmnopqrstuvwxyz-") == fences[k + 1] for k in range(0, len(fences), 2)
    )


def test_a_forged_report_json_renders_as_text_in_report_md(tmp_path):
    report = _forged()
    report["verdict"] = render.verdict(report, tmp_path)
    md = render.markdown(report, {})
    _check_page(md)
    assert "x\\|y &lt;script&gt;" in md  # the text is shown, escaped, not dropped
    # the failed steps reach the verdict, with their reasons
    failed = {f["check"] for f in report["verdict"]["failed"]}
    assert {f"export.{report['variant']}.fp16", "fusable"} <= failed


def test_a_forged_report_json_renders_as_text_in_the_index(tmp_path):
    report = _forged()
    report["verdict"] = render.verdict(report, tmp_path)
    report["verdict"]["problems"] = [HOSTILE]
    folder = tmp_path / "forged"
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps(report))
    (folder / "report.md").write_text("x")
    md = write_index(tmp_path).read_text()
    _check_page(md)
    assert "](forged/report.md)" in md


def test_the_escaper_keeps_text_readable_and_links_known():
    assert mdtext.text("belief2 ok (3.2e-06)") == "belief2 ok (3.2e-06)"
    assert mdtext.text("a|b") == "a\\|b" and mdtext.text("a\nb") == "a b"
    assert mdtext.text("https://arxiv.org/abs/2111.09883") == "https://arxiv.org/abs/2111.09883"
    assert mdtext.code("a`b|c") == "``a`b\\|c``"
    assert mdtext.link("x", "javascript:alert(1)") == "x" and mdtext.link("x", "../up/report.md") == "x"
    assert mdtext.link("x", "https://evil.example/") == "x"
    assert mdtext.link("x", "https://arxiv.org/abs/1") == "[x](https://arxiv.org/abs/1)"


@pytest.mark.slow
def test_a_random_init_plugin_with_hostile_metadata_reports_one_model_and_escaped(
    registry_restored, tmp_path, monkeypatch
):
    """report-variant --quick on a plugin variant (no zoo model: a random init). Every file of its side is the same
    seeded model, so the opset-23 file matches the opset-20 one and the fusable section passes; the plugin's
    metadata is text on the page; the verdict names every check that did not pass."""
    from dataclasses import replace

    import torch
    from torch import nn

    from attnzoo.errors import UsageError
    from attnzoo.models import StandardAttention, register_variant
    from attnzoo.report import variant as rv
    from attnzoo.report.variant import QUICK, report_variant

    class Gain(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * self.weight

    class GainAttention(StandardAttention):
        """Standard attention (a dot-product core) with a learnable output gain, its extra math."""

        def __init__(self, dim, num_heads=8, **kw):
            super().__init__(dim, num_heads=num_heads, **kw)
            self.gain = Gain(dim)

        def forward(self, x, attn_mask=None, is_causal=False):
            return self.gain(super().forward(x, attn_mask, is_causal))

    register_variant(
        "tp-hostile", GainAttention, paper=HOSTILE, equations=HOSTILE, extra_params=HOSTILE, extra_scopes=["gain"]
    )

    def not_here(*args, **kwargs):  # the cost sections are the latency tests'; this one is about the exports
        raise UsageError("not measured in this test")

    monkeypatch.setattr(rv, "latency", not_here)
    monkeypatch.setattr(rv, "scaling", not_here)
    budget = replace(QUICK, fusable_rounds=2)
    result = report_variant("tp-hostile", out=tmp_path / "r", quick=True, budget=budget)
    r = result.report
    side = r["export"]["tp-hostile"]
    assert side["source"]["kind"] == "random-init" and side["fp32"]["status"] == "ok" and side["fp32"]["passed"]
    fz = r["fusable"]
    assert fz["status"] == "ok", fz  # the opset-23 file's outputs match the opset-20 file's: the same weights
    assert fz["attention_ops"] == 4 and all(e["fused"] == e["cores"] for e in fz["fused"].values() if e["inspected"])
    assert "tensorrt" in fz["fused"]  # shown, inspected or not
    assert r["cost"]["latency"]["status"] == "unavailable"  # said, not a failure
    assert r["verdict"]["failed"] == render.failures(r) and "did not pass" not in r["verdict"]["line"], r["verdict"]
    _check_page((tmp_path / "r" / "report.md").read_text())
