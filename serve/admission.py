"""Admission of image work by its size: what decoding an upload will cost is known from its header before a pixel is
decoded, so the work (decode, resize, model, pictures) is admitted by that cost, not in arrival order.

:class:`SizeGate` (the demo's): at most ``slots`` jobs run at once, of which at most one is *large*; their decode
costs together stay within a memory budget; waiting jobs are admitted smallest first. A small request therefore
never waits behind a queue of large ones: at most for the one large job running beside it, and usually not at all.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

from attnzoo.limits import MAX_IMAGE_PIXELS, available_memory, return_free_memory

__all__ = [
    "DECODE_BYTES_PER_PIXEL",
    "DECODE_MEMORY_SHARE",
    "DECODE_MEMORY_CAP",
    "LARGE_PIXELS",
    "RETURN_MEMORY_BYTES",
    "SizeGate",
    "default_budget",
]

#: Peak memory per pixel while an upload is decoded, converted and preprocessed by the servers' one path
#: (:mod:`attnzoo.preprocess`, :mod:`attnzoo.serve.predict`), charged from the image's size alone, so it is known
#: before a pixel is decoded: the images that take the most (16-bit and float ones, converted through float64;
#: the peak is in that conversion, for classify and segment alike), with room to spare.
#: ``tests/serve/test_serve_models.py`` measures the peak of both kinds and fails when it passes this.
DECODE_BYTES_PER_PIXEL = 40
#: Share of the memory a server has that the images it decodes at once may take by default; the rest is for the
#: models, the request bodies, the runtime and, on a shared machine, everyone else.
DECODE_MEMORY_SHARE = 0.25
#: Most bytes the default budget takes, however much memory is free: room for two images at the pixel cap at once
#: (3.2 GB), the same as where the memory is unknown.
DECODE_MEMORY_CAP = 2 * MAX_IMAGE_PIXELS * DECODE_BYTES_PER_PIXEL
#: An image of more pixels than this is *large* (:class:`SizeGate` runs one at a time): 4 MP, a 2,048 x 2,048 image.
LARGE_PIXELS = 4 * 2**20
#: Work that held this many bytes of a budget or more hands the memory it freed back to the system before its
#: bytes are free for the next job (:func:`attnzoo.limits.return_free_memory`), so a server's resident memory stays
#: within its budget plus the models, round after round.
RETURN_MEMORY_BYTES = 64 * 2**20


def default_budget(memory: int | None = None) -> int:
    """:data:`DECODE_MEMORY_SHARE` of ``memory`` (default: what this machine has available now), at most
    :data:`DECODE_MEMORY_CAP` (also where the memory is unknown)."""
    memory = available_memory() if memory is None else memory
    return DECODE_MEMORY_CAP if memory is None else min(DECODE_MEMORY_CAP, int(memory * DECODE_MEMORY_SHARE))


class SizeGate:
    """Thread-safe admission of jobs by their decode cost (bytes, :data:`DECODE_BYTES_PER_PIXEL` per pixel).

    At most ``slots`` jobs run at once, at most one of them large (over ``large`` bytes), and their costs together
    stay within ``budget``; the waiting job admitted next is the smallest that fits (ties in arrival order). A
    job's cost over the whole budget is refused at once (``ValueError``, one line).
    """

    def __init__(self, budget: int, slots: int = 2, large: int = LARGE_PIXELS * DECODE_BYTES_PER_PIXEL) -> None:
        self.budget, self.slots, self.large = int(budget), max(1, int(slots)), int(large)
        self.used = self.running = self.large_running = 0
        self.peak = 0
        self._cond = threading.Condition()
        self._waiting: list[tuple[int, int]] = []  # (cost, ticket)
        self._tickets = itertools.count()

    def _fits(self, cost: int) -> bool:
        return (
            self.running < self.slots
            and self.used + cost <= self.budget
            and (cost <= self.large or self.large_running == 0)
        )

    def _next(self) -> tuple[int, int] | None:
        """The waiting job to admit now: the smallest that fits."""
        for entry in sorted(self._waiting):
            if self._fits(entry[0]):
                return entry
        return None

    @contextlib.contextmanager
    def admitted(self, pixels: int, what: str = "the image") -> Iterator[None]:
        """Hold a place for work on an image of ``pixels`` pixels until the block ends (waiting for it first).

        Raises:
            ValueError: the image's decode cost is over the whole budget.
        """
        cost = int(pixels) * DECODE_BYTES_PER_PIXEL
        if cost > self.budget:
            raise ValueError(
                f"{what} takes about {cost / 2**20:.0f} MiB of memory to decode, over this server's decode budget "
                f"of {self.budget / 2**20:.0f} MiB ({self.budget // DECODE_BYTES_PER_PIXEL / 1e6:.1f} MP); "
                "send a smaller one"
            )
        entry = (cost, next(self._tickets))
        with self._cond:
            self._waiting.append(entry)
            try:
                self._cond.wait_for(lambda: self._next() == entry)
            finally:
                self._waiting.remove(entry)
            self.used += cost
            self.running += 1
            self.large_running += cost > self.large
            self.peak = max(self.peak, self.used)
            self._cond.notify_all()
        try:
            yield
        finally:
            try:
                if cost >= RETURN_MEMORY_BYTES:
                    return_free_memory()
            finally:
                with self._cond:
                    self.used -= cost
                    self.running -= 1
                    self.large_running -= cost > self.large
                    self._cond.notify_all()
