"""Bounded reads of what a registry answers: a body within its cap and its deadline, an error
detail redacted before it is cut, a JSON document read once; a body's pieces split into runs."""

from __future__ import annotations

import math
import time
from typing import Iterator

import httpx

from attest.redact import redact_known
from tools.oci.format.errors import OciError

DETAIL_READ_BYTES = 4096
DETAIL_SHOWN_CHARS = 300


def read_bounded(
    response: httpx.Response, limit: int, what: str, *, truncate: bool = False, deadline: float = math.inf
) -> bytes:
    """At most `limit` bytes of a streamed body, read by `deadline` (time.monotonic()); more is
    refused (or cut, for error details), and so is a body still arriving at the deadline."""
    body = bytearray()
    for chunk in response.iter_bytes():  # as they arrive: a chunk size would wait to fill it
        if time.monotonic() > deadline:
            if truncate:
                return bytes(body[:limit])
            raise OciError(f"{what} was still arriving at its deadline (a peer trickling bytes)", field=what)
        body += chunk
        if len(body) > limit:
            if truncate:
                return bytes(body[:limit])
            raise OciError(f"{what} is larger than the {limit} bytes allowed", field=what)
    return bytes(body)


def error_detail(body: bytes) -> str:
    """An error body's start, for a message: redacted before it is cut, so a secret the peer
    echoes can never survive as a fragment at the cut."""
    return redact_known(body[:DETAIL_READ_BYTES].decode("utf-8", "replace"))[:DETAIL_SHOWN_CHARS]


class Pieces:
    """A body's pieces read forward without copying them whole: a run of at most N bytes (the
    last piece split, its rest kept for the next run), or everything left."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces, self._held = pieces, b""

    def take(self, count: int) -> bytes:
        return b"".join(self.upto(count))

    def upto(self, count: int) -> Iterator[bytes]:
        """Pieces adding up to at most `count` bytes (fewer only at the end of the body)."""
        while count > 0:
            piece = self._held or next(self._pieces, b"")
            self._held = b""
            if not piece:
                return
            if len(piece) > count:
                piece, self._held = piece[:count], piece[count:]
            count -= len(piece)
            yield piece

    def rest(self) -> Iterator[bytes]:
        if self._held:
            yield self._held
            self._held = b""
        yield from self._pieces
