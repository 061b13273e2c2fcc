"""The memory one serve-models replica lets its requests decode into at once: its budget, sized from the memory the
replica has (:func:`decode_budget`), handed out first come, first served (:class:`MemoryBudget`), and held for one
request's body (:func:`holding`: 413 when it never fits, 503 with ``Retry-After`` when it finds no room in time)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from attnzoo.limits import available_memory, return_free_memory
from attnzoo.serve.admission import (
    DECODE_BYTES_PER_PIXEL,
    DECODE_MEMORY_CAP,
    DECODE_MEMORY_SHARE,
    RETURN_MEMORY_BYTES,
)
from attnzoo.serve.rayserve.http_io import HTTPError, _size

__all__ = ["DECODE_WAIT_S", "replica_memory", "decode_budget", "MemoryBudget", "holding"]

#: Seconds a request waits for room in the decode budget before it gets 503 with ``Retry-After``.
DECODE_WAIT_S = 10.0


def replica_memory() -> int | None:
    """Bytes this process can still take: the machine's available memory, or less where a cgroup (v2 or v1) limits
    this container's memory; None when neither is known."""
    known = [m for m in (available_memory(), _cgroup_room()) if m is not None]
    return min(known) if known else None


def _cgroup_room() -> int | None:
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            cap = Path(limit).read_text().strip()
            if cap == "max" or int(cap) >= 2**60:  # no limit
                return None
            return max(0, int(cap) - int(Path(usage).read_text()))
        except (OSError, ValueError):
            continue
    return None


def decode_budget(settings: Mapping[str, Any], memory: int | None = None) -> int:
    """Bytes the images one replica decodes at once may hold: ``decode_memory_mb`` when set, else
    :data:`DECODE_MEMORY_SHARE` of the replica's memory, i.e. of what this machine had available when the replica
    started (``memory``, default :func:`replica_memory`) split between the deployment's ``replicas`` (a local Ray
    runs them all here; on a cluster this is on the safe side), and at most :data:`DECODE_MEMORY_CAP` (also where
    the memory is unknown)."""
    if settings.get("decode_memory_mb"):
        return int(float(settings["decode_memory_mb"]) * 2**20)
    memory = replica_memory() if memory is None else memory
    if memory is None:
        return DECODE_MEMORY_CAP
    return min(DECODE_MEMORY_CAP, int(memory * DECODE_MEMORY_SHARE / max(1, int(settings.get("replicas", 1)))))


class MemoryBudget:
    """Bytes that concurrent work may hold at once, handed out first come, first served: a request that does not
    fit waits, and so does every request after it, so a large image is not starved by a stream of small ones.
    Used from the replica's event loop only."""

    def __init__(self, total: int) -> None:
        self.total = int(total)
        self.used = 0
        self.peak = 0
        self.waited = 0
        self.refused = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()

    def _take(self, n: int) -> None:
        self.used += n
        self.peak = max(self.peak, self.used)

    def _grant(self) -> None:
        while self._waiting:
            n, fut = self._waiting[0]
            if fut.done():  # given up
                self._waiting.popleft()
                continue
            if self.used + n > self.total:
                return
            self._waiting.popleft()
            self._take(n)
            fut.set_result(None)

    async def acquire(self, n: int, timeout: float) -> bool:
        """Take ``n`` bytes, waiting up to ``timeout`` s for them (in arrival order); False when they were not
        free in time. ``n`` over :attr:`total` never fits: check that first."""
        if not self._waiting and self.used + n <= self.total:
            self._take(n)
            return True
        self.waited += 1
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(entry[1]), timeout)
            return True
        except asyncio.TimeoutError:
            if entry[1].done():  # granted just as the wait ended
                return True
            self.refused += 1
            self._give_up(entry)
            return False
        except BaseException:  # the request was cancelled (its client went away) while it waited
            if entry[1].done() and not entry[1].cancelled():
                self.release(n)
            else:
                self._give_up(entry)
            raise

    def _give_up(self, entry: tuple[int, asyncio.Future]) -> None:
        entry[1].cancel()
        with contextlib.suppress(ValueError):
            self._waiting.remove(entry)
        self._grant()  # the requests behind it may fit

    def release(self, n: int) -> None:
        """Give back ``n`` bytes taken by :meth:`acquire`."""
        self.used -= n
        self._grant()

    def as_dict(self) -> dict[str, int]:
        return {
            "bytes": self.total,
            "in_use": self.used,
            "peak": self.peak,
            "waited": self.waited,
            "refused": self.refused,
        }


@contextlib.asynccontextmanager
async def holding(
    budget: MemoryBudget, need: int, what: str, in_thread: Callable[..., Awaitable[Any]]
) -> AsyncIterator[None]:
    """Hold ``need`` bytes of ``budget`` for a request's body (``what``, for the messages): 413 when they never fit,
    503 with ``Retry-After`` when they are not free within :data:`DECODE_WAIT_S`; a large one hands the memory it
    freed back to the system (``in_thread(return_free_memory)``) before the bytes are released."""
    if need > budget.total:
        raise HTTPError(
            413,
            f"{what} takes about {_size(need)} of memory to decode, over this replica's decode "
            f"budget of {_size(budget.total)} ({budget.total // DECODE_BYTES_PER_PIXEL / 1e6:.1f} "
            "MP); send a smaller one",
        )
    if not await budget.acquire(need, DECODE_WAIT_S):
        raise HTTPError(
            503,
            f"busy: the work in progress holds {_size(budget.used)} of this replica's "
            f"{_size(budget.total)} decode budget and {what} ({_size(need)}) found no room "
            f"within {DECODE_WAIT_S:g} s; retry",
            headers={"Retry-After": "5"},
        )
    try:
        yield
    finally:
        try:
            if need >= RETURN_MEMORY_BYTES:
                await in_thread(return_free_memory)
        finally:
            budget.release(need)
