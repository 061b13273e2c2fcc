"""Which run repeats a per-variant test for which variant (docs/contributing.md, "Test tiers").

Three runs: the default one (``pytest``), CI's slow run (``pytest -m "slow and not matrix"``) and the full matrix
(``pytest -m matrix``, every variant). A per-variant test runs a few variants in the default run (its own fast
set), one variant of each kind of math in CI's slow run (:data:`SLOW_SET`), and every other variant in the matrix
run, where a repeat checks the same op kinds again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import pytest

#: One variant of each kind of math the variants add to attention, beside the reference: belief-star (the
#: projection and the head projection), mabvit-glu (the value through a SiLU gate), wafe-mse (squared-distance
#: scores, the key norm), anti-wafe-mae (pairwise L1 scores with the flipped sign) and horizontal-vertical (the
#: gate over heads and the gate over the output). With the tests' fast sets (belief2, wafe-mae, anti-wafe-mse,
#: mostly) every extra-math scope is covered.
SLOW_SET = ("standard", "belief-star", "mabvit-glu", "wafe-mse", "anti-wafe-mae", "horizontal-vertical")


def marks(variant: str, fast: Collection[str] = (), slow: Collection[str] = SLOW_SET) -> list[pytest.MarkDecorator]:
    """The marks of ``variant``'s case: none in ``fast``, ``slow`` in ``slow``, else ``slow`` and ``matrix``."""
    if variant in fast:
        return []
    if variant in slow:
        return [pytest.mark.slow]
    return [pytest.mark.slow, pytest.mark.matrix]


def per_variant(variants: Iterable[str], fast: Collection[str] = ()) -> list:
    """``pytest.param(variant)`` for each of ``variants``, marked by :func:`marks`."""
    return [pytest.param(v, marks=marks(v, fast)) for v in variants]
