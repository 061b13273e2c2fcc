"""Where a run's time goes: seconds by kind of work (the ONNX exports and their checks, loading and compiling per
backend, engine builds, timing, the A/B pairs, ...), ``phases_s`` in ``results.json``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

__all__ = ["Phases"]


class Phases(dict[str, float]):
    """Seconds of this invocation by kind of work, added to by :meth:`phase`."""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall time of the block under ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self[name] = self.get(name, 0.0) + time.perf_counter() - t0

    def summary(self, wall: float) -> dict[str, float]:
        """The seconds by kind of work, largest first, and ``other`` (setup, model creation, parity checks, the
        report's arithmetic: the wall time no phase covered)."""
        out = {k: round(v, 2) for k, v in sorted(self.items(), key=lambda kv: -kv[1])}
        out["other"] = round(max(wall - sum(self.values()), 0.0), 2)
        return out
