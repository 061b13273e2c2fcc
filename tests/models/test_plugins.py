"""Your own attention variant: register_variant, the attnzoo.variants entry points, bad input, the example
plugin's math, and the whole command path with the example installed as its own package."""

import json
import math
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from timm.layers import Attention
from torch import nn

from attnzoo.export import export_verified, report_path
from attnzoo.export.check import check_extra_math, expected_scopes
from attnzoo.export.verify import VerificationError
from attnzoo.models import (
    BUILTIN_VARIANTS,
    VARIANT_NAMES,
    VARIANTS,
    PluginWarning,
    canonical_name,
    create_model,
    load_plugins,
    register_variant,
    registry,
)
from attnzoo.models.checkpoint import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "attnzoo-cosine"
DEPTH = 4  # micro


class Scaled(nn.Module):
    """A scope with one op: multiply by a learned scalar."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return x * self.gain


class GainAttention(Attention):
    """timm's Attention whose output goes through the ``gain`` scope."""

    def __init__(self, dim, num_heads=8, **kwargs):
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.gain = Scaled()

    def forward(self, x, attn_mask=None, is_causal=False):
        return self.gain(super().forward(x, attn_mask=attn_mask))


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------------------------ registration
def test_builtins_register_through_the_same_call():
    assert len(BUILTIN_VARIANTS) == 15 and tuple(VARIANT_NAMES)[:15] == BUILTIN_VARIANTS
    assert all(VARIANTS[n].builtin and VARIANTS[n].package == "attnzoo" for n in BUILTIN_VARIANTS)
    assert not hasattr(registry, "PROJECTION_VARIANTS")
    import attnzoo.export.check as check

    assert not hasattr(check, "PROJECTION_MODULES")


@pytest.mark.slow  # a plugin variant trained, exported and verified (about 10 s)
def test_registered_variant_is_listed_built_and_exported_with_its_scope(registry_restored, tmp_path):
    spec = register_variant(
        "tp-gain", GainAttention, paper="Test paper, https://example.org", equations="eq. 1", extra_scopes=["gain"]
    )
    assert "tp-gain" in VARIANT_NAMES and VARIANT_NAMES[-1] == "tp-gain" and VARIANTS["tp-gain"] is spec
    assert spec.package == __name__.split(".")[0] and not spec.builtin
    from attnzoo.models.__main__ import variants_table

    row = [r for r in variants_table("micro").splitlines() if r.startswith("| `tp-gain`")]
    assert len(row) == 1 and "Test paper, https&#58;//example.org" in row[0] and "`gain`" in row[0]  # no autolink
    model = create_model("tp-gain", num_classes=3)
    assert "plugin" not in model.attnzoo_config  # registered by a module no installed distribution provides
    # fp16: the scope's nodes in every block, computing in fp32 (the fp32 export is the slow whole-path test's)
    report = export_verified(model, tmp_path / "g.onnx", model.attnzoo_config, dtype="fp16", batch_sizes=[1])
    assert report["passed"], report["failures"]
    blocks = report["extra_math"]["blocks"]
    assert set(blocks) == {f"blocks.{i}.attn.gain" for i in range(DEPTH)}
    assert all(b["ops"].get("Mul", 0) >= 1 for b in blocks.values())
    proto = onnx.load(str(tmp_path / "g.onnx"))
    assert expected_scopes(model.attnzoo_config, DEPTH) == [f"blocks.{i}.attn.gain" for i in range(DEPTH)]
    types = {v.name: v.type.tensor_type.elem_type for v in onnx.shape_inference.infer_shapes(proto).graph.value_info}
    muls = [n for n in proto.graph.node if n.name.startswith("blocks.0.attn.gain/Mul")]
    assert muls and all(types[n.output[0]] == onnx.TensorProto.FLOAT for n in muls)  # fp32 in the fp16 graph
    assert any(t == onnx.TensorProto.FLOAT16 for t in types.values())  # ... which really is fp16 elsewhere
    # the same graph checked for a variant that also requires a Div in the scope: one failure per block
    register_variant("tp-gain-div", GainAttention, paper="p", extra_scopes={"gain": {"Mul": 1, "Div": 1}})
    result = check_extra_math(proto, {**model.attnzoo_config, "variant": "tp-gain-div"})
    assert result["failures"] == [f"blocks.{i}.attn.gain: 0 Div node(s), need 1" for i in range(DEPTH)]


def test_a_plugins_metadata_renders_as_text_in_the_variant_tables(registry_restored, monkeypatch):
    """``python -m attnzoo.models`` puts a plugin's paper, equations, extra parameters and package into Markdown
    tables: each goes through attnzoo.mdtext, as the report pages do (no raw HTML, no link to an unknown host or a
    ``javascript:`` address, no table cell or row added)."""
    from attnzoo.models.__main__ import extra_weights_table, papers_table, variants_table
    from tests.report.test_report_escaping import HOSTILE, _check_page

    monkeypatch.setattr(registry._PLUGINS, "running", [(HOSTILE, HOSTILE)])  # as if an entry point of that package ran
    register_variant(
        "tp-hostile", GainAttention, paper=HOSTILE, equations=HOSTILE, extra_params=HOSTILE, extra_scopes=["gain"]
    )
    page = "\n\n".join([variants_table("micro"), papers_table(), extra_weights_table()])
    _check_page(page)
    rows = [r for r in page.splitlines() if r.startswith("| `tp-hostile`") or "x\\|y" in r]
    assert len(rows) == 3 and all("x\\|y &lt;script&gt;" in r for r in rows), rows  # shown, escaped, not dropped


def _post_norm_block(post_norm: bool):
    from timm.models.vision_transformer import ResPostBlock

    return ResPostBlock if post_norm else None


def _halve_mlp(halve: bool, hidden: int, build) -> int:
    return hidden // 2 if halve else hidden


def test_plugin_declares_model_options_the_factory_and_train_model_apply(registry_restored, tmp_path):
    """A made-up variant declares two model options of its own (post-norm blocks, a halved MLP) and reuses
    MABViT's ``parallel``: create_model and ``train-model --option`` apply them, the checkpoint records them,
    and an unknown option is refused listing the valid ones."""
    from timm.models.vision_transformer import Block, ResPostBlock

    from attnzoo.models import ModelOption, ParallelBlock
    from attnzoo.models.mabvit import PARALLEL
    from attnzoo.training import cli

    register_variant(
        "tp-post",
        GainAttention,
        paper="p",
        extra_scopes=["gain"],
        model_options={
            "post_norm": ModelOption(False, block_fn=_post_norm_block),
            "halve_mlp": ModelOption(False, mlp_hidden=_halve_mlp),
            "parallel": PARALLEL,
        },
    )
    assert VARIANTS["tp-post"].valid_options == ("post_norm", "halve_mlp", "parallel")
    plain = create_model("tp-post", num_classes=2)
    assert type(plain.blocks[0]) is Block and plain.blocks[0].mlp.fc1.out_features == 4 * plain.embed_dim
    model = create_model("tp-post", num_classes=2, post_norm=True, halve_mlp=True)
    assert all(type(b) is ResPostBlock for b in model.blocks)
    assert model.blocks[0].mlp.fc1.out_features == 2 * model.embed_dim
    assert model.attnzoo_config["options"] == {"post_norm": True, "halve_mlp": True, "parallel": False}
    assert type(create_model("tp-post", num_classes=2, parallel=True).blocks[0]) is ParallelBlock
    # train-model --option: applied, recorded in the checkpoint, and rebuilt from it
    assert (
        cli.main(
            [
                "--variant",
                "tp-post",
                "--option",
                "post_norm=true",
                "--data",
                "shapes",
                "--epochs",
                "1",
                "--train-size",
                "16",
                "--val-size",
                "8",
                "--batch-size",
                "8",
                "--out",
                str(tmp_path),
                "--threads",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    ckpt = tmp_path / "tp-post_cls_shapes.safetensors"
    loaded, config = load_checkpoint(ckpt)
    assert config["options"]["post_norm"] is True and all(type(b) is ResPostBlock for b in loaded.blocks)
    # bad input: one line, naming the valid options
    for argv, message in [
        (
            ["--option", "bogus=1"],
            "unknown option(s) bogus for variant 'tp-post'; valid options: post_norm, halve_mlp, parallel",
        ),
        (["--option", "post_norm=7"], "option post_norm of variant 'tp-post': must be true or false, got 7"),
    ]:
        with pytest.raises(SystemExit) as exc:
            cli.main(["--variant", "tp-post", *argv, "--no-progress", "--train-size", "8", "--out", str(tmp_path)])
        assert str(exc.value) == f"error: {message}"


@pytest.mark.parametrize(
    "model_options, message",
    [
        ({"post_norm": False}, "model option 'post_norm' must be an attnzoo.models.ModelOption"),
        ({"post-norm": None}, "model option name 'post-norm' must be a Python identifier"),
        ({"halve": "noop-option"}, "model option 'halve' changes nothing in the model"),
        ({"halve": "bad-default"}, "the default of model option 'halve' is refused by its own check: must be true"),
    ],
)
def test_bad_model_option_refused_at_registration(registry_restored, model_options, message):
    from attnzoo.models import ModelOption

    made = {
        "noop-option": ModelOption(False),
        "bad-default": ModelOption("no", mlp_hidden=_halve_mlp, check=ModelOption(False).validate),
    }
    model_options = {k: made.get(v, v) for k, v in model_options.items()}
    with pytest.raises(ValueError, match=message) as exc:
        register_variant("tp-bad", GainAttention, paper="p", model_options=model_options)
    _one_line(exc)
    assert "tp-bad" not in VARIANTS


class NoTimmKeywords(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x, attn_mask=None):
        return self.lin(x)


class WrongShape(GainAttention):
    def forward(self, x, attn_mask=None, is_causal=False):
        return super().forward(x)[:, 0]


class PassThrough(nn.Module):
    def forward(self, x):
        return x


class NoOpScopeAttention(Attention):
    """Its ``noop`` scope runs but computes nothing, so the graph holds no node named after it."""

    def __init__(self, dim, num_heads=8, **kwargs):
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.noop = PassThrough()

    def forward(self, x, attn_mask=None, is_causal=False):
        return self.noop(super().forward(x, attn_mask=attn_mask))


class UnusedScopeAttention(GainAttention):
    def forward(self, x, attn_mask=None, is_causal=False):
        return Attention.forward(self, x, attn_mask=attn_mask)


@pytest.mark.parametrize(
    "cls, scopes, message",
    [
        (NoTimmKeywords, (), r"variant 'tp-bad': NoTimmKeywords does not take timm's Attention constructor keywords"),
        (
            WrongShape,
            ("gain",),
            r"variant 'tp-bad': WrongShape.forward returns \(2, 32\), expected the input's "
            r"shape \(2, 5, 32\)",
        ),
        (
            GainAttention,
            ("nope",),
            r"variant 'tp-bad': extra scope 'nope' is not a sub-module of GainAttention "
            r"\(its sub-modules: .*gain",
        ),
        (GainAttention, ("half",), r"variant 'tp-bad': extra scope 'half' is not a sub-module of GainAttention"),
        (
            UnusedScopeAttention,
            ("gain",),
            r"variant 'tp-bad': extra scope\(s\) gain never run in "
            r"UnusedScopeAttention.forward",
        ),
        (GainAttention, "gain", r"variant 'tp-bad': extra_scopes must be a list"),
    ],
)
def test_bad_variant_refused_at_registration(registry_restored, cls, scopes, message):
    with pytest.raises(ValueError, match=message) as exc:
        register_variant("tp-bad", cls, paper="p", extra_scopes=scopes)
    _one_line(exc)
    assert "tp-bad" not in VARIANT_NAMES and "tp-bad" not in VARIANTS


@pytest.mark.parametrize(
    "name, message",
    [("belief", "clashes with variant 'belief' from package 'attnzoo'"), ("My_Variant", "must be lower-case letters")],
)
def test_bad_name_refused(registry_restored, name, message):
    with pytest.raises(ValueError, match=message) as exc:
        register_variant(name, GainAttention, paper="p")
    _one_line(exc)
    assert VARIANTS["belief"].package == "attnzoo"


def test_alias_resolves_to_its_variant_and_a_clash_is_refused(registry_restored):
    spec = register_variant("tp-gain", GainAttention, paper="p", aliases=("tp-scaled",))
    assert VARIANTS["tp-scaled"] is spec and canonical_name("TP_Scaled") == "tp-gain"
    assert "tp-scaled" not in VARIANT_NAMES  # an alias is not a second variant
    assert create_model("tp-scaled", num_classes=2).attnzoo_config["variant"] == "tp-gain"
    with pytest.raises(
        ValueError, match="variant 'wafe-dot' from package .* clashes with variant 'standard' from package 'attnzoo'"
    ) as exc:
        register_variant("tp-other", GainAttention, paper="p", aliases=("wafe-dot",))
    _one_line(exc)
    assert "tp-other" not in VARIANTS and VARIANTS["wafe-dot"].name == "standard"


@pytest.mark.slow  # exports of a plugin variant (about 7 s)
def test_scope_without_graph_ops_refused_before_export_writes(registry_restored, tmp_path):
    register_variant("tp-noop", NoOpScopeAttention, paper="p", extra_scopes=["noop"])
    model = create_model("tp-noop", num_classes=3)
    out = tmp_path / "n.onnx"
    with pytest.raises(VerificationError) as exc:
        export_verified(model, out, model.attnzoo_config, batch_sizes=[1])
    text = _one_line(exc)
    assert (
        "blocks.0.attn.noop: no nodes named blocks.0.attn.noop/... (variant 'tp-noop' declares extra scope 'noop'"
        in text
        and "n.onnx was not written" in text
    )
    assert not out.exists()


def _network(*layers):
    """A stand-in for a parsed TensorRT network: (name, layer type, output dtypes) per layer."""
    from types import SimpleNamespace as NS

    made = [
        NS(name=n, type=NS(name=t), num_outputs=len(outs), get_output=lambda j, outs=outs: NS(dtype=NS(name=outs[j])))
        for n, t, outs in layers
    ]
    return NS(num_layers=len(made), get_layer=lambda i: made[i])


def test_tensorrt_check_covers_every_op_of_a_variants_own_scope():
    from attnzoo.targets.tensorrt import check_network_precision

    s = "blocks.0.attn.my_scope"
    ops = {f"{s}/Cast": "Cast", f"{s}/MatMul": "MatMul", f"{s}/Concat": "Concat", f"{s}/Sigmoid": "Sigmoid"}
    fp32 = _network(
        (f"{s}/Cast", "CAST", ["FLOAT"]),
        (f"{s}/MatMul", "MATRIX_MULTIPLY", ["FLOAT"]),
        (f"{s}/Concat", "CONCATENATION", ["INT64"]),
        (f"{s}/Sigmoid", "ACTIVATION", ["FLOAT"]),
    )
    result = check_network_precision(fp32, {s: list(ops)}, ops)
    assert result["ok"] and result["blocks"][s] == {"layers": 2, "fp32": 2}  # MatMul, Sigmoid; not Cast, Concat
    half = _network((f"{s}/MatMul", "MATRIX_MULTIPLY", ["HALF"]), (f"{s}/Sigmoid", "ACTIVATION", ["FLOAT"]))
    result = check_network_precision(half, {s: list(ops)}, ops)
    assert result["failures"] == [f"{s}: {s}/MatMul computes in HALF, not FLOAT (fp32)"]
    result = check_network_precision(_network(("other/MatMul", "MATRIX_MULTIPLY", ["FLOAT"])), {s: list(ops)}, ops)
    assert result["failures"] == [f"{s}: none of its ops is a layer of the TensorRT network"]


# ------------------------------------------------------------------------------------------------ entry points
@pytest.fixture
def only_fake_plugins(monkeypatch):
    """load_plugins sees only this file's fake distributions (modules ``tp_*``), not plugins the user installed
    (e.g. ``pip install ./examples/attnzoo-cosine``, whose variant is already registered)."""
    import importlib.metadata as md

    real = md.entry_points

    def fake(**selection):
        return md.EntryPoints(ep for ep in real(**selection) if ep.value.startswith("tp_"))

    monkeypatch.setattr(md, "entry_points", fake)


def _fake_dist(root: Path, dist: str, version: str, module: str, code: str, entry: str = "register") -> None:
    """An installed distribution as importlib.metadata sees it: a module and a dist-info with the entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(code))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[attnzoo.variants]\n{module} = {module}:{entry}\n")


_GOOD = """
from torch import nn
from timm.layers import Attention
from attnzoo.models import register_variant

class Halve(nn.Module):
    def forward(self, x):
        return x * 0.5

class HalveAttention(Attention):
    def __init__(self, dim, num_heads=8, **kwargs):
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.halve = Halve()

    def forward(self, x, attn_mask=None, is_causal=False):
        return self.halve(super().forward(x, attn_mask=attn_mask))

def register():
    register_variant("{name}", HalveAttention, paper="Plugin paper", extra_scopes=["halve"])
"""


def test_plugins_load_and_failures_are_one_warning_each(registry_restored, only_fake_plugins, tmp_path, monkeypatch):
    _fake_dist(tmp_path, "tp-good", "1.2", "tp_good", _GOOD.replace("{name}", "tp-half"))
    _fake_dist(tmp_path, "tp-broken", "0.1", "tp_broken", "import not_a_module_anywhere\n")
    _fake_dist(tmp_path, "tp-builtin-clash", "0.1", "tp_builtin_clash", _GOOD.replace("{name}", "belief2"))
    _fake_dist(tmp_path, "tp-other-clash", "3.0", "tp_other_clash", _GOOD.replace("{name}", "tp-half"))
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        added = load_plugins()
    assert added == ["tp-half"], [str(w.message) for w in caught]
    spec = VARIANTS["tp-half"]
    assert (spec.package, spec.version, spec.paper, spec.extra_scopes) == ("tp-good", "1.2", "Plugin paper", ("halve",))
    texts = sorted(str(w.message) for w in caught if issubclass(w.category, PluginWarning))
    assert len(texts) == 3 and all("\n" not in t for t in texts)
    broken, builtin_clash, other_clash = texts
    assert broken.startswith("attnzoo variant plugin 'tp_broken' (tp-broken 0.1) skipped: ModuleNotFoundError")
    assert (
        "variant 'belief2' from package 'tp-builtin-clash' clashes with variant 'belief2' from package "
        "'attnzoo'" in builtin_clash
    )
    assert (
        "variant 'tp-half' from package 'tp-other-clash' clashes with variant 'tp-half' from package "
        "'tp-good'" in other_clash
    )
    assert VARIANTS["belief2"].package == "attnzoo"


_EXITS = """
import sys

def register():
    sys.exit(3)
"""

_REPLACES_BUILTIN = """
from dataclasses import replace
from attnzoo.models import registry

def register():
    registry.VARIANTS["standard"] = replace(registry.VARIANTS["standard"], equations="not the paper's")
    registry.ALIASES["softmax"] = "standard"
"""


def test_plugin_that_exits_or_replaces_a_builtin_is_skipped(
    registry_restored, only_fake_plugins, tmp_path, monkeypatch
):
    _fake_dist(tmp_path, "tp-exits", "0.1", "tp_exits", _EXITS)
    _fake_dist(tmp_path, "tp-good", "1.2", "tp_good", _GOOD.replace("{name}", "tp-half"))
    _fake_dist(tmp_path, "tp-replaces", "0.2", "tp_replaces", _REPLACES_BUILTIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    standard = VARIANTS["standard"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        added = load_plugins()  # before: SystemExit(3) ended the process, every command's --help included
    assert added == ["tp-half"]
    texts = sorted(str(w.message) for w in caught if issubclass(w.category, PluginWarning))
    assert texts == [
        "attnzoo variant plugin 'tp_exits' (tp-exits 0.1) skipped: it called sys.exit(3)",
        "attnzoo variant plugin 'tp_replaces' (tp-replaces 0.2) skipped: it changed the built-in variant entries "
        "'standard'",
    ]
    assert VARIANTS["standard"] is standard and "softmax" not in registry.ALIASES
    assert tuple(VARIANT_NAMES)[:15] == tuple(BUILTIN_VARIANTS) and VARIANT_NAMES[-1] == "tp-half"


def test_plugins_load_at_the_first_lookup_not_at_import(registry_restored, only_fake_plugins, tmp_path, monkeypatch):
    _fake_dist(tmp_path, "tp-good", "1.2", "tp_good", _GOOD.replace("{name}", "tp-half"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry._PLUGINS, "loaded", False)  # as right after ``import attnzoo.models``
    assert len(BUILTIN_VARIANTS) == 15 and registry._PLUGINS.loaded is False  # the built-ins need no plugin
    assert "tp-half" in VARIANTS and canonical_name("tp-half") == "tp-half" and registry._PLUGINS.loaded is True


def test_a_lookup_in_another_thread_waits_for_the_plugins(registry_restored, only_fake_plugins, tmp_path, monkeypatch):
    """serve-models looks variants up from several threads: one that comes while another loads the plugins waits
    for them instead of seeing the built-ins alone."""
    import threading
    import time

    started = tmp_path / "started"
    wait = f"def register():\n    open({str(started)!r}, 'w').close()\n    time.sleep(0.5)"
    _fake_dist(  # a module name of its own: another test's tp_good may already be imported in this process
        tmp_path,
        "tp-thread",
        "1.2",
        "tp_thread",
        "import time\n" + _GOOD.replace("{name}", "tp-half").replace("def register():", wait),
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry._PLUGINS, "loaded", False)
    loader = threading.Thread(target=lambda: canonical_name("standard"))
    loader.start()
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert started.exists()  # the loader is inside the plugin's register()
    assert "tp-half" in VARIANTS
    loader.join()


def test_a_plugin_that_hangs_is_skipped_after_the_limit_with_one_warning(
    registry_restored, only_fake_plugins, tmp_path, monkeypatch
):
    """A ``register()`` that does not return is waited for PLUGIN_REGISTER_TIMEOUT_S (attnzoo/limits.py), then
    skipped with one line naming it; the other plugins load, and what it registers once it wakes is refused."""
    import threading
    import time

    from attnzoo import limits

    late = "import time\n" + _GOOD.replace("{name}", "tp-late").replace(
        "def register():", "def register():\n    time.sleep(1.5)"
    )
    _fake_dist(tmp_path, "tp-sleeps", "0.3", "tp_sleeps", late)
    _fake_dist(tmp_path, "tp-good", "1.2", "tp_good", _GOOD.replace("{name}", "tp-half"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(limits, "PLUGIN_REGISTER_TIMEOUT_S", 0.3)
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        added = load_plugins()
    took = time.monotonic() - start
    texts = [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]
    assert added == ["tp-half"] and took < 1.4, (added, took)
    assert texts == [
        "attnzoo variant plugin 'tp_sleeps' (tp-sleeps 0.3) skipped: its entry point did not return within 0.3 s "
        "(PLUGIN_REGISTER_TIMEOUT_S in attnzoo/limits.py)"
    ]
    sleeper = next(t for t in threading.enumerate() if t.name == "attnzoo-plugin-tp_sleeps")
    assert sleeper.daemon  # never holds the process at exit
    sleeper.join(30)
    assert not sleeper.is_alive() and "tp-late" not in VARIANTS and "tp-late" not in VARIANT_NAMES


@pytest.mark.slow
def test_a_plugin_that_exits_or_hangs_leaves_import_and_help_alone(tmp_path):
    """Importing the package and a command's --help run no plugin; a lookup skips the exiting one with one line."""
    _fake_dist(tmp_path, "tp-exits", "0.1", "tp_exits", _EXITS)
    _fake_dist(tmp_path, "tp-hangs", "0.1", "tp_hangs", "import time\n\ndef register():\n    time.sleep(3600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    code = "import attnzoo.models, attnzoo.export.cli as c; c.build_parser().format_help(); print('imported')"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stdout.strip(), proc.stderr) == (0, "imported", "")
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("bench-latency")), "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "usage: bench-latency" in proc.stdout and proc.stderr == ""
    (tmp_path / "tp_hangs-0.1.dist-info" / "entry_points.txt").unlink()  # else the lookup waits the 30 s limit for it
    code = "from attnzoo.models import VARIANTS; print(len(VARIANTS) > 15)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stdout.strip()) == (0, "True")
    assert proc.stderr.splitlines() == [
        "attnzoo.variants:0: PluginWarning: attnzoo variant plugin 'tp_exits' (tp-exits 0.1) skipped: it called "
        "sys.exit(3)"
    ]


def test_checkpoint_records_the_plugin_and_names_it_when_missing(
    registry_restored, only_fake_plugins, tmp_path, monkeypatch
):
    _fake_dist(tmp_path, "tp-good", "1.2", "tp_good", _GOOD.replace("{name}", "tp-half"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_plugins() == ["tp-half"]
    model = create_model("tp-half", num_classes=2)
    path = tmp_path / "ck" / "half.safetensors"
    config = save_checkpoint(model, path, class_names=["a", "b"])
    assert config["plugin"] == {"package": "tp-good", "version": "1.2"}
    loaded, _ = load_checkpoint(path)  # with the plugin: loads
    assert loaded.attnzoo_config["variant"] == "tp-half"
    registry._ORDER.remove("tp-half")  # as in an environment without the package
    del registry.VARIANTS["tp-half"]
    with pytest.raises(ValueError) as exc:
        load_checkpoint(path)
    text = _one_line(exc)
    assert "variant 'tp-half' comes from the plugin package 'tp-good' 1.2, which is not installed here" in text
    assert "pip install 'tp-good==1.2'" in text


_SUBCLASSING = """
from attnzoo.models import StandardAttention, register_variant  # imports attnzoo.models, which loads plugins

class DirectAttention(StandardAttention):
    def scores_attention(self, x, q, k, v, attn_mask, is_causal):
        return self.softmax_attend(q @ k.transpose(-2, -1), v, attn_mask, is_causal)

def register():
    register_variant("tp-direct", DirectAttention, paper="p")
"""


@pytest.mark.slow
def test_a_plugin_module_imported_first_still_registers(tmp_path):
    """``import tp_direct`` before attnzoo.models: its entry point cannot run during that import (the module has
    not defined it yet), so it runs at the first name lookup, with no warning."""
    _fake_dist(tmp_path, "tp-direct", "1.0", "tp_direct", _SUBCLASSING)
    code = (
        "import warnings; warnings.filterwarnings('error', message='attnzoo variant plugin')\n"
        "import tp_direct\n"
        "from attnzoo.models import VARIANTS, canonical_name, create_model\n"
        "print(canonical_name('tp-direct'), VARIANTS['tp-direct'].package, "
        "type(create_model('tp-direct', num_classes=2).blocks[0].attn).__mro__[1].__name__)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["tp-direct", "tp-direct", "DirectAttention"]


# ------------------------------------------------------------------------------------------------ the example
@pytest.fixture
def cosine_module(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import attnzoo_cosine

    return attnzoo_cosine


def _cosine_reference(layer, x: np.ndarray) -> np.ndarray:
    """Swin V2 eq. 2 written out for every query i and key j of every head (B = 0), then softmax, the weighted
    sum of values and timm's output projection."""
    w_qkv = layer.qkv.weight.detach().double().numpy()
    b_qkv = layer.qkv.bias.detach().double().numpy()
    w_o, b_o = layer.proj.weight.detach().double().numpy(), layer.proj.bias.detach().double().numpy()
    taus = layer.cosine.tau.detach().double().numpy().ravel()
    heads, d = layer.num_heads, layer.head_dim
    batch, n, dim = x.shape
    out = np.zeros((batch, n, dim))
    for b in range(batch):
        qkv = x[b] @ w_qkv.T + b_qkv
        q, k, v = qkv[:, :dim], qkv[:, dim : 2 * dim], qkv[:, 2 * dim :]
        concat = np.zeros((n, dim))
        for h in range(heads):
            sl = slice(h * d, (h + 1) * d)
            tau = max(taus[h], 0.01)
            sim = np.array(
                [
                    [
                        q[i, sl] @ k[j, sl] / (math.sqrt(q[i, sl] @ q[i, sl]) * math.sqrt(k[j, sl] @ k[j, sl])) / tau
                        for j in range(n)
                    ]
                    for i in range(n)
                ]
            )
            a = np.exp(sim - sim.max(axis=1, keepdims=True))
            a /= a.sum(axis=1, keepdims=True)
            concat[:, sl] = a @ v[:, sl]
        out[b] = concat @ w_o.T + b_o
    return out


@pytest.mark.parametrize("taus", [(0.1, 0.1), (0.5, 0.001)])  # 0.001 is held at the paper's bound 0.01
def test_cosine_attention_matches_the_papers_equation(cosine_module, taus):
    torch.manual_seed(0)
    layer = cosine_module.CosineAttention(16, num_heads=2, qkv_bias=True).double().eval()
    with torch.no_grad():
        layer.cosine.tau.copy_(torch.tensor(taus, dtype=torch.float64).view(2, 1, 1))
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x).numpy()
    np.testing.assert_allclose(got, _cosine_reference(layer, x.numpy()), rtol=1e-9, atol=1e-10)


def test_cosine_similarity_is_scale_free(cosine_module):
    """cos(q, k) ignores the length of q and k: scaling them leaves the similarities unchanged (not so for q k^T)."""
    sim = cosine_module.CosineSimilarity(2)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    torch.testing.assert_close(sim(3.0 * q, 0.25 * k), sim(q, k))
    assert torch.allclose(sim(q, q).diagonal(dim1=-2, dim2=-1), torch.full((1, 2, 5), 10.0))  # cos = 1, tau = 0.1


# ------------------------------------------------------------------------------------------------ whole path
def _run(args, env, cwd, ok=True):
    """Run a console script of this environment (``train-model`` ...) or ``python`` (``-m``/``-c``)."""
    exe = [sys.executable] if args[0].startswith("-") else [str(Path(sys.executable).parent / args.pop(0))]
    proc = subprocess.run([*exe, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if ok:
        assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory):
    """The example plugin installed as a separate package into a temp dir (what `pip install` does)."""
    import shutil

    source = tmp_path_factory.mktemp("src") / EXAMPLE.name  # setuptools builds in the source folder: a copy
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(target.glob("attnzoo_cosine-0.1.0.dist-info/entry_points.txt"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "ATTNZOO_CACHE": str(target.parent / "cache"),
    }
    return target, env


@pytest.mark.slow
@pytest.mark.tensorrt
def test_example_plugin_through_every_command(installed_example, tmp_path):
    _, env = installed_example
    # listed with its paper
    table = _run(["-m", "attnzoo.models"], env, tmp_path).stdout
    rows = [r for r in table.splitlines() if r.startswith("| `cosine`")]
    assert len(rows) == 2, rows  # the variants table and the extra-weights table
    assert "arxiv.org/abs/2111.09883" in rows[0] and "plugin attnzoo-cosine 0.1.0" in rows[0]
    # train one short epoch on the smoke data, then evaluate
    train = tmp_path / "train"
    _run(
        [
            "train-model",
            "--variant",
            "cosine",
            "--data",
            "shapes",
            "--epochs",
            "1",
            "--train-size",
            "64",
            "--out",
            str(train),
            "--no-progress",
        ],
        env,
        tmp_path,
    )
    ckpt = next(train.glob("cosine_cls_*.safetensors"))
    assert json.loads(ckpt.with_suffix(".json").read_text())["plugin"] == {
        "package": "attnzoo-cosine",
        "version": "0.1.0",
    }
    evaluation = _run(["evaluate-model", str(ckpt), "--limit", "32", "--json"], env, tmp_path).stdout
    result = json.loads(evaluation)
    assert result["metric_name"] == "top1" and result["n"] == 32 and 0.0 <= result["metric"] <= 100.0
    # export the checkpoint, fp32 and fp16: verified, metadata names the variant, the scope in every block
    export = ["export-model"]
    models = tmp_path / "models"
    for dtype in ("fp32", "fp16"):
        out = models / f"cosine_{dtype}.onnx"
        _run(
            [*export, "--variant", "cosine", "--checkpoint", str(ckpt), "--dtype", dtype, "--out", str(out)],
            env,
            tmp_path,
        )
        proto = onnx.load(str(out))
        props = {p.key: p.value for p in proto.metadata_props}
        assert props["variant"] == "cosine" and props["dtype"] == dtype
        names = [n.name for n in proto.graph.node]
        for i in range(DEPTH):
            assert any(n.startswith(f"blocks.{i}.attn.cosine/ReduceL2") for n in names), i
        report = json.loads(report_path(out).read_text())
        assert report["passed"] and set(report["extra_math"]["blocks"]) == {
            f"blocks.{i}.attn.cosine" for i in range(DEPTH)
        }
    # int8 (ModelOpt Q/DQ, calibrated on the checkpoint's training split): the cosine scope stays fp32
    int8 = _run(
        [
            *export,
            "--variant",
            "cosine",
            "--checkpoint",
            str(ckpt),
            "--dtype",
            "int8",
            "--accept-accuracy-drop",
            "--out",
            str(tmp_path / "cosine_int8.onnx"),
        ],
        env,
        tmp_path,
    ).stdout
    assert "node(s) excluded, fp32, no Q/DQ" in int8
    scope_check = json.loads(report_path(tmp_path / "cosine_int8.onnx").read_text())["extra_math_scope_check"]
    assert scope_check["checker"] and scope_check["quantized"] == [] and scope_check["nodes"] >= DEPTH * 8
    # TensorRT engine (tensorrt_rtx builds without a GPU): the network check names the scope
    engine = tmp_path / "cosine.engine"
    built = _run(
        [
            *export,
            "--variant",
            "cosine",
            "--random-init",
            "--arch",
            "micro",
            "--format",
            "tensorrt",
            "--out",
            str(engine),
        ],
        env,
        tmp_path,
    ).stdout
    assert "cosine in every block" in built and engine.is_file()
    from attnzoo.targets.tensorrt.verified import engine_report_path

    net = json.loads(engine_report_path(engine).read_text())["network_check"]
    assert net["ok"] and net["extra_scopes"] == ["cosine"]
    assert [net["blocks"][f"blocks.{i}.attn.cosine"]["fp32"] >= 5 for i in range(DEPTH)] == [True] * DEPTH
    # Triton model folder
    triton = tmp_path / "triton"
    _run(
        [*export, "--variant", "cosine", "--checkpoint", str(ckpt), "--format", "triton", "--out", str(triton)],
        env,
        tmp_path,
    )
    model_dir = triton / "cosine_cls_micro"
    assert (model_dir / "config.pbtxt").is_file() and (model_dir / "1" / "model.onnx").is_file()
    # a bench row
    bench = tmp_path / "bench"
    _run(
        [
            "bench-latency",
            "--variants",
            "cosine",
            "--backends",
            "eager,ort-cpu",
            "--batch-sizes",
            "1",
            "--min-time",
            "0.05",
            "--no-pair-eager",  # the rows are the point here; pairing is tested with the benchmark
            "--ceiling-size",
            "0",
            "--out",
            str(bench),
            "--no-progress",
        ],
        env,
        tmp_path,
    )
    rows = json.loads((bench / "results.json").read_text())["results"]
    assert [(r["variant"], r["backend"], r["status"]) for r in rows if r["variant"] == "cosine"] == [
        ("cosine", "eager", "ok"),
        ("cosine", "ort-cpu", "ok"),
    ]
    # the demo lists it (its ONNX files) and the PyTorch backend serves the checkpoint
    listed = _run(
        [
            "-c",
            "from pathlib import Path; from attnzoo.serve.loading import load_models; "
            f"print([m.name for m in load_models(Path({str(models)!r}), backend='onnxruntime')]); "
            f"print([m.name for m in load_models(Path({str(train)!r}), backend='pytorch')])",
        ],
        env,
        tmp_path,
    ).stdout
    assert "cosine_fp32" in listed or "'cosine'" in listed.splitlines()[0]
    assert "'cosine'" in listed.splitlines()[1]
    # serve-models --models DIR --variants cosine selects its exports
    chosen = _run(
        [
            "-c",
            "from pathlib import Path; from attnzoo.serve.rayserve.selection import _matching; "
            f"print(sorted(_matching(Path({str(models)!r}), ['cosine_fp32.onnx', 'cosine_fp16.onnx'], "
            "['cosine'], None).files))",
        ],
        env,
        tmp_path,
    ).stdout
    assert "['cosine_fp16.onnx', 'cosine_fp32.onnx']" in chosen
    # without the plugin installed, the checkpoint names the package to install
    bare = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    missing = _run(["evaluate-model", str(ckpt)], bare, tmp_path, ok=False)
    assert missing.returncode != 0 and "pip install 'attnzoo-cosine==0.1.0'" in missing.stderr


def test_fp16_copy_keeps_the_fp32_parameters_of_its_fp32_parts(registry_restored):
    """The LayerNorms and the extra-math scopes of an fp16 export compute in fp32 with the model's own fp32
    values, not values rounded to fp16 and back (the built-in scopes have no parameters; a plugin's may)."""
    from attnzoo.export.onnx_export import _fp16_model

    register_variant("tp-gain", GainAttention, paper="Test paper", extra_scopes=["gain"])
    torch.manual_seed(0)
    model = create_model("tp-gain", arch="micro", num_classes=3).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-4)  # values fp16 cannot hold exactly
    half = _fp16_model(model, ("gain",))
    src, dst = dict(model.named_parameters()), dict(half.named_parameters())
    norms = {
        f"{m}.{p}"
        for m, mod in model.named_modules()
        if isinstance(mod, nn.LayerNorm)
        for p, _ in mod.named_parameters(recurse=False)
    }
    kept = [n for n in dst if ".attn.gain." in n or n in norms]
    assert any(".attn.gain." in n for n in kept) and norms and norms <= set(kept)
    for n in kept:
        assert dst[n].dtype == torch.float32 and torch.equal(dst[n], src[n]), n
    rounded = [n for n in dst if n not in kept]
    assert rounded and all(dst[n].dtype == torch.float16 for n in rounded)
    assert not torch.equal(dst[rounded[0]].float(), src[rounded[0]])  # the rest is fp16


def test_commands_check_names_without_torch_only_where_no_plugin_could_add_one(
    only_fake_plugins, tmp_path, monkeypatch
):
    """A command checks a variant name against ``attnzoo.modelconfig``'s built-in list before it imports torch
    only while nothing else could answer for a name: with a variant plugin installed (an entry point in
    ``attnzoo.variants``), or the registry already loaded in this process (a variant registered here), a name that
    is not a built-in's goes to the registry, so plugin variants stay accepted; a built-in's is known either way."""
    import sys

    from attnzoo import modelconfig

    loaded = sys.modules["attnzoo.models.registry"]
    monkeypatch.delitem(sys.modules, "attnzoo.models.registry")  # as in a command's fresh process (restored after)
    assert modelconfig.known_variants() is not None and modelconfig.variant_names() == modelconfig.BUILTIN_VARIANT_NAMES
    with pytest.raises(ValueError, match="^unknown variant 'tp-half'; valid variants: anti-wafe-dot, "):
        modelconfig.check_variant("tp-half")
    _fake_dist(tmp_path, "tp-good", "1.2", "tp_good", _GOOD.replace("{name}", "tp-half"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert modelconfig.plugins_installed() and modelconfig.known_variants() is None
    assert modelconfig.check_variant("tp-half") is None and modelconfig.check_variant("BELIEF_STAR") == "belief-star"
    monkeypatch.setitem(sys.modules, "attnzoo.models.registry", loaded)
    monkeypatch.setattr(modelconfig, "plugins_installed", lambda: False)
    assert modelconfig.check_variant("tp-anything") is None  # the loaded registry answers
