"""A real Bazel remote cache: nginx (Debian's, WebDAV PUT) on loopback, and two clean output
bases building both default images from a copy of this checkout. The first fills the cache; the
second must take every action that runs a process from it (100% remote cache hits) and build
the same digests. Needs the real home's Bazel repository cache (no network) and no sandbox:
it runs Bazel itself."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.fixtures.nested_bazel import bazel, checkout

NGINX = "/usr/sbin/nginx"
TARGETS = ["//images:qwen_mi300x", "//images:deepseek_spark"]
PROCESSES = re.compile(r"INFO: (\d+) processes?: (.*)\.")


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DavCache:
    def __init__(self) -> None:
        if not Path(NGINX).exists():
            pytest.fail(f"{NGINX} is missing: run tools/setup (it installs nginx-light)")
        # Not under the test's private temporary directory: nginx's workers (another user) must reach it.
        work = Path(tempfile.mkdtemp(prefix="omni-dav-", dir="/tmp"))
        work.chmod(0o755)
        self.work = work
        self.root, self.port = work / "cache", _port()
        for directory in (self.root, work / "tmp"):
            directory.mkdir(parents=True)
            directory.chmod(0o777)  # nginx's workers run as another user
        config = work / "nginx.conf"
        config.write_text(f"""daemon off;
pid {work / "nginx.pid"};
error_log {work / "error.log"} warn;
events {{}}
http {{
  access_log off;
  client_body_temp_path {work / "tmp"};
  proxy_temp_path {work / "tmp"};
  fastcgi_temp_path {work / "tmp"};
  uwsgi_temp_path {work / "tmp"};
  scgi_temp_path {work / "tmp"};
  server {{
    listen 127.0.0.1:{self.port};
    location / {{
      root {self.root};
      dav_methods PUT;
      create_full_put_path on;
      client_max_body_size 0;
    }}
  }}
}}
""")
        self.process = subprocess.Popen([NGINX, "-c", str(config)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120  # its start on a loaded machine: an event wait
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"nginx did not listen: {(work / 'error.log').read_text()[-500:]}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=20)
        shutil.rmtree(self.work, ignore_errors=True)


def test_a_clean_output_base_builds_both_images_entirely_from_the_remote_cache(tmp_path: Path) -> None:
    workspace = checkout(tmp_path / "checkout")
    cache = DavCache()
    bases = [tmp_path / "base-1", tmp_path / "base-2"]
    try:
        runs = [bazel(workspace, base, "build", f"--remote_cache={cache.url}", *TARGETS) for base in bases]
        for run in runs:
            assert run.returncode == 0, run.stderr[-3000:]
        first, second = (PROCESSES.findall(run.stderr)[-1] for run in runs)
        kinds = dict(
            (kind, int(count)) for count, kind in (part.strip().split(" ", 1) for part in second[1].split(","))
        )
        ran = {kind: count for kind, count in kinds.items() if kind not in ("internal", "remote cache hit")}
        assert kinds.get("remote cache hit", 0) > 0 and not ran, f"second build: {second}; first: {first}"
        digests = [
            [
                (base / "execroot/_main/bazel-out/k8-fastbuild/bin/images" / f"{name}.digest").read_text()
                for name in ("qwen_mi300x", "deepseek_spark")
            ]
            for base in bases
        ]
        assert digests[0] == digests[1]
        stored = [f for f in cache.root.rglob("*") if f.is_file()]
        assert {f.relative_to(cache.root).parts[0] for f in stored} == {"ac", "cas"}, cache.work / "error.log"
    finally:
        for base in bases:
            bazel(workspace, base, "shutdown")
        cache.stop()


def _synthetic_base(registry: str, repository: str, work: Path, size: int, parts: int) -> tuple[str, set[str]]:
    """A linux/amd64 'vendor' base of incompressible layers; returns its digest and its layers' hex digests."""
    import hashlib

    from omni_oci.format.layout import OCI_CONFIG, OCI_LAYER_GZIP, OCI_MANIFEST, canonical, descriptor
    from omni_oci.remote.registry import RegistryClient

    layers = []
    with RegistryClient(registry, credential=None) as client:
        for index in range(parts):
            blob, hasher = work / f"base-layer-{index}", hashlib.sha256()
            with blob.open("wb") as handle:
                for _ in range(size // parts // (16 << 20)):
                    chunk = os.urandom(16 << 20)
                    hasher.update(chunk)
                    handle.write(chunk)
            digest = "sha256:" + hasher.hexdigest()
            client.upload(repository, digest, blob, blob.stat().st_size)
            layers.append({"mediaType": OCI_LAYER_GZIP, "digest": digest, "size": blob.stat().st_size})
            blob.unlink()
        config = canonical(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Env": ["PATH=/usr/bin:/bin"]},
                "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
            }
        )
        client.upload(repository, "sha256:" + hashlib.sha256(config).hexdigest(), config, len(config))
        manifest = canonical(
            {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor(OCI_CONFIG, config), "layers": layers}
        )
        digest = client.put_manifest(repository, "release-base", manifest, OCI_MANIFEST)
    return digest, {layer["digest"].split(":", 1)[1] for layer in layers}


def test_a_release_build_on_a_2_gb_base_puts_no_base_bytes_in_the_cache(tmp_path: Path) -> None:
    """--config=release builds shallow on the pinned vendor base (here a synthetic 2 GB one, mirrored
    on loopback): the cache then holds the small layers and metadata, never a base layer."""
    import hashlib
    import json

    from tests.fixtures.registry import LoopbackRegistry

    workspace = checkout(tmp_path / "checkout")
    cache = DavCache()
    base = tmp_path / "release-base"
    with LoopbackRegistry() as registry:
        try:
            digest, base_layers = _synthetic_base(registry.host, "rocm/vllm", tmp_path, 2 << 30, 8)
            pins_path = workspace / "images" / "qwen_mi300x.pins.json"
            pins = json.loads(pins_path.read_text())
            # A test copy only: a release needs every pin, and these are the test's own values.
            pins["base"]["digest"] = digest
            pins["engine"]["commit"], pins["model"]["revision"] = "a" * 40, "b" * 40
            pins["speculator"]["revision"] = "c" * 40
            # The synthetic base installs no packages: its contents file, as tools/pin writes one.
            contents = {
                "schema_version": "1",
                "image": "qwen_mi300x",
                "base": {"image": pins["base"]["image"], "digest": digest, "platform": "linux/amd64"},
                "os": {"id": "", "version_id": "", "name": ""},
                "dpkg": [],
                "python": [],
            }
            contents_bytes = json.dumps(contents).encode()
            (workspace / "images" / "qwen_mi300x.base-contents.json").write_bytes(contents_bytes)
            pins["base"]["contents_sha256"] = hashlib.sha256(contents_bytes).hexdigest()
            pins_path.write_text(json.dumps(pins, indent=2) + "\n")
            run = bazel(
                workspace,
                base,
                "build",
                "--config=release",
                f"--repo_env=OMNI_BASE_MIRROR={registry.host}",
                f"--remote_cache={cache.url}",
                "//images:qwen_mi300x",
            )
            assert run.returncode == 0, run.stderr[-3000:]
            stored = {f.name: f.stat().st_size for f in (cache.root / "cas").rglob("*") if f.is_file()}
            assert stored and not base_layers & set(stored), "a base layer went into the cache"
            assert sum(stored.values()) < 200 << 20, f"the cache holds {sum(stored.values())} bytes"
        finally:
            bazel(workspace, base, "shutdown")
            cache.stop()
