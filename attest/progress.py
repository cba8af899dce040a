"""The one progress line of long work (hashing, downloads, pushes): items and bytes done of the
total, bytes resumed from an earlier run said apart, this run's rate and the time left."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable

PROGRESS_AFTER_BYTES = 1 << 30  # below this, hashing is quick enough to stay quiet


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Progress:
    """`label: 3/8 files, 1.20/4.00 GB (0.40 GB resumed), 212.3 MB/s, ETA 4 s`, at most once per
    `interval_s` while bytes arrive, after each item when `interval_s` is 0, and always after the
    last item. Thread-safe: parallel workers report into one line. Quiet unless `enabled` (by
    default: work of PROGRESS_AFTER_BYTES or more)."""

    def __init__(
        self,
        total_bytes: int,
        total_items: int,
        label: str,
        *,
        unit: str = "files",
        enabled: bool | None = None,
        interval_s: float = 1.0,
        emit: Callable[[str], None] = _to_stderr,
    ) -> None:
        self.total_bytes, self.total_items, self.label, self.unit = total_bytes, total_items, label, unit
        self.enabled = total_bytes >= PROGRESS_AFTER_BYTES if enabled is None else enabled
        self.interval_s, self.emit = interval_s, emit
        self.done_bytes = self.done_items = self.resumed = 0
        self.started = time.monotonic()
        self.last = 0.0
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        """`count` bytes done (negative: bytes given back, when a partial file restarts)."""
        with self._lock:
            self.done_bytes += count
            now = time.monotonic()
            if self.enabled and self.interval_s and now - self.last >= self.interval_s:
                self._print(now)

    def add_resumed(self, count: int) -> None:
        """Bytes an earlier run already did: done, but not this run's rate."""
        with self._lock:
            self.done_bytes += count
            self.resumed += count

    def item_done(self, note: str = "") -> None:
        with self._lock:
            self.done_items += 1
            if self.enabled and (not self.interval_s or self.done_items == self.total_items):
                self._print(time.monotonic(), note)

    @property
    def throughput_mb_s(self) -> float:
        return (self.done_bytes - self.resumed) / max(time.monotonic() - self.started, 1e-6) / 1e6

    def _print(self, now: float, note: str = "") -> None:
        self.last = now
        rate = max(self.done_bytes - self.resumed, 0) / max(now - self.started, 1e-6)
        left = max(self.total_bytes - self.done_bytes, 0)
        eta = f"{left / rate:.0f} s" if rate > 0 else "unknown"
        resumed = f" ({self.resumed / 1e9:.2f} GB resumed)" if self.resumed else ""
        self.emit(
            (f"{self.label}: " if self.label else "")
            + f"{self.done_items}/{self.total_items} {self.unit}, {self.done_bytes / 1e9:.2f}/"
            f"{self.total_bytes / 1e9:.2f} GB{resumed}, {rate / 1e6:.1f} MB/s, ETA {eta}"
            + (f" ({note})" if note else "")
        )
