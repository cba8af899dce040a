"""HTTP transport with one deadline per answer, for every peer Omni talks to (registries, the
hub, mirrors): httpcore's public connection pool, built with a network backend of ours
(`ConnectionPool(network_backend=...)`), under httpx's client; proxies from the environment
chosen per request.

A total deadline on the wait for an answer's status line and headers:

httpx bounds each socket read, not their sum: its read timeout restarts with every byte, so a
peer sending a header byte every few seconds would hold a request open for days. httpx has no
total timeout, so the bound sits under it, in httpcore's network backend: within
`answer_deadline(seconds, ends=...)` (the calling thread's: httpx's sync client reads on the
thread that sends), the reads that follow a request's last write wait at most `seconds` in all,
and every hop of a redirect chain (and a proxy's answer) shares that one budget, which starts at
the first answer read; `ends` (time.monotonic()) is the operation's own deadline, which no read
passes. Reads that run out fail as httpx.ReadTimeout. Bodies are read outside it, under their
caller's deadline.

The same backend reads bodies in pieces of up to BODY_READ_BYTES: httpcore asks its network
stream for 64 kB at a time, and at that size the Python work per read, not the network, bounded
a layer's download (`bazel run //tools/dev/bench:pin`, 2 GB on loopback: 3.09 s at 64 kB, 2.30 s at
1 MB, against crane export's 2.9 s). h11 buffers whatever it is given; HTTP/1.1 without
pipelining sends nothing past the answer being read.
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import httpcore
import httpx

_budget = threading.local()
BODY_READ_BYTES = 1 << 20
# The answers another attempt may change, for the hub and the registries alike: a timeout, Too
# Early (RFC 8470), too many requests, and the server and gateway failures (RFC 9110 §15.6).
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass
class _Budget:
    seconds: float
    ends: float  # the operation's deadline
    chain_ends: float = math.inf  # set by the first answer read: every later hop shares it


@contextmanager
def answer_deadline(seconds: float, *, ends: float = math.inf) -> Iterator[None]:
    previous = getattr(_budget, "current", None)
    _budget.current = _Budget(seconds, ends)
    try:
        yield
    finally:
        _budget.current = previous


def _late(budget: _Budget) -> httpcore.ReadTimeout:
    if time.monotonic() >= budget.ends:
        return httpcore.ReadTimeout("the operation passed its deadline while waiting for an answer")
    return httpcore.ReadTimeout(
        f"the answer's status line and headers did not arrive within {budget.seconds:g} s "
        "(redirects included; a peer trickling bytes, or none)"
    )


def answer_ends(now: float) -> float:
    """When the answer to a request whose answer is awaited from `now` on must have arrived
    (status line and headers), for a transport of its own (attest.edge.data_plane): the calling
    thread's budget, which every hop of a redirect chain shares, within the operation's deadline;
    math.inf outside answer_deadline."""
    budget: _Budget | None = getattr(_budget, "current", None)
    if budget is None:
        return math.inf
    budget.chain_ends = min(budget.chain_ends, now + budget.seconds)
    return min(budget.chain_ends, budget.ends)


def answer_late() -> str:
    """Why an answer awaited under the calling thread's budget did not come (see _late)."""
    budget: _Budget | None = getattr(_budget, "current", None)
    return str(_late(budget)) if budget is not None else "the answer did not arrive in time"


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self._answer_started: float | None = None  # the first read after the request's writes

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        budget: _Budget | None = getattr(_budget, "current", None)
        if budget is None:  # a body: read in larger pieces (see the module's docstring)
            return self._inner.read(max(max_bytes, BODY_READ_BYTES), timeout)
        now = time.monotonic()
        if self._answer_started is None:
            self._answer_started = now
        ends = answer_ends(self._answer_started)
        left = ends - now
        if left <= 0:
            raise _late(budget)
        try:
            return self._inner.read(max_bytes, left if timeout is None else min(timeout, left))
        except httpcore.ReadTimeout:
            if time.monotonic() >= ends:
                raise _late(budget) from None
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._answer_started = None  # a new request on this connection: its answer's clock starts later
        # httpcore sends `buffer` in a loop, slicing off what each send() took. Slicing bytes copies
        # the rest each time: an upload's 8 MB piece leaves a socket with a timeout in sends of
        # about 3 MB (measured on loopback), so 0.6-0.9 bytes are copied per byte sent. Slicing a
        # memoryview copies nothing.
        self._inner.write(memoryview(buffer), timeout)

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


class ProxyRefused(ValueError):
    """A proxy setting the transport will not use; `variable` names it."""

    def __init__(self, message: str, variable: str) -> None:
        super().__init__(message)
        self.variable = variable


def _variable_for(scheme: str) -> str:
    return "ALL_PROXY" if scheme == "all" else f"{scheme.upper()}_PROXY"


class ProxyRule:
    """Which proxy carries a request, for every transport of Omni's: the environment's proxy for
    its scheme (HTTPS_PROXY, HTTP_PROXY, else ALL_PROXY) unless NO_PROXY names its host; a SOCKS
    proxy is refused, naming its variable. The environment is read once (http, https, all and
    no, either case, as httpx reads them)."""

    def __init__(self) -> None:
        self._environment = urllib.request.getproxies_environment()
        for scheme, url in self._environment.items():
            if scheme != "no" and not url.startswith(("http://", "https://")):
                variable = _variable_for(scheme)
                raise ProxyRefused(
                    f"{variable}={url.split('://')[0]}://...: only http(s) proxies are supported "
                    "(a SOCKS proxy needs a library Omni does not ship); unset it or use an http proxy",
                    variable,
                )

    def proxy_for(self, url: httpx.URL) -> str:
        """The proxy URL that carries a request to `url`; "" for a direct connection."""
        if urllib.request.proxy_bypass_environment(url.host, self._environment):
            return ""
        return self._environment.get(url.scheme) or self._environment.get("all", "")


_HTTPCORE_ERRORS = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpcore.UnsupportedProtocol,
)


@contextmanager
def _httpx_errors() -> Iterator[None]:
    """httpcore's exceptions as httpx's own of the same name (httpx's mapping is private)."""
    try:
        yield
    except _HTTPCORE_ERRORS as exc:
        raise getattr(httpx, type(exc).__name__, httpx.TransportError)(str(exc)) from exc


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _httpx_errors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class DeadlineTransport(httpx.BaseTransport):
    """httpx's transport over httpcore pools whose network backend bounds each answer (above):
    one pool for direct connections, one per proxy. A request goes through the environment's
    proxy for its scheme (HTTPS_PROXY, HTTP_PROXY, else ALL_PROXY) unless NO_PROXY names its
    host; a SOCKS proxy is refused, naming its variable."""

    def __init__(self) -> None:
        self._ssl = httpx.create_ssl_context()  # the system's CAs; SSL_CERT_FILE/SSL_CERT_DIR honoured
        self.proxies = ProxyRule()
        self._pools: dict[str, httpcore.ConnectionPool] = {}
        self._lock = threading.Lock()  # pushes share one client across threads

    @property
    def ssl_context(self) -> Any:
        return self._ssl

    def _pool(self, url: httpx.URL) -> httpcore.ConnectionPool:
        proxy = self.proxies.proxy_for(url)
        with self._lock:
            if proxy not in self._pools:
                self._pools[proxy] = httpcore.ConnectionPool(
                    ssl_context=self._ssl,
                    proxy=self._proxy(proxy) if proxy else None,
                    network_backend=_Backend(httpcore.SyncBackend()),
                )
            return self._pools[proxy]

    def _proxy(self, url: str) -> httpcore.Proxy:
        """The proxy of a URL, its user:password (if any) sent as Proxy-Authorization as httpx
        sends it: httpcore's own URL parsing drops the userinfo."""
        parsed = httpx.URL(url)
        auth = (parsed.username, parsed.password) if parsed.username else None
        return httpcore.Proxy(str(parsed.copy_with(userinfo=b"")), auth=auth, ssl_context=self._ssl)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _httpx_errors():
            answer = self._pool(request.url).handle_request(core)
        return httpx.Response(
            status_code=answer.status, headers=answer.headers, stream=_Body(answer.stream), extensions=answer.extensions
        )

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


def retry_after(headers: httpx.Headers, now: float | None = None) -> float | None:
    """The seconds a 429 or 503 answer's `Retry-After` asks to wait (RFC 9110 10.2.3: a count of
    seconds or an HTTP-date), at least 0; None when there is none or it is neither form (the
    caller's own backoff then applies). The caller holds the wait to its deadline."""
    value = headers.get("Retry-After", "").strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
