"""A checkpoint file from the hub, resumed after a cut or a restart and verified as it arrives.

Each locked file being fetched has a partial file in MODEL_PATH/.omni-partial, named by the
lock's digest of it, beside a record of the answer its bytes came from (ETag, commit). A later
attempt, or a later run, resumes it with an HTTP Range request: what is already on disk is
hashed once (never trusted), and the hub's answer must be 206 with exactly the range asked, for
the same ETag; a 200 or another ETag restarts the file from byte 0, a commit other than the
pinned one is refused. Only a file whose every byte matched the lock is placed; a cut costs
what was in flight. Progress counts hashed bytes only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from attest.edge.data_plane import BodyBroken, blob_extensions, content_range, read_blob
from attest.edge.transport import RETRY_STATUS, answer_deadline, retry_after
from attest.errors import AttestError
from attest.files import write_atomic
from attest.hashing import new_digest
from attest.lock import LockedFile
from attest.progress import Progress
from attest.reader import read_json_file
from attest.tree import place, stat_regular
from boot.errors import BootError

# Written bytes are pushed to disk every this many bytes, so the fsync before the rename
# finds little left to write: durability overlaps the transfer instead of following it.
WRITEBACK_BYTES = 64 << 20
PART_SUFFIX = ".part"
RECORD_SUFFIX = ".part.json"
MAX_RECORD_BYTES = 4096
READ_BYTES = 1 << 20


@dataclass(frozen=True)
class Limits:
    stall_s: float
    deadline_s: float
    attempts: int
    workers: int


def download_progress(total: int, files: int, *, enabled: bool) -> Progress:
    """The download's progress line: hashed bytes, those resumed from .part files said apart."""
    return Progress(total, files, "downloading checkpoint", enabled=enabled)


class _Retry(Exception):
    """An attempt failed and another may follow; `after`: the seconds the hub asked to wait
    (Retry-After), else None."""

    def __init__(self, message: str, *, after: float | None = None) -> None:
        super().__init__(message)
        self.after = after


@dataclass
class _Partial:
    """One file's partial download: its bytes on disk, hashed so far, and the answer they came from."""

    path: Path
    record: Path
    item: LockedFile
    handle: Any = None
    digest: Any = None
    size: int = 0
    etag: str = ""
    flushed: int = 0
    fresh: bool = True  # no record yet for these bytes
    history: list[str] = field(default_factory=list)

    def restart(self, progress: Progress) -> None:
        """Back to byte 0: the bytes kept so far cannot be continued."""
        progress.add(-self.size)
        self.handle.seek(0)
        self.handle.truncate()
        self.digest = new_digest(self.item.algorithm, self.item.size)
        self.size = self.flushed = 0
        self.etag, self.fresh = "", True
        self.record.unlink(missing_ok=True)

    def discard(self) -> None:
        if self.handle is not None:
            self.handle.close()
        self.path.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)


def partial_names(item: LockedFile) -> tuple[str, str]:
    """The partial file's name and its record's: the lock's digest, and the path's, so two locked
    files with the same bytes never share one."""
    key = hashlib.sha256(item.path.encode()).hexdigest()[:16] + "-" + item.digest
    return key + PART_SUFFIX, key + RECORD_SUFFIX


def _read_record(partial: _Partial) -> str | None:
    """The ETag a resumable partial file's bytes came from; None when its record does not match."""
    try:
        value, _ = read_json_file(
            partial.record, label=str(partial.record), max_bytes=MAX_RECORD_BYTES, follow_symlinks=False
        )
    except AttestError:
        return None
    if value.get("size") != partial.item.size or value.get("digest") != partial.item.digest:
        return None
    etag = value.get("etag")
    return etag if isinstance(etag, str) and len(etag) <= 256 else None


def _open_own(path: Path) -> int:
    """A partial file to continue or begin: opened without following a link and without blocking
    (a FIFO planted there returns at once); anything but a regular file of one link (a hard link
    to a file elsewhere would be written through) is removed and the file created anew,
    exclusively."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, 0o600)
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(descriptor)
            descriptor = -1
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):  # a link, a socket, a directory
            raise
        descriptor = -1
    if descriptor < 0:
        if os.path.isdir(path) and not os.path.islink(path):
            raise IsADirectoryError(errno.EISDIR, "a directory stands where the partial file belongs", str(path))
        os.unlink(path)
        descriptor = os.open(path, flags | os.O_EXCL, 0o600)
    os.set_blocking(descriptor, True)
    return descriptor


def open_partial(directory: Path, item: LockedFile, progress: Progress) -> _Partial:
    """The partial file of `item`, its bytes hashed once from disk; a fresh one when there is
    none, or when what is there cannot be continued (no matching record, longer than the lock)."""
    part_name, record_name = partial_names(item)
    partial = _Partial(directory / part_name, directory / record_name, item)
    try:
        partial.handle = os.fdopen(_open_own(partial.path), "r+b")
    except OSError as exc:
        raise BootError(f"{item.path}: cannot open {partial.path}: {exc.strerror or exc}", field=item.path) from None
    partial.digest = new_digest(item.algorithm, item.size)
    etag = _read_record(partial)
    on_disk = os.fstat(partial.handle.fileno()).st_size
    if etag is None or on_disk > item.size:
        partial.handle.truncate(0)
        partial.record.unlink(missing_ok=True)
        return partial
    while block := partial.handle.read(READ_BYTES):
        partial.digest.update(block)
        partial.size += len(block)
    partial.etag, partial.fresh, partial.flushed = etag, False, partial.size
    progress.add_resumed(partial.size)
    if partial.size:
        print(f"{item.path}: resuming at byte {partial.size} of {item.size}", file=sys.stderr, flush=True)
    return partial


def _etag(response: httpx.Response) -> str:
    value = response.headers.get("X-Linked-Etag") or response.headers.get("ETag") or ""
    return value.removeprefix("W/").strip('"')[:256]


def _check_commit(response: httpx.Response, item: LockedFile, revision: str) -> None:
    for answer in (*response.history, response):
        commit = answer.headers.get("X-Repo-Commit")
        if commit is not None and commit.lower() != revision:
            raise BootError(
                f"{item.path}: the hub answered for commit {commit[:80]!r}, not the pinned revision {revision}",
                field=item.path,
            )


def _accept(response: httpx.Response, partial: _Partial, revision: str, progress: Progress) -> None:
    """Checks the answer against what was asked; restarts the partial file when it cannot continue."""
    item, status = partial.item, response.status_code
    if status not in (200, 206):
        message = f"{item.path}: the hub answered HTTP {status}"
        if status == 416:
            partial.restart(progress)
        if status not in RETRY_STATUS and status != 416:
            raise BootError(message, field=item.path)
        raise _Retry(message, after=retry_after(response.headers) if status in (429, 503) else None)
    _check_commit(response, item, revision)
    etag = _etag(response)
    if status == 200:
        if partial.size:
            print(f"{item.path}: the hub ignored the range: starting again from byte 0", file=sys.stderr, flush=True)
            partial.restart(progress)
    else:
        expected = (partial.size, item.size - 1, item.size)
        if content_range(response) != expected or (partial.etag and etag != partial.etag):
            partial.restart(progress)
            raise _Retry(
                f"{item.path}: the hub's partial answer ({response.headers.get('Content-Range', 'no Content-Range')}, "
                f"ETag {etag or 'none'}) does not continue byte {expected[0]} of the same file: starting again"
            )
    if partial.fresh:
        record = {"digest": item.digest, "size": item.size, "etag": etag}
        write_atomic(partial.record, json.dumps(record, sort_keys=True).encode(), mode=0o600)
        partial.etag, partial.fresh = etag, False


def _append(partial: _Partial, chunk: bytes, progress: Progress) -> None:
    """A piece of the body (read_blob never passes the lock's size): hashed, written, counted."""
    partial.digest.update(chunk)
    partial.handle.write(chunk)
    partial.size += len(chunk)
    progress.add(len(chunk))
    if partial.size - partial.flushed >= WRITEBACK_BYTES:
        partial.handle.flush()
        # DONTNEED starts asynchronous writeback of the dirty range (Linux).
        os.posix_fadvise(
            partial.handle.fileno(), partial.flushed, partial.size - partial.flushed, os.POSIX_FADV_DONTNEED
        )
        partial.flushed = partial.size


def _finish(partial: _Partial, progress: Progress) -> None:
    """Every byte is there: the file must be what the lock says, else it starts again."""
    item = partial.item
    partial.handle.flush()
    os.fsync(partial.handle.fileno())
    if partial.digest.hexdigest() != item.digest:
        received = partial.digest.hexdigest()
        partial.restart(progress)
        raise _Retry(
            f"{item.path}: the hub served other bytes ({item.algorithm} expected {item.digest}, received {received})"
        )


def _past_deadline(item: LockedFile, limits: Limits) -> BootError:
    return BootError(
        f"{item.path}: the download passed its deadline of {limits.deadline_s:g} s "
        "(DOWNLOAD_DEADLINE_S); its partial file is kept for the next run",
        field="DOWNLOAD_DEADLINE_S",
    )


def fetch_once(
    session: httpx.Client,
    url: str,
    partial: _Partial,
    revision: str,
    limits: Limits,
    deadline: float,
    progress: Progress,
    headers: dict[str, str],
) -> None:
    """One attempt: the rest of the file from where the partial file ends, through the data plane
    (attest.edge.data_plane), hashed as it is written."""
    item = partial.item
    if partial.size < item.size:
        asked = {**headers, **({"Range": f"bytes={partial.size}-"} if partial.size else {})}
        try:
            request = session.build_request(
                "GET", url, headers=asked, timeout=httpx.Timeout(limits.stall_s), extensions=blob_extensions(deadline)
            )
            # The answer (every redirect hop) within DOWNLOAD_STALL_S, and all of it within the deadline.
            with answer_deadline(limits.stall_s, ends=deadline):
                response = session.send(request, stream=True, follow_redirects=True)
            try:
                _accept(response, partial, revision, progress)
                for piece in read_blob(response, item.size - partial.size, deadline, item.path):
                    _append(partial, piece, progress)
            finally:
                response.close()
        except BodyBroken as exc:
            raise _broken(exc, item, limits) from None
        except httpx.TimeoutException:
            if time.monotonic() >= deadline:
                raise _past_deadline(item, limits) from None
            raise _Retry(f"{item.path}: no bytes for {limits.stall_s:g} s (DOWNLOAD_STALL_S)") from None
        except httpx.HTTPError as exc:
            raise _Retry(f"{item.path}: {type(exc).__name__}: {exc}") from None
        finally:
            partial.handle.flush()  # what was written is on disk for the next attempt or run
    if partial.size != item.size:
        raise _Retry(f"{item.path}: truncated download ({partial.size} of the lock's {item.size} bytes)")
    _finish(partial, progress)


def _broken(exc: BodyBroken, item: LockedFile, limits: Limits) -> Exception:
    """What a body that did not arrive whole means for the download: the deadline's refusal, or
    another attempt from where the partial file ends."""
    if exc.reason == "late":
        return _past_deadline(item, limits)
    if exc.reason == "stalled":
        return _Retry(f"{item.path}: no bytes for {limits.stall_s:g} s (DOWNLOAD_STALL_S)")
    if exc.reason == "long":
        return _Retry(f"{item.path}: the hub sent more than the lock's {item.size} bytes: {exc}")
    return _Retry(f"{exc}")


def _placed(partial: _Partial, model: Path) -> os.stat_result:
    item = partial.item
    try:
        placed = os.fstat(partial.handle.fileno())
        partial.handle.close()
        place(partial.path, model, item.path)
        found = stat_regular(model, item.path)
    except AttestError as exc:
        partial.discard()
        raise BootError(str(exc), field=item.path) from None
    partial.record.unlink(missing_ok=True)
    if found is None or (found.st_ino, found.st_dev, found.st_size) != (placed.st_ino, placed.st_dev, placed.st_size):
        raise BootError(f"{item.path} was replaced right after it was placed", field=item.path)
    return found


def _pause(failed: _Retry, attempt: int, progressed: bool, item: LockedFile, limits: Limits, deadline: float) -> None:
    """The wait before the next attempt: what the hub asked for (Retry-After), which must end
    within the deadline; else none after progress (a cut resumes at once) and a backoff after
    none."""
    left = max(0.0, deadline - time.monotonic())
    if failed.after is not None:
        if failed.after > left:
            raise BootError(
                f"{item.path}: the hub asks to retry after {failed.after:g} s (Retry-After), past the "
                f"download's deadline of {limits.deadline_s:g} s (DOWNLOAD_DEADLINE_S: {left:.0f} s left); "
                "its partial file is kept for the next run",
                field="DOWNLOAD_DEADLINE_S",
            )
        print(f"{item.path}: waiting {failed.after:g} s, as the hub's Retry-After asks", file=sys.stderr, flush=True)
        time.sleep(failed.after)
    elif not progressed:
        time.sleep(min(2 ** (attempt - 1), 10, left))


def download_file(
    session: httpx.Client,
    url: str,
    revision: str,
    item: LockedFile,
    model: Path,
    directory: Path,
    limits: Limits,
    deadline: float,
    progress: Progress,
    headers: dict[str, str],
) -> os.stat_result:
    """The file, resumed from its partial file and verified against the lock as it arrived, in
    place; bounded retries, each continuing where the last stopped. Returns the placed file's
    stat (its bytes are not read again)."""
    partial = open_partial(directory, item, progress)
    try:
        for attempt in range(1, limits.attempts + 1):
            before = partial.size
            try:
                fetch_once(session, url, partial, revision, limits, deadline, progress, headers)
            except _Retry as exc:
                partial.history.append(str(exc))
                print(f"download attempt {attempt}/{limits.attempts} failed: {exc}", file=sys.stderr, flush=True)
                if attempt < limits.attempts:
                    _pause(exc, attempt, partial.size > before, item, limits, deadline)
                continue
            except OSError as exc:
                raise BootError(
                    f"{item.path}: cannot write {partial.path}: {exc.strerror or exc}; its partial file is kept",
                    field=item.path,
                ) from None
            found = _placed(partial, model)
            progress.item_done()
            return found
    finally:
        if partial.handle is not None and not partial.handle.closed:
            partial.handle.close()
    raise BootError(
        f"{item.path}: no verified download after {limits.attempts} attempts; last: {partial.history[-1]}; "
        "its partial file is kept: the next run resumes it",
        field=item.path,
    )
