"""The model artifact's bytes and documents, without a registry: deterministic layers any tar
reader takes as the one file, the ModelPack config valid against the spec's pinned schema, the
manifests as the spec and runtimes want them, and pack's refusals."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import jsonschema
import pytest

import attest.files
from attest.lock import ARTIFACT_LOCK
from omni_oci.format.layout import OCI_CONFIG, OCI_MANIFEST
from omni_oci.format.tar_reader import TarStream, read_members
from omni_oci.model.artifact import MODEL_ARTIFACT, MODEL_CONFIG, check_manifest, parse_manifest, read_lock_layer
from omni_oci.model.errors import ModelError
from omni_oci.model.layers import IMAGE_LAYER, layer_size, stream_file_layer, tar_header
from omni_oci.model.pack import load_lock_bytes, pack, read_pack, write_pack
from tests.fixtures.model import LONG_NAME, REVISION, checkpoint_files, write_checkpoint
from tests.fixtures.owners import owned_by_another_user

SCHEMA = Path("tests/data/modelpack/config-schema.json")
SCHEMA_SHA256 = "2b47aec475d4e1d82075a1ac414e4b42830ca89f701da47c84425a336ef6a2c3"
RECORDED = Path("tests/model/recorded_digests.json")
# The layer media types docs/spec.md of the model-spec names for uncompressed tar layers.
SPEC_TAR_TYPES = {
    f"application/vnd.cncf.model.{kind}.v1.tar" for kind in ("weight", "weight.config", "doc", "code", "dataset")
}


def _checkpoint(tmp: Path, files: dict[str, bytes] | None = None) -> tuple[Path, Path]:
    root, lock = tmp / "checkpoint", tmp / "checkpoint.lock.json"
    write_checkpoint(root, files or checkpoint_files(), lock)
    return root, lock


def _pack(root: Path, lock_path: Path, platform: str = "linux/amd64"):
    lock, data = load_lock_bytes(lock_path)
    return pack(root, lock, data, platform=platform, quiet=True)


def test_the_same_files_pack_to_the_recorded_digests_whatever_their_metadata(tmp_path: Path) -> None:
    root, lock = _checkpoint(tmp_path)
    first = _pack(root, lock)
    for path in root.rglob("*"):  # what a copy on another host changes: times and modes
        os.utime(path, (1, 1_900_000_000))
        os.chmod(path, 0o600 if path.is_file() else 0o700)
    second = _pack(root, lock)
    assert (first.image_digest, first.model_digest) == (second.image_digest, second.model_digest)
    recorded = json.loads(RECORDED.read_text())
    assert {"image": first.image_digest, "modelpack": first.model_digest} == recorded, (
        "the tiny checkpoint packs to other digests than tests/model/recorded_digests.json: a change "
        "of the layer bytes or documents changes every published artifact's digest"
    )


def test_each_layer_is_its_one_file_for_the_strict_reader_and_for_tarfile(tmp_path: Path) -> None:
    root, lock_path = _checkpoint(tmp_path)
    artifact = _pack(root, lock_path)
    for layer in artifact.files:
        blob = b"".join(stream_file_layer(root, layer.item))
        assert len(blob) == layer.size == layer_size(layer.item.size)
        assert "sha256:" + hashlib.sha256(blob).hexdigest() == layer.digest
        members = [(m, d.read(m.size)) for m, d in read_members(TarStream.of_file(io.BytesIO(blob)), "layer")]
        assert [(m.name, m.kind, m.mode) for m, _ in members] == [(layer.item.path, "file", 0o644)]
        assert members[0][1] == (root / layer.item.path).read_bytes()
        with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
            (info,) = tar.getmembers()
            assert (info.name, info.mtime, info.uid, info.gid, info.uname) == (layer.item.path, 0, 0, 0, "")
    assert any(layer.item.path == LONG_NAME for layer in artifact.files)  # split into ustar's prefix
    assert read_lock_layer(artifact.lock_blob, "lock") == lock_path.read_bytes()


def test_the_modelpack_config_is_valid_against_the_pinned_schema(tmp_path: Path) -> None:
    data = SCHEMA.read_bytes()
    assert hashlib.sha256(data).hexdigest() == SCHEMA_SHA256, "the ModelPack schema is not the pinned one"
    artifact = _pack(*_checkpoint(tmp_path))
    config = json.loads(artifact.model_config)
    jsonschema.Draft202012Validator(json.loads(data)).validate(config)
    assert config["modelfs"]["diffIds"] == json.loads(artifact.image_config)["rootfs"]["diff_ids"]
    assert config["descriptor"]["revision"] == REVISION
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict enough to refuse a stray key
        jsonschema.Draft202012Validator(json.loads(data)).validate({**config, "omni": 1})


def test_both_manifests_share_the_layers_as_the_spec_and_runtimes_want(tmp_path: Path) -> None:
    artifact = _pack(*_checkpoint(tmp_path), platform="linux/arm64")
    image, model = json.loads(artifact.image_manifest), json.loads(artifact.model_manifest)
    assert model["mediaType"] == OCI_MANIFEST and model["artifactType"] == MODEL_ARTIFACT
    assert model["config"]["mediaType"] == MODEL_CONFIG
    assert {layer["mediaType"] for layer in model["layers"]} <= SPEC_TAR_TYPES
    assert image["config"]["mediaType"] == OCI_CONFIG and "artifactType" not in image
    assert {layer["mediaType"] for layer in image["layers"]} == {IMAGE_LAYER}
    assert [layer["digest"] for layer in image["layers"]] == [layer["digest"] for layer in model["layers"]]
    assert model["subject"]["digest"] == artifact.image_digest
    assert json.loads(artifact.image_config)["architecture"] == "arm64"
    paths = [layer["annotations"]["org.cncf.model.filepath"] for layer in model["layers"]]
    assert paths == sorted(paths[:-1]) + [ARTIFACT_LOCK]
    by_type = {layer["annotations"]["org.cncf.model.filepath"]: layer["mediaType"] for layer in model["layers"]}
    assert by_type["model-00001-of-00002.safetensors"].endswith("weight.v1.tar")
    assert by_type["tokenizer.json"].endswith("weight.config.v1.tar")
    assert by_type["README.md"].endswith("doc.v1.tar")
    for manifest in (image, model):
        assert check_manifest(manifest, artifact.lock, artifact.lock_sha256)


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        (lambda root: (root / "tokenizer.json").write_bytes(b'{"version": "2.0"}'), "tokenizer.json", "lock says"),
        (lambda root: (root / "config.json").write_bytes(b"{}"), "config.json", "the checkpoint lock says"),
        (lambda root: (root / "README.md").unlink(), "README.md", "missing"),
        (
            lambda root: ((root / "README.md").unlink(), (root / "README.md").symlink_to("tokenizer.json")),
            "README.md",
            "symlink",
        ),
        (
            lambda root: (
                (root / "nested").rename(root / "real"),
                (root / "nested").symlink_to("real", target_is_directory=True),
            ),
            LONG_NAME,
            "symlink",
        ),
    ],
    ids=["changed-content", "changed-size", "missing", "file-symlink", "directory-symlink"],
)
def test_pack_refuses_a_checkpoint_that_is_not_its_lock(tmp_path: Path, change, field: str, says: str) -> None:
    root, lock = _checkpoint(tmp_path)
    change(root)
    with pytest.raises(ModelError) as refused:
        _pack(root, lock)
    assert refused.value.field == field and says in str(refused.value)


def test_pack_writes_a_pack_that_push_reads_back_and_refuses_an_edited_one(tmp_path: Path) -> None:
    root, lock = _checkpoint(tmp_path)
    artifact = _pack(root, lock)
    write_pack(artifact, root, tmp_path / "pack")
    again, model = read_pack(tmp_path / "pack")
    assert (again.image_digest, model) == (artifact.image_digest, root.resolve())
    sidecar = tmp_path / "pack" / "omni-model-files.json"
    edited = json.loads(sidecar.read_text())
    edited["layers"][0]["digest"] = "sha256:" + "0" * 64
    sidecar.write_text(json.dumps(edited))
    with pytest.raises(ModelError, match="do not match"):
        read_pack(tmp_path / "pack")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    with pytest.raises(ModelError) as refused:
        write_pack(artifact, root, tmp_path / "other")
    assert refused.value.field == "--output" and (tmp_path / "other" / "keep.txt").read_text() == "mine"


def _index_is_a_fifo(pack: Path) -> None:
    (pack / "index.json").unlink()
    os.mkfifo(pack / "index.json")


def _sidecar_is_a_link(pack: Path) -> None:
    outside = pack.parent / "outside.json"
    outside.write_bytes((pack / "omni-model-files.json").read_bytes())
    (pack / "omni-model-files.json").unlink()
    (pack / "omni-model-files.json").symlink_to(outside)


def _sidecar_is_huge(pack: Path) -> None:
    with open(pack / "omni-model-files.json", "r+b") as handle:
        handle.truncate(1 << 30)  # sparse


def _a_blob_is_a_fifo(pack: Path) -> None:
    image = next(m for m in json.loads((pack / "index.json").read_text())["manifests"] if m["annotations"]
                 ["org.opencontainers.image.ref.name"] == "image")  # fmt: skip
    blob = pack / "blobs" / "sha256" / image["digest"].split(":")[1]
    blob.unlink()
    os.mkfifo(blob)


# Issue #68: a pack may come from anyone; each of its files is read bounded, as a regular file,
# never through a link, without blocking.
HOSTILE_PACKS = [
    ("index.json is a FIFO", _index_is_a_fifo, "must be a regular file"),
    ("the sidecar is a link", _sidecar_is_a_link, "symlink"),
    ("the sidecar is 1 GiB", _sidecar_is_huge, "at most"),
    ("a blob is a FIFO", _a_blob_is_a_fifo, "must be a regular file"),
]


@pytest.mark.parametrize(("case", "change", "says"), HOSTILE_PACKS, ids=[row[0] for row in HOSTILE_PACKS])
def test_a_hostile_pack_is_refused_without_blocking(tmp_path: Path, case, change, says: str) -> None:
    root, lock = _checkpoint(tmp_path)
    write_pack(_pack(root, lock), root, tmp_path / "pack")
    change(tmp_path / "pack")
    with pytest.raises(ModelError, match=says):
        read_pack(tmp_path / "pack")


@pytest.mark.parametrize(
    ("mode", "owner", "says"), [(0o777, None, "writable by group or others"), (0o700, 65534, "owned by")]
)
def test_pack_refuses_an_output_another_user_could_write(
    tmp_path: Path, monkeypatch, mode: int, owner, says: str
) -> None:
    root, lock = _checkpoint(tmp_path)
    output = tmp_path / "shared"
    output.mkdir()
    output.chmod(mode)
    if owner is not None:
        owned_by_another_user(output, monkeypatch, attest.files)
    with pytest.raises(ModelError, match=says) as refused:
        write_pack(_pack(root, lock), root, output)
    assert refused.value.field == "--output" and list(output.iterdir()) == []


def test_a_path_ustar_cannot_hold_is_refused_naming_it() -> None:
    name = "x" * 101
    with pytest.raises(ModelError) as refused:
        tar_header(name, 1)
    assert refused.value.field == name


def _hostile(edit):
    def apply(manifest: dict) -> dict:
        edit(manifest)
        return manifest

    return apply


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda m: m.update(annotations=["not", "a", "mapping"]), "omni.model.lock_sha256"),
        (lambda m: m.update(layers="none"), "manifest.layers"),
        (lambda m: m.update(layers=[]), "manifest.layers"),
        (lambda m: m["layers"][0].update(digest=5), "manifest.layers"),
        (lambda m: m["layers"][0].update(size=True), "manifest.layers"),
        (lambda m: m["layers"][0].update(size=-1), "manifest.layers"),
        (lambda m: m["layers"][0].update(annotations=["x"]), "README.md"),
        (lambda m: m["layers"][-1].update(annotations={}), ".omni-artifact.lock.json"),
        (lambda m: m["layers"].insert(0, "a string"), "manifest.layers"),
        (
            lambda m: m["layers"][1]["annotations"].update({"omni.model.file.digest": "sha256:" + "0" * 64}),
            "config.json",
        ),
        (lambda m: m["layers"][1].update(size=1), "config.json"),
        (lambda m: m["layers"].reverse(), ".omni-artifact.lock.json"),
    ],
    ids=[
        "annotations-not-a-mapping",
        "layers-not-a-list",
        "no-layers",
        "digest-not-a-string",
        "size-a-boolean",
        "size-negative",
        "layer-annotations-not-a-mapping",
        "no-lock-layer",
        "layer-not-a-descriptor",
        "file-digest-not-the-lock's",
        "size-not-the-file's-layer",
        "out-of-order",
    ],
)
def test_a_hostile_manifest_is_refused_naming_what_is_wrong(tmp_path: Path, edit, field: str) -> None:
    from omni_oci.model.artifact import lock_descriptor

    artifact = _pack(*_checkpoint(tmp_path))
    manifest = _hostile(edit)(json.loads(artifact.image_manifest))
    with pytest.raises(ModelError) as refused:
        lock_descriptor(manifest)
        check_manifest(manifest, artifact.lock, artifact.lock_sha256)
    assert refused.value.field == field, refused.value


def test_a_malformed_lock_sha256_is_refused() -> None:
    from omni_oci.model.pull import expected_lock

    for value in ("zz", "0" * 63, "0" * 64 + "\n"):
        with pytest.raises(ModelError) as refused:
            expected_lock(None, value)
        assert refused.value.field == "--lock-sha256"


@pytest.mark.parametrize(
    "data, says",
    [
        (b'{"mediaType": "a", "mediaType": "b"}', "duplicate"),
        (b"[]", "object"),
        (b'{"mediaType": ', "JSON"),
        (b'{"schemaVersion": Infinity}', "Infinity"),
    ],
    ids=["duplicate keys", "a list", "cut short", "Infinity"],
)
def test_a_served_manifest_is_read_strictly(data: bytes, says: str) -> None:
    with pytest.raises(ModelError) as refused:
        parse_manifest(data, "registry.test/m@sha256:00")
    assert refused.value.field == "manifest" and says.lower() in str(refused.value).lower(), str(refused.value)
