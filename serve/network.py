"""Where the demo and ``serve-models`` listen: loopback checks, the warning for a wider host, a free port."""

from __future__ import annotations

import ipaddress
import random
import socket
from pathlib import Path

__all__ = ["is_loopback", "exposure_warning", "free_port"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name, resolved) reaches this machine's loopback interface only."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return bool(addresses) and all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addresses)


def exposure_warning(host: str, port: int) -> str | None:
    """The warning a server listening on ``host:port`` prints (without ``warning: ``), or None on loopback."""
    if is_loopback(host):
        return None
    return f"--host {host}: port {port} answers whoever can reach this machine there (no authentication, no TLS)"


#: The lowest port :func:`free_port` picks: above Ray's worker ports (10002-19999 by default).
FIRST_FREE_PORT = 20000
#: Where Linux says which ports outgoing connections and ``bind(0)`` take (the ephemeral range).
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_RNG = random.SystemRandom()


def _ephemeral_ports_start() -> int | None:
    """The first port of the kernel's ephemeral range (32768 by default on Linux), or None where unknown."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, for a server that binds it later (HAProxy's, Ray's metrics, a test's).

    It is picked at random between :data:`FIRST_FREE_PORT` and the kernel's ephemeral range, where neither an
    outgoing connection nor a ``bind(0)`` listener takes it meanwhile: a local Ray opens dozens of both between the
    pick and the bind, and a port from the ephemeral range was sometimes taken by then (HAProxy then could not
    start). Where that range is unknown or leaves no room, the kernel picks, as ``bind(0)``.
    """
    start = _ephemeral_ports_start()
    if start is not None and start - FIRST_FREE_PORT >= 1000:
        for _ in range(64):
            port = _RNG.randrange(FIRST_FREE_PORT, start)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:  # in use (or waiting to close): another one
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
