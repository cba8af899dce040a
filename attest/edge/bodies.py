"""The one bounded reader of an HTTP body (the hub's metadata, a registry's documents, tokens and
error details): within its cap and its deadline, an error detail redacted before it is cut."""

from __future__ import annotations

import math
import time

import httpx

from attest.edge.redact import redact_known
from attest.errors import AttestError

DETAIL_READ_BYTES = 4096
DETAIL_SHOWN_CHARS = 300


def read_bounded(
    response: httpx.Response,
    limit: int,
    what: str,
    *,
    truncate: bool = False,
    deadline: float = math.inf,
    error: type[AttestError] = AttestError,
    field: str = "",
) -> bytes:
    """At most `limit` bytes of a streamed body, read by `deadline` (time.monotonic()); more is
    refused (or cut, for error details), and so is a body still arriving at the deadline. The
    refusal is an `error` (the caller's domain error) naming `what`; its field is `field`
    (default `what`), or `deadline`."""
    body = bytearray()
    for chunk in response.iter_bytes():  # as they arrive: a chunk size would wait to fill it
        if time.monotonic() > deadline:
            if truncate:
                return bytes(body[:limit])
            raise error(f"{what} was still arriving at its deadline (a peer trickling bytes)", field="deadline")
        body += chunk
        if len(body) > limit:
            if truncate:
                return bytes(body[:limit])
            raise error(f"{what} is larger than the {limit} bytes allowed", field=field or what)
    return bytes(body)


def error_detail(body: bytes) -> str:
    """An error body's start, for a message: redacted before it is cut, so a secret the peer
    echoes can never survive as a fragment at the cut."""
    return redact_known(body[:DETAIL_READ_BYTES].decode("utf-8", "replace"))[:DETAIL_SHOWN_CHARS]
