"""Omni's model signatures with the reference tool, model-signing 1.1.1 (pinned in
requirements.lock as a test dependency), both ways: `model_signing verify key` passes on a
directory `tools/model pull` wrote and on the tree a runtime mounts as an image volume (skopeo +
umoci), and fails once a file changes, is added or goes, or with another key; a signature
`model_signing sign key` makes is verified by Omni's reader with the same files, and refused
with another key or once the files differ."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from attest.lock import ARTIFACT_SIGNATURE, VERIFIED_MARKER
from omni_oci.model import oms
from omni_oci.model.errors import ModelError
from omni_oci.model.pack import load_lock_bytes
from omni_oci.model.pull import expected_lock, pull
from omni_oci.model.push import push_checkpoint
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.keys import load_private_key, load_public_key
from tests.fixtures.model import checkpoint_files, keyed_checkpoint, tree, unpacked, write_checkpoint
from tests.fixtures.oms import model_signing
from tests.fixtures.pins import key_pair
from tests.fixtures.registry import LoopbackRegistry, only_credentials

USER, PASSWORD = "omni", "reference-secret"


def _verified(directory: Path, public: Path, home: Path, signature: Path | None = None) -> subprocess.CompletedProcess:
    signature = signature or directory / ARTIFACT_SIGNATURE
    return model_signing(
        "verify", "key", str(directory), "--signature", str(signature), "--public_key", str(public), home=home
    )


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry({USER: PASSWORD}) as served:
        yield served


@pytest.fixture
def pulled(tmp_path: Path, registry, monkeypatch):
    """A signed one-pass push of a tiny checkpoint, pulled into a directory, and its tree unpacked."""
    only_credentials(tmp_path / "home", monkeypatch, registry.host, USER, PASSWORD)
    made = keyed_checkpoint(tmp_path)
    lock, data = load_lock_bytes(made.lock_path)
    target, key = f"{registry.host}/models/reference", load_private_key(made.private)
    with RegistryClient(registry.host) as client:
        report = push_checkpoint(made.root, lock, data, target, platform="linux/amd64", client=client, key=key)
    directory = tmp_path / "pulled"
    pull(f"{target}@{report.digest}", directory, expected_lock(data, ""))
    (directory / VERIFIED_MARKER).write_text("{}")  # as boot leaves it beside the files
    volume = unpacked(f"{target}@{report.digest}", tmp_path, f"{USER}:{PASSWORD}")
    return {"directory": directory, "volume": volume, "public": made.public, "tmp": tmp_path}


def test_the_reference_tool_verifies_a_pulled_directory_and_an_image_volume(pulled) -> None:
    for directory in (pulled["directory"], pulled["volume"]):
        done = _verified(directory, pulled["public"], pulled["tmp"])
        assert done.returncode == 0 and "Verification succeeded" in done.stdout, done.stdout + done.stderr


def _changed(directory: Path) -> None:
    (directory / "README.md").write_bytes(b"# not tiny\n")


def _added(directory: Path) -> None:
    (directory / "extra.safetensors").write_bytes(b"x")


def _removed(directory: Path) -> None:
    (directory / "config.json").unlink()


@pytest.mark.parametrize("edit", [_changed, _added, _removed], ids=["a file changed", "a file added", "a file gone"])
def test_the_reference_tool_refuses_a_directory_that_is_not_the_signed_one(pulled, edit) -> None:
    edit(pulled["directory"])
    done = _verified(pulled["directory"], pulled["public"], pulled["tmp"])
    assert done.returncode != 0 and "Verification failed" in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_reference_tool_refuses_another_key(pulled) -> None:
    _, other = key_pair(pulled["tmp"], "other")
    done = _verified(pulled["directory"], other, pulled["tmp"])
    assert done.returncode != 0, done.stdout + done.stderr


def test_a_signature_the_reference_tool_makes_is_read_by_omni(tmp_path: Path) -> None:
    model = tmp_path / "model"
    files = checkpoint_files()
    write_checkpoint(model, files, tmp_path / "lock.json")
    private, public = key_pair(tmp_path, "publisher")
    signature = tmp_path / ARTIFACT_SIGNATURE
    argv = ["sign", "key", str(model), "--private_key", str(private), "--signature", str(signature)]
    done = model_signing(*argv, home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    facts = oms.verified(signature.read_bytes(), load_public_key(public), "model.sig")
    assert (
        oms.differences(facts.resources, {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}) == []
    )
    assert facts.resources.keys() == tree(model).keys()
    _, other = key_pair(tmp_path, "other")
    with pytest.raises(ModelError):
        oms.verified(signature.read_bytes(), load_public_key(other), "model.sig")
