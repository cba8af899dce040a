"""The ranks of one multi-node group: rank 0 publishes its verdict (or its refusal) in the model
root; the other ranks wait for a verdict bound to the same lock, then check their own view of
every file before starting."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from attest.documents import Document, parse_document
from attest.errors import AttestError
from attest.files import canonical_json, write_atomic
from attest.lock import PUBLISHED_LOCK, REFUSED_MARKER, REVIEWED, TRUST_ON_FIRST_USE, VERIFIED_MARKER
from attest.pins import BakedImage
from attest.reader import read_json_file
from attest.redact import redact_known
from attest.tree import stat_regular
from boot.errors import BootError
from boot.locks import LockInUse, checked_lock, load_lock_file, resolve_lock
from boot.receipt import Receipt, withdraw_receipt
from boot.settings import REVISION, BootSettings

POLL_S = 5.0


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
                    lock, data = load_lock_file(published, str(published))
                    in_use = checked_lock(lock, data, TRUST_ON_FIRST_USE, str(published))
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
