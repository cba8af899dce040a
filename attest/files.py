"""Atomic file writes: a reader sees the old file or the new one, never a torn one."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write `data` to `path` via a temporary file in the same directory, created with
    `mode` from its first byte, fsynced, then renamed over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def canonical_json(value: Any) -> bytes:
    """Sorted keys, two-space indent, trailing newline: stable bytes for stable digests."""
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
