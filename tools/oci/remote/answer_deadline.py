"""A total deadline on the wait for an answer's status line and headers.

httpx bounds each socket read, not their sum: its read timeout restarts with every byte, so a
peer sending a header byte every few seconds would hold a request open for days. httpx has no
total timeout, so the bound sits under it, in httpcore's network backend: within
`answer_deadline(seconds)` (the calling thread's: httpx's sync client reads on the thread that
sends), the reads that follow a request's last write wait at most `seconds` in all, then fail
as httpx.ReadTimeout. Bodies are read outside it, each under its own deadline (registry.py).

The same backend reads bodies in pieces of up to BODY_READ_BYTES: httpcore asks its network
stream for 64 kB at a time, and at that size the Python work per read, not the network, bounded
a layer's download (`bazel run //tools/dev/bench:pin`, 2 GB on loopback: 3.09 s at 64 kB, 2.30 s at
1 MB, against crane export's 2.9 s). h11 buffers whatever it is given; HTTP/1.1 without
pipelining sends nothing past the answer being read.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import httpcore
import httpx

_budget = threading.local()
BODY_READ_BYTES = 1 << 20


@contextmanager
def answer_deadline(seconds: float) -> Iterator[None]:
    previous = getattr(_budget, "seconds", None)
    _budget.seconds = seconds
    try:
        yield
    finally:
        _budget.seconds = previous


def _late(seconds: float) -> httpcore.ReadTimeout:
    return httpcore.ReadTimeout(
        f"the answer's status line and headers did not arrive within {seconds:g} s (a peer trickling bytes, or none)"
    )


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self._answer_started: float | None = None  # the first read after the request's writes

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        seconds = getattr(_budget, "seconds", None)
        if seconds is None:  # a body: read in larger pieces (see the module's docstring)
            return self._inner.read(max(max_bytes, BODY_READ_BYTES), timeout)
        if self._answer_started is None:
            self._answer_started = time.monotonic()
        ends = self._answer_started + seconds
        left = ends - time.monotonic()
        if left <= 0:
            raise _late(seconds)
        try:
            return self._inner.read(max_bytes, left if timeout is None else min(timeout, left))
        except httpcore.ReadTimeout:
            if time.monotonic() >= ends:
                raise _late(seconds) from None
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._answer_started = None  # a new request on this connection: its answer's clock starts later
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bound_answers(client: httpx.Client) -> httpx.Client:
    """`client` with every transport of its own (the default one and the proxies from the
    environment) reading through the deadline. httpx offers no hook for httpcore's network
    backend, so its pools are reached through their attributes (both versions are locked); a
    transport given from outside (a test's MockTransport) is left as it is."""
    for transport in [client._transport, *client._mounts.values()]:  # noqa: SLF001 (see above)
        pool = getattr(transport, "_pool", None) if isinstance(transport, httpx.HTTPTransport) else None
        if pool is not None:
            if not hasattr(pool, "_network_backend"):
                raise RuntimeError(
                    "httpcore's connection pool has no _network_backend: the locked httpx/httpcore "
                    "changed; tools/oci/remote/answer_deadline.py must follow"
                )
            pool._network_backend = _Backend(pool._network_backend)  # noqa: SLF001
    return client
