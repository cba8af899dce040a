"""attest.lock: what a checkpoint lock may say, each refusal by field, each limit on both sides."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from attest.documents import parse_document
from attest.errors import AttestError
from attest.hashing import GIT_SHA1, SHA256
from attest.lock import CheckpointLock, load_lock

REVISION = "ab" * 20
LFS = {"path": "model-00001.safetensors", "size": 10, "sha256": "11" * 32}
GIT = {"path": "config.json", "size": 0, "git_sha1": "22" * 20}


def _lock(**changes: Any) -> dict[str, Any]:
    return {
        "schema_version": "1",
        "repo": "org/model",
        "revision": REVISION,
        "trust": "reviewed",
        "files": [LFS, GIT],
        **changes,
    }


def _file(**changes: Any) -> dict[str, Any]:
    return _lock(files=[{**LFS, **changes}])


REFUSED = [
    ("empty repo", _lock(repo=""), "lock.repo", "at least 1 character"),
    ("no files", _lock(files=[]), "lock.files", "at least 1 item"),
    ("unknown trust", _lock(trust="trusted"), "lock.trust", "'reviewed', 'publisher-signed' or 'trust-on-first-use'"),
    # A publisher-signed lock names its signer (tools/pin --model-signature), and only it does.
    ("signed, no signer", _lock(trust="publisher-signed"), "lock", "signed_by is required with trust publisher-signed"),
    (
        "a signer, reviewed",
        _lock(signed_by="key:" + "a" * 64),
        "lock",
        "signed_by is required with trust publisher-signed, and only with it",
    ),
    (
        "a signer without its method",
        _lock(trust="publisher-signed", signed_by="a" * 64),
        "lock.signed_by",
        "should match pattern",
    ),
    ("branch revision", _lock(revision="main"), "lock.revision", "40-character commit SHA"),
    ("negative size", _file(size=-1), "lock.files.0.size", "greater than or equal to 0"),
    ("size past 2**50", _file(size=(1 << 50) + 1), "lock.files.0.size", "less than or equal to 1125899906842624"),
    ("both digests", _file(git_sha1="22" * 20), "lock.files.0", "exactly one of sha256"),
    ("no digest", _lock(files=[{"path": "a", "size": 1}]), "lock.files.0", "exactly one of sha256"),
    ("upper-case git sha1", _lock(files=[{**GIT, "git_sha1": "AB" * 20}]), "lock.files.0.git_sha1", "lower-case"),
    ("short git sha1", _lock(files=[{**GIT, "git_sha1": "ab" * 19}]), "lock.files.0.git_sha1", "40-character"),
    ("escaping path", _file(path="../x"), "lock.files.0.path", "has an empty, '.' or '..' component"),
    ("absolute path", _file(path="/etc/passwd"), "lock.files.0.path", "is absolute"),
    (
        "listed twice",
        _lock(files=[LFS, GIT, {**LFS, "size": 3}, {**GIT, "size": 3}]),
        "lock.files",
        "file 'config.json' is listed twice",
    ),  # the first of the twice-listed names, in sorted order
    (
        "listed twice after a unique name",
        _lock(files=[{**GIT, "path": "a.json"}, {**GIT, "path": "y.json"}, {**GIT, "path": "y.json"}]),
        "lock.files",
        "file 'y.json' is listed twice",
    ),
    (
        "under a file",
        _lock(files=[LFS, {**GIT, "path": "model-00001.safetensors/inner"}]),
        "lock.files",
        "lies under another listed file 'model-00001.safetensors'",
    ),
    # Names that print as something else (issue #30): bidi overrides, C1 controls, zero-width.
    ("bidi override", _file(path="evil\u202etxt.py"), "lock.files.0.path", "(U+202E"),
    ("C1 control", _file(path="a\u0085b"), "lock.files.0.path", "(U+0085"),
    ("zero width", _file(path="con\u200bfig.json"), "lock.files.0.path", "(U+200B"),
    # boot's own working names: a lock may not make boot overwrite or trust its own state.
    ("boot's verified marker", _file(path=".omni-verified.json"), "lock.files.0.path", "boot's own working names"),
    (
        "boot's partial directory",
        _file(path=".omni-partial/model.safetensors"),
        "lock.files.0.path",
        "boot's own working names",
    ),
    (
        "boot's published lock",
        _file(path=".omni-checkpoint.lock.json"),
        "lock.files.0.path",
        "boot's own working names",
    ),
    ("rank 0's refusal", _file(path=".omni-refused.json"), "lock.files.0.path", "boot's own working names"),
]


@pytest.mark.parametrize("name,value,field,message", REFUSED, ids=[row[0] for row in REFUSED])
def test_a_malformed_lock_is_refused_naming_the_field(name: str, value: dict, field: str, message: str) -> None:
    with pytest.raises(AttestError) as caught:
        parse_document(CheckpointLock, value, label="lock")
    assert caught.value.field == field and message in str(caught.value), str(caught.value)


def test_the_limits_accept_their_last_values_and_each_file_says_how_it_is_hashed() -> None:
    lock = parse_document(
        CheckpointLock,
        _lock(files=[{**LFS, "size": 1 << 50}, {**GIT, "size": 0}, {**GIT, "path": "sub/config.json"}]),
        label="lock",
    )
    first, second, third = lock.files
    assert (first.algorithm, first.digest) == (SHA256, "11" * 32)
    assert (second.algorithm, second.digest) == (GIT_SHA1, "22" * 20)
    assert lock.total_bytes == (1 << 50) and set(lock.by_path) == {LFS["path"], "config.json", "sub/config.json"}
    assert parse_document(CheckpointLock, _lock(trust="trust-on-first-use"), label="lock").trust == "trust-on-first-use"
    assert parse_document(CheckpointLock, _lock(repo="r"), label="lock").repo == "r"


@pytest.mark.parametrize("size, accepted", [(32 << 20, True), ((32 << 20) + 1, False)], ids=["32 MiB", "32 MiB + 1"])
def test_a_lock_file_is_read_up_to_32_mib_and_its_digest_is_of_those_bytes(
    tmp_path: Path, size: int, accepted: bool
) -> None:
    text = json.dumps(_lock())
    data = (text[:-1] + " " * (size - len(text)) + "}").encode()
    path = tmp_path / "checkpoint.lock.json"
    path.write_bytes(data)
    if accepted:
        lock, read = load_lock(path)
        assert lock.repo == "org/model" and read.sha256 == hashlib.sha256(data).hexdigest()
        return
    with pytest.raises(AttestError) as caught:
        load_lock(path, label="the lock")
    assert caught.value.field == "the lock" and "at most 33554432" in str(caught.value)
