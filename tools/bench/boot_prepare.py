"""Benchmark: getting a checkpoint onto disk, verified, from a hub on loopback.

    bazel run //tools/bench:boot_prepare -- [--gb 2] [--files 8]

One synthetic checkpoint (random LFS shards, served from memory by the tests' loopback
hub), three ways, each into an empty directory:
  (a) huggingface_hub alone: snapshot_download, no verification;
  (b) ours: `boot prepare` against a reviewed lock: download, hashing as the bytes arrive,
      receipt;
  (c) the seed's way: snapshot_download, then hash every file (a second read).
Targets: (b) <= 1.15 x (a), and (b) faster than (c).
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from unittest import mock

from attest.hashing import hash_files_parallel
from boot.prepare import prepare
from boot.settings import REPO, REVISION, BootSettings
from tests.fixtures.deepseek import boot_env, write_lock
from tests.fixtures.hub import HubRepo, LoopbackHub


def _repo(gb: float, files: int) -> HubRepo:
    size = int(gb * 1e9 / files)
    block = os.urandom(1 << 20)
    shards = {f"model-{i:05d}-of-{files:05d}.safetensors": (block * (size // len(block) + 1))[:size - 1] + bytes([i])
              for i in range(files)}
    return HubRepo(REPO, REVISION, {"config.json": b"{}", **shards}, lfs=set(shards))


def _timed(label: str, run) -> float:
    started = time.perf_counter()
    run()
    seconds = time.perf_counter() - started
    print(f"  {label:<44} {seconds:7.2f} s", flush=True)
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--files", type=int, default=8)
    args = parser.parse_args()
    from huggingface_hub import snapshot_download

    repo = _repo(args.gb, args.files)
    total = sum(len(data) for data in repo.files.values())
    print(f"boot_prepare: {len(repo.files)} files, {total / 1e9:.2f} GB from a loopback hub, "
          f"{os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp, LoopbackHub(repo) as hub:
        base = Path(tmp)
        lock = base / "checkpoint.lock.json"
        sha = write_lock(lock, repo)
        env = boot_env(base, HF_ENDPOINT=hub.url, CHECKPOINT_LOCK=str(lock), CHECKPOINT_LOCK_SHA256=sha,
                       VERIFY_WORKERS="0", DOWNLOAD_WORKERS="4")
        with mock.patch.dict(os.environ, env, clear=True):
            def raw() -> None:
                snapshot_download(REPO, revision=REVISION, local_dir=str(base / "raw"), max_workers=4,
                                  endpoint=hub.url)

            def ours() -> None:
                report = prepare(BootSettings.from_env())
                assert report.downloaded == len(repo.files)

            def seed() -> None:
                snapshot_download(REPO, revision=REVISION, local_dir=str(base / "seed"), max_workers=4,
                                  endpoint=hub.url)
                hash_files_parallel([base / "seed" / name for name in repo.files], label="seed verify")

            results = {}
            for name, run, folder in (("(a) huggingface_hub snapshot_download", raw, "raw"),
                                      ("(b) ours: download + verify in one pass", ours, "model"),
                                      ("(c) seed: snapshot_download, then hash", seed, "seed")):
                results[name[:3]] = _timed(name, run)
                shutil.rmtree(base / folder, ignore_errors=True)
    a, b, c = results["(a)"], results["(b)"], results["(c)"]
    print(f"  (b)/(a) = {b / a:.2f} (target <= 1.15); (b)/(c) = {b / c:.2f} (target < 1); "
          f"ours {total / b / 1e6:.0f} MB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
