"""The hub as an untrusted peer: its metadata is compared with the lock, and each file it
serves is hashed as it arrives, against the lock.

Requests go through huggingface_hub's own HTTP session, URL builder and headers (token,
endpoint, user agent). The byte stream is handled here because the download must be hashed
in the same pass that writes it and be bounded by the lock's size; huggingface_hub's
downloaders verify nothing against a local lock.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from attest.documents import parse_document
from attest.errors import AttestError
from attest.hashing import new_digest
from attest.lock import CheckpointLock, LockedFile
from attest.primitives import REVISION_RE
from attest.reader import loads_object
from attest.tree import place, stat_regular
from boot.errors import BootError

MAX_METADATA_BYTES = 32 * 1024 * 1024
# Written bytes are pushed to disk every this many bytes, so the fsync before the rename
# finds little left to write: durability overlaps the transfer instead of following it.
WRITEBACK_BYTES = 64 << 20
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class _Lfs(_Lenient):
    sha256: str
    size: int


class _Sibling(_Lenient):
    rfilename: str
    size: int | None = None
    blobId: str | None = None  # noqa: N815 (the hub's field name)
    lfs: _Lfs | None = None


class _ModelInfo(_Lenient):
    sha: str
    siblings: list[_Sibling]


@dataclass(frozen=True)
class Limits:
    stall_s: float
    deadline_s: float
    attempts: int
    workers: int


def _endpoint(endpoint: str) -> str:
    """HF_ENDPOINT as boot's settings parsed it, else huggingface_hub's default."""
    from huggingface_hub import constants

    return (endpoint or constants.ENDPOINT).rstrip("/")


def _session() -> httpx.Client:
    from huggingface_hub.utils import get_session

    return get_session()


def _headers() -> dict[str, str]:
    from huggingface_hub.utils import build_hf_headers

    return build_hf_headers()


def fetch_model_info(
    repo: str, ref: str, *, stall_s: float, endpoint: str = "", deadline: float = math.inf
) -> tuple[str, list[LockedFile]]:
    """The 40-hex commit the hub names for `ref` (a revision, branch or tag) and its file
    listing there, read bounded and checked strictly; `deadline` (time.monotonic()) bounds the
    whole read, each wait at most `stall_s`."""
    url = f"{_endpoint(endpoint)}/api/models/{repo}/revision/{quote(ref, safe='')}"
    where = f"hub metadata of {repo}@{ref} ({url})"
    try:
        with _session().stream(
            "GET",
            url,
            params={"blobs": "true"},
            headers=_headers(),
            timeout=httpx.Timeout(stall_s),
            follow_redirects=True,
        ) as response:
            body = bytearray()
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_METADATA_BYTES:
                    raise BootError(f"{where} is larger than {MAX_METADATA_BYTES} bytes", field="HF_ENDPOINT")
                if time.monotonic() > deadline:
                    raise BootError(f"reading {where} passed its deadline", field="deadline")
            status = response.status_code
    except httpx.HTTPError as exc:
        raise BootError(
            f"cannot read {where}: {type(exc).__name__}: {exc} (check HF_ENDPOINT and the network)", field="HF_ENDPOINT"
        ) from None
    if status != 200:
        raise BootError(f"{where} answered HTTP {status}: {bytes(body[:200])!r}", field="HF_ENDPOINT")
    try:
        info = _ModelInfo.model_validate(loads_object(bytes(body), label=where, max_bytes=MAX_METADATA_BYTES))
    except AttestError as exc:
        raise BootError(str(exc), field="HF_ENDPOINT") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BootError(
            f"{where} is malformed at {'.'.join(map(str, first['loc']))}: {first['msg']}", field="HF_ENDPOINT"
        ) from None
    if not REVISION_RE.fullmatch(info.sha):
        raise BootError(f"{where} names commit {info.sha[:80]!r}; expected 40 hex digits", field="HF_ENDPOINT")
    files = []
    for sibling in info.siblings:
        if sibling.lfs and sibling.size is not None and sibling.size != sibling.lfs.size:
            raise BootError(
                f"hub metadata of {sibling.rfilename!r} gives two sizes: {sibling.size} and LFS {sibling.lfs.size}",
                field=sibling.rfilename,
            )
        entry: dict[str, Any] = {"path": sibling.rfilename, "size": sibling.lfs.size if sibling.lfs else sibling.size}
        if sibling.lfs:
            entry["sha256"] = sibling.lfs.sha256
        else:
            entry["git_sha1"] = sibling.blobId
        try:
            files.append(parse_document(LockedFile, entry, label=f"hub metadata file {sibling.rfilename!r}"))
        except AttestError as exc:
            raise BootError(str(exc), field=sibling.rfilename) from None
    return info.sha.lower(), files


def fetch_listing(repo: str, revision: str, *, stall_s: float, endpoint: str = "") -> list[LockedFile]:
    """The hub's file listing at exactly `revision`, read bounded and checked strictly."""
    sha, files = fetch_model_info(repo, revision, stall_s=stall_s, endpoint=endpoint)
    if sha != revision:
        raise BootError(f"hub metadata is for commit {sha}, not the pinned revision {revision}", field="revision")
    return files


def lock_from_listing(repo: str, revision: str, files: list[LockedFile], trust: str) -> CheckpointLock:
    document = {
        "schema_version": "1",
        "repo": repo,
        "revision": revision,
        "trust": trust,
        "files": [
            item.model_dump(mode="json", exclude_none=True) for item in sorted(files, key=lambda item: item.path)
        ],
    }
    try:
        return parse_document(CheckpointLock, document, label="hub metadata")
    except AttestError as exc:
        raise BootError(str(exc), field="HF_ENDPOINT") from None


def compare_with_lock(lock: CheckpointLock, listing: list[LockedFile]) -> None:
    """Any difference between the hub's listing and the lock refuses, naming the file."""
    hub = {item.path: item for item in listing}
    for name in sorted(set(hub) - set(lock.by_path)):
        raise BootError(
            f"the hub lists {name}, which the checkpoint lock does not: refusing a listing that differs from the lock",
            field=name,
        )
    for item in lock.files:
        theirs = hub.get(item.path)
        if theirs is None:
            raise BootError(f"the hub does not list {item.path}, which the checkpoint lock does", field=item.path)
        for what, ours, other in (("size", item.size, theirs.size), (item.algorithm, item.digest, theirs.digest)):
            if ours != other:
                raise BootError(
                    f"hub metadata differs from the checkpoint lock for {item.path}: {what} lock {ours}, hub {other}",
                    field=item.path,
                )


class DownloadProgress:
    """One stderr line for long downloads: bytes, MB/s, ETA."""

    def __init__(self, total: int, files: int, *, enabled: bool) -> None:
        self.total, self.files, self.enabled = total, files, enabled
        self.done = self.done_files = 0
        self.started = time.monotonic()
        self.last = 0.0
        self.lock = threading.Lock()

    def add(self, count: int) -> None:
        with self.lock:
            self.done += count
            now = time.monotonic()
            if self.enabled and now - self.last >= 1.0:
                self.last = now
                self._print(now)

    def file_done(self) -> None:
        with self.lock:
            self.done_files += 1
            if self.enabled and self.done_files == self.files:
                self._print(time.monotonic())

    def _print(self, now: float) -> None:
        rate = self.done / max(now - self.started, 1e-6)
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = f"{eta:.0f} s" if eta != float("inf") else "unknown"
        print(
            f"downloading checkpoint: {self.done_files}/{self.files} files, {self.done / 1e9:.2f}/"
            f"{self.total / 1e9:.2f} GB, {rate / 1e6:.1f} MB/s, ETA {eta_text}",
            file=sys.stderr,
            flush=True,
        )


class _Retry(Exception):
    pass


def _fetch_once(
    url: str, item: LockedFile, partial: Path, limits: Limits, deadline: float, progress: DownloadProgress
) -> Path:
    """One attempt: stream into a temporary file, hashing as it is written."""
    fd, temporary = tempfile.mkstemp(prefix="part-", dir=partial)
    digest = new_digest(item.algorithm, item.size)
    received = flushed = 0
    try:
        with os.fdopen(fd, "wb") as sink:
            with _session().stream(
                "GET", url, headers=_headers(), follow_redirects=True, timeout=httpx.Timeout(limits.stall_s)
            ) as response:
                if response.status_code != 200:
                    retry = response.status_code in RETRYABLE_STATUS
                    message = f"{item.path}: the hub answered HTTP {response.status_code}"
                    raise (_Retry(message) if retry else BootError(message, field=item.path))
                for chunk in response.iter_bytes():
                    received += len(chunk)
                    if received > item.size:
                        raise _Retry(f"{item.path}: the hub sent more than the lock's {item.size} bytes")
                    if time.monotonic() > deadline:
                        raise BootError(
                            f"{item.path}: the download passed its deadline of {limits.deadline_s:g} s "
                            "(DOWNLOAD_DEADLINE_S)",
                            field="DOWNLOAD_DEADLINE_S",
                        )
                    digest.update(chunk)
                    sink.write(chunk)
                    progress.add(len(chunk))
                    if received - flushed >= WRITEBACK_BYTES:
                        sink.flush()
                        # DONTNEED starts asynchronous writeback of the dirty range (Linux).
                        os.posix_fadvise(sink.fileno(), flushed, received - flushed, os.POSIX_FADV_DONTNEED)
                        flushed = received
            sink.flush()
            os.fsync(sink.fileno())
        if received != item.size:
            raise _Retry(f"{item.path}: truncated download ({received} of the lock's {item.size} bytes)")
        if digest.hexdigest() != item.digest:
            raise _Retry(
                f"{item.path}: the hub served other bytes ({item.algorithm} expected {item.digest}, "
                f"received {digest.hexdigest()})"
            )
        return Path(temporary)
    except httpx.TimeoutException:
        os.unlink(temporary)
        raise _Retry(f"{item.path}: no bytes for {limits.stall_s:g} s (DOWNLOAD_STALL_S)") from None
    except httpx.HTTPError as exc:
        os.unlink(temporary)
        raise _Retry(f"{item.path}: {type(exc).__name__}: {exc}") from None
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise BootError(f"{item.path}: cannot write under {partial}: {exc.strerror or exc}", field=item.path) from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def download_file(
    repo: str,
    revision: str,
    item: LockedFile,
    model: Path,
    partial: Path,
    limits: Limits,
    deadline: float,
    progress: DownloadProgress,
    endpoint: str = "",
) -> os.stat_result:
    """The file, verified against the lock as it arrived, in place; bounded retries; never
    half-written. Returns the placed file's stat (its bytes are not read again)."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo, item.path, revision=revision, endpoint=_endpoint(endpoint))
    failures: list[str] = []
    for attempt in range(1, limits.attempts + 1):
        try:
            temporary = _fetch_once(url, item, partial, limits, deadline, progress)
        except _Retry as exc:
            failures.append(str(exc))
            print(f"download attempt {attempt}/{limits.attempts} failed: {exc}", file=sys.stderr, flush=True)
            if attempt < limits.attempts:
                time.sleep(min(2 ** (attempt - 1), 10))
            continue
        try:
            placed = os.stat(temporary)
            place(temporary, model, item.path)
            found = stat_regular(model, item.path)
        except AttestError as exc:
            temporary.unlink(missing_ok=True)
            raise BootError(str(exc), field=item.path) from None
        if found is None or (found.st_ino, found.st_dev, found.st_size) != (
            placed.st_ino,
            placed.st_dev,
            placed.st_size,
        ):
            raise BootError(f"{item.path} was replaced right after it was placed", field=item.path)
        progress.file_done()
        return found
    raise BootError(
        f"{item.path}: no verified download after {limits.attempts} attempts; last: {failures[-1]}", field=item.path
    )
