"""The registry transport (attest/edge/transport.py): httpcore's public pool under httpx,
proxies from the environment per request, a SOCKS proxy refused naming its variable, and
httpcore's errors surfacing as httpx's."""

from __future__ import annotations

import base64
import hashlib
import http.client
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

import httpx
import pytest

from attest.edge.transport import DeadlineTransport, answer_deadline
from omni_oci.format.errors import OciError
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.bounds import ended_by_deadline
from tests.fixtures.fault_proxy import Trickler
from tests.fixtures.loopback import LoopbackHTTPServer

BLOB = b"a blob behind a proxy\n"
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()


class _Registry(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == f"/v2/omni/blobs/{DIGEST}":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BLOB)))
            self.end_headers()
            self.wfile.write(BLOB)
            return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _ForwardProxy(BaseHTTPRequestHandler):
    """A plain HTTP forward proxy: the absolute-form request line is fetched from its origin."""

    seen: list[str]
    authorizations: list[str]

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append(self.path)
        self.authorizations.append(self.headers.get("Proxy-Authorization", ""))
        target = urlsplit(self.path)
        upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
        upstream.request("GET", target.path)
        answer = upstream.getresponse()
        body = answer.read()
        self.send_response(answer.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        upstream.close()


class Served(LoopbackHTTPServer):
    def __init__(self, handler: type[BaseHTTPRequestHandler], **attributes: object) -> None:
        self._serve(type("Handler", (handler,), attributes))


@pytest.fixture
def no_proxy_env(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "userinfo, authorization",
    [("", ""), ("proxy-user:s%40cret@", "Basic " + base64.b64encode(b"proxy-user:s@cret").decode())],
)
def test_a_proxy_from_the_environment_carries_the_request(no_proxy_env, userinfo: str, authorization: str) -> None:
    seen: list[str] = []
    authorizations: list[str] = []
    with Served(_Registry) as registry, Served(_ForwardProxy, seen=seen, authorizations=authorizations) as proxy:
        no_proxy_env.setenv("HTTP_PROXY", f"http://{userinfo}127.0.0.1:{proxy.port}")
        with RegistryClient(f"127.0.0.1:{registry.port}", credential=None) as client:
            assert client.blob("omni", DIGEST, size=len(BLOB)) == BLOB
    assert seen == [f"http://127.0.0.1:{registry.port}/v2/omni/blobs/{DIGEST}"]
    assert authorizations == [authorization]


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "*"])
def test_no_proxy_sends_the_request_direct(no_proxy_env, no_proxy: str) -> None:
    seen: list[str] = []
    with Served(_Registry) as registry, Served(_ForwardProxy, seen=seen, authorizations=[]) as proxy:
        no_proxy_env.setenv("HTTP_PROXY", proxy.url)
        no_proxy_env.setenv("NO_PROXY", no_proxy)
        with RegistryClient(f"127.0.0.1:{registry.port}", credential=None) as client:
            assert client.blob("omni", DIGEST, size=len(BLOB)) == BLOB
    assert seen == []


@pytest.mark.parametrize(
    "variable, value",
    [
        ("ALL_PROXY", "socks5://127.0.0.1:1080"),
        ("HTTPS_PROXY", "socks5h://127.0.0.1:1080"),
        ("all_proxy", "socks4://x"),
    ],
)
def test_a_socks_proxy_is_refused_naming_its_variable(no_proxy_env, variable: str, value: str) -> None:
    no_proxy_env.setenv(variable, value)
    with pytest.raises(OciError, match=f"{variable.upper()}=socks") as refused:
        RegistryClient("127.0.0.1:5000", credential=None)
    assert refused.value.field == variable.upper()


def test_a_refused_connection_is_httpx_s_connect_error(no_proxy_env) -> None:
    with Served(_Registry) as closed:
        port = closed.port
    with httpx.Client(transport=DeadlineTransport()) as client, pytest.raises(httpx.ConnectError):
        client.get(f"http://127.0.0.1:{port}/v2/")


def test_a_trickled_answer_ends_at_its_answer_deadline(no_proxy_env) -> None:
    with Trickler(0.1) as peer, httpx.Client(transport=DeadlineTransport(), timeout=5) as client:
        started = time.monotonic()
        with answer_deadline(1), pytest.raises(httpx.ReadTimeout, match="did not arrive within 1 s"):
            client.get(peer.url)
        ended_by_deadline(time.monotonic() - started, 1, 10_000)  # its head would trickle for 10,000 s


def test_the_operations_deadline_caps_every_answer(no_proxy_env) -> None:
    with Trickler(0.1) as peer, httpx.Client(transport=DeadlineTransport(), timeout=5) as client:
        started = time.monotonic()
        with answer_deadline(100, ends=started + 1), pytest.raises(httpx.ReadTimeout, match="operation passed"):
            client.get(peer.url)
        ended_by_deadline(time.monotonic() - started, 1, 100)  # not the answer's own 100 s


class _SlowRedirects(BaseHTTPRequestHandler):
    """Each hop answers after 1.5 s with a redirect to the next; the 20th is the answer."""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        hop = int(self.path.rsplit("/", 1)[1])
        time.sleep(1.5)
        self.send_response(302 if hop < 20 else 200)
        if hop < 20:
            self.send_header("Location", f"/hop/{hop + 1}")
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_redirect_chain_shares_one_answer_budget(no_proxy_env) -> None:
    """Every hop within its 2 s, the chain not: 20 hops of 1.5 s are 30 s, so the chain fails at 2."""
    server = LoopbackHTTPServer()
    server._serve(_SlowRedirects)
    with server, httpx.Client(transport=DeadlineTransport(), timeout=5, follow_redirects=True) as client:
        started = time.monotonic()
        with answer_deadline(2), pytest.raises(httpx.ReadTimeout):
            client.get(f"{server.url}/hop/1")
        ended_by_deadline(time.monotonic() - started, 2, 30)
        with answer_deadline(30):
            assert client.get(f"{server.url}/hop/19").status_code == 200  # a short chain still arrives


class _Digesting(BaseHTTPRequestHandler):
    """Reads a PUT body in small pieces, slowly at first (the client's sends come back partial),
    and answers the sha256 of what arrived."""

    def log_message(self, *args: object) -> None:
        pass

    def do_PUT(self) -> None:
        left, hasher = int(self.headers["Content-Length"]), hashlib.sha256()
        while left:
            piece = self.rfile.read(min(left, 64 << 10))
            if left > (20 << 20):
                time.sleep(0.001)
            hasher.update(piece)
            left -= len(piece)
        answer = hasher.hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def test_a_body_sent_in_partial_sends_arrives_whole_and_is_never_sliced_as_bytes(no_proxy_env) -> None:
    """The transport hands httpcore a memoryview: its send loop then slices without copying, and
    every byte still arrives in order across partial sends."""
    import httpcore

    from attest.edge import transport

    written: list[type] = []

    class Recording(httpcore.NetworkStream):
        def write(self, buffer, timeout=None) -> None:
            written.append(type(buffer))

    transport._Stream(Recording()).write(b"x" * 10)
    assert written == [memoryview]
    piece = bytes(range(256)) * (32 << 10)  # 8 MiB
    with Served(_Digesting) as server, httpx.Client(transport=DeadlineTransport()) as client:
        length = {"Content-Length": str(2 * len(piece) + 12345)}
        answer = client.put(
            f"{server.url}/blob", content=iter([piece, piece, piece[:12345]]), headers=length, timeout=60
        )
    assert answer.text == hashlib.sha256(piece + piece + piece[:12345]).hexdigest()
