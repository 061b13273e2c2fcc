"""Admission of image work by size (:class:`attnzoo.serve.admission.SizeGate`) and returning freed memory."""

from __future__ import annotations

import threading
import time

import pytest

from attnzoo.limits import return_free_memory
from attnzoo.serve.admission import DECODE_BYTES_PER_PIXEL, LARGE_PIXELS, SizeGate

MP = 10**6


def test_small_work_is_admitted_before_queued_large_work_and_one_large_runs_at_a_time():
    """Two slots: a large job runs; three more large ones queue; a small one sent last is admitted at once beside
    the running large one, and the queued large ones run one by one, never two together."""
    gate = SizeGate(budget=100 * LARGE_PIXELS * DECODE_BYTES_PER_PIXEL, slots=2)
    order, running, most = [], [0], [0]
    lock = threading.Lock()
    release = threading.Event()

    def job(name: str, pixels: int, hold: threading.Event | None = None) -> None:
        with gate.admitted(pixels):
            with lock:
                order.append(name)
                running[0] += pixels > LARGE_PIXELS
                most[0] = max(most[0], running[0])
            if hold is not None:
                hold.wait(10)
            else:
                time.sleep(0.05)
            with lock:
                running[0] -= pixels > LARGE_PIXELS

    first = threading.Thread(target=job, args=("large0", 2 * LARGE_PIXELS, release))
    first.start()
    time.sleep(0.1)
    queued = [threading.Thread(target=job, args=(f"large{i}", 2 * LARGE_PIXELS)) for i in (1, 2, 3)]
    for t in queued:
        t.start()
        time.sleep(0.02)
    small = threading.Thread(target=job, args=("small", 28 * 28))
    small.start()
    small.join(5)
    assert not small.is_alive() and order == ["large0", "small"], order  # it did not wait for large0 either
    release.set()
    for t in [first, *queued]:
        t.join(10)
    assert order[2:] == ["large1", "large2", "large3"] and most[0] == 1, (order, most)
    assert gate.used == gate.running == gate.large_running == 0


def test_the_budget_bounds_the_work_admitted_at_once_and_refuses_what_never_fits():
    gate = SizeGate(budget=10 * MP * DECODE_BYTES_PER_PIXEL, slots=4, large=10**18)
    inside = threading.Event()

    def second() -> None:
        with gate.admitted(6 * MP):
            inside.set()

    with gate.admitted(6 * MP):
        waiting = threading.Thread(target=second)
        waiting.start()
        time.sleep(0.2)
        assert not inside.is_set() and gate.used == 6 * MP * DECODE_BYTES_PER_PIXEL  # 12 MP would pass 10
    waiting.join(5)
    assert inside.is_set() and gate.peak == 6 * MP * DECODE_BYTES_PER_PIXEL and gate.used == 0
    with pytest.raises(ValueError, match=r"over this server's decode budget of 381 MiB \(10.0 MP\)"):
        with gate.admitted(11 * MP, "image 'x.png' (11000x1000)"):
            pass


def test_freed_memory_goes_back_to_the_system():
    """Blocks freed by worker threads stay in glibc's arenas until trimmed: after return_free_memory the process
    holds less."""
    import psutil

    if not return_free_memory():
        pytest.skip("glibc's malloc_trim is not available here")
    import numpy as np

    kept = []

    def churn() -> None:
        big = np.ones(20 * 2**20 // 8)
        del big  # freeing a 20 MiB mapping raises glibc's mmap threshold past 3 MiB
        blocks = [np.ones(3 * 2**20 // 8) for _ in range(40)]  # 3 MiB each, now from the thread's arena
        kept.append(blocks.pop())  # the last one stays: the arena cannot shrink from its top
        del blocks

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    before = psutil.Process().memory_info().rss
    return_free_memory()
    after = psutil.Process().memory_info().rss
    assert before - after > 100 * 2**20, (before, after)
