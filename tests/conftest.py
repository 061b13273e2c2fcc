"""Fixtures shared by the tests of more than one layer."""

from collections.abc import Iterator

import pytest

from attnzoo.models import registry


@pytest.fixture
def registry_restored() -> Iterator[None]:
    """Whatever a test registers (variants, aliases, their order) is gone afterwards."""
    order, variants, aliases = list(registry._ORDER), dict(registry.VARIANTS), dict(registry.ALIASES)
    yield
    registry._ORDER[:] = order
    registry.VARIANTS.clear()
    registry.VARIANTS.update(variants)
    registry.ALIASES.clear()
    registry.ALIASES.update(aliases)
