"""Each variant's facts live in its spec, registered beside its class: order, papers, and what other layers read."""

import importlib
import re
from pathlib import Path

import pytest

from attnzoo.models import ARCHS, BUILTIN_VARIANTS, VARIANTS, Paper
from attnzoo.models.memory import forward_bytes
from attnzoo.models.wafe import mae_block

ROOT = Path(__file__).resolve().parents[2]
FAMILY_MODULES = ("standard", "belief", "belief2", "mabvit", "wafe", "hv")


def test_builtin_order_is_the_family_modules_order():
    """The built-ins register in the family modules' order (the list commands check names against,
    ``attnzoo.modelconfig.BUILTIN_VARIANT_NAMES``, is that order: the test below)."""
    modules = [VARIANTS[n].cls.__module__.rsplit(".", 1)[-1] for n in BUILTIN_VARIANTS]
    assert list(dict.fromkeys(modules)) == list(FAMILY_MODULES)
    assert VARIANTS["wafe-dot"] is VARIANTS["standard"] and VARIANTS["standard"].aliases == ("wafe-dot",)


def test_the_light_name_list_is_the_registrys_and_a_builtin_it_lacks_is_refused():
    """Commands check a variant name against ``attnzoo.modelconfig`` before PyTorch is imported: its list is the
    registry's built-ins, in order, with the same aliases, and a built-in registration it does not list (a new
    family module that forgot it) is refused naming what to add."""
    from attnzoo import modelconfig
    from attnzoo.models import ALIASES, register_variant
    from attnzoo.models.standard import StandardAttention

    assert modelconfig.BUILTIN_VARIANT_NAMES == tuple(BUILTIN_VARIANTS)
    assert modelconfig.BUILTIN_VARIANT_ALIASES == {a: n for a, n in ALIASES.items() if VARIANTS[n].builtin}
    assert modelconfig.check_variant("Wafe_Dot") == "standard" and modelconfig.check_variant("belief2") == "belief2"
    unlisted = type("UnlistedAttention", (StandardAttention,), {"__module__": "attnzoo.models.unlisted"})
    with pytest.raises(ValueError, match="built-in variant 'unlisted' .* add it to BUILTIN_VARIANT_NAMES"):
        register_variant("unlisted", unlisted, paper="A paper, https://example.org")
    assert "unlisted" not in VARIANTS


@pytest.mark.parametrize("module_name", FAMILY_MODULES)
def test_each_family_module_cites_its_paper_once_in_its_header(module_name):
    module = importlib.import_module(f"attnzoo.models.{module_name}")
    paper = module.PAPER
    assert isinstance(paper, Paper)
    header = " ".join(module.__doc__.split())
    for part in (paper.title, paper.authors, str(paper.year)):
        assert part in header, (module_name, part)
    arxiv = re.fullmatch(r"https://arxiv\.org/abs/(\d{4}\.\d{4,5})", paper.url)
    if arxiv:
        assert paper.url in header
    assert re.search(r"\beq\. \d", header), f"{module_name}: no equation numbers in the header"
    specs = [VARIANTS[n] for n in BUILTIN_VARIANTS if VARIANTS[n].cls.__module__ == module.__name__]
    assert specs and all(s.paper is paper for s in specs)


def test_the_package_points_to_nothing_outside_the_repository():
    for path in sorted((ROOT / "models").glob("*.py")):
        text = path.read_text()
        assert "shared/" not in text and "SPEC" not in text, path.name


def test_spec_facts_other_layers_read():
    facts = {
        n: (VARIANTS[n].cost_family, VARIANTS[n].pairwise_scores, dict(VARIANTS[n].zoo_options))
        for n in BUILTIN_VARIANTS
    }
    assert facts == {
        "standard": ("standard", False, {}),
        "anti-wafe-dot": ("standard", False, {}),
        "belief": ("belief", False, {}),
        "belief-star": ("belief", False, {}),
        "exclusive": ("belief", False, {}),
        "belief2": ("belief2", False, {"param_matched": True}),
        "mabvit-glu": ("mabvit", False, {}),
        "mabvit-gelu": ("mabvit", False, {}),
        "wafe-mse": ("wafe-mse", False, {}),
        "anti-wafe-mse": ("wafe-mse", False, {}),
        "wafe-mae": ("wafe-mae", True, {}),
        "anti-wafe-mae": ("wafe-mae", True, {}),
        "horizontal": ("horizontal-vertical", False, {}),
        "vertical": ("horizontal-vertical", False, {}),
        "horizontal-vertical": ("horizontal-vertical", False, {}),
    }


@pytest.mark.parametrize("name", ["wafe-mae", "anti-wafe-mae"])
def test_forward_memory_counts_the_pairwise_slab(name):
    a, hw, batch = ARCHS["tiny"], (224, 224), 2
    tokens = (224 // a["patch_size"]) ** 2 + 1
    config = {"arch": "tiny", "task": "cls", "num_classes": 10}
    slab = a["embed_dim"] // a["num_heads"] * mae_block(tokens) * tokens  # fp32 values per image
    assert (
        forward_bytes({**config, "variant": name}, hw, batch)
        - forward_bytes({**config, "variant": "wafe-mse"}, hw, batch)
        == 4 * slab * batch
    )


def test_tables_command_checks_and_updates_marked_markdown(tmp_path, monkeypatch, capsys):
    from attnzoo.errors import CommandExit
    from attnzoo.models import __main__ as tables_cli

    monkeypatch.setattr(tables_cli, "tables", lambda: {"variants-table": "| generated |"})
    page = tmp_path / "page.md"
    page.write_text("intro\n<!-- variants-table -->\n| stale |\n<!-- /variants-table -->\nafter\n")
    with pytest.raises(CommandExit) as exc:
        tables_cli.main(["--check", str(page)])
    assert exc.value.code == 1 and "--update" in str(exc.value)
    assert tables_cli.main(["--update", str(page)]) == 0
    assert page.read_text() == "intro\n<!-- variants-table -->\n| generated |\n<!-- /variants-table -->\nafter\n"
    assert tables_cli.main(["--check", str(page)]) == 0
    unmarked = tmp_path / "plain.md"
    unmarked.write_text("no tables here\n")
    with pytest.raises(CommandExit) as exc:
        tables_cli.main(["--update", str(unmarked), str(page)])
    assert exc.value.code == 2 and "no table markers" in str(exc.value)
