"""The local checkpoint against its lock: every file, nothing else, no symlink anywhere.

Each locked file is reached without following a symlink (attest.tree), must have the
lock's size and digest (sha256 for LFS files, git blob sha1 otherwise) and be unchanged
while hashed. Expected digests come only from the lock. A file whose identity matches the
receipt (boot.checkpoint.receipt) is not re-hashed; `--full` re-hashes everything. Files the lock does
not list are refused where the engine would load them, listed otherwise.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from attest.errors import AttestError
from attest.hashing import digest_fd
from attest.lock import ARTIFACT_SIGNATURE, WORKING_DIRS, WORKING_FILES, CheckpointLock, LockedFile
from attest.progress import Progress
from attest.reader import loads_object
from attest.tree import open_regular, stat_regular, walk_files
from boot.checkpoint.receipt import Identity, Receipt
from boot.errors import BootError

WEIGHT_INDEX = "model.safetensors.index.json"
# Names of ours inside the model root (partial downloads, rank 0's published verdict): attest.lock.
# What SGLang, transformers and the tokenizers load from a model directory: code under
# --trust-remote-code, weights, configs, tokenizer and template files.
ENGINE_LOADED_SUFFIXES = (
    ".py",
    ".pyc",
    ".so",
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".gguf",
    ".json",
    ".model",
    ".tiktoken",
    ".txt",
    ".jinja",
)
MAX_INDEX_BYTES = 64 * 1024 * 1024


@dataclass
class LocalCheck:
    """Files that match the lock (with their identity) and files that do not (with why)."""

    good: dict[str, Identity] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    hashed: int = 0
    hashed_bytes: int = 0
    reused: int = 0  # vouched for by the receipt's identities
    downloaded: int = 0  # hashed as they arrived, never read again


@dataclass(frozen=True)
class VerifyReport:
    files: int
    hashed: int
    reused: int
    hashed_bytes: int
    seconds: float
    trust: str
    downloaded: int = 0
    listed_extra: tuple[str, ...] = ()

    @property
    def throughput_mb_s(self) -> float:
        return self.hashed_bytes / max(self.seconds, 1e-9) / 1e6


def _hash_one(model: Path, item: LockedFile, progress: Progress) -> tuple[Identity | None, str]:
    try:
        with open_regular(model, item.path) as fd:
            before = os.fstat(fd)
            if before.st_size != item.size:
                return None, f"Wrong file size: {item.path} (expected {item.size} bytes, found {before.st_size})"
            digest = digest_fd(fd, item.algorithm, item.size, on_bytes=progress.add)
            after = os.fstat(fd)
    except AttestError as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"{item.path} cannot be read: {exc.strerror or exc}"
    finally:
        progress.item_done()
    if (before.st_size, before.st_mtime_ns, before.st_ctime_ns) != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ctime_ns,
    ):
        return None, f"checkpoint file changed while it was hashed: {item.path}"
    if digest != item.digest:
        return None, f"Hash mismatch: {item.path} ({item.algorithm} expected {item.digest}, found {digest})"
    return Identity.of(after), ""


def check_local(
    model: Path,
    lock: CheckpointLock,
    receipt: Receipt | None,
    *,
    rehash_all: bool = False,
    workers: int = 0,
    quiet: bool = False,
) -> LocalCheck:
    """Every locked file on disk, hashed unless the receipt vouches for its exact identity."""
    result = LocalCheck()
    to_hash: list[LockedFile] = []
    for item in lock.files:
        try:
            found = stat_regular(model, item.path)
        except AttestError as exc:
            result.problems[item.path] = str(exc)
            continue
        if found is None:
            result.problems[item.path] = f"checkpoint file is missing: {item.path} (under {model})"
        elif found.st_size != item.size:
            result.problems[item.path] = (
                f"Wrong file size: {item.path} (expected {item.size} bytes, found {found.st_size})"
            )
        elif not rehash_all and receipt is not None and receipt.files.get(item.path) == Identity.of(found):
            result.good[item.path] = Identity.of(found)
            result.reused += 1
        else:
            to_hash.append(item)
    result.hashed = len(to_hash)
    result.hashed_bytes = sum(item.size for item in to_hash)
    progress = Progress(result.hashed_bytes, len(to_hash), "verifying checkpoint", enabled=False if quiet else None)
    with ThreadPoolExecutor(max(1, workers or min(32, os.cpu_count() or 1))) as pool:
        for item, (identity, problem) in zip(to_hash, pool.map(lambda i: _hash_one(model, i, progress), to_hash)):
            if identity is None:
                result.problems[item.path] = problem
            else:
                result.good[item.path] = identity
                if not quiet:
                    print(f"Verified {item.path}", flush=True)
    return result


def unexpected_files(model: Path, lock: CheckpointLock) -> tuple[list[str], list[str]]:
    """(refused, listed): files the lock does not name; refused where the engine would load
    them or where they are symlinks."""
    listed = lock.by_path
    refused, extra = [], []
    for name, is_link in walk_files(model, WORKING_FILES, WORKING_DIRS):
        if name in listed and not is_link:
            continue
        if name == ARTIFACT_SIGNATURE and not is_link:
            continue  # the model artifact's signature (tools/model), never loaded by the engine
        if is_link or name.lower().endswith(ENGINE_LOADED_SUFFIXES):
            refused.append(name + (" (symlink)" if is_link else ""))
        else:
            extra.append(name)
    return sorted(refused), sorted(extra)


def check_weight_index(model: Path, lock: CheckpointLock) -> None:
    """Every shard the (verified) weight index names is a locked file."""
    item = lock.by_path.get(WEIGHT_INDEX)
    if item is None:
        return
    try:
        with open_regular(model, WEIGHT_INDEX) as fd:
            data = os.pread(fd, MAX_INDEX_BYTES + 1, 0)
        if len(data) > MAX_INDEX_BYTES:
            raise AttestError(f"{WEIGHT_INDEX} is larger than {MAX_INDEX_BYTES} bytes", field=WEIGHT_INDEX)
        weight_map = loads_object(data, label=WEIGHT_INDEX, max_bytes=MAX_INDEX_BYTES).get("weight_map")
    except AttestError as exc:
        raise BootError(str(exc), field=WEIGHT_INDEX) from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise BootError(f"{WEIGHT_INDEX} has no readable weight_map", field=WEIGHT_INDEX)
    missing = sorted(set(weight_map.values()) - set(lock.by_path))
    if missing:
        raise BootError(
            f"weight index names shards that the checkpoint lock does not list: {missing[:5]}", field=WEIGHT_INDEX
        )


def finish(
    model: Path,
    lock: CheckpointLock,
    check: LocalCheck,
    *,
    started: float,
    trust: str,
    quiet: bool = False,
    refuse_extra: bool = False,
) -> VerifyReport:
    """The checks after every file matched: nothing unexpected (`refuse_extra`: nothing at all
    the lock does not list), the index covered."""
    refused, extra = unexpected_files(model, lock)
    if refuse_extra:
        refused, extra = sorted(refused + extra), []
    if refused:
        raise BootError(
            f"files in {model} that the checkpoint lock does not list and the engine would load: "
            f"{refused[:5]}{' …' if len(refused) > 5 else ''}; remove them",
            field=refused[0].split(" ")[0],
        )
    if extra and not quiet:
        print(
            f"note: {len(extra)} file(s) in {model} are not in the checkpoint lock (not loaded by the engine): "
            f"{extra[:5]}",
            file=sys.stderr,
            flush=True,
        )
    check_weight_index(model, lock)
    seconds = time.monotonic() - started
    report = VerifyReport(
        len(lock.files), check.hashed, check.reused, check.hashed_bytes, seconds, trust, check.downloaded, tuple(extra)
    )
    if not quiet:
        print(
            f"Verified {report.files} files against the {trust} checkpoint lock in {seconds:.2f} s: "
            f"{report.downloaded} downloaded and hashed as they arrived, {report.hashed} hashed from disk "
            f"({report.hashed_bytes / 1e9:.2f} GB, {report.throughput_mb_s:.0f} MB/s), {report.reused} unchanged "
            "since the receipt",
            file=sys.stderr,
            flush=True,
        )
    return report


def first_problem(lock: CheckpointLock, problems: dict[str, str]) -> BootError:
    name = next(item.path for item in lock.files if item.path in problems)
    return BootError(problems[name], field=name)
