"""Where the demo and ``serve-models`` listen: loopback checks, the warning for a wider host, a free port."""

from __future__ import annotations

import ipaddress
import socket

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


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
