"""Checkpoint verification against the hub's file metadata, with a receipt.

Every file: inside the model root, exact size, then sha256 (LFS) or git blob sha1
(others), and unchanged while hashed. The receipt (`verification.json`) lets a file whose
size, mtime_ns and inode are unchanged and whose expected digest is the same skip
re-hashing. The old receipt is withdrawn before checking, so a failed or interrupted run
never leaves a "verified" receipt behind.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from attest.errors import AttestError
from attest.hashing import GIT_SHA1, SHA256, Progress, hash_files_parallel
from boot.errors import BootError
from boot.state import load, save

RECEIPT = "verification.json"
WEIGHT_INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class FileEntry:
    """One file of the pinned revision, as the hub describes it."""

    name: str
    size: int
    digest: str
    algorithm: str  # SHA256 for LFS files, GIT_SHA1 otherwise

    @classmethod
    def from_sibling(cls, sibling: Any) -> "FileEntry":
        """From huggingface_hub's RepoSibling (model_info(files_metadata=True))."""
        lfs = getattr(sibling, "lfs", None)
        if lfs:
            sha = lfs["sha256"] if isinstance(lfs, dict) else lfs.sha256
            return cls(sibling.rfilename, int(sibling.size), sha, SHA256)
        return cls(sibling.rfilename, int(sibling.size), sibling.blob_id, GIT_SHA1)

    def public_dict(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "digest": self.digest, "algorithm": self.algorithm}


@dataclass(frozen=True)
class VerifyReport:
    files: int
    hashed: int
    reused: int
    hashed_bytes: int
    seconds: float

    @property
    def throughput_mb_s(self) -> float:
        return self.hashed_bytes / max(self.seconds, 1e-9) / 1e6


def _identity(stat: os.stat_result) -> dict[str, int]:
    return {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}


def withdraw_receipt(state: Path) -> dict[str, Any]:
    """Remove the receipt (so nothing claims "verified" while we check) and return it."""
    old = load(state, RECEIPT) or {}
    (state / RECEIPT).unlink(missing_ok=True)
    return old if isinstance(old, dict) else {}


def verify_checkpoint(
    model: Path,
    entries: Iterable[FileEntry],
    *,
    state: Path,
    revision: str,
    workers: int = 0,
    quiet: bool = False,
    rehash_all: bool = False,
    previous: dict[str, Any] | None = None,
) -> VerifyReport:
    """Verify `entries` under `model`; `previous` is a receipt already withdrawn by the
    caller (else the current one is read and withdrawn here)."""
    started = time.monotonic()
    entries = list(entries)
    old = withdraw_receipt(state) if previous is None else previous
    reusable = old.get("revision") == revision and not rehash_all
    cached = {f["name"]: f for f in old.get("files", [])} if reusable else {}

    root = model.resolve()
    to_hash: dict[Path, tuple[FileEntry, dict[str, int]]] = {}
    verified: dict[str, dict[str, Any]] = {}
    for entry in entries:
        path = model / entry.name
        try:
            resolved = path.resolve(strict=True)
        except OSError:
            raise BootError(f"checkpoint file is missing: {entry.name}", field=entry.name) from None
        if not resolved.is_relative_to(root) or resolved == root:
            raise BootError(f"checkpoint file escapes the model root: {entry.name}", field=entry.name)
        before = resolved.stat()
        if before.st_size != entry.size:
            raise BootError(
                f"Wrong file size: {entry.name} (expected {entry.size} bytes, found {before.st_size})", field=entry.name
            )
        identity = _identity(before)
        previous = cached.get(entry.name, {})
        if previous.get("digest") == entry.digest and all(previous.get(k) == v for k, v in identity.items()):
            verified[entry.name] = previous
            continue
        to_hash[resolved] = (entry, identity)

    hashed_bytes = sum(entry.size for entry, _ in to_hash.values())
    progress = Progress(hashed_bytes, len(to_hash), "verifying checkpoint", enabled=None if not quiet else False)
    try:
        digests = hash_files_parallel(
            to_hash, label="verifying checkpoint", workers=workers or None,
            algorithm_of=lambda p: to_hash[p][0].algorithm, progress=progress,
        )
    except AttestError as exc:
        raise BootError(str(exc), field=exc.field) from None
    for path, (entry, identity) in to_hash.items():
        if digests[path] != entry.digest:
            raise BootError(
                f"Hash mismatch: {entry.name} ({entry.algorithm} expected {entry.digest}, found {digests[path]})",
                field=entry.name,
            )
        if _identity(path.stat()) != identity:
            raise BootError(f"checkpoint file changed while it was hashed: {entry.name}", field=entry.name)
        verified[entry.name] = {"name": entry.name, "digest": entry.digest, **identity}
        if not quiet:
            print(f"Verified {entry.name}", flush=True)

    index_path = model / WEIGHT_INDEX
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
            shards = set(weight_map.values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise BootError(f"{WEIGHT_INDEX} has no readable weight_map", field=WEIGHT_INDEX) from None
        missing = sorted(shards - set(verified))
        if missing:
            raise BootError(
                f"weight index names shards that were not verified: {missing[:5]}", field=WEIGHT_INDEX
            )
    files = [verified[entry.name] for entry in entries]
    seconds = time.monotonic() - started
    report = VerifyReport(len(entries), len(to_hash), len(entries) - len(to_hash), hashed_bytes, seconds)
    save(state, RECEIPT, {
        "revision": revision,
        "status": "verified",
        "files": files,
        "expected": [entry.public_dict() for entry in entries],
    })
    if not quiet:
        print(f"Verified {report.files} files ({report.hashed} hashed, {report.reused} unchanged since the receipt): "
              f"{hashed_bytes / 1e9:.2f} GB in {seconds:.2f} s, {report.throughput_mb_s:.0f} MB/s",
              file=sys.stderr, flush=True)
    return report


def entries_from_receipt(state: Path, revision: str) -> list[FileEntry]:
    """What the last verification expected, for an offline re-check (`boot verify`)."""
    receipt = load(state, RECEIPT)
    if not receipt or receipt.get("revision") != revision or receipt.get("status") != "verified":
        raise BootError(
            f"no verified receipt for revision {revision} in {state / RECEIPT}; run `boot prepare` first",
            field=RECEIPT,
        )
    try:
        return [FileEntry(e["name"], int(e["size"]), e["digest"], e["algorithm"]) for e in receipt["expected"]]
    except (KeyError, TypeError, ValueError):
        raise BootError(f"{RECEIPT} has no readable expected file list", field=RECEIPT) from None
