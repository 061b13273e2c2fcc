"""A fixture that takes the network away: Hugging Face Hub offline and every internet socket's connect refused, so
a test that passes under it reached nothing (timm's ``pretrained=True`` and ``local-dir:`` included)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import huggingface_hub.constants
import pytest


class NetworkUsed(AssertionError):
    """A test under :func:`offline` tried to connect somewhere."""


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """HF_HUB_OFFLINE=1 (the environment and huggingface_hub's constant, read at its import) and no internet
    connection; yields the addresses a refused connect asked for (none when the test kept off the network)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    asked: list[object] = []
    connect = socket.socket.connect

    def refuse(self: socket.socket, address: object) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            asked.append(address)
            raise NetworkUsed(f"a test under the offline fixture connected to {address!r}")
        connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", refuse)
    yield asked
    assert asked == [], f"connections attempted: {asked}"
