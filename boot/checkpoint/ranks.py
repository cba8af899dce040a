"""The ranks of one multi-node group: rank 0 publishes its verdict (or its refusal) in the model
root; the other ranks wait for it, then check their own view of every file before starting.

The model volume is writable by whoever can write it, so its verdict proves nothing by itself.
With RANK_KEY_FILE (a key every rank holds and the volume does not: a mounted Secret), the
verdict and the refusal carry an HMAC-SHA256 over their content, this group's RANK_GROUP and
rank 0's start; a rank accepts one only if the MAC, the group and the lock match, rank 0
started no earlier than RANK_START_SPREAD_S before this rank did (an earlier run's verdict is
stale), the files are exactly the lock's, and each file's size, mtime, ctime and inode are what
rank 0 verified. Without a key a rank takes the verdict only as "rank 0 is done" and hashes
every file itself: it then costs one read of the checkpoint per rank, at disk speed. A verdict
that is not taken is not a refusal: the rank waits for one that is (RANK_WAIT_TIMEOUT_S), and
reads the file again only when it changes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from attest.documents import Document, parse_document
from attest.edge.redact import escaped, redact_known
from attest.errors import AttestError
from attest.files import canonical_json, write_atomic
from attest.lock import PINNED_TRUST, PUBLISHED_LOCK, REFUSED_MARKER, TRUST_ON_FIRST_USE, VERIFIED_MARKER
from attest.pins import BakedImage
from attest.reader import read_file, read_json_file
from attest.tree import stat_regular
from boot.checkpoint.locks import LockInUse, checked_lock, load_lock_file, resolve_lock
from boot.checkpoint.receipt import Receipt, withdraw_receipt
from boot.checkpoint.verify import check_local, first_problem
from boot.errors import BootError
from boot.settings import REVISION, BootSettings

POLL_S = 5.0
KEY_MIN_BYTES = 32
MAX_KEY_BYTES = 4096
MAX_REFUSAL_BYTES = 64 << 10
RUN_STARTED_NS = time.time_ns()  # this process's start, as the verdict records rank 0's
_MAC = r"^([0-9a-f]{64})?$"


class MarkedFile(Document):
    size: int = Field(ge=0)
    mtime_ns: int
    ctime_ns: int
    inode: int = Field(ge=0)


class RefusedMarker(Document):
    """Rank 0's refusal, published in the model root so the other ranks refuse at once."""

    schema_version: Literal["2"] = "2"
    error: str = Field(max_length=4000)
    field: str = Field(max_length=500)
    group: str = Field(max_length=256)
    rank0_started_ns: int
    mac: str = Field(pattern=_MAC)


class VerifiedMarker(Document):
    """Rank 0's verdict, published in the model root for the other ranks."""

    schema_version: Literal["2"] = "2"
    revision: str
    lock_sha256: str
    trust: str
    group: str = Field(max_length=256)
    rank0_started_ns: int
    files: dict[str, MarkedFile]
    mac: str = Field(pattern=_MAC)


def rank_key(settings: BootSettings) -> bytes | None:
    """The group's key from RANK_KEY_FILE, read once and bounded; None without one. Refused when
    it is short or lives in the model volume, where whoever forges verdicts could read it."""
    path = settings.rank_key_file
    if path is None:
        return None
    resolved, model = Path(os.path.realpath(path)), Path(os.path.realpath(settings.model))
    if resolved == model or model in resolved.parents:
        raise BootError(
            f"RANK_KEY_FILE {path} is inside MODEL_PATH, next to the verdicts it would authenticate",
            field="RANK_KEY_FILE",
        )
    try:
        key = read_file(path, label=f"RANK_KEY_FILE {path}", max_bytes=MAX_KEY_BYTES).data.strip()
    except AttestError as exc:
        raise BootError(str(exc), field="RANK_KEY_FILE") from None
    if len(key) < KEY_MIN_BYTES:
        raise BootError(
            f"RANK_KEY_FILE {path} holds {len(key)} bytes; expected at least {KEY_MIN_BYTES} "
            "(e.g. openssl rand -hex 32)",
            field="RANK_KEY_FILE",
        )
    return key


def _mac(key: bytes | None, document: dict) -> str:
    if key is None:
        return ""
    signed = canonical_json({name: value for name, value in document.items() if name != "mac"})
    return hmac.new(key, signed, hashlib.sha256).hexdigest()


def _publish(settings: BootSettings, name: str, document: dict, key: bytes | None) -> None:
    document = {**document, "group": settings.rank_group, "rank0_started_ns": RUN_STARTED_NS, "mac": ""}
    document["mac"] = _mac(key, document)
    write_atomic(settings.model / name, canonical_json(document))


def publish(settings: BootSettings, in_use: LockInUse, receipt: Receipt) -> None:
    marker = {
        "schema_version": "2",
        "revision": REVISION,
        "lock_sha256": in_use.sha256,
        "trust": in_use.trust,
        "files": {
            name: {"size": item.size, "mtime_ns": item.mtime_ns, "ctime_ns": item.ctime_ns, "inode": item.inode}
            for name, item in receipt.files.items()
        },
    }
    if in_use.trust not in PINNED_TRUST:
        # Other ranks have no reviewed lock either: they take this one, bound by the marker's digest.
        write_atomic(settings.model / PUBLISHED_LOCK, in_use.data)
    _publish(settings, VERIFIED_MARKER, marker, rank_key(settings))


def withdraw_verdicts(settings: BootSettings) -> None:
    withdraw_receipt(settings.state)
    for name in (VERIFIED_MARKER, REFUSED_MARKER):
        marker = settings.model / name
        if os.path.lexists(marker):  # a read-only model volume holds none: nothing to remove there
            marker.unlink()


def publish_refusal(settings: BootSettings, refusal: AttestError) -> None:
    """Rank 0 could not verify the checkpoint: say so where the other ranks wait (a failure to
    say so only leaves them to their RANK_WAIT_TIMEOUT_S)."""
    marker = {
        "schema_version": "2",
        "error": redact_known(str(refusal))[:4000],
        "field": redact_known(refusal.field)[:500],
    }
    try:
        _publish(settings, REFUSED_MARKER, marker, rank_key(settings))
    except (OSError, AttestError) as exc:
        print(
            f"could not tell the other ranks about the refusal ({settings.model / REFUSED_MARKER}: {exc})",
            file=sys.stderr,
            flush=True,
        )


class _Watch:
    """A file rank 0 publishes, read again only when its identity (inode, times, size) changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.identity: tuple[int, ...] | None = None

    def changed(self) -> bool:
        try:
            found = os.lstat(self.path)
            identity: tuple[int, ...] | None = (found.st_ino, found.st_mtime_ns, found.st_ctime_ns, found.st_size)
        except FileNotFoundError:
            identity = None
        changed, self.identity = identity != self.identity, identity
        return changed and identity is not None


def _read(path: Path, model: type, max_bytes: int) -> tuple[dict, Document]:
    value, _ = read_json_file(path, label=str(path), max_bytes=max_bytes, follow_symlinks=False)
    return value, parse_document(model, value, label=str(path))


def _not_ours(settings: BootSettings, key: bytes | None, value: dict, published: Document) -> str:
    """Why a published verdict or refusal is not this run's rank 0's ("" when it is)."""
    if key is None:
        return ""
    if not hmac.compare_digest(published.mac, _mac(key, value)):
        return "its MAC does not match RANK_KEY_FILE's key (forged, or another group's)"
    if published.group != settings.rank_group:
        return f"it is for group {escaped(published.group)!r}, this rank's is {settings.rank_group!r} (RANK_GROUP)"
    if published.rank0_started_ns < RUN_STARTED_NS - settings.rank_start_spread_s * 10**9:
        ago = (RUN_STARTED_NS - published.rank0_started_ns) / 1e9
        return f"it is stale: its rank 0 started {ago:.0f} s before this rank (an earlier run's)"
    return ""


def _lock_in_use(settings: BootSettings, baked: BakedImage | None) -> LockInUse | None:
    in_use = resolve_lock(settings, baked, derive=False)
    published = settings.model / PUBLISHED_LOCK
    if in_use is None and published.exists():
        lock, data = load_lock_file(published, str(published))
        in_use = checked_lock(lock, data, TRUST_ON_FIRST_USE, str(published))
    return in_use


def _verdict_problem(settings: BootSettings, key: bytes | None, in_use: LockInUse | None) -> tuple[str, Document]:
    """Why rank 0's verdict cannot be taken ("" when it can), and the verdict."""
    if in_use is None:
        return "this rank has no checkpoint lock yet", None
    # Bounded by the lock: an entry per locked file, nothing more.
    max_bytes = min(64 << 20, 4096 + 1024 * len(in_use.lock.files))
    try:
        value, marker = _read(settings.model / VERIFIED_MARKER, VerifiedMarker, max_bytes)
    except AttestError as exc:
        return f"rank 0's verdict cannot be read: {exc}", None
    problem = _not_ours(settings, key, value, marker)
    if not problem and marker.lock_sha256 != in_use.sha256:
        problem = f"rank 0's verdict is bound to lock {marker.lock_sha256}, this rank's is {in_use.sha256}"
    if not problem and set(marker.files) != set(in_use.lock.by_path):
        problem = "rank 0's verdict names other files than the lock"
    return problem, marker


def _check_refusal(settings: BootSettings, key: bytes | None) -> None:
    """A refusal this run's rank 0 published: this rank refuses too. One that is not is ignored."""
    path = settings.model / REFUSED_MARKER
    try:
        value, refused = _read(path, RefusedMarker, MAX_REFUSAL_BYTES)
    except AttestError as exc:
        problem = f"it cannot be read: {exc}"
    else:
        problem = _not_ours(settings, key, value, refused)
        if not problem:
            raise BootError(
                f"Rank {settings.node_rank}: rank 0 refused the checkpoint, so this rank does not start: "
                f"{escaped(refused.error)}",
                field=escaped(refused.field) or REFUSED_MARKER,
            )
    print(f"Rank {settings.node_rank}: ignoring {path}: {problem}", file=sys.stderr, flush=True)


def _files_problem(
    settings: BootSettings, in_use: LockInUse, marker: VerifiedMarker, key: bytes | None
) -> tuple[str, str]:
    """Why this rank's view of the files is not what the verdict says, and the file ("" when it
    is): rank 0's verified identities with a key, else this rank's own hashes."""
    if key is None:
        check = check_local(
            settings.model, in_use.lock, None, rehash_all=True, workers=settings.verify_workers, quiet=True
        )
        if not check.problems:
            return "", ""
        problem = first_problem(in_use.lock, check.problems)
        return str(problem), problem.field
    for item in in_use.lock.files:
        expected = marker.files[item.path]
        try:
            found = stat_regular(settings.model, item.path)
        except AttestError as exc:
            return str(exc), item.path
        view = (
            MarkedFile(size=found.st_size, mtime_ns=found.st_mtime_ns, ctime_ns=found.st_ctime_ns, inode=found.st_ino)
            if found
            else None
        )
        if view != expected or expected.size != item.size:
            return (
                f"Rank {settings.node_rank}: {item.path} differs from rank 0's verified view "
                f"(rank 0 {expected}, here {view})",
                item.path,
            )
    return "", ""


def _refusal_already_there(settings: BootSettings, key: bytes | None, refusal: _Watch) -> None:
    """A refusal already published when this rank starts: this run's rank 0's refuses this rank at
    once, instead of leaving it to wait out RANK_WAIT_TIMEOUT_S. With a key, `_check_refusal`
    tells this run's (authenticated, its rank 0 started within RANK_START_SPREAD_S) from an
    earlier one's; without one, nothing is authenticated and a refusal written before that window
    is taken for an earlier run's (rank 0 withdraws it when it starts) and ignored."""
    if not refusal.changed():
        return
    if key is None:
        try:
            written = os.lstat(refusal.path).st_mtime_ns
        except FileNotFoundError:
            return
        if written < RUN_STARTED_NS - settings.rank_start_spread_s * 10**9:
            print(f"Rank {settings.node_rank}: ignoring {refusal.path}: an earlier run's", file=sys.stderr, flush=True)
            return
    _check_refusal(settings, key)


def wait_for_rank0(settings: BootSettings, baked: BakedImage | None, *, poll_s: float | None = None) -> None:
    """Ranks > 0: this run's rank 0's verdict bound to the same lock, then this node's view of every file."""
    poll_s = poll_s or POLL_S
    deadline = time.monotonic() + settings.rank_wait_s
    key = rank_key(settings)
    verdict, refusal = _Watch(settings.model / VERIFIED_MARKER), _Watch(settings.model / REFUSED_MARKER)
    _refusal_already_there(settings, key, refusal)
    seen, field = "no verdict yet", "RANK_WAIT_TIMEOUT_S"
    print(
        f"Rank {settings.node_rank}: waiting for rank 0's verdict in {settings.model} "
        f"(up to {settings.rank_wait_s:g} s, RANK_WAIT_TIMEOUT_S)",
        file=sys.stderr,
        flush=True,
    )
    while True:
        if refusal.changed():
            _check_refusal(settings, key)
        if verdict.changed():
            in_use = _lock_in_use(settings, baked)
            seen, marker = _verdict_problem(settings, key, in_use)
            if not seen:
                seen, field = _files_problem(settings, in_use, marker, key)
                if not seen:
                    break
                field = field or "RANK_WAIT_TIMEOUT_S"
        if time.monotonic() >= deadline:
            raise BootError(
                f"Rank {settings.node_rank}: no verified checkpoint from rank 0 in {settings.model} "
                f"within {settings.rank_wait_s} s ({seen})",
                field=field,
            )
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
    in_use.warn()
    how = (
        "verified by rank 0" if key else "hashed by this rank (no RANK_KEY_FILE: rank 0's verdict is not authenticated)"
    )
    print(f"Rank {settings.node_rank}: checkpoint {how} against the {in_use.trust} lock {in_use.sha256}", flush=True)
