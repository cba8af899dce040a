"""The data plane (attest/edge/data_plane.py), on loopback peers that frame, cut, trickle and
redirect byte for byte: every blob body is exactly its size or refused with the reason and what
had arrived, within its deadline; a resumed range continues; credentials stay with their origin;
the proxy rule is the control plane's; a connection read whole carries the next blob."""

from __future__ import annotations

import base64
import socket
import ssl
import struct
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from attest.edge.data_plane import MAX_OTHER_BODY_BYTES, BodyBroken, DataPlaneTransport, blob_extensions, read_blob
from attest.edge.transport import answer_deadline
from tests.fixtures.bounds import ended_by_deadline
from tests.fixtures.fault_proxy import ScriptedPeer, Trickler

SIZE = 100
BLOB = bytes(range(SIZE))


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def _head(status: str = "200 OK", **headers: object) -> bytes:
    lines = [f"HTTP/1.1 {status}"] + [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(body: bytes, *, keep: bool = False, **headers: object):
    """A script: one whole answer with a Content-Length (unless headers say otherwise)."""

    def script(client: socket.socket, head: bytes) -> bool:
        client.sendall(_head(**{"Content_Length": len(body), **headers}) + body)
        return keep

    return script


def _unframed(body: bytes):
    def script(client: socket.socket, head: bytes) -> bool:
        client.sendall(_head(Connection="close") + body)
        return False

    return script


def _chunked(body: bytes):
    def script(client: socket.socket, head: bytes) -> bool:
        client.sendall(_head(Transfer_Encoding="chunked") + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        return False

    return script


def _cut(sent: int, *, reset: bool = False):
    """Announces the whole blob, sends `sent` bytes, then closes (or resets) the connection."""

    def script(client: socket.socket, head: bytes) -> bool:
        client.sendall(_head(Content_Length=SIZE) + BLOB[:sent])
        time.sleep(0.2)  # the bytes are on their way before the end
        if reset:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False

    return script


def _trickle(interval_s: float, *, first: int = 0, stall_s: float = 0.0):
    """Sends `first` bytes at once, waits `stall_s`, then the rest one byte every `interval_s`."""

    def script(client: socket.socket, head: bytes) -> bool:
        client.sendall(_head(Content_Length=SIZE) + BLOB[:first])
        time.sleep(stall_s)
        for byte in BLOB[first:]:
            time.sleep(interval_s)
            client.sendall(bytes([byte]))
        return False

    return script


class _Fetch:
    """A data-plane GET read through read_blob, keeping the pieces that arrived before a refusal."""

    def __init__(self, client: httpx.Client | None = None) -> None:
        self.client = client or httpx.Client(transport=DataPlaneTransport(), follow_redirects=True)
        self.pieces: list[bytes] = []

    def __call__(self, url: str, size: int = SIZE, *, deadline_s: float = 60.0, read_s: float = 30.0,
                 answer_s: float = 30.0, headers: dict | None = None) -> bytes:  # fmt: skip
        deadline = time.monotonic() + deadline_s
        request = self.client.build_request(
            "GET", url, headers=headers or {}, timeout=read_s, extensions=blob_extensions(deadline)
        )
        with answer_deadline(answer_s, ends=deadline):
            response = self.client.send(request, stream=True)
        try:
            self.pieces.extend(read_blob(response, size, deadline, "the blob"))
        finally:
            response.close()
        return b"".join(self.pieces)


BAD_BODIES = [
    ("longer, announced", _answer(BLOB + b"extra"), "long", 0, "announces '105' bytes, not the 100 expected"),
    ("longer, unframed", _unframed(BLOB + b"extra"), "long", 105, "sends more than the 100 bytes expected"),
    ("longer, chunked", _chunked(BLOB + b"extra"), "long", 105, "sends more than the 100 bytes expected"),
    ("shorter, announced", _answer(BLOB[:96]), "short", 0, "announces '96' bytes, fewer than the 100 expected"),
    ("shorter, unframed", _unframed(BLOB[:96]), "short", 96, "ended after 96 of 100 bytes"),
    ("cut under its length", _cut(60), "cut", 60, "broke off after 60 of 100 bytes"),
    ("reset under its length", _cut(60, reset=True), "cut", 60, "broke off after 60 of 100 bytes"),
    ("encoded", _answer(BLOB, Content_Encoding="gzip"), "long", 0, "was sent encoded \\(gzip\\)"),
]


@pytest.mark.parametrize("script, reason, received, message", [row[1:] for row in BAD_BODIES],
                         ids=[row[0] for row in BAD_BODIES])  # fmt: skip
def test_a_body_that_is_not_exactly_its_size_is_refused_keeping_what_arrived(script, reason, received, message):
    fetch = _Fetch()
    with ScriptedPeer(script) as peer, pytest.raises(BodyBroken, match=message) as refused:
        fetch(f"{peer.url}/blob")
    assert (refused.value.reason, refused.value.received) == (reason, received)
    if reason != "long":  # every byte that arrived was handed on before the refusal
        assert b"".join(fetch.pieces) == BLOB[:received]


@pytest.mark.parametrize("framing", [_answer, _unframed, _chunked])
def test_a_whole_body_arrives_exactly(framing) -> None:
    with ScriptedPeer(framing(BLOB)) as peer:
        assert _Fetch()(f"{peer.url}/blob") == BLOB


def test_a_trickled_body_ends_at_its_deadline_not_at_its_last_byte() -> None:
    started = time.monotonic()
    with ScriptedPeer(_trickle(0.5)) as peer, pytest.raises(BodyBroken, match="still arriving at its deadline"):
        _Fetch()(f"{peer.url}/blob", deadline_s=0.6)
    ended_by_deadline(time.monotonic() - started, 0.6, 50)  # 100 bytes at 2 a second would take 50 s


def test_a_silent_body_ends_at_its_deadline_not_at_the_read_timeout() -> None:
    started = time.monotonic()
    with ScriptedPeer(_trickle(0.0, first=10, stall_s=60.0)) as peer, pytest.raises(BodyBroken) as refused:
        _Fetch()(f"{peer.url}/blob", deadline_s=0.6, read_s=30.0)
    assert (refused.value.reason, refused.value.received) == ("late", 10)
    ended_by_deadline(time.monotonic() - started, 0.6, 30)  # not the 30 s read timeout


# Every framing an answer can have, each stalling after its first bytes (issue #68: http.client
# drops `connection.sock` for answers that close the connection, and the watchdog had no socket).
STALL_HEADS = {
    "content-length": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\n",
    "close-delimited": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
    "http/1.0": b"HTTP/1.0 200 OK\r\n\r\n",
    "http/1.0 with length": b"HTTP/1.0 200 OK\r\nContent-Length: 100\r\n\r\n",
}
STALL_S, DEADLINE_S = 30.0, 1.0


@pytest.mark.parametrize("framing", sorted(STALL_HEADS))
def test_a_stalled_body_ends_at_its_deadline_whatever_its_framing(framing: str, monkeypatch) -> None:
    raised: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: raised.append(hook.exc_value))
    release = threading.Event()

    def script(client: socket.socket, head: bytes) -> bool:
        client.sendall(STALL_HEADS[framing] + BLOB[:10])
        release.wait(STALL_S)
        return False

    with ScriptedPeer(script) as peer:
        started = time.monotonic()
        try:
            with pytest.raises(BodyBroken) as refused:
                _Fetch()(f"{peer.url}/blob", deadline_s=DEADLINE_S, read_s=STALL_S)
            took = time.monotonic() - started
        finally:
            release.set()
    assert (refused.value.reason, refused.value.received) == ("late", 10)
    ended_by_deadline(took, DEADLINE_S, STALL_S)  # not the peer's stall nor the read timeout (both 30 s)
    assert raised == []  # the watchdog's timer thread raised nothing


def test_a_stalled_body_is_refused_after_one_read_timeout_keeping_what_arrived() -> None:
    fetch = _Fetch()
    with ScriptedPeer(_trickle(0.0, first=40, stall_s=60.0)) as peer, pytest.raises(BodyBroken) as refused:
        fetch(f"{peer.url}/blob", read_s=2.0)
    assert (refused.value.reason, refused.value.received) == ("stalled", 40)
    assert b"".join(fetch.pieces) == BLOB[:40]


def test_a_trickled_answer_head_ends_at_the_answer_deadline() -> None:
    started = time.monotonic()
    with Trickler(0.05) as peer, pytest.raises(httpx.ReadTimeout, match="did not arrive within 0.5 s"):
        _Fetch()(f"{peer.url}/blob", answer_s=0.5, read_s=5.0)
    ended_by_deadline(time.monotonic() - started, 0.5, 5000)  # its head would trickle for 5000 s


def test_a_redirect_chain_shares_one_answer_budget() -> None:
    """The first hop answers after 20 s, the second trickles its head: 22 s in all, not each."""
    with Trickler(0.05) as store:

        def slow_redirect(client: socket.socket, head: bytes) -> bool:
            time.sleep(20)
            client.sendall(_head("307 Temporary Redirect", Location=f"{store.url}/blob", Content_Length=0))
            return False

        started = time.monotonic()
        with ScriptedPeer(slow_redirect) as registry, pytest.raises(httpx.ReadTimeout, match="redirects included"):
            _Fetch()(f"{registry.url}/blob", answer_s=22.0, read_s=60.0, deadline_s=600.0)
    ended_by_deadline(time.monotonic() - started, 22, 20 + 22)  # each hop its own 22 s would take 42 s


def _ranged(client: socket.socket, head: bytes) -> bool:
    start = int(head.split(b"Range: bytes=")[1].split(b"-")[0]) if b"Range:" in head else 0
    rest = BLOB[start:]
    status = "206 Partial Content" if start else "200 OK"
    headers = {"Content_Range": f"bytes {start}-{SIZE - 1}/{SIZE}"} if start else {}
    client.sendall(_head(status, Content_Length=len(rest), **headers) + rest)
    return True


def test_a_resumed_range_reads_exactly_the_rest() -> None:
    with ScriptedPeer(_ranged) as peer:
        response_bytes = _Fetch()(f"{peer.url}/blob", SIZE - 40, headers={"Range": "bytes=40-"})
    assert response_bytes == BLOB[40:]
    assert b"Range: bytes=40-" in peer.heads[0]
    assert b"Accept-Encoding: identity" in peer.heads[0]  # sizes and digests are of the stored bytes


def test_a_credential_stays_with_its_origin_across_redirects() -> None:
    with ScriptedPeer(_answer(BLOB)) as store:
        hops = iter(["/v2/blob-again", f"{store.url}/signed?x=1"])

        def origin(client: socket.socket, head: bytes) -> bool:
            client.sendall(_head("307 Temporary Redirect", Location=next(hops), Content_Length=0))
            return True

        with ScriptedPeer(origin) as registry:
            body = _Fetch()(f"{registry.url}/v2/blob", headers={"Authorization": "Bearer secret-token"})
    assert body == BLOB
    assert all(b"Authorization: Bearer secret-token" in head for head in registry.heads)  # same origin: kept
    assert len(registry.heads) == 2 and b"Authorization" not in store.heads[0]  # another origin: dropped


def test_an_answer_that_is_not_the_blob_is_read_only_to_its_cap() -> None:
    huge = b"x" * (4 * MAX_OTHER_BODY_BYTES)
    with ScriptedPeer(_answer(huge, status="404 Not Found")) as peer:
        with httpx.Client(transport=DataPlaneTransport()) as client:
            request = client.build_request("GET", f"{peer.url}/blob", extensions=blob_extensions(time.monotonic() + 60))
            response = client.send(request, stream=True)
            assert response.status_code == 404 and len(response.read()) <= MAX_OTHER_BODY_BYTES


@pytest.mark.parametrize("userinfo", ["", "user:pass@"])
def test_an_http_proxy_from_the_environment_carries_the_blob(no_proxy_env, userinfo: str) -> None:
    with ScriptedPeer(_answer(BLOB)) as proxy:
        no_proxy_env.setenv("HTTP_PROXY", f"http://{userinfo}{proxy.host}")
        body = _Fetch()("http://127.0.0.1:9/blob")  # port 9 is never dialled: the proxy answers
    assert body == BLOB
    assert proxy.heads[0].startswith(b"GET http://127.0.0.1:9/blob HTTP/1.1")
    expected = b"Proxy-Authorization: Basic " + base64.b64encode(b"user:pass")
    assert (expected in proxy.heads[0]) == bool(userinfo)


def test_no_proxy_sends_the_blob_direct(no_proxy_env) -> None:
    with ScriptedPeer(_answer(BLOB)) as proxy, ScriptedPeer(_answer(BLOB)) as origin:
        no_proxy_env.setenv("HTTP_PROXY", proxy.url)
        no_proxy_env.setenv("NO_PROXY", "127.0.0.1")
        assert _Fetch()(f"{origin.url}/blob") == BLOB
    assert proxy.heads == [] and origin.heads[0].startswith(b"GET /blob HTTP/1.1")


def test_a_connection_read_whole_carries_the_next_blob_and_a_stale_one_is_replaced() -> None:
    client = httpx.Client(transport=DataPlaneTransport())
    with ScriptedPeer(_answer(BLOB, keep=True)) as peer:
        for _ in range(3):
            assert _Fetch(client)(f"{peer.url}/blob") == BLOB
    assert peer.connections == 1
    with ScriptedPeer(_answer(BLOB)) as closing:  # closes each connection after its answer, unannounced
        for _ in range(3):
            assert _Fetch(client)(f"{closing.url}/blob") == BLOB
    assert closing.connections == 3
    client.close()


def test_only_marked_gets_take_the_data_plane() -> None:
    with ScriptedPeer(_answer(BLOB, keep=True)) as peer, httpx.Client(transport=DataPlaneTransport()) as client:
        marked = client.get(f"{peer.url}/blob", extensions=blob_extensions(time.monotonic() + 60))
        plain = client.get(f"{peer.url}/blob")
    assert marked.content == plain.content == BLOB
    # httpcore's answers carry their network stream; http.client's do not.
    assert "network_stream" not in marked.extensions and "network_stream" in plain.extensions


@pytest.fixture
def tls_peer_context(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    """A server context for 127.0.0.1 with a certificate made here, and that certificate's path."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert


def test_a_blob_over_tls_is_read_when_its_certificate_is_trusted(tls_peer_context, no_proxy_env) -> None:
    context, cert = tls_peer_context
    no_proxy_env.setenv("SSL_CERT_FILE", str(cert))
    with ScriptedPeer(_answer(BLOB), tls=context) as peer:
        assert _Fetch()(f"https://{peer.host}/blob") == BLOB


def test_a_blob_over_tls_is_refused_when_its_certificate_is_not(tls_peer_context) -> None:
    context, _ = tls_peer_context
    with ScriptedPeer(_answer(BLOB), tls=context) as peer, pytest.raises(httpx.ConnectError, match="CERTIFICATE"):
        _Fetch()(f"https://{peer.host}/blob")
