"""Fixtures shared by the tests of more than one layer, the fault handler kept on to the end, and every skip held
to the README's sentence on skipped tests (tests/skips.py)."""

import faulthandler
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from attnzoo.models import registry
from tests import skips


def pytest_configure(config: pytest.Config) -> None:
    """A skip whose reason the README's sentence does not name fails, naming it (tests/skips.py)."""
    if not config.pluginmanager.is_registered(skips):
        config.pluginmanager.register(skips, "attnzoo-readme-skips")


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


def quick_bench_args(
    out: str | Path,
    variants: str,
    backends: str,
    *extra: str,
    cache_dir: str | Path | None = None,
    batch_sizes: str = "1",
    min_time: str = "0.05",
) -> list[str]:
    """``bench-latency``'s arguments for a short run of the micro model on one thread, into ``out`` (its engine and
    export cache in ``cache_dir``, default ``out/cache``), without a progress bar; ``extra`` follows."""
    return [
        *("--arch", "micro", "--variants", variants, "--backends", backends),
        *("--batch-sizes", batch_sizes, "--min-time", min_time, "--threads", "1"),
        *("--out", str(out), "--cache-dir", str(cache_dir if cache_dir is not None else Path(out) / "cache")),
        "--no-progress",
        *extra,
    ]


@pytest.fixture(scope="session")
def bench_args() -> Callable[..., list[str]]:
    """:func:`quick_bench_args`: the setup of a short ``bench-latency`` run that the benchmark, backend, bf16,
    TensorRT and plugin tests share."""
    return quick_bench_args


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Keep the fault handler on until the interpreter is gone. pytest switches its own off here (after the summary),
    so a native crash in a library's teardown at exit would end the run with status 139 and nothing said; this way
    it prints every thread's Python stack."""
    if sys.__stderr__ is not None and not sys.__stderr__.closed:
        faulthandler.enable(file=sys.__stderr__, all_threads=True)
