"""The variant registry: CLI name -> attention class, default options, paper, equations and extra-math scopes.

Every variant, the 15 built-ins included, is added by :func:`register_variant`; third-party packages add theirs
through the entry-point group ``attnzoo.variants`` (:func:`load_plugins`, run once when ``attnzoo.models`` is
first imported). ``VARIANT_NAMES`` and ``VARIANTS`` are live views of the registry.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Type, Union, overload

import torch
from torch import nn

from .belief import DEFAULT_EPS, BeliefAttention, BeliefStarAttention, ExclusiveAttention
from .belief2 import Belief2Attention
from .hv import HVAttention
from .mabvit import MABViTAttention
from .standard import StandardAttention
from .wafe import WAFEAttention

__all__ = ["VariantSpec", "VARIANTS", "VARIANT_NAMES", "BUILTIN_VARIANTS", "ALIASES", "BUILTIN_PACKAGE",
           "ENTRY_POINT_GROUP", "PROJECTION_OPS", "KEY_NORM_OPS", "PluginWarning", "register_variant", "load_plugins",
           "canonical_name", "split_options", "attention_class", "create_attention", "TIMM_ATTN_KWARGS"]

#: The distribution the built-in variants come from.
BUILTIN_PACKAGE = "attnzoo"
#: Entry-point group of third-party variant packages: each entry point is a zero-argument callable that calls
#: :func:`register_variant`.
ENTRY_POINT_GROUP = "attnzoo.variants"
#: The keywords timm's ``Block`` passes to its ``attn_layer`` (timm >= 1.0.23), used to probe a new class.
TIMM_ATTN_KWARGS: Dict[str, Any] = dict(qkv_bias=True, qk_norm=False, scale_norm=False, proj_bias=True,
                                        attn_drop=0.0, proj_drop=0.0, norm_layer=nn.LayerNorm)
#: Minimum op counts of one orthogonal-projection scope (``OrthogonalProjection``: two inner products as
#: ``Mul`` + ``ReduceSum``, ``Add`` eps, ``Div``, ``Mul`` coef * v, ``Sub``).
PROJECTION_OPS: Mapping[str, int] = {"Mul": 3, "ReduceSum": 2, "Add": 1, "Div": 1, "Sub": 1}
#: Minimum op counts of one MSE key-norm scope (``KeyNormBias``: ``Mul`` k * k, ``ReduceSum``, ``Mul`` by
#: sign / d).
KEY_NORM_OPS: Mapping[str, int] = {"Mul": 2, "ReduceSum": 1}
_PROBE_DIM, _PROBE_HEADS, _PROBE_SHAPE = 32, 2, (2, 5, 32)
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")

_BELIEF = "BeliefFormer (001)"
_BELIEF2 = "Improved Belief-Attention / Belief2 (000)"
_MAB = "MABViT (002)"
_WAFE = "Divergence vs. Convergence, WAFE (003)"
_HV = "Horizontal and Vertical Attention (004)"


class PluginWarning(UserWarning):
    """A variant plugin failed to load or was refused (its other variants and other plugins still load)."""


@dataclass(frozen=True)
class VariantSpec:
    """One attention variant.

    Attributes:
        name: CLI name.
        cls: Attention class (a ``timm.layers.Attention`` drop-in).
        options: Default attention options passed to ``cls``.
        model_options: Default model-level options (block type, MLP width).
        paper: Source paper.
        equations: Equations the class implements.
        extra_params: Parameters over ``standard`` per block, in words.
        extra_scopes: Sub-module paths (inside the attention module) whose ops are the variant's extra math:
            exported as nodes named ``<blocks>.N.attn.<scope>/<Op>``, required in every block, kept fp32 in
            fp16 graphs and left unquantized in int8/fp8 ones.
        scope_ops: ``{scope: {op type: minimum count}}`` for scopes that declare required ops (the orthogonal
            projection's :data:`PROJECTION_OPS`); a scope without an entry needs at least one op.
        package: Distribution that registered the variant (``attnzoo`` for the built-ins).
        version: That distribution's version ('' when unknown).
    """

    name: str
    cls: Type[nn.Module]
    options: Mapping[str, Any] = field(default_factory=dict)
    model_options: Mapping[str, Any] = field(default_factory=dict)
    paper: str = ""
    equations: str = ""
    extra_params: str = "none"
    extra_scopes: Tuple[str, ...] = ()
    scope_ops: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    package: str = BUILTIN_PACKAGE
    version: str = ""

    @property
    def valid_options(self) -> Tuple[str, ...]:
        return tuple(self.options) + tuple(self.model_options)

    @property
    def builtin(self) -> bool:
        return self.package == BUILTIN_PACKAGE

    def required_ops(self, scope: str) -> Mapping[str, int]:
        """Minimum op counts of one extra scope (empty: at least one op of any type)."""
        return self.scope_ops.get(scope, {})


#: Canonical names in registration order (built-ins first, in the order of SPEC.md).
_ORDER: List[str] = []
#: Accepted aliases -> canonical name.
ALIASES: Dict[str, str] = {"wafe-dot": "standard"}
#: name (aliases included) -> spec; kept up to date by :func:`register_variant`.
VARIANTS: Dict[str, VariantSpec] = {}
#: (package, version) of the plugin whose entry point is running, while :func:`load_plugins` runs it.
_LOADING: List[Tuple[str, str]] = []


class _Names(Sequence):
    """A live, read-only tuple-like view of the registered canonical names."""

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Tuple[str, ...]: ...

    def __getitem__(self, i):
        return tuple(_ORDER)[i]

    def __len__(self) -> int:
        return len(_ORDER)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_ORDER))

    def __contains__(self, name: object) -> bool:
        return name in _ORDER

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, _Names)) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(_ORDER))


#: Canonical variant names: the built-ins in the order of SPEC.md, then registered plugins (a live view).
VARIANT_NAMES: Sequence[str] = _Names()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _normalize_scopes(name: str, extra_scopes: Union[Sequence[str], Mapping[str, Optional[Mapping[str, int]]]]
                      ) -> Tuple[Tuple[str, ...], Dict[str, Dict[str, int]]]:
    """``extra_scopes`` as (scope names, {scope: required op counts}); a bare name requires >= 1 op."""
    if isinstance(extra_scopes, str):
        raise ValueError(f"variant {name!r}: extra_scopes must be a list of sub-module names, not the string "
                         f"{extra_scopes!r}")
    items = list(extra_scopes.items()) if isinstance(extra_scopes, Mapping) else [(s, None) for s in extra_scopes]
    scopes, ops = [], {}
    for scope, need in items:
        if not isinstance(scope, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*", scope):
            raise ValueError(f"variant {name!r}: extra scope {scope!r} is not a sub-module path such as 'projection'")
        if scope in scopes:
            raise ValueError(f"variant {name!r}: extra scope {scope!r} is listed twice")
        scopes.append(scope)
        if need:
            bad = {op: n for op, n in dict(need).items()
                   if not isinstance(op, str) or not isinstance(n, int) or isinstance(n, bool) or n < 1}
            if bad:
                raise ValueError(f"variant {name!r}: required ops of scope {scope!r} must map ONNX op types to "
                                 f"counts >= 1, got {bad}")
            ops[scope] = dict(need)
    return tuple(scopes), ops


def _probe(spec: VariantSpec) -> None:
    """Build one layer of ``spec`` with timm's ``Block`` keywords, run it, and find its extra scopes.

    Raises:
        ValueError: one line naming the variant and what is wrong.
    """
    cls_name = spec.cls.__name__
    try:
        layer = _bound_class(spec, dict(spec.options))(_PROBE_DIM, num_heads=_PROBE_HEADS, **TIMM_ATTN_KWARGS)
    except TypeError as exc:
        raise ValueError(f"variant {spec.name!r}: {cls_name} does not take timm's Attention constructor keywords "
                         f"(dim, num_heads, {', '.join(TIMM_ATTN_KWARGS)}) plus its options: {_first_line(exc)}"
                         ) from None
    except Exception as exc:
        raise ValueError(f"variant {spec.name!r}: {cls_name}(dim={_PROBE_DIM}, num_heads={_PROBE_HEADS}, ...) "
                         f"failed: {_first_line(exc)}") from None
    called: Dict[str, int] = {}
    hooks = []
    for scope in spec.extra_scopes:
        try:
            module = layer.get_submodule(scope)
        except AttributeError:
            subs = [n for n, _ in layer.named_modules() if n]
            if scope in subs:
                raise ValueError(f"variant {spec.name!r}: extra scope {scope!r} has the name of an nn.Module "
                                 "attribute, which hides the sub-module; rename it") from None
            subs = ", ".join(subs) or "none"
            raise ValueError(f"variant {spec.name!r}: extra scope {scope!r} is not a sub-module of {cls_name} "
                             f"(its sub-modules: {subs})") from None
        hooks.append(module.register_forward_hook(lambda *_, s=scope: called.__setitem__(s, called.get(s, 0) + 1)))
    x = torch.randn(*_PROBE_SHAPE, generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            out = layer.eval()(x, attn_mask=None)
    except Exception as exc:
        raise ValueError(f"variant {spec.name!r}: {cls_name}.forward(x, attn_mask=None) failed on tokens of shape "
                         f"{tuple(x.shape)}: {_first_line(exc)}") from None
    finally:
        for hook in hooks:
            hook.remove()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(x.shape):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"variant {spec.name!r}: {cls_name}.forward returns {got}, expected the input's shape "
                         f"{tuple(x.shape)} (batch, tokens, dim)")
    unused = [s for s in spec.extra_scopes if not called.get(s)]
    if unused:
        raise ValueError(f"variant {spec.name!r}: extra scope(s) {', '.join(unused)} never run in "
                         f"{cls_name}.forward, so they would produce no ops in the graph")


def register_variant(
        name: str,
        attn_layer: Type[nn.Module],
        *,
        paper: str,
        equations: str = "",
        options: Optional[Mapping[str, Any]] = None,
        extra_scopes: Union[Sequence[str], Mapping[str, Optional[Mapping[str, int]]]] = (),
        model_options: Optional[Mapping[str, Any]] = None,
        extra_params: str = "",
) -> VariantSpec:
    """Add an attention variant; every command (train, evaluate, export, bench, demo, serve) then takes it.

    Args:
        name: CLI name: lower-case letters, digits and ``-`` (e.g. ``cosine``).
        attn_layer: A ``timm.layers.Attention`` drop-in: ``attn_layer(dim, num_heads=..., qkv_bias=...,
            qk_norm=..., scale_norm=..., proj_bias=..., attn_drop=..., proj_drop=..., norm_layer=...,
            **options)`` and ``forward(x, attn_mask=None, is_causal=False)`` returning x's shape.
        paper: The paper it comes from (title, and a link), shown by ``python -m attnzoo.models`` and the demo.
        equations: Which equations of the paper it implements.
        options: Default constructor options; each becomes a variant option (``--option key=value``).
        extra_scopes: Sub-module names of ``attn_layer`` whose ops are the variant's extra math, e.g.
            ``["projection"]``; or ``{scope: {op type: minimum count}}`` to also require ops (a bare name, or
            ``None``, requires at least one op). Export names their nodes ``<blocks>.N.attn.<scope>/<Op>`` and
            checks them in every block (standard ONNX ops only, fp32 in fp16 graphs, unquantized in int8).
        model_options: Model-level options (block type, MLP width) of a built-in variant.
        extra_params: Parameters over ``standard`` per block, in words (for the variants table).

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
        raise ValueError(f"variant {name!r}: attn_layer must be an nn.Module class (a timm attn_layer), "
                         f"got {attn_layer!r}")
    if not isinstance(paper, str) or not paper.strip():
        raise ValueError(f"variant {name!r}: paper must name the source paper (title and link)")
    package, version = _LOADING[-1] if _LOADING else _package_of(attn_layer)
    if name in VARIANTS:
        other = VARIANTS[name]
        raise ValueError(f"variant {name!r} from package {package!r} clashes with variant {other.name!r} from "
                         f"package {other.package!r}; not registered (rename one of them)")
    scopes, scope_ops = _normalize_scopes(name, extra_scopes)
    spec = VariantSpec(name, attn_layer, dict(options or {}), dict(model_options or {}), paper.strip(), equations,
                       extra_params or ("none" if package == BUILTIN_PACKAGE else ""), scopes, scope_ops,
                       package, version)
    _probe(spec)
    VARIANTS[name] = spec
    _ORDER.append(name)
    return spec


def _package_of(attn_layer: type) -> Tuple[str, str]:
    """``(distribution, version)`` of the installed package that defines ``attn_layer`` (registered outside an
    entry point); a module that no installed distribution provides (a script, a notebook: ``__main__``) gives
    ``(module, "")``, and such a variant's checkpoints record no plugin to install."""
    top = attn_layer.__module__.split(".")[0]
    if top == BUILTIN_PACKAGE:
        return BUILTIN_PACKAGE, ""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    for dist in packages_distributions().get(top, []):
        try:
            return dist, version(dist)
        except PackageNotFoundError:
            continue
    return top, ""


def load_plugins() -> List[str]:
    """Run every entry point of the group ``attnzoo.variants``; return the names they registered.

    A plugin that fails (import error, bad registration, name clash) is named in one :class:`PluginWarning`
    and its variants are removed; the other plugins still load.
    """
    from importlib.metadata import entry_points

    added: List[str] = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        package = dist.metadata["Name"] if dist is not None else ep.value.split(":")[0].split(".")[0]
        version = dist.version if dist is not None else ""
        before = len(_ORDER)
        _LOADING.append((package, version))
        try:
            ep.load()()
        except Exception as exc:  # any failure of third-party code: one warning, keep going
            for bad in _ORDER[before:]:
                VARIANTS.pop(bad, None)
            del _ORDER[before:]
            reason = str(exc) if isinstance(exc, ValueError) else _first_line(exc)
            warnings.warn(f"attnzoo variant plugin {ep.name!r} ({package} {version}) skipped: {reason}",
                          PluginWarning, stacklevel=2)
        else:
            added += _ORDER[before:]
        finally:
            _LOADING.pop()
    return added


def _register_builtins() -> None:
    projection = {"projection": PROJECTION_OPS}
    head_projection = {"head_projection": PROJECTION_OPS}
    key_norm = {"key_norm": KEY_NORM_OPS}  # MSE: the ||k||^2 term of the squared distance (eq. 3-4)
    distance = {"distance": None}  # MAE: the pairwise L1 distances (eq. 5-6); ops depend on mae_impl
    mab_model = {"parallel": False, "pr": False}
    eps = {"eps": DEFAULT_EPS}
    for name, cls, opts, model, paper, eqs, extra, scopes in [
        ("standard", StandardAttention, {}, {}, "Vaswani et al. 2017", "WAFE eq. 1", "none", {}),
        ("belief", BeliefAttention, eps, {}, _BELIEF, "eq. 10-12", "none", projection),
        ("belief-star", BeliefStarAttention, eps, {}, _BELIEF, "eq. 10, 13-15", "W^s (D x D + bias)",
         {**projection, **head_projection}),
        ("exclusive", ExclusiveAttention, eps, {}, _BELIEF2, "Remark 1 (eq. 7, W = 0)", "none", head_projection),
        ("belief2", Belief2Attention, {"phi": "gelu", "zz": True, **eps}, {"param_matched": False}, _BELIEF2,
         "eq. 11-15, Prop. 1", "W^p (D x D + bias), W^Z (D x D) if zz", projection),
        ("mabvit-glu", MABViTAttention, {"value_act": "glu"}, mab_model, _MAB, "Modified Attention Block (GLU)",
         "W^b (D x D + bias); pr: MLP 3D", {}),
        ("mabvit-gelu", MABViTAttention, {"value_act": "gelu"}, mab_model, _MAB, "Modified Attention Block (GELU)",
         "none; pr: MLP 3D", {}),
        ("anti-wafe-dot", WAFEAttention, {"score": "dot", "anti": True}, {}, _WAFE, "eq. 2", "none", {}),
        ("wafe-mse", WAFEAttention, {"score": "mse", "anti": False}, {}, _WAFE, "eq. 3", "none", key_norm),
        ("anti-wafe-mse", WAFEAttention, {"score": "mse", "anti": True}, {}, _WAFE, "eq. 4", "none", key_norm),
        ("wafe-mae", WAFEAttention, {"score": "mae", "anti": False, "mae_impl": "auto"}, {}, _WAFE, "eq. 5",
         "none", distance),
        ("anti-wafe-mae", WAFEAttention, {"score": "mae", "anti": True, "mae_impl": "auto"}, {}, _WAFE, "eq. 6",
         "none", distance),
        ("horizontal", HVAttention, {"horizontal": True, "vertical": False}, {}, _HV, "eq. 5-6",
         "W^A1 (d x d), W^A2 (D x d), w^B, b^B", {}),
        ("vertical", HVAttention, {"horizontal": False, "vertical": True, "reduction": 4}, {}, _HV, "eq. 7-8",
         "W^U1, W^U2 (D x D/4), W^U (D/4 x D), b^U", {}),
        ("horizontal-vertical", HVAttention, {"horizontal": True, "vertical": True, "reduction": 4}, {}, _HV,
         "eq. 5-8", "both of the above", {}),
    ]:
        _LOADING.append((BUILTIN_PACKAGE, ""))
        try:
            register_variant(name, cls, paper=paper, equations=eqs, options=opts, extra_scopes=scopes,
                             model_options=model, extra_params=extra)
        finally:
            _LOADING.pop()




def canonical_name(name: str) -> str:
    """Resolve case, ``_``/``-`` spelling and aliases; raise ``ValueError`` listing valid names."""
    key = str(name).strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in _ORDER:
        raise ValueError(f"unknown variant {name!r}; valid variants: {', '.join(sorted(VARIANTS))}")
    return key


def split_options(name: str, **options: Any) -> Tuple[VariantSpec, Dict[str, Any], Dict[str, Any]]:
    """Validate ``options`` for a variant; return (spec, attention options, model options) with defaults."""
    spec = VARIANTS[canonical_name(name)]
    unknown = sorted(set(options) - set(spec.valid_options))
    if unknown:
        valid = ", ".join(spec.valid_options) or "none"
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for variant {spec.name!r}; valid options: {valid}")
    attn = {k: options.get(k, v) for k, v in spec.options.items()}
    model = {k: options.get(k, v) for k, v in spec.model_options.items()}
    return spec, attn, model


def _bound_class(spec: VariantSpec, attn: Mapping[str, Any]) -> Type[nn.Module]:
    """A real subclass of ``spec.cls`` (timm checks ``issubclass``) with ``attn`` bound as constructor defaults."""
    base = spec.cls

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **{**attn, **kwargs})

    cls_name = "".join(p.capitalize() for p in spec.name.split("-")) + "Attention"
    return type(cls_name, (base,), {"__init__": __init__, "__module__": base.__module__,
                                    "variant": spec.name, "variant_options": dict(attn)})


def attention_class(name: str, **options: Any) -> Type[nn.Module]:
    """A class usable as timm's ``attn_layer`` with the variant's options bound as constructor defaults.

    timm checks ``issubclass(attn_layer, ...)``, so this returns a real subclass, not a ``functools.partial``.
    Model-level options (``parallel``, ``pr``, ``param_matched``) are not accepted here.
    """
    spec, attn, model = split_options(name, **options)
    given_model = sorted(k for k in options if k in spec.model_options)
    if given_model:
        raise ValueError(f"{', '.join(given_model)} are model options of {spec.name!r}; pass them to create_model")
    return _bound_class(spec, attn)


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
    timm_kwargs = {"attn_head_dim", "dim_out", "qkv_bias", "qk_norm", "scale_norm", "proj_bias", "gated",
                   "attn_drop", "proj_drop", "norm_layer", "device", "dtype"}
    variant_opts = {k: v for k, v in options.items() if k not in timm_kwargs}
    layer_kwargs = {k: v for k, v in options.items() if k in timm_kwargs}
    return attention_class(spec.name, **variant_opts)(dim, num_heads=num_heads, **layer_kwargs)


_register_builtins()
#: The 15 built-in variants, in the order of SPEC.md.
BUILTIN_VARIANTS: Tuple[str, ...] = tuple(_ORDER)
VARIANTS.update({alias: VARIANTS[target] for alias, target in ALIASES.items()})
