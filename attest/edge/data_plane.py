"""The data plane: every blob body Omni fetches (a registry's layers for pull, pin and image
copies; the hub's checkpoint files) comes off the socket into one buffer per body, and passes
through one bounded reader, `read_blob`: never past its size, within its deadline, a cut or a
short body named with how much had arrived, a body sent encoded refused.

Contract. `DataPlaneTransport` is the httpx transport of the registry client and of boot's hub
session. A GET marked with `blob_extensions(deadline)` is sent with the standard library's
http.client and its body read into one buffer per body, one socket read per piece; every
other request (manifests, tokens, uploads, listings) goes to the `DeadlineTransport` beneath it.
httpx stays the client for both: its redirects (the Authorization header dropped when a hop
leaves the origin), the callers' auth and retries. Both transports share one proxy rule
(`ProxyRule`); a blob fetched from an https origin through a proxy goes through httpcore's
tunnel, under the same bounds.

Why http.client, chosen by measurement: a 1 GiB body on loopback (nginx, sendfile), hashed as it
is read, took 1.07-1.29 s of client CPU through httpx (h11 and httpcore copy each received byte
about four times), 0.87-0.92 s with `readinto` into a reused 1 MiB buffer, 0.90-0.94 s when each
piece is then copied out as bytes, and 0.93-1.00 s with one socket read per piece (kept: see
_Body._pieces), against 0.59 s for sha256 alone; `read1` (bytes allocated per read) took
0.92-1.63 s. Pieces are handed on as bytes, one copy of 0.03 s per GiB: a consumer may keep them
(tools/model pull's tar reader does), so no reused buffer can leak into kept data.

Threat model: the peer serving the bytes is untrusted, and so is every header it sends. Its
status line and headers arrive within the calling thread's answer budget
(attest.edge.transport.answer_deadline), redirect hops included; its body by the deadline the
request carries. A socket timeout bounds one read but http.client loops over many, so each wait
is also bounded by a watchdog that shuts the socket down at its deadline. An answer that is not
the blob (a redirect, an error) is read at most MAX_OTHER_BODY_BYTES, within the answer's
budget. The expected size and digest come from the caller's pins and locks, never the peer.
"""

from __future__ import annotations

import base64
import http.client
import math
import re
import socket
import threading
import time
from typing import Iterator

import httpx

from attest.edge.transport import DeadlineTransport, answer_ends, answer_late
from attest.errors import AttestError

DATA_PLANE = "omni.data_plane"  # a request extension: the body's deadline (time.monotonic())
BUFFER_BYTES = 1 << 20
MAX_OTHER_BODY_BYTES = 64 << 10
MAX_IDLE_PER_ORIGIN = 8


def blob_extensions(deadline: float) -> dict[str, float]:
    """The extensions that send a GET through the data plane, its body read by `deadline`."""
    return {DATA_PLANE: deadline}


class _Watchdog:
    """Shuts a socket down at a moment (time.monotonic()), so that a read blocked on it ends then."""

    def __init__(self) -> None:
        self.fired = False
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def arm(self, sock: socket.socket, at: float) -> None:
        self.disarm()
        if math.isinf(at):
            return
        self._timer = threading.Timer(max(0.0, at - time.monotonic()), self._fire, (sock,))
        self._timer.daemon = True
        self._timer.start()

    def _fire(self, sock: socket.socket) -> None:
        with self._lock:
            if self._timer is None:  # disarmed while this thread started
                return
            self.fired = True
            try:
                # socket.socket's own shutdown: an SSLSocket's would drop its TLS state under a reader.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except (OSError, TypeError, ValueError):
                pass  # closed already: nothing is left to wait on; a timer thread never raises

    def disarm(self) -> None:
        """After this returns, the socket is never shut down by this watchdog."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


class _Exchange:
    """One connection with its watchdog; reused for the next blob of the same origin when its
    last answer was read whole and nothing fired."""

    def __init__(self, connection: http.client.HTTPConnection) -> None:
        self.connection = connection
        # The socket itself, kept: http.client drops `connection.sock` (sets it to None) as soon as
        # an answer will close the connection (Connection: close, HTTP/1.0, no framing), while the
        # answer still reads from it; the watchdog must be able to shut down that very socket.
        self.sock: socket.socket = connection.sock
        self.watchdog = _Watchdog()
        self.reused = False  # a kept connection the peer may have closed since

    def close(self) -> None:
        self.watchdog.disarm()
        self.connection.close()


_RESET = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class _Body(httpx.SyncByteStream):
    """An answer's body, read with readinto into one buffer and handed on as bytes."""

    def __init__(self, owner: DataPlaneTransport, key: tuple, exchange: _Exchange, answer: http.client.HTTPResponse,
                 ends: float, limit: float) -> None:  # fmt: skip
        self._owner, self._key, self._exchange, self._answer = owner, key, exchange, answer
        self._ends, self._limit, self._whole = ends, limit, False

    def __iter__(self) -> Iterator[bytes]:
        watchdog, received = self._exchange.watchdog, 0
        watchdog.arm(self._exchange.sock, self._ends)
        try:
            for piece in self._pieces():
                received += len(piece)
                if received > self._limit:  # not the blob: what follows is of no use to anyone
                    return
                yield piece
            if watchdog.fired:  # the shutdown ended a body with no framing as if it were whole
                raise TimeoutError("the watchdog ended the body")
            self._whole = True
        except (OSError, http.client.HTTPException) as exc:
            raise _transport_error(exc, watchdog.fired, "the body passed its deadline", received) from None
        finally:
            watchdog.disarm()

    def _pieces(self) -> Iterator[bytes]:
        """The body as it arrives, each piece from at most one read of the socket, so a cut or a
        stall loses nothing that had arrived. A body of announced length is read into one reused
        buffer (the buffered reader's `readinto1`: http.client's own `readinto` fills the whole
        buffer, over many reads); a chunked or unframed one through `read1`."""
        answer = self._answer
        if answer.length is None:
            while piece := answer.read1(BUFFER_BYTES):
                yield piece
            return
        view, left = memoryview(bytearray(min(BUFFER_BYTES, answer.length) or 1)), answer.length
        while left:
            count = answer.fp.readinto1(view[: min(left, len(view))])
            if not count:
                raise http.client.IncompleteRead(b"", left)
            left -= count
            yield bytes(view[:count])
        answer.close()  # every announced byte read: the connection is ready for the next request

    def close(self) -> None:
        exchange = self._exchange
        exchange.watchdog.disarm()
        if self._whole and not self._answer.will_close and not exchange.watchdog.fired:
            self._owner.keep(self._key, exchange)
        else:
            exchange.close()


def _transport_error(exc: BaseException, fired: bool, late: str, received: int = 0) -> httpx.TransportError:
    """An http.client or socket failure as the httpx error of the same meaning."""
    if fired:
        return httpx.ReadTimeout(late)
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(f"no bytes within the read timeout ({received} bytes had arrived)")
    if isinstance(exc, http.client.IncompleteRead):
        return httpx.RemoteProtocolError(
            f"the peer closed the connection {exc.expected} bytes before the end of the body it announced"
        )
    if isinstance(exc, (http.client.HTTPException, ValueError)):
        return httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}"[:300])
    return httpx.ReadError(f"{type(exc).__name__}: {exc}")


class DataPlaneTransport(httpx.BaseTransport):
    """httpx's transport for a client that fetches blobs: data-plane GETs over http.client (see
    the module's docstring), everything else through `control`."""

    def __init__(self, control: DeadlineTransport | None = None) -> None:
        self.control = control if control is not None else DeadlineTransport()
        self._idle: dict[tuple, list[_Exchange]] = {}
        self._lock = threading.Lock()

    def keep(self, key: tuple, exchange: _Exchange) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < MAX_IDLE_PER_ORIGIN:
                exchange.reused = True
                idle.append(exchange)
                return
        exchange.close()

    def _take(self, key: tuple) -> _Exchange | None:
        with self._lock:
            idle = self._idle.get(key)
            return idle.pop() if idle else None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body_ends = request.extensions.get(DATA_PLANE)
        proxy = self.control.proxies.proxy_for(request.url)
        if body_ends is None or request.method != "GET" or (proxy and request.url.scheme == "https"):
            return self.control.handle_request(request)
        timeouts = request.extensions.get("timeout", {})
        key = (request.url.scheme, request.url.host, request.url.port, proxy)
        exchange = self._take(key)
        if exchange is not None:
            try:
                return self._exchange(exchange, key, request, proxy, timeouts, float(body_ends))
            except _Stale:
                pass  # the peer closed an idle connection: a new one carries the request
        # A new connection is never stale (_Stale is raised only for a reused one).
        return self._exchange(self._connect(request.url, proxy, timeouts), key, request, proxy, timeouts,
                              float(body_ends))  # fmt: skip

    def _connect(self, url: httpx.URL, proxy: str, timeouts: dict) -> _Exchange:
        target = httpx.URL(proxy) if proxy else url
        port = target.port or (443 if target.scheme == "https" else 80)
        try:
            sock = socket.create_connection((target.host, port), timeout=timeouts.get("connect"))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"{target.host}:{port}: {exc}") from None
        except OSError as exc:
            raise httpx.ConnectError(f"{target.host}:{port}: {exc.strerror or exc}") from None
        if target.scheme == "https":
            sock = self._tls(sock, target.host, answer_ends(time.monotonic()))
        sock.settimeout(timeouts.get("read"))
        connection = http.client.HTTPConnection(target.host, port)
        connection.sock = sock
        return _Exchange(connection)

    def _tls(self, sock: socket.socket, host: str, ends: float) -> socket.socket:
        watchdog = _Watchdog()
        watchdog.arm(sock, ends)
        try:
            return self.control.ssl_context.wrap_socket(sock, server_hostname=host)
        except OSError as exc:
            sock.close()
            if watchdog.fired:
                raise httpx.ConnectTimeout(answer_late()) from None
            raise httpx.ConnectError(f"{host}: TLS: {exc}") from None
        finally:
            watchdog.disarm()

    def _exchange(self, exchange: _Exchange, key: tuple, request: httpx.Request, proxy: str, timeouts: dict,
                  body_ends: float) -> httpx.Response:  # fmt: skip
        """The request sent and its answer's head read, within the answer budget."""
        connection, watchdog = exchange.connection, exchange.watchdog
        try:
            _send(connection, request, proxy)
            ends = answer_ends(time.monotonic())
            watchdog.arm(exchange.sock, ends)
            answer = connection.getresponse()
            if watchdog.fired:  # the shutdown ended a head mid-line: http.client takes that for its end
                raise TimeoutError("the watchdog ended the answer's head")
        except _RESET as exc:
            exchange.close()
            if exchange.reused and not watchdog.fired:
                raise _Stale(f"{type(exc).__name__}: {exc}") from None
            raise _transport_error(exc, watchdog.fired, answer_late()) from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            exchange.close()
            raise _transport_error(exc, watchdog.fired, answer_late()) from None
        finally:
            watchdog.disarm()
        blob = 200 <= answer.status < 300
        stream = _Body(self, key, exchange, answer, body_ends if blob else ends,
                       math.inf if blob else MAX_OTHER_BODY_BYTES)  # fmt: skip
        return httpx.Response(
            status_code=answer.status,
            headers=[(name.encode("latin-1"), value.encode("latin-1")) for name, value in answer.getheaders()],
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": answer.reason.encode("latin-1", "replace")},
        )

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for exchanges in idle.values():
            for exchange in exchanges:
                exchange.close()
        self.control.close()


class _Stale(Exception):
    """A reused connection the peer had closed: the request goes again on a new one."""


def _send(connection: http.client.HTTPConnection, request: httpx.Request, proxy: str) -> None:
    """The request line and headers as httpx built them; the body as sent, never encoded (its
    size and digest are the pinned ones); through an http proxy, the absolute form (RFC 9112 3.2.2)."""
    url = request.url
    target = str(url.copy_with(fragment=None)) if proxy else url.raw_path.decode("ascii")
    connection.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
    for name, value in request.headers.raw:
        if name.lower() != b"accept-encoding":
            connection.putheader(name, value)
    connection.putheader("Accept-Encoding", "identity")
    if proxy:
        parsed = httpx.URL(proxy)
        if parsed.username:
            userinfo = f"{parsed.username}:{parsed.password}".encode()
            connection.putheader("Proxy-Authorization", "Basic " + base64.b64encode(userinfo).decode("ascii"))
    connection.endheaders()


class BodyBroken(AttestError):
    """A blob's body that did not arrive whole and exact. `reason`: `cut` (the connection broke
    off or stalled), `short` (it ended early or announced fewer bytes), `long` (more bytes than
    expected, or encoded), `stalled` (no byte within a read's timeout), `late` (its deadline
    passed); `received`: the bytes that had arrived."""

    def __init__(self, message: str, *, reason: str, received: int) -> None:
        super().__init__(message, field="body")
        self.reason, self.received = reason, received


CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")


def content_range(response: httpx.Response) -> tuple[int, int, int] | None:
    """(first byte, last byte, total) of a 206's Content-Range, or None where it has none of that
    form: what a resumed read checks before it takes the body as the rest it asked for."""
    found = CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", ""))
    return None if found is None else (int(found[1]), int(found[2]), int(found[3]))


def read_blob(response: httpx.Response, size: int, deadline: float, what: str) -> Iterator[bytes]:
    """The body of a blob answer: exactly `size` bytes (the rest of a resumed range, for a 206),
    as they arrive, by `deadline` (time.monotonic()). Anything else is a BodyBroken naming `what`."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise BodyBroken(f"{what} was sent encoded ({encoding[:40]}); its bytes are pinned as stored", reason="long",
                         received=0)  # fmt: skip
    announced = response.headers.get("Content-Length")
    if announced is not None and announced.strip() != str(size):
        short = announced.strip().isdigit() and int(announced) < size
        raise BodyBroken(
            f"{what} announces {announced[:40]!r} bytes, {'fewer than' if short else 'not'} the {size} expected",
            reason="short" if short else "long", received=0,
        )  # fmt: skip
    received = 0
    try:
        for piece in response.iter_bytes():  # identity only (above): no decoder touches the bytes
            received += len(piece)
            if received > size:
                raise BodyBroken(f"{what} sends more than the {size} bytes expected", reason="long", received=received)
            if time.monotonic() > deadline:
                raise _late(what, received, size)
            yield piece
    except httpx.TransportError as exc:
        if time.monotonic() >= deadline:
            raise _late(what, received, size) from None
        if isinstance(exc, httpx.TimeoutException):
            raise BodyBroken(
                f"{what} stalled after {received} of {size} bytes (no bytes within the read timeout)",
                reason="stalled", received=received,
            ) from None  # fmt: skip
        raise BodyBroken(
            f"{what} broke off after {received} of {size} bytes ({type(exc).__name__}: {exc})", reason="cut",
            received=received,
        ) from None  # fmt: skip
    if received != size:
        raise BodyBroken(f"{what} ended after {received} of {size} bytes", reason="short", received=received)


def _late(what: str, received: int, size: int) -> BodyBroken:
    return BodyBroken(
        f"{what} was still arriving at its deadline ({received} of {size} bytes)", reason="late", received=received
    )
