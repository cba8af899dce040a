"""attest.hashing against independent digests: chunk boundaries, git blob ids, parallel
hashing, unreadable files, and the progress line's thresholds."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from attest.errors import AttestError
from attest.hashing import CHUNK, GIT_SHA1, SHA256, digest_fd, digest_file, hash_files_parallel, new_digest, sha256_file
from attest.progress import PROGRESS_AFTER_BYTES, Progress

SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7]


def _content(size: int) -> bytes:
    return (hashlib.sha256(str(size).encode()).digest() * (size // 32 + 1))[:size]


@pytest.mark.parametrize("size", SIZES)
def test_sha256_of_every_chunk_boundary(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(_content(size))
    assert sha256_file(path) == hashlib.sha256(_content(size)).hexdigest()
    seen = []
    assert digest_file(path, SHA256, on_bytes=seen.append) == hashlib.sha256(_content(size)).hexdigest()
    assert sum(seen) == size and all(0 < part <= CHUNK for part in seen)


@pytest.mark.parametrize("size", [0, 5, CHUNK + 1])
def test_git_blob_id_matches_git(tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(_content(size))
    expected = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout
    assert digest_file(path, GIT_SHA1) == expected.strip()


def test_digest_fd_reads_from_the_start_whatever_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"abcdef")
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 3, os.SEEK_SET)
        assert digest_fd(fd, SHA256, 6) == hashlib.sha256(b"abcdef").hexdigest()
    finally:
        os.close(fd)


def test_an_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'"):
        new_digest("md5", 0)


@pytest.mark.parametrize("kind", ["missing", "directory", "unreadable"])
def test_a_file_that_cannot_be_hashed_is_a_refusal_naming_it(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "f"
    if kind == "directory":
        path.mkdir()
    elif kind == "unreadable":
        path.write_bytes(b"x")
        path.chmod(0)
        if os.access(path, os.R_OK):
            pytest.skip("root reads any file")
    with pytest.raises(AttestError) as caught:
        sha256_file(path)
    assert caught.value.field == str(path) and "cannot hash local file" in str(caught.value)
    if kind == "missing":
        with pytest.raises(AttestError) as caught:
            hash_files_parallel([path], label="x")
        assert caught.value.field == str(path)


@pytest.mark.parametrize("workers", [None, 1, 3])
def test_parallel_hashing_gives_every_file_its_own_digest(tmp_path: Path, workers) -> None:
    paths = []
    for size in SIZES:
        path = tmp_path / f"f{size}"
        path.write_bytes(_content(size))
        paths.append(path)
    git = tmp_path / "g"
    git.write_bytes(b"hello\n")
    digests = hash_files_parallel(
        [*paths, git], label="x", workers=workers, algorithm_of=lambda p: GIT_SHA1 if p == git else SHA256
    )
    assert digests == {
        **{p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths},
        git: "ce013625030ba8dba906f756967f9e9ca394464a",
    }


def test_progress_is_quiet_below_the_threshold_and_prints_at_it() -> None:
    assert Progress(PROGRESS_AFTER_BYTES - 1, 1, "x").enabled is False
    assert Progress(PROGRESS_AFTER_BYTES, 1, "x").enabled is True
    assert Progress(0, 1, "x", enabled=True).enabled is True
    lines: list[str] = []
    progress = Progress(2000, 2, "hashing", enabled=True, emit=lines.append)
    progress.add(1000)
    assert len(lines) == 1 and lines[0].startswith("hashing: 0/2 files, 0.00/0.00 GB, ")
    progress.add(500)  # within a second of the last line: not printed again
    assert len(lines) == 1
    progress.item_done()
    progress.item_done("last")  # the last item always prints
    assert (
        len(lines) == 2 and lines[1].startswith("hashing: 2/2 files, 0.00/0.00 GB, ") and lines[1].endswith(" (last)")
    )
    assert (progress.done_bytes, progress.done_items) == (1500, 2) and progress.throughput_mb_s > 0
    quiet: list[str] = []
    silent = Progress(2000, 1, "x", enabled=False, emit=quiet.append)
    silent.add(10)
    silent.item_done()
    assert quiet == []


def test_progress_counts_this_runs_rate_apart_from_resumed_bytes() -> None:
    lines: list[str] = []
    progress = Progress(2_000_000_000, 1, "", unit="blobs", enabled=True, interval_s=0, emit=lines.append)
    progress.add_resumed(1_000_000_000)
    progress.add(500_000_000)
    progress.item_done("uploaded")
    assert lines == [lines[0]] and lines[0].startswith("1/1 blobs, 1.50/2.00 GB (1.00 GB resumed), ")
    assert progress.throughput_mb_s < progress.done_bytes / 1e6 / max(time.monotonic() - progress.started, 1e-6)


def test_progress_writes_to_stderr_by_default(capsys) -> None:
    progress = Progress(10, 1, "hashing", enabled=True)
    progress.item_done()
    assert capsys.readouterr().err.startswith("hashing: 1/1 files")


def test_a_callers_progress_receives_the_bytes_and_files(tmp_path: Path) -> None:
    paths = []
    for index in range(3):
        paths.append(tmp_path / f"f{index}")
        paths[-1].write_bytes(b"x" * (index + 1))
    progress = Progress(6, 3, "x", enabled=False)
    hash_files_parallel(paths, label="x", progress=progress)
    assert (progress.done_bytes, progress.done_items) == (6, 3)
