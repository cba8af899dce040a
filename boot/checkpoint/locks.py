"""Which checkpoint lock boot verifies against: the reviewed lock the image pins (by sha256), the
lock file as found, the trust-on-first-use lock kept in STATE_PATH, or one derived from the hub."""

from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from attest.errors import AttestError
from attest.files import write_atomic
from attest.lock import LOCK_FILE, TRUST_ON_FIRST_USE, CheckpointLock, load_lock
from attest.pins import BakedImage
from boot.checkpoint import hub
from boot.errors import BootError
from boot.settings import REPO, REVISION, BootSettings

UNPINNED = "unpinned"


@dataclass(frozen=True)
class LockInUse:
    lock: CheckpointLock
    data: bytes  # the exact bytes checked, published as they are
    trust: str  # reviewed, trust-on-first-use, or unpinned
    source: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def warn(self) -> None:
        if self.trust == TRUST_ON_FIRST_USE:
            print(
                f"WARNING: TRUST ON FIRST USE: the checkpoint lock {self.source} was derived from the hub, not "
                f"reviewed; pin a reviewed lock (CHECKPOINT_LOCK and its sha256 {self.sha256}) for production",
                file=sys.stderr,
                flush=True,
            )
        elif self.trust == UNPINNED:
            print(
                f"WARNING: the checkpoint lock {self.source} is not pinned (no image pin model.lock_sha256, "
                f"CHECKPOINT_LOCK_SHA256 unset); its sha256 is {self.sha256}",
                file=sys.stderr,
                flush=True,
            )


def _pinned_lock_sha256(settings: BootSettings, baked: BakedImage | None) -> str:
    image_pin = (baked.pins.model.lock_sha256 or "") if baked else ""
    if image_pin and settings.checkpoint_lock_sha256 and image_pin != settings.checkpoint_lock_sha256:
        raise BootError(
            f"CHECKPOINT_LOCK_SHA256 {settings.checkpoint_lock_sha256} differs from the image pin "
            f"model.lock_sha256 {image_pin}",
            field="CHECKPOINT_LOCK_SHA256",
        )
    return image_pin or settings.checkpoint_lock_sha256


def checked_lock(lock: CheckpointLock, data: bytes, trust: str, source: str) -> LockInUse:
    for what, ours, theirs in (("repo", REPO, lock.repo), ("revision", REVISION, lock.revision)):
        if ours != theirs:
            raise BootError(
                f"the checkpoint lock {source} is for {what} {theirs}, boot pins {ours}",
                field=f"checkpoint lock.{what}",
            )
    return LockInUse(lock, data, trust, source)


def load_lock_file(path: Path, label: str) -> tuple[CheckpointLock, bytes]:
    try:
        lock, read = load_lock(path, label=label)
        return lock, read.data
    except AttestError as exc:
        raise BootError(str(exc), field=exc.field or label) from None


def resolve_lock(settings: BootSettings, baked: BakedImage | None, *, derive: bool) -> LockInUse | None:
    """The lock to verify against. Pinned: its bytes must have the pinned sha256. Unpinned:
    the lock file as found, else the trust-on-first-use lock kept in STATE_PATH, else (when
    `derive`) one derived from the hub now; None where none exists and none may be derived."""
    pinned = _pinned_lock_sha256(settings, baked)
    path = settings.checkpoint_lock
    if path.exists() or path.is_symlink():
        lock, data = load_lock_file(path, "CHECKPOINT_LOCK")
        sha256 = hashlib.sha256(data).hexdigest()
        if pinned and sha256 != pinned:
            field = "CHECKPOINT_LOCK_SHA256" if settings.checkpoint_lock_sha256 else "model.lock_sha256"
            raise BootError(f"the checkpoint lock {path} has sha256 {sha256}; {field} pins {pinned}", field=field)
        return checked_lock(lock, data, lock.trust if pinned else UNPINNED, str(path))
    if pinned:
        raise BootError(
            f"the pinned checkpoint lock is missing: {path} (CHECKPOINT_LOCK"
            f"{', default' if 'CHECKPOINT_LOCK' in settings.defaults_used else ''})",
            field="CHECKPOINT_LOCK",
        )
    kept = settings.state / LOCK_FILE
    if kept.exists():
        lock, data = load_lock_file(kept, str(kept))
        return checked_lock(lock, data, TRUST_ON_FIRST_USE, str(kept))
    if not derive:
        return None
    listing = hub.fetch_listing(
        REPO,
        REVISION,
        stall_s=settings.download_stall_s,
        endpoint=settings.hf_endpoint,
        deadline=time.monotonic() + settings.download_deadline_s,
    )
    lock = hub.lock_from_listing(REPO, REVISION, listing, TRUST_ON_FIRST_USE)
    data = lock.document_bytes()
    write_atomic(kept, data)
    return checked_lock(lock, data, TRUST_ON_FIRST_USE, str(kept))
