"""The probe every registered attention class passes: built with timm's ``Block`` keywords, run on a few tokens,
its output the input's shape and each extra-math scope a sub-module that runs (one ``ValueError`` line naming
the variant otherwise); and the class with a variant's options bound, as timm's ``attn_layer`` takes it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from timm.layers import Attention
from torch import nn

from attnzoo.errors import first_line

__all__ = ["TIMM_ATTN_KWARGS", "probe", "bound_class"]

#: The keywords timm's ``Block`` passes to its ``attn_layer`` (timm >= 1.0.23), used to probe a new class.
TIMM_ATTN_KWARGS: dict[str, Any] = dict(
    qkv_bias=True,
    qk_norm=False,
    scale_norm=False,
    proj_bias=True,
    attn_drop=0.0,
    proj_drop=0.0,
    norm_layer=nn.LayerNorm,
)
_PROBE_DIM, _PROBE_HEADS, _PROBE_SHAPE = 32, 2, (2, 5, 32)


def bound_class(name: str, base: type[nn.Module], attn: Mapping[str, Any]) -> type[nn.Module]:
    """A real subclass of ``base``, variant ``name``'s class (timm checks ``issubclass``), with ``attn`` bound as
    constructor defaults."""

    def __init__(self, *args, **kwargs):
        base.__init__(self, *args, **{**attn, **kwargs})

    cls_name = "".join(p.capitalize() for p in name.split("-")) + "Attention"
    return type(
        cls_name,
        (base,),
        {"__init__": __init__, "__module__": base.__module__, "variant": name, "variant_options": dict(attn)},
    )


def probe(name: str, cls: type[nn.Module], options: Mapping[str, Any], extra_scopes: Sequence[str]) -> tuple[str, ...]:
    """Build one layer of variant ``name`` (``cls`` with ``options`` bound) with timm's ``Block`` keywords, run it,
    and check that each of ``extra_scopes`` is a sub-module that runs.

    Returns:
        The layer's extra weights (:func:`_extra_weights`).

    Raises:
        ValueError: one line naming the variant and what is wrong.
    """
    cls_name = cls.__name__
    try:
        layer = bound_class(name, cls, dict(options))(_PROBE_DIM, num_heads=_PROBE_HEADS, **TIMM_ATTN_KWARGS)
    except TypeError as exc:
        raise ValueError(
            f"variant {name!r}: {cls_name} does not take timm's Attention constructor keywords "
            f"(dim, num_heads, {', '.join(TIMM_ATTN_KWARGS)}) plus its options: {first_line(exc, typed=True)}"
        ) from None
    except Exception as exc:
        raise ValueError(
            f"variant {name!r}: {cls_name}(dim={_PROBE_DIM}, num_heads={_PROBE_HEADS}, ...) "
            f"failed: {first_line(exc, typed=True)}"
        ) from None
    called: dict[str, int] = {}
    hooks = []
    for scope in extra_scopes:
        try:
            module = layer.get_submodule(scope)
        except AttributeError:
            subs = [n for n, _ in layer.named_modules() if n]
            if scope in subs:
                raise ValueError(
                    f"variant {name!r}: extra scope {scope!r} has the name of an nn.Module "
                    "attribute, which hides the sub-module; rename it"
                ) from None
            listed = ", ".join(subs) or "none"
            raise ValueError(
                f"variant {name!r}: extra scope {scope!r} is not a sub-module of {cls_name} (its sub-modules: {listed})"
            ) from None
        hooks.append(module.register_forward_hook(lambda *_, s=scope: called.__setitem__(s, called.get(s, 0) + 1)))
    x = torch.randn(*_PROBE_SHAPE, generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            out = layer.eval()(x, attn_mask=None)
    except Exception as exc:
        raise ValueError(
            f"variant {name!r}: {cls_name}.forward(x, attn_mask=None) failed on tokens of shape "
            f"{tuple(x.shape)}: {first_line(exc, typed=True)}"
        ) from None
    finally:
        for hook in hooks:
            hook.remove()
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(x.shape):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(
            f"variant {name!r}: {cls_name}.forward returns {got}, expected the input's shape "
            f"{tuple(x.shape)} (batch, tokens, dim)"
        )
    unused = [s for s in extra_scopes if not called.get(s)]
    if unused:
        raise ValueError(
            f"variant {name!r}: extra scope(s) {', '.join(unused)} never run in "
            f"{cls_name}.forward, so they would produce no ops in the graph"
        )
    return _extra_weights(layer)


def _extra_weights(layer: nn.Module) -> tuple[str, ...]:
    """Parameters of ``layer`` that timm's ``Attention`` of the probe's width lacks, as module names
    (``proj_s.weight`` and ``proj_s.bias`` give ``proj_s``)."""
    with torch.device("meta"):
        base = {n for n, _ in Attention(_PROBE_DIM, num_heads=_PROBE_HEADS, **TIMM_ATTN_KWARGS).named_parameters()}
    names = [re.sub(r"\.(weight|bias)$", "", n) for n, _ in layer.named_parameters() if n not in base]
    return tuple(dict.fromkeys(names))
