"""The verification receipt (STATE_PATH/verification.json): which files were verified
against which lock, and each file's identity when it was.

It holds no digests (those come only from the lock), so it can only ever save work, never
change what is expected. A file is re-hashed unless its size, mtime_ns, ctime_ns, inode and
device all match: an in-place edit that restores the mtime (`touch -d`) still moves the
ctime, which only the kernel sets. The receipt carries an HMAC-SHA256 under a random key
kept 0600 in STATE_PATH (`receipt.key`): a receipt edited by anyone who cannot read that key
is refused. A key that is not a regular file owned by the running uid with mode 0600 is
refused (exit 2, naming it): a key another user wrote or can read could sign a forged receipt.
What this cannot stop: root on the host (it can read the key, or change the bytes under a
mounted filesystem), which docs/boot.md's security notes say.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Literal

from pydantic import Field

from attest.documents import Document, parse_document
from attest.errors import AttestError
from attest.files import canonical_json, write_atomic
from attest.reader import read_json_file
from boot.errors import BootError

RECEIPT = "verification.json"
RECEIPT_KEY = "receipt.key"
MAX_RECEIPT_BYTES = 64 * 1024 * 1024


class Identity(Document):
    size: int = Field(ge=0)
    mtime_ns: int
    ctime_ns: int
    inode: int = Field(ge=0)
    device: int = Field(ge=0)

    @classmethod
    def of(cls, stat: os.stat_result) -> "Identity":
        return cls(
            size=stat.st_size,
            mtime_ns=stat.st_mtime_ns,
            ctime_ns=stat.st_ctime_ns,
            inode=stat.st_ino,
            device=stat.st_dev,
        )


class Receipt(Document):
    schema_version: Literal["1"] = "1"
    status: Literal["verified"] = "verified"
    revision: str
    lock_sha256: str
    trust: Literal["reviewed", "publisher-signed", "trust-on-first-use", "unpinned"]
    files: dict[str, Identity]
    mac: str = ""

    def body(self) -> bytes:
        return canonical_json(self.model_dump(mode="json", exclude={"mac"}))


MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 256


def _key(state: Path, *, create: bool) -> bytes | None:
    path = state / RECEIPT_KEY
    if not path.exists() and not path.is_symlink():
        if not create:
            return None
        state.mkdir(parents=True, exist_ok=True)
        write_atomic(path, secrets.token_hex(32).encode(), mode=0o600)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise BootError(
            f"the receipt key cannot be read: {path} ({why}); expected a regular file owned by uid "
            f"{os.geteuid()} with mode 0600",
            field=str(path),
        ) from None
    try:
        info = os.fstat(fd)  # of what was opened: no swap between the check and the read
        problems = []
        if not stat.S_ISREG(info.st_mode):
            problems.append("is not a regular file")
        if info.st_uid != os.geteuid():
            problems.append(f"is owned by uid {info.st_uid}")
        if info.st_mode & 0o077:
            problems.append(f"has mode {stat.S_IMODE(info.st_mode):04o}")
        if problems:
            raise BootError(
                f"the receipt key {path} {' and '.join(problems)}; expected a file owned by uid "
                f"{os.geteuid()} with mode 0600 (a key others wrote or can read could sign a forged "
                "receipt: remove it, and the next prepare makes a new one)",
                field=str(path),
            )
        data = os.read(fd, MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not MIN_KEY_BYTES <= len(data) <= MAX_KEY_BYTES:
        raise BootError(
            f"the receipt key {path} holds {len(data)} bytes; at least {MIN_KEY_BYTES} and at most "
            f"{MAX_KEY_BYTES} allowed",
            field=str(path),
        )
    return data


def _mac(key: bytes, receipt: Receipt) -> str:
    return hmac.new(key, receipt.body(), hashlib.sha256).hexdigest()


def save_receipt(state: Path, receipt: Receipt) -> None:
    key = _key(state, create=True)
    signed = receipt.model_copy(update={"mac": _mac(key, receipt)})
    write_atomic(state / RECEIPT, canonical_json(signed.model_dump(mode="json")))


def load_receipt(state: Path, *, lock_sha256: str, revision: str) -> tuple[Receipt | None, str]:
    """The receipt if it is intact and bound to this lock and revision, else None and why it
    was refused ("" when there is none)."""
    path = state / RECEIPT
    if not path.exists() and not path.is_symlink():
        return None, ""
    try:
        value, _ = read_json_file(path, label=str(path), max_bytes=MAX_RECEIPT_BYTES, follow_symlinks=False)
        receipt = parse_document(Receipt, value, label=str(path))
    except AttestError as exc:
        return None, f"{exc}"
    key = _key(state, create=False)
    if key is None or not hmac.compare_digest(receipt.mac, _mac(key, receipt)):
        return None, f"{path} fails its integrity check (edited, or written under another {RECEIPT_KEY})"
    if receipt.lock_sha256 != lock_sha256:
        return None, f"{path} is bound to checkpoint lock {receipt.lock_sha256[:12]}…, not {lock_sha256[:12]}…"
    if receipt.revision != revision:
        return None, f"{path} is for revision {receipt.revision}, not {revision}"
    return receipt, ""


def withdraw_receipt(state: Path) -> None:
    """Nothing claims "verified" while files may change."""
    (state / RECEIPT).unlink(missing_ok=True)
