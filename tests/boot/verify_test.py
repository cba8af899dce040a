"""boot.checkpoint.verify's checks one by one, on checkpoints and locks the test writes: each way a
file can be wrong, each way the weight index can be wrong, and files changing underneath."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from unittest import mock

import pytest

from attest.documents import parse_document
from attest.lock import CheckpointLock, LockedFile
from attest.progress import Progress
from boot.checkpoint import verify
from boot.checkpoint.receipt import Identity, Receipt
from boot.errors import BootError
from boot.settings import REVISION

INDEX = verify.WEIGHT_INDEX


def _write(model: Path, files: dict[str, bytes]) -> CheckpointLock:
    entries = []
    for name, data in sorted(files.items()):
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_bytes(data)
        entries.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return parse_document(
        CheckpointLock,
        {"schema_version": "1", "repo": "o/r", "revision": REVISION, "trust": "reviewed", "files": entries},
        label="lock",
    )


def _checkpoint(model: Path) -> CheckpointLock:
    index = json.dumps({"weight_map": {"a.weight": "model-1.safetensors", "b.weight": "model-2.safetensors"}})
    return _write(
        model,
        {
            "config.json": b"{}",
            INDEX: index.encode(),
            "model-1.safetensors": b"\x01" * 64,
            "model-2.safetensors": b"\x02" * 64,
        },
    )


def test_an_intact_checkpoint_passes_and_a_receipt_is_reused_only_for_identical_files(tmp_path: Path) -> None:
    lock = _checkpoint(tmp_path)
    first = verify.check_local(tmp_path, lock, None, quiet=True)
    assert (first.problems, first.hashed, first.reused) == ({}, 4, 0)
    receipt = Receipt(revision=REVISION, lock_sha256="ab" * 32, trust="reviewed", files=first.good)
    again = verify.check_local(tmp_path, lock, receipt, quiet=True)
    assert (again.problems, again.hashed, again.reused) == ({}, 0, 4)
    assert verify.check_local(tmp_path, lock, receipt, rehash_all=True, quiet=True).hashed == 4
    os.utime(tmp_path / "config.json", ns=(1, 1))  # identity changed: hashed again, not reused
    changed = verify.check_local(tmp_path, lock, receipt, quiet=True)
    assert (changed.hashed, changed.reused) == (1, 3)


@pytest.mark.parametrize(
    "breaker, message",
    [
        (lambda m: (m / "model-1.safetensors").unlink(), "checkpoint file is missing: model-1.safetensors"),
        (lambda m: (m / "model-1.safetensors").write_bytes(b"\x01" * 65), "Wrong file size: model-1.safetensors"),
        (lambda m: (m / "model-1.safetensors").write_bytes(b"\x09" * 64), "Hash mismatch: model-1.safetensors"),
        (
            lambda m: (
                (m / "model-1.safetensors").unlink(),
                (m / "model-1.safetensors").symlink_to(m / "model-2.safetensors"),
            ),
            "model-1.safetensors",
        ),
        (lambda m: ((m / "model-1.safetensors").unlink(), (m / "model-1.safetensors").mkdir()), "model-1.safetensors"),
    ],
)
def test_each_broken_file_is_a_problem_naming_it(tmp_path: Path, breaker, message: str) -> None:
    lock = _checkpoint(tmp_path)
    breaker(tmp_path)
    check = verify.check_local(tmp_path, lock, None, quiet=True)
    assert list(check.problems) == ["model-1.safetensors"] and message in check.problems["model-1.safetensors"]
    assert "model-1.safetensors" not in check.good and len(check.good) == 3
    with pytest.raises(BootError) as caught:
        raise verify.first_problem(lock, check.problems)
    assert caught.value.field == "model-1.safetensors"


def test_a_file_that_changes_while_it_is_hashed_is_a_problem(tmp_path: Path) -> None:
    lock = _checkpoint(tmp_path)
    target = tmp_path / "model-1.safetensors"
    real = verify.digest_fd

    def digest_then_touch(fd, algorithm, size, on_bytes=None):
        digest = real(fd, algorithm, size, on_bytes=on_bytes)
        if os.fstat(fd).st_ino == target.stat().st_ino:
            os.utime(target, ns=(5, 5))
        return digest

    with mock.patch.object(verify, "digest_fd", digest_then_touch):
        check = verify.check_local(tmp_path, lock, None, quiet=True)
    assert check.problems == {"model-1.safetensors": "checkpoint file changed while it was hashed: model-1.safetensors"}


def test_a_size_that_changes_between_stat_and_open_is_a_problem(tmp_path: Path) -> None:
    lock = _checkpoint(tmp_path)
    item = lock.by_path["model-1.safetensors"]
    grown = LockedFile(path=item.path, size=item.size + 1, sha256=item.sha256)
    identity, problem = verify._hash_one(tmp_path, grown, Progress(0, 1, "x", enabled=False))
    assert identity is None and problem.startswith("Wrong file size: model-1.safetensors (expected 65 bytes, found 64)")


@pytest.mark.parametrize(
    "index, message",
    [
        ({"weight_map": {"a": "model-3.safetensors"}}, "names shards that the checkpoint lock does not list"),
        ({"weight_map": ["model-1.safetensors"]}, "has no readable weight_map"),
        ({"weight_map": {"a": 1}}, "has no readable weight_map"),
        ({"metadata": {}}, "has no readable weight_map"),
        (b"{not json", "model.safetensors.index.json"),
    ],
)
def test_the_weight_index_must_name_only_locked_shards(tmp_path: Path, index, message: str) -> None:
    data = index if isinstance(index, bytes) else json.dumps(index).encode()
    lock = _write(tmp_path, {"config.json": b"{}", INDEX: data, "model-1.safetensors": b"\x01"})
    with pytest.raises(BootError) as caught:
        verify.check_weight_index(tmp_path, lock)
    assert caught.value.field == INDEX and message in str(caught.value)


def test_an_oversized_weight_index_is_refused_before_parsing(tmp_path: Path) -> None:
    lock = _write(tmp_path, {"config.json": b"{}", INDEX: b" " * 64})
    with mock.patch.object(verify, "MAX_INDEX_BYTES", 63), pytest.raises(BootError, match="is larger than 63 bytes"):
        verify.check_weight_index(tmp_path, lock)
    with mock.patch.object(verify, "MAX_INDEX_BYTES", 64), pytest.raises(BootError, match="JSON|weight_map"):
        verify.check_weight_index(tmp_path, lock)


def test_a_lock_without_an_index_skips_the_index_check(tmp_path: Path) -> None:
    lock = _write(tmp_path, {"config.json": b"{}"})
    assert verify.check_weight_index(tmp_path, lock) is None


def test_identity_binds_size_mtime_ctime_inode_and_device(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    identity = Identity.of(path.stat())
    os.utime(path, ns=(7, 7))
    assert Identity.of(path.stat()) != identity


def test_symlinks_are_refused_even_where_the_lock_lists_the_name_or_the_engine_would_not_load_it(
    tmp_path: Path,
) -> None:
    lock = _checkpoint(tmp_path)
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").symlink_to(tmp_path / "model-1.safetensors")
    (tmp_path / "notes.md").symlink_to(tmp_path / "model-2.safetensors")
    (tmp_path / "README.md").write_text("kept")
    (tmp_path / "extra.py").write_text("planted")
    refused, extra = verify.unexpected_files(tmp_path, lock)
    assert refused == ["config.json (symlink)", "extra.py", "notes.md (symlink)"]
    assert extra == ["README.md"]


@pytest.mark.parametrize("planted, field", [(["b.py", "a.py"], "a.py"), (["a-link.json"], "a-link.json")])
def test_the_refusal_of_unlisted_files_names_the_first_one(tmp_path: Path, planted: list[str], field: str) -> None:
    lock = _checkpoint(tmp_path)
    for name in planted:
        if "link" in name:
            (tmp_path / name).symlink_to(tmp_path / "config.json")
        else:
            (tmp_path / name).write_text("x")
    check = verify.check_local(tmp_path, lock, None, quiet=True)
    with pytest.raises(BootError) as caught:
        verify.finish(tmp_path, lock, check, started=0.0, trust="reviewed", quiet=True)
    assert caught.value.field == field and "the engine would load" in str(caught.value)
