"""The pairing: each row timed beside its partners in the same rounds, A B A B, because a shared machine is noisy
-- eager of the same variant at the row's precision (the speed-up), ``standard`` on the same backend, dtype and
batch (the variant's overhead), and the two fastest fp32 CPU runtimes against each other (the head-to-head that
decides the report's fastest CPU runtime). The partners are kept while a later row needs them and closed after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from attnzoo.benchmarks.phases import Phases
from attnzoo.benchmarks.plan import Settings, on_cpu
from attnzoo.benchmarks.stats import ratio_stats
from attnzoo.benchmarks.timing import measure_pair
from attnzoo.errors import first_line
from attnzoo.runtime.backends import Call, get_backend

__all__ = ["Partner", "Pairing", "baseline_dtype"]


class Partner:
    """A runner another row is timed against (A/B): the one just measured, or -- for a row a resumed run kept --
    loaded again when first needed (``None`` if that fails: the pairs are then left out)."""

    def __init__(self, runner: Call | None = None, load: Callable[[], Call | None] | None = None) -> None:
        self.runner, self.load = runner, load

    def get(self) -> Call | None:
        if self.runner is None and self.load is not None:
            load, self.load = self.load, None
            try:
                self.runner = load()
            except Exception:  # a partner that will not load: no pairs, the row says nothing wrong
                self.runner = None
        return self.runner

    def close(self) -> None:
        """Close the runner's session (if it was loaded); it is not loaded again."""
        runner, self.runner, self.load = self.runner, None, None
        if runner is not None:
            runner.close()


def baseline_dtype(backend: str, dtype: str, eagers: dict[str, Any]) -> str | None:
    """The precision of the eager row a ``backend`` row at ``dtype`` is compared with: eager at the same precision
    where that row ran (an fp16 row against eager fp16, not fp32), else -- and for eager's own rows -- eager fp32;
    ``None`` without an eager fp32 row. Eager fp32 is its own baseline."""
    reference = get_backend(backend).is_reference
    if not reference and dtype in eagers:
        return dtype
    return "fp32" if "fp32" in eagers or (reference and dtype == "fp32") else None


class Pairing:
    """The A/B partners of one run and what their pairs measured: ``standard``'s runners (partners of every later
    variant), the head-to-head pairs and their errors."""

    def __init__(self, settings: Settings, device: torch.device, phases: Phases) -> None:
        self.settings, self.device, self.phases = settings, device, phases
        self.standard: dict[tuple[str, str, int], Partner] = {}
        self.pairs: list[dict[str, Any]] = []  # head-to-head fp32 CPU runtimes (b time / a time)
        self.head_to_head_errors: list[str] = []

    def with_eager(self, row: dict[str, Any], runner: Call, base: str | None, eagers: dict[str, Partner]) -> None:
        """Time ``runner`` against the eager row of precision ``base``, A B A B; the speed-up's pairs in ``row``."""
        eager = eagers[base].get() if base in eagers and self.settings.pair_eager else None
        if eager is None or eager is runner:
            return
        with self.phases.phase("A/B pairs with eager"):
            a, b = measure_pair(
                eager.fn, runner.fn, self.settings.min_time, cuda_a=eager.cuda, cuda_b=runner.cuda, settled=True
            )
        pair = ratio_stats(b, a)  # eager time / backend time = speed-up
        row.update(
            speedup_pair_median=pair["ratio_median"],
            speedup_pair_q1=pair["ratio_q1"],
            speedup_pair_q3=pair["ratio_q3"],
            speedup_pairs=pair["pairs"],
        )

    def with_standard(self, variant: str, backend: str, dtype: str, batch: int, runner: Call) -> dict[str, Any] | None:
        """Time ``runner`` against ``standard`` on the same backend, dtype and batch, A B A B: the overhead entry
        (``None`` for ``standard`` itself, or without its runner)."""
        std = self.standard[(backend, dtype, batch)].get() if (backend, dtype, batch) in self.standard else None
        if variant == "standard" or std is None:
            return None
        with self.phases.phase("A/B pairs with standard"):
            a, b = measure_pair(
                std.fn, runner.fn, self.settings.min_time, cuda_a=std.cuda, cuda_b=runner.cuda, settled=True
            )
        return {
            "variant": variant,
            "backend": backend,
            "dtype": dtype,
            "batch": batch,
            **ratio_stats(a, b),
            **_medians_ms(variant=b, standard=a),
        }

    def head_to_head(
        self, variant: str, batch: int, runners: dict[str, Call | None], rows: Sequence[dict[str, Any]]
    ) -> None:
        """Time the two fastest fp32 CPU runtimes (by speed-up over eager in ``rows``) against each other, A B A B,
        so the report's "fastest" rests on a direct comparison, not on two comparisons with eager made at different
        times. A timing failure is a note in ``head_to_head_errors``."""
        live = {k: v for k, v in runners.items() if v is not None}
        if len(live) < 2:
            return
        speedup = {
            r["backend"]: r["speedup_pair_median"] or 0.0
            for r in rows
            if (r["variant"], r["batch"], r["dtype"], r["status"]) == (variant, batch, "fp32", "ok")
            and r["backend"] in live
        }
        a, b = sorted(live, key=lambda k: -speedup.get(k, 0.0))[:2]
        try:
            with self.phases.phase("CPU head-to-head"):
                ta, tb = measure_pair(live[a].fn, live[b].fn, self.settings.min_time, settled=True)
        except Exception as exc:  # a timing failure is a note, not a crash
            self.head_to_head_errors.append(f"{variant} b{batch} {a}/{b}: {first_line(exc, typed=True)}")
            return
        self.pairs.append(
            {
                "variant": variant,
                "batch": batch,
                "a": a,
                "b": b,
                **ratio_stats(ta, tb),
                **_medians_ms(a=ta, b=tb),
            }
        )

    def keep(
        self,
        variant: str,
        backend: str,
        dtype: str,
        batch: int,
        partner: Partner,
        eagers: dict[str, Partner],
        cpu_runners: dict[str, Partner],
    ) -> bool:
        """Keep a runner where later rows look for their A/B partners; whether it was kept."""
        kept = variant == "standard"
        if get_backend(backend).is_reference:
            eagers[dtype], kept = partner, True
        elif dtype == "fp32" and on_cpu(backend, self.device):
            cpu_runners[backend], kept = partner, True
        if variant == "standard":
            self.standard[(backend, dtype, batch)] = partner
        return kept

    def close(self) -> None:
        """Close the runners kept to the end of the run (``standard``'s, every later variant's partners)."""
        for partner in self.standard.values():
            partner.close()
        self.standard.clear()


def _medians_ms(**samples: Sequence[float]) -> dict[str, float]:
    """Each side's median of a pair's timings (seconds), in ms, as ``<side>_median_ms`` in the order given."""
    return {f"{side}_median_ms": float(np.median(times) * 1e3) for side, times in samples.items()}
