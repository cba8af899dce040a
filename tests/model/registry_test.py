"""The model artifact through a real registry (docker-registry with htpasswd, on loopback):
pushed signed, pulled back by skopeo and unpacked by umoci to the checkpoint byte for byte,
pulled and verified by tools/model, re-pushed with HEADs only; and refused when the registry
serves something else than the lock: swapped, missing or extra layers, another lock, layers
holding links, two files or other paths, a different blob, a pull cut off and run again."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from attest.errors import AttestError
from attest.lock import ARTIFACT_LOCK, PARTIAL_DIR
from omni_oci.format.layout import OCI_INDEX, OCI_MANIFEST, canonical, sha256_digest
from omni_oci.model.errors import ModelError
from omni_oci.model.layers import layer_size
from omni_oci.model.pack import load_lock_bytes, pack
from omni_oci.model.pull import expected_lock, pull
from omni_oci.model.push import push_artifact
from omni_oci.model.verify import verify_artifact
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.keys import load_private_key
from tests.fixtures.cosign import verifiers
from tests.fixtures.model import REVISION, keyed_checkpoint, tree, unpacked
from tests.fixtures.pins import key_pair
from tests.fixtures.raw_tar import EOA, member
from tests.fixtures.registry import LoopbackRegistry, only_credentials
from tests.fixtures.tools import hold_run_lock
from tools.model.cli import main

USER, PASSWORD = "omni", "model-secret"
SAME_SIZE = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry({USER: PASSWORD}) as served:
        yield served


@pytest.fixture
def world(tmp_path: Path, registry, monkeypatch):
    only_credentials(tmp_path / "home", monkeypatch, registry.host, USER, PASSWORD)
    made = keyed_checkpoint(tmp_path)
    root, lock_path, private, public = made.root, made.lock_path, made.private, made.public
    lock, data = load_lock_bytes(lock_path)
    artifact = pack(root, lock, data, platform="linux/amd64", quiet=True)

    class World:
        pass

    world = World()
    world.__dict__.update(
        root=root, lock_path=lock_path, private=private, public=public, artifact=artifact, tmp=tmp_path
    )
    world.client = lambda: RegistryClient(registry.host)
    world.host = registry.host
    return world


def _push(world, repository: str, **kwargs):
    with world.client() as client:
        return push_artifact(
            world.artifact, world.root, f"{world.host}/{repository}", client=client, key=load_private_key(world.private)
        )


def test_pushed_signed_pulled_by_skopeo_and_umoci_and_by_pull_to_the_same_tree(world) -> None:
    report = _push(world, "models/tiny")
    assert report.signed and not report.present
    expected = {**tree(world.root), ARTIFACT_LOCK: world.lock_path.read_bytes()}
    assert tree(unpacked(f"{world.host}/models/tiny@{report.digest}", world.tmp, f"{USER}:{PASSWORD}")) == expected
    for digest in (report.digest, report.model_digest):
        pulled = world.tmp / f"pulled-{digest[7:15]}"
        argv = ["pull", f"{world.host}/models/tiny@{digest}", str(pulled), "--lock", str(world.lock_path)]
        assert main([*argv, "--key", str(world.public)]) == 0
        assert tree(pulled) == expected
        assert not (pulled / ".omni-partial").exists()
    again = _push(world, "models/tiny")
    assert (
        again.uploaded == []
        and again.uploaded_bytes == 0
        and len(again.present) == len(report.present) + len(report.uploaded)
    )


def test_both_manifests_verify_with_cosign_2_and_3_from_every_layout_each_reads(world) -> None:
    """A default signed push: cosign 2 (legacy tags only) and cosign 3 (bundles, and the tags
    when told) verify the signature and the SLSA provenance of the image and of the ModelPack
    manifest; another key is refused by each."""
    report = _push(world, "models/cosign")
    _, other_public = key_pair(world.tmp, "other")
    credentials = ("--registry-username", USER, "--registry-password", PASSWORD)
    for cosign in verifiers():
        for digest in (report.digest, report.model_digest):
            reference = f"{world.host}/models/cosign@{digest}"
            for legacy in (False, True) if cosign.reads_bundles else (True,):
                where = f"{cosign}, {'legacy tags' if legacy else 'bundles'}, {digest}"
                signature = cosign.run("verify", "--key", str(world.public), *credentials, reference, legacy=legacy)
                assert signature.returncode == 0, f"{where}: {signature.stderr}"
                attestation = cosign.run(
                    "verify-attestation", "--key", str(world.public), "--type", "slsaprovenance1", *credentials,
                    reference, legacy=legacy,
                )  # fmt: skip
                assert attestation.returncode == 0, f"{where}: {attestation.stderr}"
                other = cosign.run("verify", "--key", str(other_public), *credentials, reference, legacy=legacy)
                assert other.returncode != 0, where


def test_verify_names_the_layout_it_accepted_and_bundles_only_refuses_tags_alone(world, capsys) -> None:
    report = _push(world, "models/layouts")
    reference = f"{world.host}/models/layouts@{report.digest}"
    verify = ["verify", reference, "--key", str(world.public), "--lock", str(world.lock_path), "--layout"]
    for layout, accepted in (("auto", "sigstore bundles"), ("bundles", "sigstore bundles"), ("legacy", "legacy tags")):
        assert main([*verify, layout]) == 0
        assert json.loads(capsys.readouterr().out)["signatures"] == accepted
    # The registry lost the bundles (the referrers fallback tag now lists none) and kept the tags.
    empty = canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []})
    with world.client() as client:
        client.put_manifest("models/layouts", report.digest.replace(":", "-"), empty, OCI_INDEX)
    assert main([*verify, "bundles"]) == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "bundle" and "no Sigstore bundle refers to" in refusal["error"]
    assert main([*verify, "auto"]) == 0
    assert json.loads(capsys.readouterr().out)["signatures"] == "legacy tags"


def test_verify_accepts_both_manifests_and_refuses_another_key_lock_or_no_signature(world, capsys) -> None:
    report = _push(world, "models/verify")
    expected = expected_lock(world.lock_path.read_bytes(), "")
    for digest, kind in ((report.digest, "image"), (report.model_digest, "application/vnd.cncf.model")):
        summary = verify_artifact(f"{world.host}/models/verify@{digest}", world.public, expected, client=world.client())
        assert summary["kind"].startswith(kind) and summary["revision"] == REVISION
        assert summary["files"] == len(world.artifact.files)
    _, other_public = key_pair(world.tmp, "other")
    other_lock = expected_lock(None, "0" * 64)
    with world.client() as client:
        unsigned = push_artifact(world.artifact, world.root, f"{world.host}/models/unsigned", client=client)
    rows = [
        (
            f"models/verify@{report.digest}",
            other_public,
            expected,
            "bundle.verificationMaterial",
        ),  # the bundle names its key
        (f"models/verify@{report.digest}", world.public, other_lock, "provenance.lock_sha256"),
        (f"models/unsigned@{unsigned.digest}", world.public, expected, f"{report.digest.replace(':', '-')}"),
    ]
    for reference, key, lock, field in rows:
        with pytest.raises(Exception) as refused:
            verify_artifact(f"{world.host}/{reference}", key, lock, client=world.client())
        assert field in refused.value.field, (reference, refused.value)


def _put(client: RegistryClient, repository: str, manifest: dict, blobs: list[bytes]) -> str:
    for blob in blobs:
        if not client.has_blob(repository, sha256_digest(blob)):
            client.upload(repository, sha256_digest(blob), blob, len(blob))
    data = canonical(manifest)
    return client.put_manifest(repository, sha256_digest(data), data, OCI_MANIFEST)


def _served(world, repository: str, edit) -> str:
    """The artifact pushed as it is, then a manifest `edit` made of it (and the blobs it adds)."""
    with world.client() as client:
        push_artifact(world.artifact, world.root, f"{world.host}/{repository}", client=client)
        manifest = json.loads(world.artifact.image_manifest)
        blobs = edit(manifest, world) or []
        return _put(client, repository, manifest, blobs)


def _layer(manifest: dict, path: str) -> dict:
    return next(layer for layer in manifest["layers"] if layer["annotations"]["org.cncf.model.filepath"] == path)


def _crafted(manifest: dict, path: str, tar: bytes) -> list[bytes]:
    """Replace `path`'s layer by `tar`, padded with zeros to the size its file's layer has."""
    layer = _layer(manifest, path)
    blob = tar + bytes(layer["size"] - len(tar))
    layer["digest"] = sha256_digest(blob)
    return [blob]


def _swap(manifest: dict, world) -> None:
    first, second = _layer(manifest, SAME_SIZE[0]), _layer(manifest, SAME_SIZE[1])
    first["digest"], second["digest"] = second["digest"], first["digest"]


def _drop(manifest: dict, world) -> None:
    manifest["layers"] = [layer for layer in manifest["layers"] if "README" not in json.dumps(layer)]


def _extra(manifest: dict, world) -> list[bytes]:
    layer = dict(_layer(manifest, "README.md"))
    layer["annotations"] = {**layer["annotations"], "org.cncf.model.filepath": "zz-extra.md"}
    manifest["layers"].insert(-1, layer)


def _other_lock(manifest: dict, world) -> list[bytes]:
    from omni_oci.model.artifact import lock_layer

    data = world.lock_path.read_bytes().replace(REVISION.encode(), b"f" * 40)
    blob = lock_layer(data)
    manifest["layers"][-1]["digest"], manifest["layers"][-1]["size"] = sha256_digest(blob), len(blob)
    return [blob]


WEIGHT = SAME_SIZE[0]


def _weight_tar(*members: bytes) -> callable:
    return lambda manifest, world: _crafted(manifest, WEIGHT, b"".join(members) + EOA)


def _two_files(manifest: dict, world) -> list[bytes]:
    """The right file, then a second one (ended by one zero block, to fit the layer's size)."""
    right = member(WEIGHT, (world.root / WEIGHT).read_bytes())
    return _crafted(manifest, WEIGHT, right + member("evil.py") + bytes(512))


REFUSALS = [
    ("swapped", _swap, SAME_SIZE[0], "holds file"),
    ("missing", _drop, "README.md", "lacks"),
    ("extra", _extra, "zz-extra.md", "does not list"),
    ("another-lock", _other_lock, ARTIFACT_LOCK, "expected"),
    ("symlink", _weight_tar(member(WEIGHT, typeflag=b"2", linkname="/etc/passwd")), WEIGHT, "symlink"),
    ("two-files", _two_files, WEIGHT, "evil.py"),
    ("other-path", _weight_tar(member("../" + WEIGHT, b"x")), WEIGHT, "../" + WEIGHT),
    ("directory", _weight_tar(member(WEIGHT + "/", typeflag=b"5")), WEIGHT, "dir"),
]


@pytest.mark.parametrize(("name", "edit", "field", "says"), REFUSALS, ids=[row[0] for row in REFUSALS])
def test_pull_refuses_what_is_not_the_lock_and_places_nothing(world, name, edit, field, says) -> None:
    digest = _served(world, f"models/{name}", edit)
    target = world.tmp / "pulled"
    with pytest.raises(ModelError) as refused:
        pull(
            f"{world.host}/models/{name}@{digest}",
            target,
            expected_lock(world.lock_path.read_bytes(), ""),
            client=world.client(),
        )
    assert refused.value.field == field and says in str(refused.value), refused.value
    assert not (target / ARTIFACT_LOCK).exists()
    if name == "symlink":
        assert not os.path.lexists(target / WEIGHT)


class _Rewriting(httpx.HTTPTransport):
    """Serves blob `wanted` as `instead`'s bytes, or cuts `wanted` off after `cut` bytes."""

    def __init__(self, wanted: str, instead: str = "", cut: int = 0) -> None:
        super().__init__()
        self.wanted, self.instead, self.cut, self.served = wanted, instead, cut, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.instead and request.url.path.endswith(self.wanted):
            request.url = request.url.copy_with(path=request.url.path.replace(self.wanted, self.instead))
        response = super().handle_request(request)
        if self.cut and request.url.path.endswith(self.wanted) and request.method == "GET":
            self.served += 1
            body = response.read()[: self.cut]
            return httpx.Response(response.status_code, headers=response.headers, content=body)
        return response


def _pull_through(world, repository: str, digest: str, transport: httpx.HTTPTransport) -> dict:
    client = RegistryClient(world.host, transport=transport)
    return pull(
        f"{world.host}/{repository}@{digest}",
        world.tmp / "pulled",
        expected_lock(world.lock_path.read_bytes(), ""),
        client=client,
    )


def test_a_registry_serving_another_blob_is_refused(world) -> None:
    report = _push(world, "models/liar")
    manifest = json.loads(world.artifact.image_manifest)
    wanted, instead = (_layer(manifest, name)["digest"] for name in SAME_SIZE)
    with pytest.raises(ModelError) as refused:
        _pull_through(world, "models/liar", report.digest, _Rewriting(wanted, instead))
    assert refused.value.field == SAME_SIZE[0]
    assert not (world.tmp / "pulled" / ARTIFACT_LOCK).exists()


def test_a_pull_cut_off_is_not_complete_and_a_rerun_fetches_only_the_rest(world) -> None:
    report = _push(world, "models/cut")
    manifest = json.loads(world.artifact.image_manifest)
    wanted = _layer(manifest, SAME_SIZE[1])["digest"]
    with pytest.raises(ModelError):
        _pull_through(world, "models/cut", report.digest, _Rewriting(wanted, cut=3000))
    pulled = world.tmp / "pulled"
    assert not (pulled / ARTIFACT_LOCK).exists() and not (pulled / SAME_SIZE[1]).exists()
    summary = _pull_through(world, "models/cut", report.digest, httpx.HTTPTransport())
    assert summary["fetched"] == 1 and summary["kept"] == len(world.artifact.files) - 1
    assert filecmp.cmp(pulled / SAME_SIZE[1], world.root / SAME_SIZE[1], shallow=False)
    assert (pulled / ARTIFACT_LOCK).read_bytes() == world.lock_path.read_bytes()
    (pulled / "stray.json").write_text("{}")
    with pytest.raises(ModelError) as refused:
        _pull_through(world, "models/cut", report.digest, httpx.HTTPTransport())
    assert refused.value.field == "stray.json"


def test_pull_without_a_local_lock_is_refused_before_any_request(world, capsys) -> None:
    assert main(["pull", f"{world.host}/models/x@sha256:" + "0" * 64, str(world.tmp / "d")]) == 2
    assert json.loads(capsys.readouterr().err)["field"] == "--lock"
    assert not (world.tmp / "d").exists()
    assert main(["pull", f"{world.host}/models/x:latest", str(world.tmp / "d"), "--lock-sha256", "0" * 64]) == 2
    assert json.loads(capsys.readouterr().err)["field"] == "reference"


def test_layer_sizes_follow_from_the_lock_alone() -> None:
    assert [layer_size(size) for size in (0, 1, 512, 513)] == [1536, 2048, 2048, 2560]


def test_help_names_every_subcommand() -> None:
    shown = subprocess.run(
        ["python3", "-m", "tools.model.cli", "--help"], capture_output=True, text=True, timeout=60, cwd=os.getcwd()
    )
    assert shown.returncode == 0 and all(word in shown.stdout for word in ("pack", "push", "pull", "verify"))


def test_one_pass_push_gives_the_packed_digests_and_refuses_a_file_that_is_not_the_lock(world) -> None:
    from omni_oci.model.push import push_checkpoint

    lock, data = load_lock_bytes(world.lock_path)
    with world.client() as client:
        client.chunked_threshold, client.chunk_size = 1024, 4096  # several chunks per file layer
        report = push_checkpoint(
            world.root, lock, data, f"{world.host}/models/onepass", platform="linux/amd64", client=client
        )
    assert (report.digest, report.model_digest) == (world.artifact.image_digest, world.artifact.model_digest)
    summary = pull(
        f"{world.host}/models/onepass@{report.digest}",
        world.tmp / "one",
        expected_lock(data, ""),
        client=world.client(),
    )
    assert summary["fetched"] == len(world.artifact.files)
    (world.root / SAME_SIZE[0]).write_bytes(bytes(6400))
    with world.client() as client, pytest.raises(ModelError) as refused:
        push_checkpoint(world.root, lock, data, f"{world.host}/models/changed", platform="linux/amd64", client=client)
    assert refused.value.field == SAME_SIZE[0]
    with world.client() as client:
        tags = client.request("GET", "/v2/models/changed/tags/list", repository="models/changed")
    assert tags.status_code == 404 or not json.loads(tags.content).get("tags")  # no manifest was pushed


def test_push_names_its_two_forms(world, capsys) -> None:
    assert (
        main(["pack", "--model", str(world.root), "--lock", str(world.lock_path), "--output", str(world.tmp / "p")])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["image_manifest"] == world.artifact.image_digest
    assert main(["push", str(world.tmp / "p"), f"{world.host}/models/cli", "--signing-key", str(world.private)]) == 0
    assert json.loads(capsys.readouterr().out)["signed"] is True
    assert main(["push", f"{world.host}/models/x", "--unsigned"]) == 2
    assert json.loads(capsys.readouterr().err)["field"] == "push"
    assert main(["push", "--model", str(world.root), "a", "b", "--unsigned"]) == 2


def test_a_planted_partial_directory_link_is_refused_and_nothing_written_through_it(world) -> None:
    report = _push(world, "models/planted")
    elsewhere, dest = world.tmp / "elsewhere", world.tmp / "planted"
    elsewhere.mkdir()
    dest.mkdir()
    (dest / ".omni-partial").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(AttestError) as refused:  # the run-lock's own refusal, reported as is
        pull(
            f"{world.host}/models/planted@{report.digest}",
            dest,
            expected_lock(world.lock_path.read_bytes(), ""),
            client=world.client(),
        )
    assert refused.value.field == ".omni-partial" and list(elsewhere.iterdir()) == []


def test_a_second_pull_into_one_directory_is_refused_naming_the_first_and_changes_nothing(world, capsys) -> None:
    report = _push(world, "models/twice")
    dest = world.tmp / "pulled"
    dest.mkdir()
    holder = hold_run_lock(dest / PARTIAL_DIR)
    argv = ["pull", f"{world.host}/models/twice@{report.digest}", str(dest), "--lock", str(world.lock_path)]
    try:
        assert main(argv) == 2
        refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert refusal["field"] == PARTIAL_DIR and f"in use by another run (pid {holder.pid}" in refusal["error"]
        assert sorted(p.name for p in dest.iterdir()) == [PARTIAL_DIR]
    finally:
        holder.kill()
        holder.wait()
    assert main(argv) == 0
    assert tree(dest) == {**tree(world.root), ARTIFACT_LOCK: world.lock_path.read_bytes()}


@pytest.mark.parametrize("where", ["partial file", "placed file"])
def test_a_planted_hard_link_is_never_written_through_nor_taken_as_present(world, where: str) -> None:
    """A hard link to a file outside DIR, planted where a partial file goes or where a placed file
    is (with the right bytes): the outside file never changes, and the pull places its own."""
    report = _push(world, f"models/link-{where.split()[0]}")
    manifest = json.loads(world.artifact.image_manifest)
    dest, outside = world.tmp / "pulled", world.tmp / "outside.bin"
    item = SAME_SIZE[0]
    outside.write_bytes((world.root / item).read_bytes() if where == "placed file" else b"the user's own bytes")
    before = outside.read_bytes()
    if where == "partial file":
        (dest / PARTIAL_DIR).mkdir(parents=True)
        os.link(outside, dest / PARTIAL_DIR / (_layer(manifest, item)["digest"].split(":", 1)[1] + ".part"))
    else:
        dest.mkdir()
        os.link(outside, dest / item)
    summary = _pull_through(world, f"models/link-{where.split()[0]}", report.digest, httpx.HTTPTransport())
    assert summary["kept"] == 0  # the linked file with the right bytes was not taken as present
    assert outside.read_bytes() == before and os.stat(outside).st_nlink == 1
    assert os.stat(dest / item).st_nlink == 1 and (dest / item).read_bytes() == (world.root / item).read_bytes()


@pytest.mark.parametrize("change", ["same size", "longer", "shorter"])
def test_a_file_changed_after_pack_is_refused_and_nothing_is_tagged(world, change: str) -> None:
    """The push of a pack hashes nothing: a file whose bytes changed since pack is refused by the
    registry, which takes a blob only under the digest pack computed; one whose size changed is
    refused before a byte of it leaves, naming the file. Either way no manifest or tag exists."""
    name = SAME_SIZE[0]
    data = (world.root / name).read_bytes()
    edited = {"same size": bytes([data[0] ^ 1]) + data[1:], "longer": data + b"x", "shorter": data[:-1]}[change]
    (world.root / name).write_bytes(edited)
    with pytest.raises(AttestError) as refused:
        _push(world, f"models/changed-{change.replace(' ', '-')}")
    assert refused.value.field == name, (refused.value.field, str(refused.value))
    assert ("changed since `pack`" if change == "same size" else "the checkpoint lock says") in str(refused.value)
    with world.client() as client:
        tags = client.request("GET", f"/v2/models/changed-{change.replace(' ', '-')}/tags/list", repository="x")
    assert tags.status_code == 404 or tags.json().get("tags") in (None, [])
