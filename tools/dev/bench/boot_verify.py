"""Benchmark: checkpoint verification throughput, side by side with the machine's limit.

    bazel run //tools/dev/bench:boot_verify -- [--gb 3] [--files 12] [--small 1000] [--speed-seconds 3]

On the same synthetic files (in the page cache): our parallel verify with no receipt,
our warm re-verify (receipt), `sha256sum` run in parallel on all cores, and the limit
(`openssl speed` sha256 per core times cores). Then a warm re-verify of many small files.
Targets: >= 85% of the limit cold; warm re-verify of 1,000 files < 100 ms.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from boot.checkpoint import VerifyReport, resolve_lock
from boot.checkpoint.from_hub import verify_rank0
from boot.settings import REPO, REVISION, BootSettings
from tools.dev.bench.peers import cores as core_count
from tools.dev.bench.peers import openssl_sha256_per_core_mb_s, require


def _make(root: Path, count: int, size: int) -> list[dict]:
    """`count` random files of `size` bytes and their lock entries."""
    root.mkdir(parents=True, exist_ok=True)
    entries = []
    block = os.urandom(1 << 20)
    for index in range(count):
        path = root / f"model-{index:05d}.safetensors"
        digest = hashlib.sha256()
        with path.open("wb") as handle:
            written = 0
            while written < size:
                chunk = block[: min(len(block), size - written)]
                handle.write(chunk)
                digest.update(chunk)
                written += len(chunk)
        entries.append({"path": path.name, "size": size, "sha256": digest.hexdigest()})
    return entries


def _settings(base: Path, model: str, entries: list[dict]) -> BootSettings:
    """Settings that pin a lock of `entries` for the model directory `model`."""
    lock = base / f"{model}.lock.json"
    data = json.dumps(
        {"schema_version": "1", "repo": REPO, "revision": REVISION, "trust": "reviewed", "files": entries}
    ).encode()
    lock.write_bytes(data)
    return BootSettings.from_env(
        {
            "MODEL_PATH": str(base / model),
            "STATE_PATH": str(base / f"state-{model}"),
            "CHECKPOINT_LOCK": str(lock),
            "CHECKPOINT_LOCK_SHA256": hashlib.sha256(data).hexdigest(),
        }
    )


def _verify(settings: BootSettings) -> VerifyReport:
    return verify_rank0(settings, resolve_lock(settings, None, derive=False), download=False, quiet=True)


def _say(message: str) -> None:
    print(f"boot_verify: {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=3.0)
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--speed-seconds", type=int, default=3, help="how long openssl speed measures the limit")
    args = parser.parse_args()
    peers = require("boot_verify", "openssl", "sha256sum")
    cores = core_count()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        base = Path(tmp)
        size = int(args.gb * 1e9 / args.files)
        _say(f"writing {args.files} files, {args.gb:g} GB ...")
        entries = _make(base / "model", args.files, size)
        settings = _settings(base, "model", entries)
        total = size * args.files
        subprocess.run(f"cat {base}/model/* > /dev/null", shell=True, check=True)  # into the page cache

        _say("verifying without a receipt, then with it ...")
        started = time.perf_counter()
        report = _verify(settings)
        cold = time.perf_counter() - started
        started = time.perf_counter()
        warm_report = _verify(settings)
        warm = time.perf_counter() - started
        assert report.hashed == args.files and warm_report.hashed == 0

        _say(f"sha256sum with {cores} processes, openssl speed ({args.speed_seconds} s) ...")
        files = " ".join(str(base / "model" / e["path"]) for e in entries)
        started = time.perf_counter()
        subprocess.run(
            f"printf '%s\\n' {files} | xargs -P {cores} -n 1 {peers['sha256sum']} > /dev/null", shell=True, check=True
        )
        sha256sum = time.perf_counter() - started
        per_core = openssl_sha256_per_core_mb_s(peers["openssl"], args.speed_seconds)
        limit = per_core * cores

        _say(f"{args.small} small files ...")
        small = _settings(base, "small", _make(base / "small", args.small, 4096))
        _verify(small)
        started = time.perf_counter()
        _verify(small)
        small_warm = time.perf_counter() - started
        shutil.rmtree(base / "small")

    ours = total / cold / 1e6
    print(f"verify {args.files} files, {total / 1e9:.2f} GB in the page cache, {cores} cores:")
    print(f"  ours, no receipt        {ours:8.0f} MB/s  ({cold:.2f} s)  = {ours / limit:.0%} of the limit")
    print(f"  sha256sum x{cores} (xargs -P) {total / sha256sum / 1e6:8.0f} MB/s  ({sha256sum:.2f} s)")
    print(f"  limit: openssl speed    {limit:8.0f} MB/s  ({per_core:.0f} MB/s per core x {cores})")
    print(f"  ours, warm (receipt)    {warm * 1000:8.1f} ms for {args.files} files")
    print(f"  ours, warm, {args.small} small files {small_warm * 1000:6.1f} ms (target < 100 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
