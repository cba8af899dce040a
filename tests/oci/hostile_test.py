"""Registries are untrusted: a real docker-registry on loopback, behind a small proxy the
test controls, and images crafted to hurt the reader (gzip bombs, oversized or lying blobs,
malformed manifests). Every case is refused or recovered from, bounded in memory."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from omni_oci.format.errors import OciError
from omni_oci.format.image_contract import BAKED_PATH
from omni_oci.format.layout import OCI_CONFIG, OCI_MANIFEST, TITLE, canonical, descriptor, sha256_digest
from omni_oci.remote.push import push
from omni_oci.remote.registry import RegistryClient
from omni_oci.remote.shallow_base import fetch_base
from omni_oci.signing.keys import load_private_key
from omni_oci.signing.legacy import push_image_signature
from tests.fixtures.oci import blobs_of, make_image, make_layer
from tests.fixtures.pins import key_pair
from tests.fixtures.registry import LoopbackRegistry

GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry() as running:
        yield running


class Proxy:
    """Forwards to the real registry, except where `decide(method, path, count)` answers
    instead (a status code): the test's hostile registry."""

    def __init__(self, upstream: str, decide) -> None:
        self.counts: dict[str, int] = {}
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                kind = (
                    "upload"
                    if "/blobs/uploads/" in self.path and self.command == "PUT"
                    else "manifest"
                    if "/manifests/" in self.path and self.command == "PUT"
                    else self.command
                )
                proxy.counts[kind] = proxy.counts.get(kind, 0) + 1
                status = decide(self.command, kind, proxy.counts[kind])
                if status is not None:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    if status == 201 and kind == "upload":
                        self.send_header("Location", "/v2/forged")
                    self.end_headers()
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                response = httpx.request(self.command, f"http://{upstream}{self.path}", headers=headers, content=body)
                self.send_response(response.status_code)
                for key, value in response.headers.items():
                    if key.lower() in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        continue
                    if key.lower() == "location":
                        value = value.replace(upstream, proxy.host)
                    self.send_header(key, value)
                data = b"" if self.command == "HEAD" else response.content
                self.send_header(
                    "Content-Length",
                    str(len(data) if self.command != "HEAD" else response.headers.get("content-length", "0")),
                )
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_PATCH = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _layout(tmp_path: Path) -> Path:
    work = tmp_path / "img"
    work.mkdir()
    layers = [make_layer(work, name, {f"/opt/{name}/data": name * 100}) for name in ("a", "b", "c", "d")]
    make_image(work / "layout", layers, entrypoint=["/bin/true"])
    return work / "layout"


def test_push_retries_a_registry_that_fails_every_third_upload_once(tmp_path: Path, registry, capsys) -> None:
    failed: set[int] = set()

    def every_third_once(method: str, kind: str, count: int):
        if kind == "upload" and count % 3 == 0 and count not in failed:
            failed.add(count)
            return 500
        return None

    proxy = Proxy(registry.host, every_third_once)
    try:
        layout = _layout(tmp_path)
        report = push(layout, f"{proxy.host}/omni/flaky:v1")
        assert report.digest == blobs_of(layout)["digest"] and len(report.uploaded) == 5
        assert failed, "the proxy never failed an upload"
        assert "registry: attempt 1/3 failed: upload of sha256:" in capsys.readouterr().err
        second = push(layout, f"{proxy.host}/omni/flaky:v1")
        assert (second.uploaded_bytes, second.uploaded) == (0, [])
    finally:
        proxy.close()


@pytest.mark.parametrize("lie,message", [("upload", "acknowledged sha256:"), ("manifest", "acknowledged manifest")])
def test_a_registry_that_acknowledges_but_does_not_store_is_refused(
    tmp_path: Path, registry, lie: str, message: str
) -> None:
    proxy = Proxy(registry.host, lambda method, kind, count: 201 if kind == lie else None)
    try:
        with pytest.raises(OciError, match=message):
            push(_layout(tmp_path), f"{proxy.host}/omni/liar-{lie}:v1")
    finally:
        proxy.close()


# --- verify: signature first, everything bounded ------------------------------------------
def _push_crafted(client: RegistryClient, repository: str, last_layer: bytes, *, layers: bool = True) -> str:
    config = canonical(
        {"architecture": "amd64", "os": "linux", "config": {}, "rootfs": {"type": "layers", "diff_ids": []}}
    )
    manifest_layers = []
    for blob in (config, last_layer):
        client.upload(repository, sha256_digest(blob), blob, len(blob))
    if layers:
        manifest_layers = [descriptor(GZIP_LAYER, last_layer, annotations={TITLE: BAKED_PATH})]
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": descriptor(OCI_CONFIG, config),
            "layers": manifest_layers,
        }
    )
    return client.put_manifest(repository, sha256_digest(manifest), manifest, OCI_MANIFEST)


def _gzip_bomb(megabytes: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    return b"".join(packer.compress(block) for _ in range(megabytes)) + packer.flush()


def _verify_in_subprocess(reference: str, public: Path) -> dict:
    script = (
        "import json, resource, sys\nfrom tools.oci import verify\n"
        f"code = verify.main([{reference!r}, '--key', {str(public)!r}])\n"
        "print(json.dumps({'code': code, 'rss_kb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert "Traceback" not in done.stderr, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["refusal"] = json.loads(done.stderr.strip().splitlines()[-1]) if result["code"] else None
    return result


@pytest.mark.parametrize(
    "case,signed,message",
    [
        ("gzip bomb, unsigned", False, "is not signed/attested there"),
        ("gzip bomb, signed", True, "decompresses to more than"),
        ("pins layer not gzip", True, "is not a gzip stream"),
        ("pins layer not a tar", True, "the pins layer does not hold /etc/omni/image.json"),
        ("manifest without layers", True, "manifest has no layers"),
    ],
)
def test_verify_refuses_hostile_images_in_bounded_memory(
    tmp_path: Path, registry, case: str, signed: bool, message: str
) -> None:
    private, public = key_pair(tmp_path, "signer")
    repository = "omni/" + case.replace(" ", "-").replace(",", "")
    last = {
        "gzip bomb, unsigned": lambda: _gzip_bomb(512),
        "gzip bomb, signed": lambda: _gzip_bomb(512),
        "pins layer not gzip": lambda: b"plain bytes, not gzip",
        "pins layer not a tar": lambda: gzip.compress(b"not a tar archive" * 10, mtime=0),
        "manifest without layers": lambda: b"unused",
    }[case]()
    with RegistryClient(registry.host) as client:
        digest = _push_crafted(client, repository, last, layers=case != "manifest without layers")
        if signed:
            push_image_signature(client, repository, digest, load_private_key(private))
    result = _verify_in_subprocess(f"{registry.host}/{repository}@{digest}", public)
    assert result["code"] == 2 and message in result["refusal"]["error"], result
    # The interpreter with its imports peaks near 100 MB alone (more where PYTHONPATH is long);
    # decompressing the 512 MB bomb would need at least 512 MB.
    assert result["rss_kb"] < 200 * 1024, f"peak memory {result['rss_kb'] / 1024:.0f} MB"


class _ServesMore:
    """A registry whose manifest names a small config but serves far more bytes for it."""

    def __init__(self, declared_size: int, served: int) -> None:
        config = canonical({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
        self.manifest = canonical(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {"mediaType": OCI_CONFIG, "digest": sha256_digest(config), "size": declared_size},
                "layers": [],
            }
        )
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if "/manifests/" in self.path:
                    body, length = outer.manifest, len(outer.manifest)
                else:
                    body, length = None, served
                self.send_response(200)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                if body is not None:
                    self.wfile.write(body)
                    return
                chunk = b"{" * (1 << 20)
                try:
                    for _ in range(served >> 20):
                        self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.parametrize(
    "declared,served,message",
    [
        (3 << 30, 3 << 30, "declares 3221225472 bytes; at most 8388608"),
        (512, 64 << 20, "larger than the 512 bytes allowed"),
    ],
)
def test_the_base_fetch_never_reads_a_config_past_its_bounds(
    tmp_path: Path, declared: int, served: int, message: str
) -> None:
    hostile = _ServesMore(declared, served)
    try:
        with pytest.raises(OciError, match=message):
            fetch_base(f"{hostile.host}/vendor/big", sha256_digest(hostile.manifest), "linux/amd64", tmp_path / "out")
    finally:
        hostile.server.shutdown()
    assert not (tmp_path / "out").exists()


def test_a_blob_cut_short_under_its_content_length_is_a_refusal_naming_the_registry() -> None:
    """The connection closes after 100 of the 1000 bytes the answer announced: a refusal naming
    the registry, the blob and how much arrived, never an internal error."""
    digest = "sha256:" + "ab" * 32

    class CutShort(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"x" * 100)
            self.wfile.flush()
            self.close_connection = True

    server = ThreadingHTTPServer(("127.0.0.1", 0), CutShort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_port}"
    try:
        with RegistryClient(host) as client, pytest.raises(OciError) as refused:
            for _ in client.stream_blob("omni/cut", digest, 1000):
                pass
    finally:
        server.shutdown()
        server.server_close()
    assert refused.value.field == digest
    assert f"{host}/omni/cut: blob {digest} broke off after 100 of 1000 bytes" in str(refused.value)
