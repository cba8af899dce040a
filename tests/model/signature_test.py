"""The model signature a signed artifact carries (omni_oci/model/sign.py): an OpenSSF Model Signing
v1.0 bundle over exactly the lock's files with their sha256, valid for the spec's schemas, the
same bytes on every run, the layer before the lock's; placed by pull, present in the tree a
runtime unpacks (skopeo + umoci, as an image volume), checked by verify; and refused where it
would sign other bytes or lies elsewhere in the manifest."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from attest.lock import ARTIFACT_LOCK, ARTIFACT_SIGNATURE, PARTIAL_DIR, WORKING_NAMES
from boot.checkpoint.verify import unexpected_files
from omni_oci.model import oms
from omni_oci.model.artifact import (
    FILE_DIGEST,
    FILEPATH,
    check_manifest,
    one_file_layer,
    read_signature_layer,
    signature_descriptor,
)
from omni_oci.model.errors import ModelError
from omni_oci.model.pack import load_lock_bytes, pack, read_pack, write_pack
from omni_oci.model.pull import expected_lock, pull
from omni_oci.model.push import push_artifact, push_checkpoint
from omni_oci.model.sign import model_signature, signed_artifact
from omni_oci.model.verify import checked_model_signature, verify_artifact
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.keys import load_private_key, load_public_key
from tests.fixtures.model import checkpoint_files, tree, unpacked, write_checkpoint
from tests.fixtures.oms import payload, schema_valid
from tests.fixtures.pins import key_pair
from tests.fixtures.registry import LoopbackRegistry, only_credentials
from tools.model.cli import main as model_cli

USER, PASSWORD = "omni", "signature-secret"


@pytest.fixture
def checkpoint(tmp_path: Path):
    root, lock_path = tmp_path / "checkpoint", tmp_path / "lock.json"
    files = checkpoint_files()
    write_checkpoint(root, files, lock_path)
    private, public = key_pair(tmp_path, "signer")
    _, other = key_pair(tmp_path, "other")
    lock, data = load_lock_bytes(lock_path)
    return {
        "root": root,
        "lock_path": lock_path,
        "files": files,
        "lock": lock,
        "lock_bytes": data,
        "key": load_private_key(private),
        "public": public,
        "other": other,
    }


def _signed(world):
    artifact = pack(world["root"], world["lock"], world["lock_bytes"], platform="linux/amd64", quiet=True)
    return signed_artifact(artifact, world["root"], world["key"])


def _sha256s(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def test_the_signature_signs_exactly_the_locked_files_with_their_sha256(checkpoint) -> None:
    artifact = _signed(checkpoint)
    assert schema_valid(artifact.signature)
    facts = oms.verified(artifact.signature, load_public_key(checkpoint["public"]), ARTIFACT_SIGNATURE)
    # Every file, LFS or not, by the sha256 of its bytes (the lock has git sha1s for some).
    assert facts.resources == _sha256s(checkpoint["files"]) and facts.method == "key"
    assert {*WORKING_NAMES, ARTIFACT_SIGNATURE} <= set(facts.ignore_paths)
    assert payload(json.loads(artifact.signature))["subject"][0]["name"] == checkpoint["lock"].repo
    for manifest in (artifact.image_manifest, artifact.model_manifest):
        document = json.loads(manifest)
        paths = [layer["annotations"][FILEPATH] for layer in document["layers"]]
        assert paths == [*sorted(checkpoint["files"]), ARTIFACT_SIGNATURE, ARTIFACT_LOCK]
        signed = signature_descriptor(document, checkpoint["lock"])
        assert signed["annotations"][FILE_DIGEST] == (f"sha256:{hashlib.sha256(artifact.signature).hexdigest()}")
        assert len(check_manifest(document, checkpoint["lock"], artifact.lock_sha256)) == len(checkpoint["files"])


def test_the_same_key_and_files_give_the_same_artifact_and_a_pack_keeps_it(checkpoint, tmp_path: Path) -> None:
    first, second = _signed(checkpoint), _signed(checkpoint)
    assert (first.signature, first.image_digest, first.model_digest) == (
        second.signature,
        second.image_digest,
        second.model_digest,
    )
    unsigned = pack(
        checkpoint["root"], checkpoint["lock"], checkpoint["lock_bytes"], platform="linux/amd64", quiet=True
    )
    assert unsigned.signature is None and unsigned.image_digest != first.image_digest
    write_pack(first, checkpoint["root"], tmp_path / "pack")
    again, _ = read_pack(tmp_path / "pack")
    assert (again.signature, again.image_digest) == (first.signature, first.image_digest)


def test_a_file_that_is_not_its_lock_is_never_signed(checkpoint) -> None:
    (checkpoint["root"] / "tokenizer.json").write_bytes(b'{"version": "2.0"}')  # same size, other bytes
    with pytest.raises(ModelError) as refused:
        model_signature(checkpoint["root"], checkpoint["lock"], checkpoint["key"])
    assert refused.value.field == "tokenizer.json" and "changed since" in str(refused.value)


def test_a_checkpoint_holding_its_own_model_sig_is_pushed_without_ours(tmp_path: Path) -> None:
    root, lock_path = tmp_path / "checkpoint", tmp_path / "lock.json"
    write_checkpoint(root, {**checkpoint_files(), ARTIFACT_SIGNATURE: b"{}"}, lock_path)
    lock, _ = load_lock_bytes(lock_path)
    private, _ = key_pair(tmp_path, "signer")
    with pytest.raises(ModelError, match="--no-model-signature") as refused:
        model_signature(root, lock, load_private_key(private))
    assert refused.value.field == ARTIFACT_SIGNATURE


def _lfs(world) -> str:
    return next(item.path for item in world["lock"].files if item.algorithm == "sha256")


def _statement_without(world) -> dict:
    resources = _sha256s(world["files"])
    del resources["README.md"]
    return oms.statement(world["lock"].repo, resources)


def _statement_with_more(world) -> dict:
    return oms.statement(world["lock"].repo, {**_sha256s(world["files"]), "extra.safetensors": "0" * 64})


def _statement_of_other_bytes(world) -> dict:
    return oms.statement(world["lock"].repo, {**_sha256s(world["files"]), _lfs(world): "1" * 64})


@pytest.mark.parametrize(
    "make, says",
    [
        (_statement_without, "README.md: in the lock, not in the signature"),
        (_statement_with_more, "extra.safetensors: in the signature, not in the lock"),
        (_statement_of_other_bytes, "the signature says sha256:1111"),
    ],
    ids=["a file missing", "a file more", "another revision's bytes"],
)
def test_verify_refuses_a_signature_of_other_files(checkpoint, make, says: str) -> None:
    signature = oms.sign(checkpoint["key"], make(checkpoint))
    with pytest.raises(ModelError, match=says) as refused:
        checked_model_signature(signature, checkpoint["lock"], checkpoint["public"])
    assert refused.value.field == ARTIFACT_SIGNATURE


def test_verify_and_push_refuse_a_signature_of_another_key(checkpoint, tmp_path: Path) -> None:
    other_private, _ = key_pair(tmp_path, "third")
    artifact = pack(
        checkpoint["root"], checkpoint["lock"], checkpoint["lock_bytes"], platform="linux/amd64", quiet=True
    )
    theirs = signed_artifact(artifact, checkpoint["root"], load_private_key(other_private))
    with pytest.raises(ModelError, match="names the key"):
        checked_model_signature(theirs.signature, checkpoint["lock"], checkpoint["public"])
    with pytest.raises(ModelError, match="signed with another key") as refused:  # before any request
        push_artifact(theirs, checkpoint["root"], "127.0.0.1:9/models/x", key=checkpoint["key"])
    assert refused.value.field == ARTIFACT_SIGNATURE


def _moved_first(document: dict) -> None:
    document["layers"].insert(0, document["layers"].pop(-2))


def _twice(document: dict) -> None:
    document["layers"].insert(-2, copy.deepcopy(document["layers"][-2]))


def _unnamed_digest(document: dict) -> None:
    document["layers"][-2]["annotations"][FILE_DIGEST] = "sha1:abc"


def _other_type(document: dict) -> None:
    document["layers"][-2]["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"


@pytest.mark.parametrize(
    "edit, says",
    [
        (_moved_first, "holds model.sig, which the checkpoint lock does not list"),
        (_twice, "holds model.sig, which the checkpoint lock does not list"),
        (_unnamed_digest, "names no sha256 of its file"),
        (_other_type, "layer media type"),
    ],
    ids=["before the files", "twice", "no digest", "another media type"],
)
def test_a_signature_layer_anywhere_else_or_malformed_is_refused(checkpoint, edit, says: str) -> None:
    artifact = _signed(checkpoint)
    document = json.loads(artifact.image_manifest)
    edit(document)
    with pytest.raises(ModelError, match=says) as refused:
        check_manifest(document, checkpoint["lock"], artifact.lock_sha256)
    assert refused.value.field == ARTIFACT_SIGNATURE


def test_boot_takes_the_signature_beside_the_files_and_nothing_else_new(checkpoint) -> None:
    root, lock = checkpoint["root"], checkpoint["lock"]
    (root / ARTIFACT_SIGNATURE).write_bytes(b"{}")
    assert unexpected_files(root, lock) == ([], [])
    (root / "sub").mkdir()
    (root / "sub" / ARTIFACT_SIGNATURE).write_bytes(b"{}")  # only the model root's is the artifact's
    assert unexpected_files(root, lock) == ([], [f"sub/{ARTIFACT_SIGNATURE}"])


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry({USER: PASSWORD}) as served:
        yield served


def _push(world, registry, target: str, *, model_signed: bool = True):
    with RegistryClient(registry.host) as client:
        return push_checkpoint(
            world["root"],
            world["lock"],
            world["lock_bytes"],
            target,
            platform="linux/amd64",
            client=client,
            key=world["key"],
            model_signed=model_signed,
        )


def test_pushed_signed_the_signature_lies_beside_the_files_pulled_and_unpacked(
    checkpoint, registry, tmp_path: Path, monkeypatch
) -> None:
    only_credentials(tmp_path / "home", monkeypatch, registry.host, USER, PASSWORD)
    target = f"{registry.host}/models/signed"
    report = _push(checkpoint, registry, target)
    assert report.model_signed and report.digest == _signed(checkpoint).image_digest  # as pack --signing-key
    expected, pulled, lock = tree(checkpoint["root"]), tmp_path / "pulled", checkpoint["lock_bytes"]
    said = pull(f"{target}@{report.digest}", pulled, expected_lock(lock, ""))
    placed = tree(pulled)
    assert said["model_signature"] == ARTIFACT_SIGNATURE and not (pulled / PARTIAL_DIR).exists()
    assert {name: placed[name] for name in expected} == expected
    assert set(placed) == {*expected, ARTIFACT_SIGNATURE, ARTIFACT_LOCK}
    facts = oms.verified(placed[ARTIFACT_SIGNATURE], load_public_key(checkpoint["public"]), ARTIFACT_SIGNATURE)
    on_disk = {
        name: hashlib.sha256(data).hexdigest() for name, data in placed.items() if name not in facts.ignore_paths
    }
    assert oms.differences(facts.resources, on_disk) == []
    assert tree(unpacked(f"{target}@{report.digest}", tmp_path, f"{USER}:{PASSWORD}")) == placed
    for digest in (report.digest, report.model_digest):
        verified = verify_artifact(f"{target}@{digest}", checkpoint["public"], None)
        assert verified["model_signature"].startswith(f"{ARTIFACT_SIGNATURE} verified"), verified
    # A re-pull keeps every file and the signature; an unsigned artifact's pull removes it.
    again = pull(f"{target}@{report.digest}", pulled, expected_lock(lock, ""))
    assert again["fetched"] == 0 and tree(pulled) == placed
    unsigned = _push(checkpoint, registry, target, model_signed=False)
    plain = pack(checkpoint["root"], checkpoint["lock"], lock, platform="linux/amd64", quiet=True)
    assert not unsigned.model_signed and unsigned.digest == plain.image_digest
    pull(f"{target}@{unsigned.digest}", pulled, expected_lock(lock, ""))
    assert not (pulled / ARTIFACT_SIGNATURE).exists() and (pulled / ARTIFACT_LOCK).exists()


def test_verify_names_the_publisher_a_publisher_signed_lock_names(
    checkpoint, registry, tmp_path: Path, monkeypatch
) -> None:
    only_credentials(tmp_path / "home", monkeypatch, registry.host, USER, PASSWORD)
    signer = "key:" + oms.key_hint(load_public_key(checkpoint["public"]))
    document = {**json.loads(checkpoint["lock_bytes"]), "trust": "publisher-signed", "signed_by": signer}
    checkpoint["lock_path"].write_text(json.dumps(document))
    checkpoint["lock"], checkpoint["lock_bytes"] = load_lock_bytes(checkpoint["lock_path"])
    report = _push(checkpoint, registry, f"{registry.host}/models/publisher-signed")
    verified = verify_artifact(f"{registry.host}/models/publisher-signed@{report.digest}", checkpoint["public"], None)
    assert verified["lock_trust"] == f"publisher-signed by {signer}"


def test_a_signature_layer_holding_other_bytes_than_it_names_is_refused(checkpoint) -> None:
    artifact = _signed(checkpoint)
    document = json.loads(artifact.image_manifest)
    layer = signature_descriptor(document, checkpoint["lock"])
    blob = one_file_layer(ARTIFACT_SIGNATURE, artifact.signature + b" ")
    with pytest.raises(ModelError, match="is not the file its layer's annotation names") as refused:
        read_signature_layer(blob, layer, "model.sig layer")
    assert refused.value.field == ARTIFACT_SIGNATURE


def test_no_model_signature_is_refused_for_a_pack(tmp_path: Path, capsys) -> None:
    argv = ["push", str(tmp_path / "pack"), "127.0.0.1:9/models/x", "--no-model-signature"]
    assert model_cli(argv) == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == "--no-model-signature", refusal
