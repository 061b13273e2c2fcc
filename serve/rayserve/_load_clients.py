"""The load test's clients and measurements: closed-loop aiohttp clients, their throughput and latency, the
replicas' own counts, and the kill test (one replica process killed mid-run: who failed, when it was replaced).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import numpy as np

from attnzoo.lazy import lazy_import
from attnzoo.serve.rayserve.config import DEPLOYMENT

# imported on first use: Ray
serve = lazy_import("ray.serve")
ray_state = lazy_import("ray._private.state")


@dataclass
class Record:
    """One request: start and end (``time.perf_counter``), HTTP status or the exception's name, and for a
    failure the start of its response body or the exception's message."""

    start: float
    end: float
    status: Any
    detail: str = ""


async def _client(session, url: str, body: bytes, stop_at: float, records: list[Record], timeout: float) -> None:
    headers = {"Content-Type": "image/png"}
    while time.perf_counter() < stop_at:
        start = time.perf_counter()
        detail = ""
        try:
            async with session.post(url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                answer = await r.read()
                status: Any = r.status
                if status != 200:
                    detail = answer[:200].decode("utf-8", "replace")
        except asyncio.TimeoutError:
            status = "timeout"
        except Exception as exc:  # connection reset by a killed replica's proxy, refused ...: an error
            status, detail = type(exc).__name__, str(exc)[:200]
        records.append(Record(start, time.perf_counter(), status, detail))


async def _run(url: str, body: bytes, clients: int, seconds: float, timeout: float) -> list[Record]:
    records: list[Record] = []
    stop_at = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(_client(session, url, body, stop_at, records, timeout) for _ in range(clients)))
    return records


def run_clients(url: str, body: bytes, clients: int, seconds: float, timeout: float = 60.0) -> list[Record]:
    """``clients`` closed-loop clients posting ``body`` to ``url`` for ``seconds``; every request's record
    (requests in flight at the end are awaited, up to ``timeout``)."""
    return asyncio.run(_run(url, body, clients, seconds, timeout))


def summarize(records: Sequence[Record], t0: float, t1: float) -> dict[str, Any]:
    """Throughput and latency of the requests that started in ``[t0, t1)``.

    ``throughput_rps``: answers with status 200 that ended in ``[t0, t1)``, per second. Latency percentiles
    are over the successful requests that started in the window. ``errors``: answered with another status or
    failed by the connection; ``lost``: no answer within the timeout.
    """
    window = [r for r in records if t0 <= r.start < t1]
    ok = [r for r in window if r.status == 200]
    lat = np.array([r.end - r.start for r in ok]) * 1000.0
    done = sum(1 for r in records if r.status == 200 and t0 <= r.end < t1)
    errors: dict[str, int] = {}
    for r in window:
        if r.status not in (200, "timeout"):
            errors[str(r.status)] = errors.get(str(r.status), 0) + 1
    pct = (lambda q: round(float(np.percentile(lat, q)), 2)) if len(lat) else (lambda q: None)
    return {
        "requests": len(window),
        "ok": len(ok),
        "errors": sum(errors.values()),
        "errors_by_status": errors,
        "lost": sum(1 for r in window if r.status == "timeout"),
        "seconds": round(t1 - t0, 3),
        "throughput_rps": round(done / (t1 - t0), 2),
        "p50_ms": pct(50),
        "p95_ms": pct(95),
        "p99_ms": pct(99),
        "mean_ms": round(float(lat.mean()), 2) if len(lat) else None,
        "max_ms": round(float(lat.max()), 2) if len(lat) else None,
    }


def _get_json(url: str, timeout: float = 10.0) -> dict[str, Any]:
    r = httpx.get(url, timeout=timeout)
    r.raise_for_status()
    return r.json()


def replica_stats(url: str, replicas: int, wait_s: float = 30.0) -> dict[str, dict[str, Any]]:
    """``GET /stats`` until each of ``replicas`` replicas answered once (the router spreads the calls), for at most
    ``wait_s`` seconds: a replica the controller already counts as running can take a moment more to be routed to
    (HAProxy reloads its backends), so a fixed number of back-to-back calls could see only the old one."""
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + wait_s
    while len(seen) < replicas and time.monotonic() < deadline:
        try:
            s = _get_json(f"{url}/stats")
            seen[s["replica"]] = s
        except Exception:  # a replica being replaced: try again
            time.sleep(0.2)
            continue
        if len(seen) < replicas:
            time.sleep(0.05)
    return seen


def replica_pid(replica: str) -> int:
    """The process id of the running replica whose id ``GET /stats`` gives (from Ray's actor table: the replica
    does not tell HTTP clients its pid)."""
    name = f"SERVE_REPLICA::{DEPLOYMENT}#{DEPLOYMENT}#{replica}"
    found = [a["Pid"] for a in ray_state.actors().values() if a.get("Name") == name and a.get("State") == "ALIVE"]
    if not found:
        raise RuntimeError(f"no running replica {replica} in Ray's actor table")
    return int(found[0])


def _mean_batch(stats: dict[str, dict[str, Any]]) -> float | None:
    hist: dict[int, int] = {}
    for s in stats.values():
        for k, v in s["requests_per_batch"].items():
            hist[int(k)] = hist.get(int(k), 0) + v
    n = sum(hist.values())
    return round(sum(k * v for k, v in hist.items()) / n, 3) if n else None


# ------------------------------------------------------------------------------------------ kill test
class _StatusPoller(threading.Thread):
    """Polls ``serve.status()`` (the running replica count) every ``period`` s until stopped."""

    def __init__(self, app: str, deployment: str, period: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.app, self.deployment, self.period = app, deployment, period
        self.timeline: list[tuple[float, int]] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                d = serve.status().applications[self.app].deployments[self.deployment]
                running = int(d.replica_states.get("RUNNING", 0))
                if not self.timeline or self.timeline[-1][1] != running:
                    self.timeline.append((time.perf_counter(), running))
            except Exception:  # the controller busy: next poll
                pass
            self._stop_event.wait(self.period)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)


def kill_test(url: str, body: bytes, clients: int, seconds: float, replicas: int, timeout: float) -> dict[str, Any]:
    """Kill one replica process (SIGKILL) a third into a ``seconds`` run; who failed, and the recovery."""
    before = replica_stats(url, replicas)
    if len(before) < 2:
        raise RuntimeError(f"the kill test needs 2 replicas answering, saw {len(before)}")
    victim = sorted(before.values(), key=lambda s: s["replica"])[0]
    victim_pid = replica_pid(victim["replica"])
    poller = _StatusPoller(DEPLOYMENT, DEPLOYMENT)
    poller.start()
    killed: dict[str, float] = {}

    def killer() -> None:
        time.sleep(seconds / 3)
        killed["at"] = time.perf_counter()
        os.kill(victim_pid, signal.SIGKILL)

    killer_thread = threading.Thread(target=killer, daemon=True)
    t0 = time.perf_counter()
    killer_thread.start()
    records = run_clients(f"{url}/classify", body, clients, seconds, timeout)
    t1 = time.perf_counter()
    # wait (bounded) for the deployment to have all its replicas again
    deadline = time.perf_counter() + 120
    while time.perf_counter() < deadline and (not poller.timeline or poller.timeline[-1][1] < replicas):
        time.sleep(0.5)
    poller.stop()
    kill_at = killed["at"]
    failed = [r for r in records if r.status != 200]
    in_flight = [r for r in failed if r.start <= kill_at]
    later = [r for r in failed if r.start > kill_at]
    back = next((ts for ts, n in poller.timeline if ts > kill_at and n >= replicas), None)
    dropped = any(ts > kill_at and n < replicas for ts, n in poller.timeline)
    after = replica_stats(url, replicas)
    return {
        "replicas": replicas,
        "killed_replica": victim["replica"],
        "killed_pid": victim_pid,
        "kill_at_s": round(kill_at - t0, 3),
        "summary": summarize(records, t0, t1),
        "failed_in_flight_at_kill": len(in_flight),
        "failed_sent_after_kill": len(later),
        "failed_statuses": sorted({str(r.status) for r in failed}),
        "failures_sent_after_kill": [
            {"after_kill_s": round(r.start - kill_at, 4), "status": str(r.status), "detail": r.detail} for r in later
        ],
        "replica_count_dropped": dropped,
        "replicas_back_after_s": round(back - kill_at, 3) if back else None,
        "replicas_after": sorted(after),
        "replaced": victim["replica"] not in after and len(after) >= replicas,
        "timeline": [[round(ts - t0, 3), n] for ts, n in poller.timeline],
    }
