"""File hashing: one file, or many in parallel with a progress line on long work.

hashlib releases the GIL while digesting large buffers, so threads use every core
without the start-up cost of processes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable, Iterable

from attest.errors import AttestError
from attest.progress import Progress

CHUNK = 4 * 1024 * 1024


SHA256 = "sha256"
GIT_SHA1 = "git-sha1"  # git's blob id: sha1 over "blob <size>\0" + content


def new_digest(algorithm: str, size: int) -> "hashlib._Hash":
    """A running digest; git's blob id hashes a header carrying the size first."""
    if algorithm == SHA256:
        return hashlib.sha256()
    if algorithm == GIT_SHA1:
        digest = hashlib.sha1(usedforsecurity=False)
        digest.update(b"blob %d\0" % size)
        return digest
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def digest_fd(fd: int, algorithm: str, size: int, *, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex digest of an open file read from its start, in 4 MiB chunks into one reused buffer."""
    digest = new_digest(algorithm, size)
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    offset = 0
    while True:
        read = os.preadv(fd, [buffer], offset)
        if not read:
            break
        offset += read
        digest.update(view[:read])
        if on_bytes:
            on_bytes(read)
    return digest.hexdigest()


def digest_file(path: Path, algorithm: str = SHA256, *, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex digest of a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return digest_fd(fd, algorithm, os.fstat(fd).st_size, on_bytes=on_bytes)
        finally:
            os.close(fd)
    except OSError as exc:
        raise AttestError(f"cannot hash local file: {path}", field=str(path)) from exc


def sha256_file(path: Path, *, on_bytes: Callable[[int], None] | None = None) -> str:
    return digest_file(path, SHA256, on_bytes=on_bytes)


def hash_files_parallel(
    paths: Iterable[Path],
    *,
    label: str,
    workers: int | None = None,
    algorithm_of: Callable[[Path], str] = lambda path: SHA256,
    progress_enabled: bool | None = None,
    progress: "Progress | None" = None,
) -> dict[Path, str]:
    """Digest of every path (sha256 unless `algorithm_of` says otherwise), in parallel;
    a progress line appears for work over 1 GiB."""
    paths = list(paths)
    sizes = {}
    for path in paths:
        try:
            sizes[path] = path.stat().st_size
        except OSError as exc:
            raise AttestError(f"cannot hash local file: {path}", field=str(path)) from exc
    progress = progress or Progress(sum(sizes.values()), len(paths), label, enabled=progress_enabled)

    def one(path: Path) -> tuple[Path, str]:
        digest = digest_file(path, algorithm_of(path), on_bytes=progress.add)
        progress.item_done()
        return path, digest

    from concurrent.futures import ThreadPoolExecutor  # a start that hashes nothing does not pay for it

    workers = workers or min(32, (os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return dict(pool.map(one, paths))
