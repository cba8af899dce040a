"""boot.checkpoint.receipt: what a receipt binds, what makes it refused, and its limits on both sides."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from boot.checkpoint.receipt import (
    RECEIPT,
    RECEIPT_KEY,
    Identity,
    Receipt,
    load_receipt,
    save_receipt,
    withdraw_receipt,
)
from boot.errors import BootError

LOCK = "ab" * 32
REVISION = "cd" * 20


def _saved(state: Path) -> Receipt:
    receipt = Receipt(
        revision=REVISION,
        lock_sha256=LOCK,
        trust="reviewed",
        files={"a.bin": Identity(size=1, mtime_ns=2, ctime_ns=3, inode=4, device=5)},
    )
    save_receipt(state, receipt)
    return receipt


def test_a_saved_receipt_loads_back_bound_to_its_lock_and_revision(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert load_receipt(state, lock_sha256=LOCK, revision=REVISION) == (None, "")
    saved = _saved(state)
    loaded, why = load_receipt(state, lock_sha256=LOCK, revision=REVISION)
    assert why == "" and loaded.files == saved.files and len(loaded.mac) == 64
    key = state / RECEIPT_KEY
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 64  # 32 random bytes, hex
    path = state / RECEIPT
    assert load_receipt(state, lock_sha256="ef" * 32, revision=REVISION) == (
        None,
        f"{path} is bound to checkpoint lock abababababab…, not efefefefefef…",
    )
    assert load_receipt(state, lock_sha256=LOCK, revision="01" * 20) == (
        None,
        f"{path} is for revision {REVISION}, not {'01' * 20}",
    )
    withdraw_receipt(state)
    assert not path.exists()
    withdraw_receipt(state)  # nothing to withdraw is fine


def test_a_receipt_without_its_key_or_under_another_key_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _saved(state)
    (state / RECEIPT_KEY).unlink()
    receipt, why = load_receipt(state, lock_sha256=LOCK, revision=REVISION)
    assert receipt is None and why.endswith(
        f"fails its integrity check (edited, or written under another {RECEIPT_KEY})"
    )
    assert not (state / RECEIPT_KEY).exists()  # loading never creates a key
    (state / RECEIPT_KEY).write_bytes(b"0" * 64)
    (state / RECEIPT_KEY).chmod(0o600)
    assert load_receipt(state, lock_sha256=LOCK, revision=REVISION)[0] is None


def test_a_linked_receipt_or_key_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _saved(state)
    (state / RECEIPT).rename(tmp_path / "real.json")
    (state / RECEIPT).symlink_to(tmp_path / "real.json")
    receipt, why = load_receipt(state, lock_sha256=LOCK, revision=REVISION)
    assert receipt is None and "symlink" in why
    (state / RECEIPT).unlink()
    (state / RECEIPT).symlink_to(tmp_path / "dangling")  # a dangling link is not "no receipt"
    assert load_receipt(state, lock_sha256=LOCK, revision=REVISION)[1] != ""
    (state / RECEIPT).unlink()
    _saved(state)
    (state / RECEIPT_KEY).rename(tmp_path / "key")
    (state / RECEIPT_KEY).symlink_to(tmp_path / "key")
    with pytest.raises(BootError, match="the receipt key cannot be read") as caught:
        load_receipt(state, lock_sha256=LOCK, revision=REVISION)
    assert caught.value.field == str(state / RECEIPT_KEY) and "a symbolic link" in str(caught.value)


@pytest.mark.parametrize("size, readable", [(256, True), (257, False)])
def test_the_key_is_at_most_256_bytes(tmp_path: Path, size: int, readable: bool) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / RECEIPT_KEY).write_bytes(b"k" * size)
    (state / RECEIPT_KEY).chmod(0o600)
    if readable:
        _saved(state)
        assert load_receipt(state, lock_sha256=LOCK, revision=REVISION)[1] == ""
        return
    with pytest.raises(BootError, match="at most 256 allowed"):
        _saved(state)


@pytest.mark.parametrize(
    "mode, foreign, problem",
    [
        (0o644, False, "has mode 0644"),
        (0o640, False, "has mode 0640"),
        (0o600, True, "is owned by uid {owner}"),
        (0o666, True, "is owned by uid {owner} and has mode 0666"),
    ],
)
def test_a_key_others_own_or_can_read_is_refused_naming_it(
    tmp_path: Path, monkeypatch, mode: int, foreign: bool, problem: str
) -> None:
    """A key another user wrote (or anyone can read) could have signed a forged receipt: with it,
    an in-place edit would pass verify. Refused before the receipt is trusted."""
    state = tmp_path / "state"
    _saved(state)
    key = state / RECEIPT_KEY
    key.chmod(mode)
    owner = key.stat().st_uid
    if foreign:  # the key stays ours; this process acts as another uid (no chown in a sandbox)
        monkeypatch.setattr(os, "geteuid", lambda: owner + 4242)
    with pytest.raises(BootError) as caught:
        load_receipt(state, lock_sha256=LOCK, revision=REVISION)
    assert caught.value.field == str(key) and problem.format(owner=owner) in str(caught.value)
    assert "mode 0600" in str(caught.value)
