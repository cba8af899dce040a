"""File hashing: one file, or many in parallel with a progress line on long work.

hashlib releases the GIL while digesting large buffers, so threads use every core
without the start-up cost of processes.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, TextIO

from attest.errors import AttestError

CHUNK = 4 * 1024 * 1024
PROGRESS_AFTER_BYTES = 1 << 30  # below this, hashing is quick enough to stay quiet


def sha256_file(path: Path, *, on_bytes: Callable[[int], None] | None = None) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb", buffering=0) as handle:
            buffer = bytearray(CHUNK)
            view = memoryview(buffer)
            while True:
                read = handle.readinto(buffer)
                if not read:
                    break
                digest.update(view[:read])
                if on_bytes:
                    on_bytes(read)
    except OSError as exc:
        raise AttestError(f"cannot hash local file: {path}", field=str(path)) from exc
    return digest.hexdigest()


class Progress:
    """A single self-overwriting stderr line: done/total bytes, rate, files."""

    def __init__(self, total_bytes: int, total_files: int, label: str, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.total_bytes, self.total_files, self.label = total_bytes, total_files, label
        self.stream = stream or sys.stderr
        self.enabled = total_bytes >= PROGRESS_AFTER_BYTES if enabled is None else enabled
        self.done_bytes = self.done_files = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._last = 0.0

    def add_bytes(self, count: int) -> None:
        with self._lock:
            self.done_bytes += count
            self._maybe_print()

    def file_done(self) -> None:
        with self._lock:
            self.done_files += 1
            self._maybe_print(force=self.done_files == self.total_files)

    def _maybe_print(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.5):
            return
        self._last = now
        elapsed = max(now - self.started, 1e-6)
        rate = self.done_bytes / elapsed / 1e6
        self.stream.write(
            f"\r{self.label}: {self.done_files}/{self.total_files} files, "
            f"{self.done_bytes / 1e9:.2f}/{self.total_bytes / 1e9:.2f} GB, {rate:.0f} MB/s"
        )
        if force:
            self.stream.write("\n")
        self.stream.flush()

    @property
    def throughput_mb_s(self) -> float:
        return self.done_bytes / max(time.monotonic() - self.started, 1e-6) / 1e6


def hash_files_parallel(
    paths: Iterable[Path],
    *,
    label: str,
    workers: int | None = None,
    hasher: Callable[[Path, Callable[[int], None]], str] | None = None,
    progress_enabled: bool | None = None,
) -> dict[Path, str]:
    """sha256 of every path, in parallel; a progress line appears for work over 1 GiB."""
    paths = list(paths)
    sizes = {}
    for path in paths:
        try:
            sizes[path] = path.stat().st_size
        except OSError as exc:
            raise AttestError(f"cannot hash local file: {path}", field=str(path)) from exc
    progress = Progress(sum(sizes.values()), len(paths), label, enabled=progress_enabled)
    run = hasher or (lambda path, on_bytes: sha256_file(path, on_bytes=on_bytes))

    def one(path: Path) -> tuple[Path, str]:
        digest = run(path, progress.add_bytes)
        progress.file_done()
        return path, digest

    workers = workers or min(32, (os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return dict(pool.map(one, paths))
