"""prepare: the pinned checkpoint on local disk, exactly as its lock says.

Rank 0 checks what is on disk against the lock, and only for files that are missing or
wrong asks the hub: its listing must equal the lock, and each file is hashed as it
arrives. It then writes the receipt and publishes its verdict in the model root; other
ranks wait for that verdict (bound to the same lock) and check their own view of every
file before starting.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field

from attest.baked import load_baked
from attest.documents import Document, parse_document
from attest.errors import AttestError
from attest.files import canonical_json, write_atomic
from attest.lock import (
    LOCK_FILE,
    PARTIAL_DIR,
    PUBLISHED_LOCK,
    REFUSED_MARKER,
    REVIEWED,
    TRUST_ON_FIRST_USE,
    VERIFIED_MARKER,
    CheckpointLock,
    load_lock,
)
from attest.pins import BakedImage
from attest.primitives import writable_dir
from attest.reader import read_json_file
from attest.redact import redact_known
from attest.tree import stat_regular
from boot import hub
from boot.errors import BootError
from boot.receipt import Identity, Receipt, load_receipt, save_receipt, withdraw_receipt
from boot.settings import REPO, REVISION, BootSettings
from boot.verify import VerifyReport, check_local, finish, first_problem

POLL_S = 5.0
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


class MarkedFile(Document):
    size: int = Field(ge=0)
    mtime_ns: int
    inode: int = Field(ge=0)


class RefusedMarker(Document):
    """Rank 0's refusal, published in the model root so the other ranks refuse at once."""

    schema_version: Literal["1"] = "1"
    error: str = Field(max_length=4000)
    field: str = Field(max_length=500)


class VerifiedMarker(Document):
    """Rank 0's verdict, published in the model root for the other ranks."""

    schema_version: Literal["1"] = "1"
    revision: str
    lock_sha256: str
    trust: str
    files: dict[str, MarkedFile]


def pinned_lock_sha256(settings: BootSettings, baked: BakedImage | None) -> str:
    image_pin = (baked.pins.model.lock_sha256 or "") if baked else ""
    if image_pin and settings.checkpoint_lock_sha256 and image_pin != settings.checkpoint_lock_sha256:
        raise BootError(
            f"CHECKPOINT_LOCK_SHA256 {settings.checkpoint_lock_sha256} differs from the image pin "
            f"model.lock_sha256 {image_pin}",
            field="CHECKPOINT_LOCK_SHA256",
        )
    return image_pin or settings.checkpoint_lock_sha256


def _checked(lock: CheckpointLock, data: bytes, trust: str, source: str) -> LockInUse:
    for what, ours, theirs in (("repo", REPO, lock.repo), ("revision", REVISION, lock.revision)):
        if ours != theirs:
            raise BootError(
                f"the checkpoint lock {source} is for {what} {theirs}, boot pins {ours}",
                field=f"checkpoint lock.{what}",
            )
    return LockInUse(lock, data, trust, source)


def _load(path: Path, label: str) -> tuple[CheckpointLock, bytes]:
    try:
        lock, read = load_lock(path, label=label)
        return lock, read.data
    except AttestError as exc:
        raise BootError(str(exc), field=exc.field or label) from None


def resolve_lock(settings: BootSettings, baked: BakedImage | None, *, derive: bool) -> LockInUse | None:
    """The lock to verify against. Pinned: its bytes must have the pinned sha256. Unpinned:
    the lock file as found, else the trust-on-first-use lock kept in STATE_PATH, else (when
    `derive`) one derived from the hub now; None where none exists and none may be derived."""
    pinned = pinned_lock_sha256(settings, baked)
    path = settings.checkpoint_lock
    if path.exists() or path.is_symlink():
        lock, data = _load(path, "CHECKPOINT_LOCK")
        sha256 = hashlib.sha256(data).hexdigest()
        if pinned and sha256 != pinned:
            field = "CHECKPOINT_LOCK_SHA256" if settings.checkpoint_lock_sha256 else "model.lock_sha256"
            raise BootError(f"the checkpoint lock {path} has sha256 {sha256}; {field} pins {pinned}", field=field)
        return _checked(lock, data, lock.trust if pinned else UNPINNED, str(path))
    if pinned:
        raise BootError(
            f"the pinned checkpoint lock is missing: {path} (CHECKPOINT_LOCK"
            f"{', default' if 'CHECKPOINT_LOCK' in settings.defaults_used else ''})",
            field="CHECKPOINT_LOCK",
        )
    kept = settings.state / LOCK_FILE
    if kept.exists():
        lock, data = _load(kept, str(kept))
        return _checked(lock, data, TRUST_ON_FIRST_USE, str(kept))
    if not derive:
        return None
    listing = hub.fetch_listing(REPO, REVISION, stall_s=settings.download_stall_s, endpoint=settings.hf_endpoint)
    lock = hub.lock_from_listing(REPO, REVISION, listing, TRUST_ON_FIRST_USE)
    data = lock.document_bytes()
    write_atomic(kept, data)
    return _checked(lock, data, TRUST_ON_FIRST_USE, str(kept))


def _limits(settings: BootSettings) -> hub.Limits:
    return hub.Limits(
        settings.download_stall_s, settings.download_deadline_s, settings.download_attempts, settings.download_workers
    )


def fetch_missing(settings: BootSettings, in_use: LockInUse, names: list[str]) -> dict[str, Identity]:
    """Download `names` (files missing or wrong on disk) after the hub's listing matched the
    lock; each is hashed as it arrives. Returns each placed file's identity."""
    lock = in_use.lock
    listing = hub.fetch_listing(
        lock.repo, lock.revision, stall_s=settings.download_stall_s, endpoint=settings.hf_endpoint
    )
    hub.compare_with_lock(lock, listing)
    items = [lock.by_path[name] for name in names]
    writable_dir(settings.model, "MODEL_PATH", create=False, default_used="MODEL_PATH" in settings.defaults_used)
    partial = settings.model / PARTIAL_DIR
    partial.mkdir(mode=0o700, exist_ok=True)
    total = sum(item.size for item in items)
    print(
        f"downloading {len(items)} file(s), {total / 1e9:.2f} GB, from {settings.hf_endpoint or 'the hub'}",
        file=sys.stderr,
        flush=True,
    )
    progress = hub.DownloadProgress(total, len(items), enabled=total >= 64 << 20)
    deadline = time.monotonic() + settings.download_deadline_s
    with ThreadPoolExecutor(settings.download_workers) as pool:
        futures = [
            pool.submit(
                hub.download_file,
                lock.repo,
                lock.revision,
                item,
                settings.model,
                partial,
                _limits(settings),
                deadline,
                progress,
                settings.hf_endpoint,
            )
            for item in items
        ]
        errors = [future.exception() for future in futures]
    try:
        partial.rmdir()
    except OSError:
        pass
    for error in errors:
        if error is not None:
            raise error
    return {item.path: Identity.of(future.result()) for item, future in zip(items, futures)}


def publish(settings: BootSettings, in_use: LockInUse, receipt: Receipt) -> None:
    marker = VerifiedMarker(
        revision=REVISION,
        lock_sha256=in_use.sha256,
        trust=in_use.trust,
        files={
            name: MarkedFile(size=identity.size, mtime_ns=identity.mtime_ns, inode=identity.inode)
            for name, identity in receipt.files.items()
        },
    )
    if in_use.trust != REVIEWED:
        # Other ranks have no reviewed lock either: they take this one, bound by the marker's digest.
        write_atomic(settings.model / PUBLISHED_LOCK, in_use.data)
    write_atomic(settings.model / VERIFIED_MARKER, canonical_json(marker.model_dump(mode="json")))


def withdraw_verdicts(settings: BootSettings) -> None:
    withdraw_receipt(settings.state)
    for name in (VERIFIED_MARKER, REFUSED_MARKER):
        marker = settings.model / name
        if os.path.lexists(marker):  # a read-only model volume holds none: nothing to remove there
            marker.unlink()


def publish_refusal(settings: BootSettings, refusal: AttestError) -> None:
    """Rank 0 could not verify the checkpoint: say so where the other ranks wait (a failure to
    say so only leaves them to their RANK_WAIT_TIMEOUT_S)."""
    marker = RefusedMarker(error=redact_known(str(refusal))[:4000], field=redact_known(refusal.field)[:500])
    try:
        write_atomic(settings.model / REFUSED_MARKER, canonical_json(marker.model_dump(mode="json")))
    except OSError as exc:
        print(
            f"could not tell the other ranks about the refusal ({settings.model / REFUSED_MARKER}: {exc.strerror})",
            file=sys.stderr,
            flush=True,
        )


def model_root(settings: BootSettings, *, create: bool) -> Path:
    model = settings.model
    source = "MODEL_PATH" + (" (default)" if "MODEL_PATH" in settings.defaults_used else "")
    if not model.is_absolute():
        raise BootError(f"{source} must be an absolute path, got {model}", field="MODEL_PATH")
    if create:
        try:
            model.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BootError(f"{source} {model} cannot be created: {exc.strerror}", field="MODEL_PATH") from None
    if not model.is_dir():
        raise BootError(f"no checkpoint at {source} {model}: not a directory", field="MODEL_PATH")
    return model


def _require_some_checkpoint(settings: BootSettings, lock) -> None:
    """A MODEL_PATH holding none of the locked files is a wrong path, not a broken checkpoint:
    refuse before withdrawing the receipt, which still vouches for the real one."""
    if not any(os.path.lexists(settings.model / item.path) for item in lock.files):
        source = "MODEL_PATH" + (" (default)" if "MODEL_PATH" in settings.defaults_used else "")
        raise BootError(
            f"no checkpoint at {source} {settings.model}: none of the lock's {len(lock.files)} files "
            f"(e.g. {lock.files[0].path}) is there; is MODEL_PATH right? The receipt in "
            f"{settings.state} (STATE_PATH) is kept",
            field="MODEL_PATH",
        )


def verify_rank0(
    settings: BootSettings, in_use: LockInUse, *, download: bool, rehash_all: bool = False, quiet: bool = False
) -> VerifyReport:
    started = time.monotonic()
    receipt, refused = load_receipt(settings.state, lock_sha256=in_use.sha256, revision=REVISION)
    if refused:
        if not download and not rehash_all:
            raise BootError(
                f"the receipt is refused: {refused}; run `boot verify --full` or `boot prepare`",
                field="verification.json",
            )
        print(f"receipt refused: {refused}; re-hashing every file", file=sys.stderr, flush=True)
    lock = in_use.lock
    if not download:
        _require_some_checkpoint(settings, lock)
    withdraw_verdicts(settings)  # from here on files may change: nothing claims "verified"
    check = check_local(
        settings.model, lock, receipt, rehash_all=rehash_all, workers=settings.verify_workers, quiet=quiet
    )
    if check.problems and download:
        for name, problem in check.problems.items():
            if "is missing" not in problem:
                print(f"fetching {name} again: {problem}", file=sys.stderr, flush=True)
        check.good.update(fetch_missing(settings, in_use, list(check.problems)))
        check.downloaded = len(check.problems)
        check.problems = {}
    if check.problems:
        raise first_problem(lock, check.problems)
    report = finish(settings.model, lock, check, started=started, trust=in_use.trust, quiet=quiet)
    signed = Receipt(revision=REVISION, lock_sha256=in_use.sha256, trust=in_use.trust, files=check.good)
    save_receipt(settings.state, signed)
    if settings.nnodes > 1:  # the verdict other ranks wait for; a single node writes nothing to MODEL_PATH
        publish(settings, in_use, signed)
    return report


def _read_published(settings: BootSettings, name: str, model: type, max_bytes: int, context: str = ""):
    """A verdict rank 0 published in the model root: read once, bounded, without following links."""
    path = settings.model / name
    try:
        value, _ = read_json_file(path, label=str(path), max_bytes=max_bytes, follow_symlinks=False)
        return parse_document(model, value, label=str(path))
    except AttestError as exc:
        raise BootError(f"{context}{exc}", field=name) from None


def _read_marker(settings: BootSettings) -> VerifiedMarker | None:
    if not (settings.model / VERIFIED_MARKER).exists():
        return None
    return _read_published(settings, VERIFIED_MARKER, VerifiedMarker, 64 << 20)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def _refuse_with_rank0(settings: BootSettings) -> None:
    refused = _read_published(
        settings,
        REFUSED_MARKER,
        RefusedMarker,
        64 << 10,
        f"Rank {settings.node_rank}: rank 0 published a refusal that cannot be read: ",
    )
    raise BootError(
        f"Rank {settings.node_rank}: rank 0 refused the checkpoint, so this rank does not start: {refused.error}",
        field=refused.field or REFUSED_MARKER,
    )


def wait_for_rank0(settings: BootSettings, baked: BakedImage | None, *, poll_s: float | None = None) -> None:
    """Ranks > 0: rank 0's verdict bound to the same lock, then this node's view of every file."""
    poll_s = poll_s or POLL_S
    deadline = time.monotonic() + settings.rank_wait_s
    seen = "no verdict yet"
    # A refusal already there is an earlier run's: rank 0 withdraws it when it starts again.
    stale_refusal = _identity(settings.model / REFUSED_MARKER)
    while True:
        refusal = _identity(settings.model / REFUSED_MARKER)
        if refusal is not None and refusal != stale_refusal:
            _refuse_with_rank0(settings)
        marker = _read_marker(settings)
        if marker is not None:
            in_use = resolve_lock(settings, baked, derive=False)
            if in_use is None:
                published = settings.model / PUBLISHED_LOCK
                if published.exists():
                    lock, data = _load(published, str(published))
                    in_use = _checked(lock, data, TRUST_ON_FIRST_USE, str(published))
            if in_use is not None and marker.lock_sha256 == in_use.sha256:
                break
            seen = (
                f"rank 0's verdict is bound to lock {marker.lock_sha256}, "
                f"this rank's is {in_use.sha256 if in_use else 'missing'}"
            )
        if time.monotonic() >= deadline:
            raise BootError(
                f"Rank {settings.node_rank}: no verified checkpoint from rank 0 in {settings.model} "
                f"within {settings.rank_wait_s} s ({seen})",
                field="RANK_WAIT_TIMEOUT_S",
            )
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    in_use.warn()
    for item in in_use.lock.files:
        expected = marker.files.get(item.path)
        try:
            found = stat_regular(settings.model, item.path)
        except AttestError as exc:
            raise BootError(str(exc), field=item.path) from None
        view = MarkedFile(size=found.st_size, mtime_ns=found.st_mtime_ns, inode=found.st_ino) if found else None
        if expected is None or view != expected or expected.size != item.size:
            raise BootError(
                f"Rank {settings.node_rank}: {item.path} differs from rank 0's verified view "
                f"(rank 0 {expected}, here {view})",
                field=item.path,
            )
    print(
        f"Rank {settings.node_rank}: checkpoint verified by rank 0 against the {in_use.trust} lock {in_use.sha256}",
        flush=True,
    )


def prepare(settings: BootSettings) -> VerifyReport | None:
    if settings.skip_prepare:
        if not (settings.model / "config.json").is_file():
            raise BootError(f"SKIP_PREPARE=1 but {settings.model}/config.json is missing", field="SKIP_PREPARE")
        print("SKIP_PREPARE=1 - using existing checkpoint (no lock check)", flush=True)
        return None
    baked = load_baked()
    if settings.node_rank != 0:
        wait_for_rank0(settings, baked)
        return None
    model_root(settings, create=True)
    try:
        return _prepare_rank0(settings, baked)
    except AttestError as exc:
        if settings.nnodes > 1:  # the other ranks wait in the model root for this verdict
            publish_refusal(settings, exc)
        raise


def _prepare_rank0(settings: BootSettings, baked: BakedImage | None) -> VerifyReport | None:
    in_use = resolve_lock(settings, baked, derive=True)
    in_use.warn()
    if settings.skip_verify:
        withdraw_verdicts(settings)
        missing = [
            item.path
            for item in in_use.lock.files
            if (found := stat_regular(settings.model, item.path)) is None or found.st_size != item.size
        ]
        if missing:
            fetch_missing(settings, in_use, missing)
        print("SKIP_VERIFY=1 - not re-hashing the checkpoint (downloads were hashed as they arrived)", flush=True)
        return None
    return verify_rank0(settings, in_use, download=True)


def verify_only(settings: BootSettings, *, full: bool) -> VerifyReport:
    """`boot verify [--full]`: the local checkpoint against the lock, no network."""
    model = model_root(settings, create=False)
    print(f"verifying {model} (MODEL_PATH)", file=sys.stderr, flush=True)
    in_use = resolve_lock(settings, load_baked(), derive=False)
    if in_use is None:
        raise BootError(
            f"no checkpoint lock: {settings.checkpoint_lock} (CHECKPOINT_LOCK) is missing and "
            f"{settings.state / LOCK_FILE} was never derived; run `boot prepare` first",
            field="CHECKPOINT_LOCK",
        )
    in_use.warn()
    return verify_rank0(settings, in_use, download=False, rehash_all=full)
