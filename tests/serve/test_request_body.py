"""serve-models reads a request body with a time limit on every Python the package supports (3.10 has no
``asyncio.timeout``)."""

from __future__ import annotations

import asyncio

import pytest

from attnzoo.serve.rayserve import http_io


class _Request:
    """A Starlette request stand-in: its headers and a body stream of ``chunks``, ``delay`` s before each."""

    def __init__(self, chunks: list[bytes], delay: float = 0.0) -> None:
        self.headers = {"content-length": str(sum(map(len, chunks)))}
        self.chunks, self.delay = chunks, delay

    async def stream(self):
        for chunk in self.chunks:
            await asyncio.sleep(self.delay)
            yield chunk


@pytest.fixture(params=["this python", "python 3.10"])
def python(request, monkeypatch):
    if request.param == "python 3.10":
        monkeypatch.delattr(asyncio, "timeout", raising=False)  # added in 3.11
    return request.param


def test_body_is_read_whole(python):
    body = asyncio.run(http_io._body(_Request([b"ab", b"cd"]), limit=10))
    assert body == b"abcd"


def test_body_that_does_not_arrive_is_a_408(python, monkeypatch):
    monkeypatch.setattr(http_io, "BODY_TIMEOUT_S", 0.05)
    with pytest.raises(http_io.HTTPError) as err:
        asyncio.run(http_io._body(_Request([b"ab", b"cd"], delay=1.0), limit=10))
    assert err.value.status == 408 and "did not arrive within 0.05 s" in err.value.message
