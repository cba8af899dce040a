"""The OCI tools: deterministic layers, reproducible images, shallow bases, and registry
round trips through a real loopback registry (Debian's docker-registry)."""

from __future__ import annotations

import gzip
import json
import re
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from omni_oci.format.errors import OciError
from omni_oci.format.layout import canonical, sha256_digest
from omni_oci.format.reference import Reference, api_path
from omni_oci.remote.push import push
from omni_oci.remote.registry import RegistryClient
from omni_oci.remote.shallow_base import fetch_base
from tests.fixtures.oci import blobs_of, crane, make_image, make_layer
from tests.fixtures.registry import LoopbackRegistry
from tools.oci.build.layer import write_layer

APP = {"/opt/omni/app/launcher/cli.py": "print('hello')\n", "/opt/omni/app/launcher/__init__.py": ""}
DEPS = {
    "/opt/omni/site-packages/dep/__init__.py": "VERSION = 1\n",
    "/opt/omni/site-packages/dep/data.bin": b"\0" * 5000,
}


def _build(work: Path, app: dict) -> dict:
    work.mkdir(parents=True)
    deps = make_layer(work, "deps", DEPS)
    application = make_layer(work, "app", app)
    make_image(
        work / "layout",
        [deps, application],
        entrypoint=["/usr/bin/python3", "-m", "launcher"],
        labels={"omni.test": "1"},
    )
    return blobs_of(work / "layout")


def test_layers_are_deterministic_and_normalised(tmp_path: Path) -> None:
    desc, blob = make_layer(tmp_path, "a", {"/b/z.txt": "z", "/b/a.sh": "#!/bin/sh\n", "/c": "c"})
    (tmp_path / "a-src/b/a.sh").chmod(0o755)
    desc2 = write_layer(
        [{"src": str(tmp_path / "a-src" / p), "dest": "/" + p} for p in ("c", "b/z.txt", "b/a.sh")],
        tmp_path / "again.tar.gz",
    )
    assert desc2["digest"] != desc["digest"]  # a.sh is executable now: the mode is part of the bytes
    third = write_layer(
        [{"src": str(tmp_path / "a-src" / p), "dest": "/" + p} for p in ("b/a.sh", "c", "b/z.txt")],
        tmp_path / "third.tar.gz",
    )
    assert third == desc2  # input order does not matter
    raw = (tmp_path / "third.tar.gz").read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip header mtime 0
    assert desc2["diff_id"] == sha256_digest(gzip.decompress(raw))
    with tarfile.open(tmp_path / "third.tar.gz") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == ["b", "b/a.sh", "b/z.txt", "c"]
        assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", 0)}
        assert {m.name: oct(m.mode) for m in members} == {
            "b": "0o755",
            "b/a.sh": "0o755",
            "b/z.txt": "0o644",
            "c": "0o644",
        }
        assert all(not m.pax_headers for m in members)


def test_same_inputs_same_digests_and_one_byte_changes_only_the_app_layer(tmp_path: Path) -> None:
    first = _build(tmp_path / "one", APP)
    second = _build(tmp_path / "two", APP)
    assert first == second
    changed = _build(tmp_path / "three", {**APP, "/opt/omni/app/launcher/cli.py": "print('hellO')\n"})
    assert changed["layers"][0] == first["layers"][0]
    assert changed["layers"][1] != first["layers"][1]
    assert changed["config"] != first["config"] and changed["digest"] != first["digest"]


@pytest.mark.parametrize(
    "entries,message",
    [
        ([{"src": "/nonexistent/file.py", "dest": "/x.py"}], "layer input /nonexistent/file.py is unreadable"),
        ([{"src": "/etc/hostname", "dest": "/../etc/x"}], "must be a path inside the image"),
        ([{"src": "/etc/hostname", "dest": "/"}], "must be a path inside the image"),
    ],
)
def test_layer_refusals(tmp_path: Path, entries: list, message: str) -> None:
    with pytest.raises(OciError, match=message):
        write_layer(entries, tmp_path / "x.tar.gz")


def test_conflicting_destinations_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    with pytest.raises(OciError, match="two different entries for x"):
        write_layer(
            [{"src": str(tmp_path / "a"), "dest": "/x"}, {"src": str(tmp_path / "b"), "dest": "/x"}],
            tmp_path / "x.tar.gz",
        )


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry() as running:
        yield running


def _vendor_base(work: Path, registry: LoopbackRegistry, repo: str, size: int = 300_000) -> str:
    """A synthetic 'vendor' base pushed to the registry; returns its manifest digest."""
    layer = make_layer(work, "vendor-layer", {"/usr/lib/vendor.bin": bytes(range(256)) * (size // 256)})
    make_image(work / "vendor", [layer], entrypoint=["/bin/vendor"], env={"PATH": "/usr/bin:/bin", "VENDOR": "1"})
    return push(work / "vendor", f"{registry.host}/{repo}:1.0").digest


def test_push_pull_by_digest_roundtrip_and_zero_byte_second_push(tmp_path: Path, registry) -> None:
    _build(tmp_path / "img", APP)
    layout = tmp_path / "img" / "layout"
    first = push(layout, f"{registry.host}/omni/roundtrip:v1")
    blobs = blobs_of(layout)
    assert first.reference == f"{registry.host}/omni/roundtrip@{blobs['digest']}"
    assert first.uploaded_bytes == sum(
        Path(layout, "blobs/sha256", d.split(":")[1]).stat().st_size for d in [blobs["config"], *blobs["layers"]]
    )
    manifest = crane("manifest", first.reference)
    assert manifest.returncode == 0, manifest.stderr
    assert manifest.stdout.encode() == Path(layout, "blobs/sha256", blobs["digest"].split(":")[1]).read_bytes()
    pulled = tmp_path / "pulled"
    result = crane("pull", "--format", "oci", first.reference, str(pulled))
    assert result.returncode == 0, result.stderr
    for digest in [blobs["config"], *blobs["layers"]]:
        name = digest.split(":")[1]
        assert (pulled / "blobs/sha256" / name).read_bytes() == (layout / "blobs/sha256" / name).read_bytes()
    assert crane("validate", "--remote", first.reference).returncode == 0
    assert crane("digest", f"{registry.host}/omni/roundtrip:v1").stdout.strip() == blobs["digest"]
    second = push(layout, f"{registry.host}/omni/roundtrip:v1")
    assert (second.uploaded_bytes, second.uploaded) == (0, [])
    assert len(second.present) == 3


def test_shallow_base_is_mounted_on_the_same_registry(tmp_path: Path, registry) -> None:
    base_digest = _vendor_base(tmp_path, registry, "vendor/base")
    source = fetch_base(f"{registry.host}/vendor/base", base_digest, "linux/amd64", tmp_path / "shallow")
    assert source["digest"] == base_digest and sorted(p.name for p in (tmp_path / "shallow").iterdir()) == [
        "base.json",
        "config.json",
        "manifest.json",
    ]
    app = make_layer(tmp_path, "app", APP)
    result = make_image(
        tmp_path / "app-image", [app], base=tmp_path / "shallow", entrypoint=["/usr/bin/python3", "-m", "launcher"]
    )
    base_layer = json.loads((tmp_path / "shallow" / "manifest.json").read_text())["layers"][0]["digest"]
    assert not Path(tmp_path / "app-image/blobs/sha256", base_layer.split(":")[1]).exists()  # never copied
    assert result["manifest"]["annotations"]["org.opencontainers.image.base.digest"] == base_digest
    env = result["config"]["config"]["Env"]
    assert "VENDOR=1" in env and result["config"]["config"]["Entrypoint"][0] == "/usr/bin/python3"
    report = push(tmp_path / "app-image", f"{registry.host}/omni/app:1")
    assert report.mounted == [base_layer] and base_layer not in report.uploaded
    assert report.uploaded_bytes < 10_000  # config, manifest-sized blobs and the tiny app layer only
    assert crane("validate", "--remote", report.reference).returncode == 0


def test_shallow_base_is_streamed_from_another_registry(tmp_path: Path, registry) -> None:
    base_digest = _vendor_base(tmp_path, registry, "vendor/streamed", size=2_000_000)
    fetch_base(f"{registry.host}/vendor/streamed", base_digest, "linux/amd64", tmp_path / "shallow")
    make_image(tmp_path / "app-image", [make_layer(tmp_path, "app", APP)], base=tmp_path / "shallow")
    with LoopbackRegistry() as target:
        report = push(tmp_path / "app-image", f"{target.host}/omni/app")
        assert len(report.streamed) == 1 and not report.mounted
        assert crane("validate", "--remote", report.reference).returncode == 0


def test_platform_is_resolved_from_an_index_and_refused_when_missing(tmp_path: Path, registry) -> None:
    base_digest = _vendor_base(tmp_path, registry, "vendor/multi")
    manifest_bytes, _ = RegistryClient(registry.host).manifest("vendor/multi", base_digest)
    index = canonical(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": base_digest,
                    "size": len(manifest_bytes),
                    "platform": {"os": "linux", "architecture": "amd64"},
                }
            ],
        }
    )
    with RegistryClient(registry.host) as client:
        index_digest = client.put_manifest("vendor/multi", "multi", index, "application/vnd.oci.image.index.v1+json")
    source = fetch_base(f"{registry.host}/vendor/multi", index_digest, "linux/amd64", tmp_path / "amd64")
    assert source["digest"] == index_digest and source["manifest_digest"] == base_digest
    with pytest.raises(OciError, match=r"platform linux/arm64 is missing from the index \(it has \['linux/amd64'\]\)"):
        fetch_base(f"{registry.host}/vendor/multi", index_digest, "linux/arm64", tmp_path / "arm64")


@pytest.mark.parametrize(
    "image,digest,message",
    [
        ("127.0.0.1:1/vendor/base:latest", "", "is not pinned: its digest is empty"),
        ("127.0.0.1:1/vendor/base:latest", "sha256:" + "a" * 64, "names a tag; pin it by digest only"),
        ("127.0.0.1:1/vendor/base", "sha256:short", "the digest must be sha256:<64 lower-case hex>"),
    ],
)
def test_unpinned_bases_are_refused(tmp_path: Path, image: str, digest: str, message: str) -> None:
    with pytest.raises(OciError, match=message):
        fetch_base(image, digest, "linux/amd64", tmp_path / "out")
    assert not (tmp_path / "out").exists()


class _LyingRegistry:
    """Serves a manifest and config whose bytes do not match the digests asked for."""

    def __init__(self, corrupt: str, manifest: bytes, config: bytes) -> None:
        lying = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if "/manifests/" in self.path:
                    body = manifest + (b" " if corrupt == "manifest" else b"")
                    kind = "application/vnd.oci.image.manifest.v1+json"
                else:
                    body = config.replace(b"amd64", b"arm64") if corrupt == "config" else config
                    kind = "application/octet-stream"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        lying.host = f"127.0.0.1:{self.server.server_port}"


@pytest.mark.parametrize(
    "corrupt,message", [("manifest", "manifest bytes do not match the requested digest"), ("config", "is corrupt")]
)
def test_digest_mismatch_from_the_registry_is_refused(tmp_path: Path, corrupt: str, message: str) -> None:
    config = canonical({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256_digest(config),
                "size": len(config),
            },
            "layers": [],
        }
    )
    lying = _LyingRegistry(corrupt, manifest, config)
    try:
        with pytest.raises(OciError, match=message):
            fetch_base(f"{lying.host}/vendor/base", sha256_digest(manifest), "linux/amd64", tmp_path / "out")
    finally:
        lying.server.shutdown()
    assert not (tmp_path / "out").exists()


def test_a_blob_shorter_than_its_descriptor_is_refused_before_it_is_read(tmp_path: Path, registry) -> None:
    base_digest = _vendor_base(tmp_path, registry, "vendor/corrupt")
    fetch_base(f"{registry.host}/vendor/corrupt", base_digest, "linux/amd64", tmp_path / "shallow")
    layer = json.loads((tmp_path / "shallow/manifest.json").read_text())["layers"][0]
    with (
        RegistryClient(registry.host) as client,
        pytest.raises(OciError, match="announces '[0-9]+' bytes, fewer than the [0-9]+ expected"),
    ):
        for _ in client.stream_blob("vendor/corrupt", layer["digest"], layer["size"] + 1):
            pass


def test_references_parse() -> None:
    assert Reference.parse("docker.io/rocm/vllm@sha256:" + "a" * 64).registry == "registry-1.docker.io"
    assert Reference.parse("ubuntu:24.04").repository == "library/ubuntu"
    ref = Reference.parse("127.0.0.1:5000/omni/app:v1")
    assert (ref.registry, ref.repository, ref.tag) == ("127.0.0.1:5000", "omni/app", "v1")
    with pytest.raises(OciError, match="lower case"):
        Reference.parse("127.0.0.1:5000/Omni/App")


# Names that must never become a registry URL's path (issue #68): each refused before any request.
CLIMBING_NAMES = [
    ("dot segments in a tag", "omni/app", "../../../x/manifests/evil", "reference"),
    ("a percent-encoded dot segment", "omni/app", "%2e%2e", "reference"),
    ("a tag starting with a dot", "omni/app", ".hidden", "reference"),
    ("a slash in a tag", "omni/app", "v1/../../other", "reference"),
    ("a dot segment in the repository", "omni/../other", "v1", "repository"),
    ("a percent sign in the repository", "omni/%2e%2e/other", "v1", "repository"),
    ("an empty repository component", "omni//app", "v1", "repository"),
]


@pytest.mark.parametrize(
    ("case", "repository", "reference", "field"), CLIMBING_NAMES, ids=[r[0] for r in CLIMBING_NAMES]
)
def test_a_name_that_would_climb_never_reaches_the_registry(case, repository, reference, field) -> None:
    asked: list[str] = []
    client = RegistryClient(
        "127.0.0.1:1", credential=None, transport=httpx.MockTransport(lambda r: asked.append(str(r.url)))
    )
    for call in (
        lambda: client.put_manifest(repository, reference, b"{}", "application/vnd.oci.image.manifest.v1+json"),
        lambda: client.manifest_digest(repository, reference),
        lambda: client.manifest(repository, reference),
    ):
        with pytest.raises(OciError) as refused:
            call()
        assert refused.value.field == field
    assert asked == []


def test_the_api_path_is_built_for_every_kind() -> None:
    digest = "sha256:" + "a" * 64
    assert api_path("omni/app", "manifests", "v1.0_rc-1") == "/v2/omni/app/manifests/v1.0_rc-1"
    assert api_path("omni/app", "blobs", digest) == f"/v2/omni/app/blobs/{digest}"
    assert api_path("omni/app", "blobs/uploads") == "/v2/omni/app/blobs/uploads/"
    assert api_path("omni/app", "referrers", digest) == f"/v2/omni/app/referrers/{digest}"


@pytest.mark.parametrize(
    "given, field",
    [
        ({"architecture": "arm64"}, "architecture"),
        ({"os": "windows"}, "os"),
        ({"architecture": "amd64", "variant": "v8"}, None),  # the base has no variant: the image may name one
        ({"architecture": "amd64", "os": "linux"}, None),  # repeating the base's platform is allowed
        ({}, None),
    ],
)
def test_a_base_platform_is_never_overridden(tmp_path: Path, given: dict, field: str | None) -> None:
    base_layer = make_layer(tmp_path, "base", {"/bin/tool": "x"})
    make_image(tmp_path / "base", [base_layer], os="linux", architecture="amd64")
    app = make_layer(tmp_path, "app", APP)
    if field is None:
        result = make_image(tmp_path / "image", [app], base=tmp_path / "base", **given)
        assert (result["config"]["os"], result["config"]["architecture"]) == ("linux", "amd64")
        assert result["config"].get("variant") == given.get("variant")
        return
    with pytest.raises(OciError, match=f"{field} '{given[field]}' differs from the base's") as refused:
        make_image(tmp_path / "image", [app], base=tmp_path / "base", **given)
    assert refused.value.field == field


def test_tags_from_a_list_a_file_and_the_workspace_status(tmp_path: Path, registry) -> None:
    from omni_oci.remote.push import expand_tags
    from tools.oci.push import read_status, read_tags

    (tmp_path / "tags.txt").write_text("# release tags\nv1.2.3\n\n  stable  \n")
    (tmp_path / "stable-status.txt").write_text("STABLE_OMNI_SOURCE_COMMIT " + "ab" * 20 + "\nBUILD_USER ci\n")
    status = read_status([tmp_path / "stable-status.txt"])
    tags = expand_tags(
        ["latest", "git-{STABLE_OMNI_SOURCE_COMMIT}", *read_tags(tmp_path / "tags.txt"), "latest"], status
    )
    assert tags == ["latest", "git-" + "ab" * 20, "v1.2.3", "stable"]
    _build(tmp_path / "img", APP)
    report = push(tmp_path / "img" / "layout", f"{registry.host}/omni/tagged:first", tags=tags)
    assert report.tags == ["first", *tags]
    listed = crane("ls", f"{registry.host}/omni/tagged")
    assert listed.returncode == 0 and sorted(listed.stdout.split()) == sorted(report.tags)
    for tag in report.tags:
        assert crane("digest", f"{registry.host}/omni/tagged:{tag}").stdout.strip() == report.digest


@pytest.mark.parametrize(
    "tags, message",
    [
        (["{BUILD_SCM_REVISION}"], "uses {BUILD_SCM_REVISION}, which the workspace status does not hold"),
        (["-leading-dash"], "is not a valid tag"),
        (["a" * 129], "is not a valid tag"),
        (["has space"], "is not a valid tag"),
        (["v{BUILD_USER}/x"], "is not a valid tag"),
    ],
)
def test_bad_or_half_stamped_tags_are_refused_before_any_push(tags: list, message: str) -> None:
    from omni_oci.remote.push import expand_tags

    with pytest.raises(OciError, match=re.escape(message)) as refused:
        expand_tags(tags, {"BUILD_USER": "ci"})
    assert refused.value.field == "remote_tags"


def test_load_tarballs_are_deterministic_and_refuse_what_cannot_load(tmp_path: Path) -> None:
    from omni_oci.format.layout import BASE_SIDECAR
    from tools.oci.build.load import write_tarball

    _build(tmp_path / "img", APP)
    layout = tmp_path / "img" / "layout"
    first = write_tarball(layout, tmp_path / "one.tar", tags=["omni/app:1"])
    write_tarball(layout, tmp_path / "two.tar", tags=["omni/app:1"])
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    with tarfile.open(tmp_path / "one.tar") as tar:
        assert {(m.uid, m.gid, m.mtime, m.uname) for m in tar.getmembers()} == {(0, 0, 0, "")}
        assert [m.name for m in tar.getmembers()] == sorted(m.name for m in tar.getmembers())
        assert json.loads(tar.extractfile("index.json").read())["manifests"][0]["digest"] == first
    for tag in ("omni/app", "Omni/App:1", "omni/app@sha256:" + "0" * 64, "omni/app:a/b"):
        with pytest.raises(OciError, match="must be REPOSITORY:TAG") as refused:
            write_tarball(layout, tmp_path / "bad.tar", tags=[tag])
        assert refused.value.field == "repo_tags"
    with pytest.raises(OciError, match="format must be one of docker, oci"):
        write_tarball(layout, tmp_path / "bad.tar", tags=[], fmt="zip")
    (layout / BASE_SIDECAR).write_text("{}")
    with pytest.raises(OciError, match="is a shallow image"):
        write_tarball(layout, tmp_path / "bad.tar", tags=[])
    assert not list(tmp_path.glob("*bad.tar*"))  # nothing half-written


class _Recording(httpx.HTTPTransport):
    """A real transport that records requests and how many uploads were in flight at once."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__()
        self.delay_s, self.seen, self.in_flight, self.most = delay_s, [], 0, 0
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        uploading = request.method in ("PUT", "PATCH") and "/blobs/uploads/" in request.url.path
        with self.lock:
            self.seen.append((request.method, request.url.path, request.headers.get("Content-Range")))
            if uploading:
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
        try:
            if uploading:
                time.sleep(self.delay_s)
            return super().handle_request(request)
        finally:
            if uploading:
                with self.lock:
                    self.in_flight -= 1


def _many_layers(work: Path, count: int, size: int) -> Path:
    import random

    # Random bytes: the gzip blobs stay as large as the files.
    layers = [make_layer(work, f"l{i}", {f"/data/{i}.bin": random.Random(i).randbytes(size)}) for i in range(count)]
    make_image(work / "layout", layers, entrypoint=["/bin/true"])
    return work / "layout"


def test_blobs_go_up_in_parallel_bounded_with_progress(tmp_path: Path, registry) -> None:
    layout = _many_layers(tmp_path, 6, 2000)
    transport, lines = _Recording(delay_s=0.3), []
    with RegistryClient(registry.host, transport=transport) as client:
        report = push(layout, f"{registry.host}/omni/parallel:1", client=client, jobs=3, progress=lines.append)
    assert 2 <= transport.most <= 3  # several at once, never more than asked
    assert len(report.uploaded) == 7 and len(lines) == 7 and lines[-1].startswith("7/7 blobs")
    assert crane("digest", f"{registry.host}/omni/parallel:1").stdout.strip() == report.digest
    with pytest.raises(OciError, match="jobs must be at least 1"):
        push(layout, f"{registry.host}/omni/parallel:1", jobs=0)


def test_large_blobs_go_up_in_chunks_and_the_registry_has_them_whole(tmp_path: Path, registry) -> None:
    layout = _many_layers(tmp_path, 1, 50_000)
    transport = _Recording()
    with RegistryClient(registry.host, transport=transport) as client:
        client.chunked_threshold, client.chunk_size = 10_000, 16_384
        report = push(layout, f"{registry.host}/omni/chunked:1", client=client)
    patches = [range_ for method, _, range_ in transport.seen if method == "PATCH"]
    assert len(patches) >= 2 and patches[0] == "0-16383"
    ends = [int(r.split("-")[1]) for r in patches]
    assert ends == sorted(ends)
    layer = json.loads(crane("manifest", f"{registry.host}/omni/chunked:1").stdout)["layers"][0]
    with RegistryClient(registry.host) as reader:  # read back whole, digest and size checked
        assert len(reader.blob("omni/chunked", layer["digest"], size=layer["size"])) == layer["size"] > 16_384
    assert layer["digest"] in report.uploaded


def _platform_image(work: Path, name: str, **platform: str) -> Path:
    layer = make_layer(work, name, {f"/{name}.txt": name})
    make_image(work / name, [layer], entrypoint=["/bin/true"], **platform)
    return work / name


def test_an_index_holds_one_image_per_platform_and_pushes_whole(tmp_path: Path, registry) -> None:
    from tools.oci.build.index import write_index

    amd = _platform_image(tmp_path, "amd", os="linux", architecture="amd64")
    arm = _platform_image(tmp_path, "arm", os="linux", architecture="arm64", variant="v8")
    digest = write_index(tmp_path / "index", [arm, amd])
    assert write_index(tmp_path / "again", [amd, arm]) == digest  # the order given does not matter
    report = push(tmp_path / "index", f"{registry.host}/omni/multi:1")
    assert report.digest == digest and len(report.uploaded) == 4
    for platform, image in (("linux/amd64", amd), ("linux/arm64/v8", arm)):
        resolved = crane("digest", "--platform", platform, f"{registry.host}/omni/multi:1").stdout.strip()
        assert resolved == blobs_of(image)["digest"]
    assert len(push(tmp_path / "index", f"{registry.host}/omni/multi:1").uploaded) == 0


@pytest.mark.parametrize(
    "case, message",
    [
        ("same platform twice", "are both linux/amd64: an index holds one image per platform"),
        ("shallow", "is a shallow image"),
        ("none", "an index needs at least one image"),
    ],
)
def test_index_refusals(tmp_path: Path, case: str, message: str) -> None:
    from omni_oci.format.layout import BASE_SIDECAR
    from tools.oci.build.index import write_index

    one = _platform_image(tmp_path, "one", os="linux", architecture="amd64")
    two = _platform_image(tmp_path, "two", os="linux", architecture="amd64")
    images = {"same platform twice": [one, two], "shallow": [one], "none": []}[case]
    if case == "shallow":
        (one / BASE_SIDECAR).write_text("{}")
    with pytest.raises(OciError, match=message):
        write_index(tmp_path / "index", images)


def test_the_worker_answers_each_request_and_survives_failures(tmp_path: Path) -> None:
    import io as stdio

    from tools.oci.build import worker

    def tool(argv: list[str]) -> int:
        if argv == ["--fail"]:
            raise SystemExit(2)
        if argv == ["--bug"]:
            raise RuntimeError("a bug")
        print("args:", " ".join(argv))
        return 0

    (tmp_path / "params").write_text("--spec\nspec.json\n")
    requests = [
        {"arguments": [f"@{tmp_path / 'params'}", "--x"], "requestId": 1},
        {"arguments": ["--fail"]},
        {"arguments": ["--bug"], "requestId": 3},
        {"arguments": ["again"], "requestId": 4},
    ]
    out = stdio.StringIO()
    assert worker.serve(tool, stdio.StringIO("".join(json.dumps(r) + "\n" for r in requests)), out) == 0
    responses = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["requestId"], r["exitCode"]) for r in responses] == [(1, 0), (0, 2), (3, 1), (4, 0)]
    assert responses[0]["output"] == "args: --spec spec.json --x\n"
    assert "RuntimeError: a bug" in responses[2]["output"] and responses[3]["output"] == "args: again\n"
    assert worker.run(tool, [f"@{tmp_path / 'params'}"]) == 0  # the plain command line reads the param file too


def test_the_layer_tool_as_a_worker_writes_what_the_command_line_writes(tmp_path: Path) -> None:
    import io as stdio

    from tools.oci.build import layer, worker

    (tmp_path / "a.txt").write_text("a\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"entries": [{"src": str(tmp_path / "a.txt"), "dest": "/a.txt"}]}))
    assert (
        layer.main(
            ["--spec", str(spec), "--output", str(tmp_path / "cli.tar.gz"), "--descriptor", str(tmp_path / "cli.json")]
        )
        == 0
    )
    request = {
        "arguments": [
            "--spec",
            str(spec),
            "--output",
            str(tmp_path / "w.tar.gz"),
            "--descriptor",
            str(tmp_path / "w.json"),
        ],
        "requestId": 7,
    }
    out = stdio.StringIO()
    worker.serve(layer.main, stdio.StringIO(json.dumps(request) + "\n"), out)
    assert json.loads(out.getvalue())["exitCode"] == 0
    assert (tmp_path / "w.tar.gz").read_bytes() == (tmp_path / "cli.tar.gz").read_bytes()


def test_index_refuses_an_image_without_a_platform_or_with_a_missing_blob(tmp_path: Path) -> None:
    from omni_oci.format.layout import blob_path, read_blob, read_layout
    from tools.oci.build.index import write_index

    image = _platform_image(tmp_path, "img", os="linux", architecture="amd64")
    _, manifest, _ = read_layout(image)
    layer = blob_path(image, manifest["layers"][0]["digest"])
    layer.unlink()
    with pytest.raises(OciError, match=f"lacks blob {manifest['layers'][0]['digest']}"):
        write_index(tmp_path / "index", [image])
    # A layout whose config (digests intact) names no architecture: only a hostile layout has one.
    from omni_oci.format.layout import OCI_CONFIG, descriptor, write_blob, write_layout

    bare = _platform_image(tmp_path, "bare", os="linux", architecture="amd64")
    _, bare_manifest, _ = read_layout(bare)
    config = json.loads(read_blob(bare, bare_manifest["config"]["digest"]))
    config.pop("architecture")
    config_bytes = canonical(config)
    write_blob(bare, config_bytes)
    write_layout(bare, canonical({**bare_manifest, "config": descriptor(OCI_CONFIG, config_bytes)}))
    with pytest.raises(OciError, match="its config names no os/architecture"):
        write_index(tmp_path / "index2", [bare])


def test_a_debian_layer_takes_passwd_and_group_together_or_neither(tmp_path: Path, capsys) -> None:
    from tools.debian import rootfs

    with pytest.raises(SystemExit) as exited:
        rootfs.main(
            [
                "--lock",
                "l",
                "--debs",
                "d",
                "--output",
                "o",
                "--descriptor",
                "x",
                "--packages",
                "p",
                "--arch",
                "amd64",
                "--passwd",
                "passwd",
            ]
        )
    assert exited.value.code == 2 and "--passwd and --group go together" in capsys.readouterr().err


def test_a_blob_the_registry_does_not_have_is_refused_with_its_answer(registry) -> None:
    missing = "sha256:" + "0" * 64
    with RegistryClient(registry.host) as client, pytest.raises(OciError) as refused:
        for _ in client.stream_blob("vendor/none", missing, 10):
            pass
    # The refusal's detail is the registry's own error body, read bounded from the streamed answer.
    assert f"blob {missing} failed with HTTP 404" in str(refused.value)
    assert "BLOB_UNKNOWN" in str(refused.value) or "NAME_UNKNOWN" in str(refused.value)
