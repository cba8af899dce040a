"""Hostile peers (issue #30): registries, token servers, credential helpers and model servers
that try to take a credential elsewhere, make us print a secret, or keep us waiting.

Each row runs against real loopback servers (or real helper programs) and holds the same
invariants: a refusal from the documented set (OciError / PeerError naming the peer, exit 2 for
commands) within its deadline plus 5 s, no form of any secret in anything printed, and no
credential seen by a host it was not set for.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attest.edge.redact import learn, redact_known, redactor, secret_forms
from omni_oci.format.errors import OciError
from omni_oci.remote.auth import credentials
from omni_oci.remote.auth.authorization import realm_withholds
from omni_oci.remote.auth.credentials import Credential, lookup
from omni_oci.remote.registry import RegistryClient
from omni_oci.remote.session import ATTEMPTS
from tests.fixtures.bounds import ended_by_deadline, ended_long_before
from tests.fixtures.loopback import LoopbackHTTPServer
from tests.fixtures.registry import credential_helper, no_credentials
from tools.gate.openai_client import Deadline, DeadlinePassed, Endpoint, PeerError
from tools.oci.push import main as push_main

USER, PASSWORD = "omni-hostile", "Pa55-w0rd/with'quote\"and\\slash"


class Scripted(LoopbackHTTPServer):
    """A loopback server answering every request with `respond(handler)`; it records each
    request's method, path and Authorization header."""

    def __init__(self, respond: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.seen: list[tuple[str, str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                outer.seen.append((self.command, self.path, self.headers.get("Authorization", "")))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                respond(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_HEAD = do_DELETE = _any

        self._serve(Handler)

    def authorizations(self) -> list[str]:
        return [auth for _, _, auth in self.seen if auth]


def _answer(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"", headers: dict | None = None) -> None:
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _trickle(handler: BaseHTTPRequestHandler, body: bytes, every_s: float, headers: dict | None = None) -> None:
    handler.send_response(200)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    try:
        for byte in body:
            handler.wfile.write(bytes([byte]))
            handler.wfile.flush()
            time.sleep(every_s)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _forms(*secrets: str) -> list[str]:
    pair = f"{USER}:{PASSWORD}"
    return [
        form for secret in (*secrets, pair, base64.b64encode(pair.encode()).decode()) for form in secret_forms(secret)
    ]


def _assert_clean(text: str, *secrets: str) -> None:
    for form in _forms(PASSWORD, *secrets):
        assert form not in text, f"a form of a secret ({form[:6]}...) was printed"


CREDENTIAL = Credential(USER, PASSWORD, "test")


# --- credentials go only to their own host ---------------------------------------------


def test_an_upload_location_on_another_host_gets_no_credential() -> None:
    with Scripted(lambda h: _answer(h, 201 if h.command == "PUT" else 404)) as elsewhere:

        def registry(h: BaseHTTPRequestHandler) -> None:
            if not h.headers.get("Authorization"):
                return _answer(h, 401, headers={"WWW-Authenticate": 'Basic realm="r"'})
            if h.command == "POST":
                return _answer(h, 202, headers={"Location": f"{elsewhere.url}/upload/1"})
            _answer(h, 200 if h.command == "HEAD" else 404)

        with Scripted(registry) as own, RegistryClient(f"127.0.0.1:{own.port}", credential=CREDENTIAL) as client:
            client.upload("repo", "sha256:" + "0" * 64, b"x", 1)
        assert [method for method, _, _ in elsewhere.seen] == ["PUT"]
        assert elsewhere.authorizations() == [], "the registry's credential went to the upload's other host"
        assert own.authorizations(), "the registry itself did get the credential"


@pytest.mark.parametrize(
    "registry_host, realm, allowed",
    [
        ("127.0.0.1:5000", "http://127.0.0.1:5000/token", ""),  # the registry itself
        ("registry.example.com", "https://auth.example.com/token", ""),  # same registrable domain, https
        ("registry-1.docker.io", "https://auth.docker.io/token", ""),
        ("registry.example.com", "http://auth.example.com/token", "over plain http"),
        ("registry.example.com", "https://auth.example.org/token", "not in the registry's registrable domain"),
        ("registry.example.co.uk", "https://evil.co.uk/token", "not in the registry's registrable domain"),
        ("foo.github.io", "https://bar.github.io/token", "not in the registry's registrable domain"),  # a public suffix
        ("127.0.0.1:5000", "https://127.0.0.1:5001/token", "not in the registry's registrable domain"),
    ],
)
def test_a_token_realm_gets_credentials_only_over_https_in_the_registrys_domain(registry_host, realm, allowed) -> None:
    scheme = "http" if registry_host.startswith("127.") else "https"
    why = realm_withholds(httpx.URL(f"{scheme}://{registry_host}"), httpx.URL(realm))
    assert (why == "") if not allowed else (allowed in why), why


def test_a_realm_on_another_host_over_http_is_asked_anonymously_and_the_refusal_says_why() -> None:
    with Scripted(lambda h: _answer(h, 401)) as token_server:

        def registry(h: BaseHTTPRequestHandler) -> None:
            _answer(h, 401, headers={"WWW-Authenticate": f'Bearer realm="{token_server.url}/token",service="s"'})

        with (
            Scripted(registry) as own,
            RegistryClient(f"127.0.0.1:{own.port}", credential=CREDENTIAL) as client,
            pytest.raises(OciError) as refused,
        ):
            client.manifest("repo", "latest")
    assert token_server.seen and token_server.authorizations() == []
    assert "withheld" in str(refused.value) and "plain http" in str(refused.value)
    _assert_clean(str(refused.value))


# --- secrets never printed ---------------------------------------------------------------


def _echoing_registry(h: BaseHTTPRequestHandler) -> None:
    """Wants Basic auth, then fails every request with 500 echoing the request's headers."""
    if not h.headers.get("Authorization"):
        return _answer(h, 401, headers={"WWW-Authenticate": 'Basic realm="r"'})
    _answer(
        h,
        500,
        json.dumps(
            {"errors": [{"message": f"bad request: {dict(h.headers)}", "detail": h.headers.get("Authorization", "")}]}
        ).encode(),
    )


def _layout(tmp_path: Path) -> Path:
    from tests.fixtures.oci import make_image, make_layer

    layer = make_layer(tmp_path, "app", {"/opt/x": "x\n"})
    make_image(tmp_path / "layout", [layer], entrypoint=["/bin/true"])
    return tmp_path / "layout"


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch) -> Path:
    return no_credentials(tmp_path / "home", monkeypatch)


@pytest.mark.parametrize("source", ["environment", "auth file", "credential helper"])
def test_a_registry_echoing_the_credentials_never_gets_them_printed(
    tmp_path: Path, clean_env: Path, monkeypatch, capfd, source: str
) -> None:
    secret = f"{PASSWORD}-{os.urandom(6).hex()}"
    pair = base64.b64encode(f"{USER}:{secret}".encode()).decode()
    with Scripted(_echoing_registry) as registry:
        host = f"127.0.0.1:{registry.port}"
        if source == "environment":
            monkeypatch.setenv("OMNI_REGISTRY_USERNAME", USER)
            monkeypatch.setenv("OMNI_REGISTRY_PASSWORD", secret)
            monkeypatch.setenv("OMNI_REGISTRY_HOST", host)
        elif source == "auth file":
            (tmp_path / "auth.json").write_text(json.dumps({"auths": {host: {"auth": pair}}}))
            monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "auth.json"))
        else:
            (tmp_path / "answer.json").write_text(json.dumps({"Username": USER, "Secret": secret}))
            credential_helper(tmp_path / "bin", "echoed", f"cat {tmp_path / 'answer.json'}\n")
            monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
            (clean_env / ".docker" / "config.json").write_text(json.dumps({"credHelpers": {host: "echoed"}}))
        code = push_main([str(_layout(tmp_path)), f"{host}/omni/app:1"])
    out, err = capfd.readouterr()
    assert code == 2 and registry.authorizations(), err
    assert "attempt 1/3 failed" in err  # the retries were printed, and redacted too
    for form in [*secret_forms(secret), *secret_forms(pair), *secret_forms(f"{USER}:{secret}")]:
        # Not even a fragment: a message cut at a length must not leave half a secret behind.
        fragments = {form[i : i + 10] for i in range(max(len(form) - 9, 1))}
        assert not [piece for piece in fragments if piece in out + err], f"{source}: part of a secret was printed"


@settings(max_examples=200, deadline=None)
@given(
    secret=st.text(min_size=4, max_size=40).filter(lambda s: s.strip() == s and "\x00" not in s),
    prefix=st.text(max_size=20),
    suffix=st.text(max_size=20),
    spelling=st.sampled_from(["raw", "json", "json-ascii", "repr", "url", "shell", "unicode-escape"]),
)
def test_the_redactor_hides_any_secret_in_any_escaped_spelling(
    secret: str, prefix: str, suffix: str, spelling: str
) -> None:
    import shlex
    from urllib.parse import quote

    spelled = {
        "raw": secret,
        "json": json.dumps(secret, ensure_ascii=False)[1:-1],
        "json-ascii": json.dumps(secret)[1:-1],
        "repr": repr(secret)[1:-1],
        "url": quote(secret, safe=""),
        "shell": shlex.quote(secret),
        "unicode-escape": secret.encode("unicode_escape").decode("ascii"),
    }[spelling]
    hidden = redactor([secret])(prefix + spelled + suffix)
    assert spelled not in hidden


def test_a_learned_secret_is_redacted_from_every_later_line() -> None:
    learned = "learned-" + os.urandom(8).hex()
    assert redact_known(f"x {learned} y") == f"x {learned} y"
    learn(learned)
    assert learned not in redact_known(f"x {learned} y") and "[REDACTED]" in redact_known(learned)


# --- every wait has a total deadline ------------------------------------------------------


def test_a_manifest_read_back_trickling_a_byte_at_a_time_is_cut_at_its_deadline() -> None:
    manifest = json.dumps({"schemaVersion": 2, "layers": [], "pad": "x" * 200}).encode()

    def registry(h: BaseHTTPRequestHandler) -> None:
        if h.command == "PUT":
            return _answer(h, 201)
        _trickle(h, manifest, 0.2, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})

    with Scripted(registry) as own, RegistryClient(f"127.0.0.1:{own.port}", credential=None) as client:
        client.document_deadline_s = 2
        started = time.monotonic()
        with pytest.raises(OciError, match="still arriving at its deadline"):
            client.put_manifest("repo", "1", manifest, "application/vnd.oci.image.manifest.v1+json")
        # The document's deadline, not the read-back's last byte (0.2 s each: about 50 s).
        ended_by_deadline(time.monotonic() - started, client.document_deadline_s, 0.2 * len(manifest))


def _trickled_headers(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
    """A status line and one endless header, a byte every 0.2 s: httpx's read timeout never fires."""
    try:
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 5000:
            if stop.is_set():
                return
            h.wfile.write(bytes([byte]))
            h.wfile.flush()
            time.sleep(0.2)
    except (BrokenPipeError, ConnectionResetError):
        pass


@pytest.mark.parametrize("who", ["registry", "token service"])
def test_an_answer_trickling_its_headers_is_cut_at_the_deadline(who: str) -> None:
    stop = threading.Event()

    def registry(h: BaseHTTPRequestHandler) -> None:
        if who == "token service" and not h.path.startswith("/token"):
            return _answer(h, 401, headers={"WWW-Authenticate": f'Bearer realm="http://{h.headers["Host"]}/token"'})
        _trickled_headers(h, stop)

    with Scripted(registry) as own, RegistryClient(f"127.0.0.1:{own.port}", credential=None) as client:
        client.document_deadline_s = 1
        started = time.monotonic()
        try:
            with pytest.raises(OciError, match="did not arrive within 1 s") as refused:
                client.manifest("repo", "latest")
        finally:
            stop.set()
        # Each of the ATTEMPTS gets its own deadline (the backoff between them within the slack), not
        # the endless header's 5000 bytes at 0.2 s each.
        ended_by_deadline(time.monotonic() - started, ATTEMPTS * client.document_deadline_s, 1000)
    assert refused.value.field == "registry" and any(path.startswith("/token") for _, path, _ in own.seen) == (
        who == "token service"
    )


def test_a_202_without_location_is_refused_naming_the_registry() -> None:
    with (
        Scripted(lambda h: _answer(h, 202)) as own,
        RegistryClient(f"127.0.0.1:{own.port}", credential=None) as c,
        pytest.raises(OciError, match="answered 202 without a Location header") as refused,
    ):
        c.upload("repo", "sha256:" + "1" * 64, b"x", 1)
    assert f"127.0.0.1:{own.port}" in str(refused.value)


@pytest.mark.parametrize("where", ["REGISTRY_AUTH_FILE", "DOCKER_CONFIG"])
def test_a_fifo_as_an_auth_file_is_refused_at_once(tmp_path: Path, clean_env: Path, monkeypatch, where: str) -> None:
    fifo = tmp_path / ("auth.json" if where == "REGISTRY_AUTH_FILE" else "docker/config.json")
    fifo.parent.mkdir(exist_ok=True)
    os.mkfifo(fifo)
    monkeypatch.setenv(where, str(fifo if where == "REGISTRY_AUTH_FILE" else fifo.parent))
    with pytest.raises(OciError, match="must be a regular file") as refused:
        lookup("127.0.0.1:5999")  # a blocking open would hang here: Bazel's timeout
    assert refused.value.field == str(fifo)


def test_non_ascii_auth_in_config_json_is_refused_naming_the_file(tmp_path: Path, clean_env: Path) -> None:
    config = clean_env / ".docker" / "config.json"
    config.write_text(json.dumps({"auths": {"127.0.0.1:5999": {"auth": "dXNlcjpwYXNz\u00e9"}}}))
    with pytest.raises(OciError, match="auth is not base64 of user:password") as refused:
        lookup("127.0.0.1:5999")
    assert str(config) in str(refused.value)


def _child(code: str, env: dict[str, str], log: Path) -> tuple[int, float, str]:
    """(peak resident KB, seconds, stderr) of `code` run in a fresh interpreter. The peak is the
    child's own VmHWM (reset at exec, unlike wait4's maxrss, which counts the forked parent)."""
    started = time.monotonic()
    with log.open("w") as err:
        subprocess.run([sys.executable, "-c", code + PEAK], env=env, stderr=err, timeout=120)
    text = log.read_text()
    peak = int(text.rsplit("peak-kb ", 1)[1].split()[0])
    return peak, time.monotonic() - started, text


PEAK = """
import sys
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print("peak-kb", line.split()[1], file=sys.stderr)
"""


@pytest.mark.parametrize(
    "name, body, message",
    [
        ("hangs", "sleep 600\n", "did not answer within"),
        ("floods", "head -c 1500000000 /dev/zero\n", "answered more than 65536 bytes"),
        ("lingers", '(sleep 600 &) ; echo \'{"Username":"u","Secret":"lingering-secret"}\'\n', ""),
    ],
)
def test_a_hostile_credential_helper_costs_one_bounded_attempt(
    tmp_path: Path, clean_env: Path, monkeypatch, name: str, body: str, message: str
) -> None:
    credential_helper(tmp_path / "bin", name, f"echo run >> {tmp_path / 'runs'}\n" + body)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (clean_env / ".docker" / "config.json").write_text(json.dumps({"credsStore": name}))
    code = """
import sys, time
from omni_oci.remote.auth.credentials import lookup
from omni_oci.format.errors import OciError
for attempt in range(3):  # a failed lookup is asked once per run
    try:
        found = lookup("127.0.0.1:5999")
        print("found", found.username, file=sys.stderr)
    except OciError as exc:
        print("refused", exc, file=sys.stderr)
"""
    peak_kb, seconds, err = _child(
        code, {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, tmp_path / "child.log"
    )
    # At most the helper's deadline (the hanging one), not its 600 s sleep; the child's start is within the slack.
    ended_by_deadline(seconds, credentials.HELPER_DEADLINE_S, 600, started_with_it=False)
    assert peak_kb < 200 * 1024, f"peak memory {peak_kb // 1024} MB"
    assert (tmp_path / "runs").read_text().count("run") == 1, "the helper was asked more than once"
    if message:
        assert err.count(message) == 3, err
    else:
        assert err.count("found u") == 3 and "lingering-secret" not in err, err


# --- the gate's peers ----------------------------------------------------------------------

CHAT = json.dumps(
    {"choices": [{"message": {"content": "hello"}, "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}
).encode()


@pytest.mark.parametrize("call", ["chat", "metrics", "stream"])
@pytest.mark.parametrize("how", ["trickled body", "trickled headers"])
def test_a_gate_peer_trickling_bytes_is_cut_at_the_runs_deadline(call: str, how: str) -> None:
    stop = threading.Event()

    def server(h: BaseHTTPRequestHandler) -> None:
        if how == "trickled headers":
            return _trickled_headers(h, stop)
        body = b"data: " + CHAT + b"\n\n" if call == "stream" else CHAT
        _trickle(h, body if call != "metrics" else b"vllm:spec_decode_num_drafts_total 1\n" * 50, 0.2)

    deadline_s = 3.0
    with Scripted(server) as peer:
        endpoint = Endpoint("spec", peer.url, "m", "", request_timeout=60, deadline=Deadline(deadline_s))
        started = time.monotonic()
        with endpoint.client() as client:
            if call == "chat":
                with pytest.raises(PeerError) as refused:
                    endpoint.chat(client, {"messages": []})
            elif call == "metrics":
                assert endpoint.metrics(client) is None  # /metrics is optional: a late one is "not exposed"
                refused = None
            else:
                with pytest.raises(PeerError) as refused:
                    endpoint.stream_first_chunk(client, {"stream": True})
        stop.set()
        ended_by_deadline(time.monotonic() - started, deadline_s, 60, started_with_it=False)  # not the 60 s timeout
        if refused is not None:
            assert isinstance(refused.value, DeadlinePassed) or "did not answer within" in str(refused.value)


def test_a_gate_stream_of_blank_lines_is_capped_not_waited_on() -> None:
    def server(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        try:
            while True:
                h.wfile.write(b"\n" * 65536)
        except (BrokenPipeError, ConnectionResetError):
            pass

    with Scripted(server) as peer:
        endpoint = Endpoint("spec", peer.url, "m", "", request_timeout=600, deadline=Deadline(600))
        started = time.monotonic()
        with endpoint.client() as client, pytest.raises(PeerError, match="without a data chunk"):
            endpoint.stream_first_chunk(client, {"stream": True})
        ended_long_before(time.monotonic() - started, 600, what="the cap on blank lines")


@settings(max_examples=100, deadline=None)
@given(
    body=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=500), max_size=30),
    limit=st.integers(min_value=0, max_value=3000),
)
def test_the_bounded_reader_returns_a_body_within_its_cap_and_refuses_one_past_it(
    body: bytes, cuts: list[int], limit: int
) -> None:
    """However a peer splits its body into pieces, what is read is exactly the body when it fits
    the cap, and a refusal naming the document when it does not (never a silent cut)."""
    from attest.edge.bodies import read_bounded

    def pieces():
        offset = 0
        for cut in cuts:
            if offset >= len(body):
                break
            yield body[offset : offset + cut]
            offset += cut
        if offset < len(body):
            yield body[offset:]

    response = httpx.Response(200, stream=httpx.ByteStream(b"") if not body else _Pieces(pieces()))
    if len(body) <= limit:
        assert read_bounded(response, limit, "the document") == body
    else:
        with pytest.raises(OciError, match="the document is larger than"):
            read_bounded(response, limit, "the document", error=OciError)


class _Pieces(httpx.SyncByteStream):
    def __init__(self, pieces) -> None:
        self._pieces = pieces

    def __iter__(self):
        yield from self._pieces
