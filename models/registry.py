"""The variant registry: CLI name -> attention class and everything the other layers need to know about it.

Every variant, the 15 built-ins included, is added by :func:`register_variant`, called beside its class in
the family module (``standard``, ``belief``, ``belief2``, ``mabvit``, ``wafe``, ``hv``; ``attnzoo.models``
imports them in that order, which is the built-in order). Third-party packages add theirs through the
entry-point group ``attnzoo.variants`` (:func:`load_plugins`, run once, at the first lookup of a variant name:
a command that never asks for a variant, ``--help`` included, runs no plugin code). ``VARIANT_NAMES``,
``BUILTIN_VARIANTS`` and ``VARIANTS`` are live views of the registry; other
modules ask a variant's :class:`VariantSpec` (paper, extra-math scopes, pairwise scores, cost family, zoo
options, extra weights) instead of keeping lists of names.

This module keeps registration and lookup; running the plugins, each in a sandbox, is :mod:`._plugins`', and the
probe every registered class passes (timm's keywords, the output's shape, the extra scopes) is :mod:`._probe`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, overload

import torch
from torch import nn

from attnzoo.errors import first_line, quoted
from attnzoo.modelconfig import BUILTIN_VARIANT_ALIASES, BUILTIN_VARIANT_NAMES

from ._plugins import BUILTIN_PACKAGE, ENTRY_POINT_GROUP, PluginLoader, PluginWarning
from ._probe import TIMM_ATTN_KWARGS, bound_class, probe

__all__ = [
    "Paper",
    "ModelOption",
    "ModelBuild",
    "VariantSpec",
    "VARIANTS",
    "VARIANT_NAMES",
    "BUILTIN_VARIANTS",
    "ALIASES",
    "BUILTIN_PACKAGE",
    "ENTRY_POINT_GROUP",
    "PluginWarning",
    "register_variant",
    "load_plugins",
    "canonical_name",
    "split_options",
    "attention_class",
    "create_attention",
    "TIMM_ATTN_KWARGS",
]

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class Paper:
    """A paper variants come from, cited once (the ``PAPER`` of its family module).

    Attributes:
        title: Title as published.
        authors: Authors, e.g. ``"Vaswani et al."``.
        year: Year of the version cited.
        url: Where to read it (the arXiv abstract page where there is one).
    """

    title: str
    authors: str
    year: int
    url: str

    def __str__(self) -> str:
        return f'{self.authors}, "{self.title}", {self.year}, {self.url}'


@dataclass(frozen=True)
class ModelBuild:
    """What a :class:`ModelOption`'s ``mlp_hidden`` hook may read about the model being built.

    Attributes:
        variant: Canonical variant name.
        attn_options: The variant's attention options (defaults filled in).
        embed_dim: Token width D.
        num_heads: Heads M.
    """

    variant: str
    attn_options: Mapping[str, Any]
    embed_dim: int
    num_heads: int

    def attention_extra_params(self) -> int:
        """Parameters one attention layer of the variant has over ``standard``'s of the same width (both built
        on the meta device)."""
        with torch.device("meta"):
            spec = VARIANTS[self.variant]
            layer = bound_class(spec.name, spec.cls, self.attn_options)(
                self.embed_dim, num_heads=self.num_heads, qkv_bias=True
            )
            base = VARIANTS["standard"].cls(self.embed_dim, num_heads=self.num_heads, qkv_bias=True)
        return sum(p.numel() for p in layer.parameters()) - sum(p.numel() for p in base.parameters())


def _same_type_as(default: Any) -> Callable[[Any], Any]:
    """The default check of a :class:`ModelOption`: a given value has the default's type (an int is taken
    for a float)."""

    def check(value: Any) -> Any:
        kind = type(default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if type(value) is not kind:
            shown = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
                kind, kind.__name__
            )
            raise ValueError(f"must be {shown}, got {value!r}")
        return value

    return check


@dataclass(frozen=True)
class ModelOption:
    """A model-level option of a variant: a change to the ViT around its attention (block type, MLP width).

    Declared in ``register_variant(..., model_options={name: ModelOption(...)})``; given like an attention
    option (``create_model(variant, name=value)``, ``train-model --option name=value``), recorded in the
    model's config, and applied by :func:`attnzoo.models.create_model` through the hooks below, in the order
    the variant declares its options. The built-ins: MABViT's ``parallel`` and ``pr``
    (``attnzoo.models.mabvit.PARALLEL``, ``PR``) and Belief2's ``param_matched``
    (``attnzoo.models.belief2.PARAM_MATCHED``); a plugin may reuse them or declare its own.

    Attributes:
        default: Value when the option is not given.
        block_fn: ``value -> block class``: the timm ``block_fn`` to build (``None``: keep the one so far,
            timm's ``Block``).
        mlp_hidden: ``(value, hidden, build) -> hidden``: the block MLP's hidden width from the width so far
            (``build``: a :class:`ModelBuild`).
        check: ``value -> value``: refuses a bad value with ``ValueError`` (one line) and may normalise it;
            default: the value must have the default's type.
    """

    default: Any
    block_fn: Callable[[Any], type[nn.Module] | None] | None = None
    mlp_hidden: Callable[[Any, int, ModelBuild], int] | None = None
    check: Callable[[Any], Any] | None = None

    def validate(self, value: Any) -> Any:
        """``value`` checked (and normalised) by :attr:`check`."""
        return (self.check or _same_type_as(self.default))(value)


@dataclass(frozen=True)
class VariantSpec:
    """One attention variant: its class and every fact about it that another module needs.

    Attributes:
        name: CLI name.
        cls: Attention class (a ``timm.layers.Attention`` drop-in).
        options: Default attention options passed to ``cls``.
        model_options: Model-level options (block type, MLP width): name -> :class:`ModelOption`.
        paper: Source paper: a :class:`Paper` for the built-ins, a citation string for a plugin.
        equations: Equations the class implements.
        extra_params: Parameters over ``standard`` per block, in words.
        extra_scopes: Sub-module paths (inside the attention module) whose ops are the variant's extra math:
            exported as nodes named ``<blocks>.N.attn.<scope>/<Op>``, required in every block, kept fp32 in
            fp16 graphs and left unquantized in int8/fp8 ones.
        scope_ops: ``{scope: {op type: minimum count}}`` for scopes that declare required ops (the orthogonal
            projection's ``PROJECTION_OPS``); a scope without an entry needs at least one op.
        package: Distribution that registered the variant (``attnzoo`` for the built-ins).
        version: That distribution's version ('' when unknown).
        aliases: Other names every command accepts for it.
        pairwise_scores: Its scores need pairwise distances that no matrix product computes (the MAE
            variants), computed slab by slab; the forward-memory estimate counts the slab.
        cost_family: Variants whose cost grows the same way share a family (the scaling study times one of
            each); the variant's own name unless given.
        zoo_options: Options the zoo trains it with (Belief2's ``param_matched``).
        extra_weights: Parameters its attention layer holds beyond timm's ``Attention``, as module names
            (``proj_s``): what a timm checkpoint lacks. Found by the probe at registration.
    """

    name: str
    cls: type[nn.Module]
    options: Mapping[str, Any] = field(default_factory=dict)
    model_options: Mapping[str, ModelOption] = field(default_factory=dict)
    paper: Paper | str = ""
    equations: str = ""
    extra_params: str = "none"
    extra_scopes: tuple[str, ...] = ()
    scope_ops: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    package: str = BUILTIN_PACKAGE
    version: str = ""
    aliases: tuple[str, ...] = ()
    pairwise_scores: bool = False
    cost_family: str = ""
    zoo_options: Mapping[str, Any] = field(default_factory=dict)
    extra_weights: tuple[str, ...] = ()

    @property
    def valid_options(self) -> tuple[str, ...]:
        return tuple(self.options) + tuple(self.model_options)

    @property
    def builtin(self) -> bool:
        return self.package == BUILTIN_PACKAGE

    def required_ops(self, scope: str) -> Mapping[str, int]:
        """Minimum op counts of one extra scope (empty: at least one op of any type)."""
        return self.scope_ops.get(scope, {})


#: Canonical names in registration order (the built-ins first, in their order).
_ORDER: list[str] = []
#: Accepted aliases -> canonical name (each variant's ``aliases``).
ALIASES: dict[str, str] = {}


class _Registry(dict):
    """``name (aliases included) -> spec``: a dict whose lookups first load the installed plugins
    (:meth:`~attnzoo.models._plugins.PluginLoader.ensure`), so that importing the package runs no third-party code."""

    def __getitem__(self, key: str) -> VariantSpec:
        _PLUGINS.ensure()
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        _PLUGINS.ensure()
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        _PLUGINS.ensure()
        return super().__contains__(key)

    def __iter__(self) -> Iterator[str]:
        _PLUGINS.ensure()
        return super().__iter__()

    def __len__(self) -> int:
        _PLUGINS.ensure()
        return super().__len__()

    def keys(self):
        _PLUGINS.ensure()
        return super().keys()

    def values(self):
        _PLUGINS.ensure()
        return super().values()

    def items(self):
        _PLUGINS.ensure()
        return super().items()


#: name (aliases included) -> spec; kept up to date by :func:`register_variant`.
VARIANTS: dict[str, VariantSpec] = _Registry()
#: The installed plugins, run once at the first lookup over these tables, each sandboxed (:mod:`._plugins`).
_PLUGINS = PluginLoader(_ORDER, VARIANTS, ALIASES)


class _Names(Sequence):
    """A live, read-only tuple-like view of the registered canonical names (the built-ins' only if
    ``builtin``)."""

    def __init__(self, builtin: bool = False) -> None:
        self._builtin = builtin

    def _names(self) -> tuple[str, ...]:
        if self._builtin:  # the built-ins need no plugin loaded
            return tuple(n for n in _ORDER if dict.__getitem__(VARIANTS, n).builtin)
        _PLUGINS.ensure()
        if _PLUGINS.deferred:
            _PLUGINS.load_deferred()
        return tuple(_ORDER)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __eq__(self, other: object) -> bool:
        return self._names() == (tuple(other) if isinstance(other, (tuple, list, _Names)) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._names())


#: Canonical variant names: the built-ins in their order, then registered plugins (a live view).
VARIANT_NAMES: Sequence[str] = _Names()
#: The 15 built-in variants in their order (a live view, complete once ``attnzoo.models`` is imported).
BUILTIN_VARIANTS: Sequence[str] = _Names(builtin=True)


def _normalize_scopes(
    name: str, extra_scopes: Sequence[str] | Mapping[str, Mapping[str, int] | None]
) -> tuple[tuple[str, ...], dict[str, dict[str, int]]]:
    """``extra_scopes`` as (scope names, {scope: required op counts}); a bare name requires >= 1 op."""
    if isinstance(extra_scopes, str):
        raise ValueError(
            f"variant {name!r}: extra_scopes must be a list of sub-module names, not the string {extra_scopes!r}"
        )
    items = list(extra_scopes.items()) if isinstance(extra_scopes, Mapping) else [(s, None) for s in extra_scopes]
    scopes, ops = [], {}
    for scope, need in items:
        if not isinstance(scope, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", scope):
            raise ValueError(f"variant {name!r}: extra scope {scope!r} is not a sub-module path such as 'projection'")
        if scope in scopes:
            raise ValueError(f"variant {name!r}: extra scope {scope!r} is listed twice")
        scopes.append(scope)
        if need:
            bad = {
                op: n
                for op, n in dict(need).items()
                if not isinstance(op, str) or not isinstance(n, int) or isinstance(n, bool) or n < 1
            }
            if bad:
                raise ValueError(
                    f"variant {name!r}: required ops of scope {scope!r} must map ONNX op types to "
                    f"counts >= 1, got {bad}"
                )
            ops[scope] = dict(need)
    return tuple(scopes), ops


def _check_model_options(
    name: str, options: Mapping[str, Any], model_options: Mapping[str, Any]
) -> dict[str, ModelOption]:
    """``model_options`` of a registration, each a :class:`ModelOption` that changes the model and takes its
    own default.

    Raises:
        ValueError: one line naming the variant and the option.
    """
    for key, opt in model_options.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"variant {name!r}: model option name {key!r} must be a Python identifier")
        if key in options:
            raise ValueError(f"variant {name!r}: {key!r} is both an attention option and a model option")
        if not isinstance(opt, ModelOption):
            raise ValueError(
                f"variant {name!r}: model option {key!r} must be an attnzoo.models.ModelOption "
                f"(default, block_fn / mlp_hidden), got {opt!r}"
            )
        if opt.block_fn is None and opt.mlp_hidden is None:
            raise ValueError(
                f"variant {name!r}: model option {key!r} changes nothing in the model (give it a "
                "block_fn or an mlp_hidden)"
            )
        try:
            opt.validate(opt.default)
        except ValueError as exc:
            raise ValueError(
                f"variant {name!r}: the default of model option {key!r} is refused by its own check: {first_line(exc)}"
            ) from None
    return dict(model_options)


def register_variant(
    name: str,
    attn_layer: type[nn.Module],
    *,
    paper: Paper | str,
    equations: str = "",
    options: Mapping[str, Any] | None = None,
    extra_scopes: Sequence[str] | Mapping[str, Mapping[str, int] | None] = (),
    model_options: Mapping[str, ModelOption] | None = None,
    extra_params: str = "",
    aliases: Sequence[str] = (),
    pairwise_scores: bool = False,
    cost_family: str = "",
    zoo_options: Mapping[str, Any] | None = None,
) -> VariantSpec:
    """Add an attention variant; every command (train, evaluate, export, bench, demo, serve) then takes it.

    Args:
        name: CLI name: lower-case letters, digits and ``-`` (e.g. ``cosine``).
        attn_layer: A ``timm.layers.Attention`` drop-in: ``attn_layer(dim, num_heads=..., qkv_bias=...,
            qk_norm=..., scale_norm=..., proj_bias=..., attn_drop=..., proj_drop=..., norm_layer=...,
            **options)`` and ``forward(x, attn_mask=None, is_causal=False)`` returning x's shape.
        paper: The paper it comes from: a :class:`Paper`, or a string with its title and a link; shown by
            ``python -m attnzoo.models``.
        equations: Which equations of the paper it implements.
        options: Default constructor options; each becomes a variant option (``--option key=value``).
        extra_scopes: Sub-module names of ``attn_layer`` whose ops are the variant's extra math, e.g.
            ``["projection"]``; or ``{scope: {op type: minimum count}}`` to also require ops (a bare name, or
            ``None``, requires at least one op). Export names their nodes ``<blocks>.N.attn.<scope>/<Op>`` and
            checks them in every block (standard ONNX ops only, fp32 in fp16 graphs, unquantized in int8).
        model_options: Model-level options, name -> :class:`ModelOption` (its default, its check, and the
            block class or MLP width it sets); each becomes a variant option like ``options``' entries.
        extra_params: Parameters over ``standard`` per block, in words (for the variants table).
        aliases: Other names every command accepts for it.
        pairwise_scores: Its scores need pairwise distances computed slab by slab (the forward-memory
            estimate counts the slab).
        cost_family: The group of variants whose cost grows the same way (default: its own name).
        zoo_options: Options the zoo trains it with.

    Returns:
        The registered :class:`VariantSpec`.

    Raises:
        ValueError: one line naming the variant and what is wrong: a bad name, a name already registered
            (naming both packages), a class that does not take timm's keywords, a forward returning the wrong
            shape, or an extra scope that is not a sub-module (or never runs).
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"variant name {name!r} must be lower-case letters, digits and '-' (e.g. 'my-variant')")
    if not isinstance(attn_layer, type) or not issubclass(attn_layer, nn.Module):
        raise ValueError(
            f"variant {name!r}: attn_layer must be an nn.Module class (a timm attn_layer), got {attn_layer!r}"
        )
    if not isinstance(paper, Paper) and (not isinstance(paper, str) or not paper.strip()):
        raise ValueError(f"variant {name!r}: paper must name the source paper (title and link)")
    package, version = _PLUGINS.source(attn_layer)
    aliases = (aliases,) if isinstance(aliases, str) else tuple(aliases)
    for new in (name, *aliases):
        if not isinstance(new, str) or not _NAME_RE.fullmatch(new):
            raise ValueError(f"variant {name!r}: alias {new!r} must be lower-case letters, digits and '-'")
        if dict.__contains__(VARIANTS, new):
            other = dict.__getitem__(VARIANTS, new)
            raise ValueError(
                f"variant {new!r} from package {package!r} clashes with variant {other.name!r} from "
                f"package {other.package!r}; not registered (rename one of them)"
            )
    if package == BUILTIN_PACKAGE:
        _check_listed(name, aliases)
    scopes, scope_ops = _normalize_scopes(name, extra_scopes)
    model_options = _check_model_options(name, dict(options or {}), dict(model_options or {}))
    spec = VariantSpec(
        name,
        attn_layer,
        dict(options or {}),
        model_options,
        paper.strip() if isinstance(paper, str) else paper,
        equations,
        extra_params or ("none" if package == BUILTIN_PACKAGE else ""),
        scopes,
        scope_ops,
        package,
        version,
        aliases,
        bool(pairwise_scores),
        cost_family or name,
        dict(zoo_options or {}),
    )
    spec = replace(spec, extra_weights=probe(name, spec.cls, spec.options, spec.extra_scopes))
    with _PLUGINS.register_lock:
        if _PLUGINS.refused():
            raise ValueError(f"variant {name!r}: its plugin was skipped (its entry point did not return in time)")
        VARIANTS[name] = spec
        VARIANTS.update({alias: spec for alias in aliases})
        ALIASES.update({alias: name for alias in aliases})
        _ORDER.append(name)
    return spec


def _check_listed(name: str, aliases: tuple[str, ...]) -> None:
    """A built-in is registered in the place and with the aliases :data:`attnzoo.modelconfig.BUILTIN_VARIANT_NAMES`
    and ``BUILTIN_VARIANT_ALIASES`` give it: the light list every command checks a name against before it imports
    PyTorch must name exactly the registry's built-ins."""
    place = sum(dict.__getitem__(VARIANTS, n).builtin for n in _ORDER)
    listed = {a for a, n in BUILTIN_VARIANT_ALIASES.items() if n == name}
    if place >= len(BUILTIN_VARIANT_NAMES) or BUILTIN_VARIANT_NAMES[place] != name or set(aliases) != listed:
        raise ValueError(
            f"built-in variant {name!r} (aliases {list(aliases)}) is not the one attnzoo.modelconfig lists in its "
            "place: add it to BUILTIN_VARIANT_NAMES (and its aliases to BUILTIN_VARIANT_ALIASES) in registration "
            "order, so that commands check names without importing PyTorch"
        )


def load_plugins() -> list[str]:
    """Run every entry point of the group ``attnzoo.variants``; return the names they registered.

    Called once by the first lookup of a variant name (``VARIANTS``, ``VARIANT_NAMES``, :func:`canonical_name`);
    ``BUILTIN_VARIANTS`` and importing the package run no plugin. A plugin that fails (import error, bad
    registration, name clash, ``sys.exit``, a built-in's entry replaced) is named in one :class:`PluginWarning`
    and its variants are removed; the other plugins still load. A plugin module imported directly (``import
    attnzoo_cosine``) imports ``attnzoo.models`` before it has defined its entry point: that one runs once the
    module is imported, at the next name lookup (:func:`canonical_name`, ``VARIANT_NAMES``).
    """
    return _PLUGINS.load()


def canonical_name(name: str) -> str:
    """Resolve case, ``_``/``-`` spelling and aliases; raise ``ValueError`` listing valid names."""
    _PLUGINS.ensure()
    if _PLUGINS.deferred:
        _PLUGINS.load_deferred()
    key = str(name).strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in _ORDER:
        raise ValueError(f"unknown variant {quoted(name)}; valid variants: {', '.join(sorted(VARIANTS))}")
    return key


def split_options(name: str, **options: Any) -> tuple[VariantSpec, dict[str, Any], dict[str, Any]]:
    """Validate ``options`` for a variant; return (spec, attention options, model options) with defaults."""
    spec = VARIANTS[canonical_name(name)]
    unknown = sorted(set(options) - set(spec.valid_options))
    if unknown:
        valid = ", ".join(spec.valid_options) or "none"
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for variant {spec.name!r}; valid options: {valid}")
    attn = {k: options.get(k, v) for k, v in spec.options.items()}
    model = {}
    for key, opt in spec.model_options.items():
        if key not in options:
            model[key] = opt.default
            continue
        try:
            model[key] = opt.validate(options[key])
        except ValueError as exc:
            raise ValueError(f"option {key} of variant {spec.name!r}: {first_line(exc)}") from None
    return spec, attn, model


def attention_class(name: str, **options: Any) -> type[nn.Module]:
    """A class usable as timm's ``attn_layer`` with the variant's options bound as constructor defaults.

    timm checks ``issubclass(attn_layer, ...)``, so this returns a real subclass, not a ``functools.partial``.
    Model-level options (``parallel``, ``pr``, ``param_matched``) are not accepted here.
    """
    spec, attn, model = split_options(name, **options)
    given_model = sorted(k for k in options if k in spec.model_options)
    if given_model:
        raise ValueError(f"{', '.join(given_model)} are model options of {spec.name!r}; pass them to create_model")
    return bound_class(spec.name, spec.cls, attn)


def create_attention(name: str, dim: int, num_heads: int = 8, **options: Any) -> nn.Module:
    """Build one attention layer of a variant.

    Args:
        name: Variant name (see ``VARIANTS``).
        dim: Token width D.
        num_heads: Heads M.
        **options: Variant options and any ``timm.layers.Attention`` keyword (``qkv_bias``, ``attn_drop`` ...).

    Raises:
        ValueError: unknown variant or option.
    """
    spec = VARIANTS[canonical_name(name)]
    timm_kwargs = {
        "attn_head_dim",
        "dim_out",
        "qkv_bias",
        "qk_norm",
        "scale_norm",
        "proj_bias",
        "gated",
        "attn_drop",
        "proj_drop",
        "norm_layer",
        "device",
        "dtype",
    }
    variant_opts = {k: v for k, v in options.items() if k not in timm_kwargs}
    layer_kwargs = {k: v for k, v in options.items() if k in timm_kwargs}
    return attention_class(spec.name, **variant_opts)(dim, num_heads=num_heads, **layer_kwargs)
