"""omni_oci/remote/registry.py's chunked uploads after a cut: the upload's status (GET on its
session, as the distribution spec defines it) says where the registry stopped and only the rest
is sent again; a registry that refuses the status (docker-registry invalidates a session whose
PATCH broke off) gets a fresh session, and the blob still arrives whole. A registry scripted to
the spec checks the first; docker-registry on loopback, behind a proxy that cuts the first
connection to carry N bytes towards it, checks the second."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from omni_oci.format.errors import OciError
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.fault_proxy import FaultProxy, Step
from tests.fixtures.registry import LoopbackRegistry

BLOB = random.Random(11).randbytes(8 << 20)
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()
CHUNK = 1 << 20


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry() as started:
        yield started


def _client(host: str) -> RegistryClient:
    client = RegistryClient(host, credential=None)
    client.chunked_threshold, client.chunk_size = CHUNK, CHUNK
    return client


class SpecRegistry:
    """Uploads as the distribution spec defines them, in memory: POST opens a session, PATCH
    appends at its Content-Range, GET reports `Range: 0-<last byte>`, PUT closes with the
    digest. The `cut`-th PATCH stores half its bytes, then the connection breaks."""

    def __init__(self, cut: int) -> None:
        self.cut, self.patches, self.received = cut, 0, 0
        self.session = bytearray()
        self.blobs: dict[str, bytes] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "HEAD":
            return httpx.Response(200 if path.rsplit("/", 1)[1] in self.blobs else 404)
        if request.method == "POST":
            self.session = bytearray()
            return httpx.Response(202, headers={"Location": "/v2/spec/blobs/uploads/1"})
        if request.method == "GET":
            return httpx.Response(204, headers={"Range": f"0-{max(len(self.session) - 1, 0)}", "Location": path})
        body = request.read()
        self.received += len(body)
        if request.method == "PATCH":
            self.patches += 1
            if int(request.headers["Content-Range"].split("-")[0]) != len(self.session):
                return httpx.Response(416)
            if self.patches == self.cut:
                self.session += body[: len(body) // 2]
                raise httpx.RemoteProtocolError("the connection broke off", request=request)
            self.session += body
            return httpx.Response(202, headers={"Location": path})
        digest = request.url.params["digest"]
        self.blobs[digest] = bytes(self.session + body)
        return httpx.Response(201 if hashlib.sha256(self.blobs[digest]).hexdigest() == digest[7:] else 400)


def _stream() -> Iterator[bytes]:
    return iter([BLOB[start : start + 300_000] for start in range(0, len(BLOB), 300_000)])


class _Reopened:
    """An OffsetStream: the blob read again from any offset (as tools/model streams a file's layer)."""

    def __init__(self) -> None:
        self.opened: list[int] = []

    def from_offset(self, offset: int) -> Iterator[bytes]:
        self.opened.append(offset)
        return iter([BLOB[start : start + 300_000] for start in range(offset, len(BLOB), 300_000)])


@pytest.mark.parametrize("content", ["file", "bytes", "stream", "offset-stream"])
def test_a_cut_chunked_upload_resumes_where_the_registry_stopped(tmp_path: Path, content: str, capsys) -> None:
    path = tmp_path / "blob"
    path.write_bytes(BLOB)
    spec = SpecRegistry(cut=4)
    client = RegistryClient("127.0.0.1:1", credential=None, transport=httpx.MockTransport(spec))
    client.chunked_threshold, client.chunk_size = CHUNK, CHUNK
    reopened = _Reopened()
    sources = {"file": path, "bytes": BLOB, "stream": _stream, "offset-stream": reopened}
    client.upload("spec", DIGEST, sources[content], len(BLOB))
    assert spec.blobs[DIGEST] == BLOB
    if content == "offset-stream":  # each chunk streamed from its own start, the cut one from where it stopped
        assert reopened.opened == [
            0,
            CHUNK,
            2 * CHUNK,
            3 * CHUNK,
            3 * CHUNK + CHUNK // 2,
            *range(4 * CHUNK + CHUNK // 2, len(BLOB), CHUNK),
        ]
    assert spec.received - len(BLOB) == CHUNK // 2  # only the half chunk the registry did not keep
    assert "resuming at byte 3670016" in capsys.readouterr().err  # 3 chunks and the kept half


@pytest.mark.parametrize("kind", ["cut", "reset"])
def test_docker_registry_refuses_the_broken_session_and_gets_a_fresh_one(registry, kind: str, capsys) -> None:
    repository = f"resume/{kind}"
    with FaultProxy(registry_address(registry), [Step(kind, after=(3 << 20) + 12345, upstream=True)]) as proxy:
        with _client(proxy.host) as client:
            client.upload(repository, DIGEST, BLOB, len(BLOB))
            assert client.has_blob(repository, DIGEST)
        sent = proxy.to_server
    assert sent <= 2 * len(BLOB), sent  # the bytes before the cut, then the blob once more
    assert "upload status of" in capsys.readouterr().err
    with RegistryClient(registry.host, credential=None) as direct:
        assert direct.blob(repository, DIGEST, size=len(BLOB)) == BLOB


def test_a_registry_that_lost_the_session_gets_the_upload_again_from_the_start(registry, capsys) -> None:
    with FaultProxy(registry_address(registry), [Step("cut", after=2 << 20, upstream=True)]) as proxy:
        with _client(proxy.host) as client:
            real_status = client._upload_status

            def lost(*args):
                raise OciError("upload status: HTTP 404", field="upload")

            client._upload_status = lost
            client.upload("resume/lost", DIGEST, BLOB, len(BLOB))
            client._upload_status = real_status
            assert client.has_blob("resume/lost", DIGEST)
    assert "attempt 1/3 failed" in capsys.readouterr().err


def registry_address(registry: LoopbackRegistry) -> tuple[str, int]:
    return ("127.0.0.1", registry.port)
