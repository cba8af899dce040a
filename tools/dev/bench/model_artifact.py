"""Benchmark: a model checkpoint as an OCI artifact, tools/model against the tools a user has.

    bazel run //tools/dev/bench:model_artifact -- [--size-gb 4] [--files 8] [--small-files 100]

1. pack + push of a synthetic checkpoint (`--files` incompressible shards, `--size-gb` in all)
   to a fresh loopback docker-registry, against `crane push` of the same layer blobs already
   written out as an OCI layout, to another fresh registry. Peak RSS of each (ru_maxrss).
2. Re-push of a `--small-files` checkpoint whose blobs are all there: wall time, HEADs only.
3. pull (files written, each hashed against the lock as it arrives) of the large artifact,
   against `openssl speed sha256` on all cores: the share of the hashing ceiling reached.

Each run is a child process, so its peak memory is its own. Results go to stdout as a table;
docs/models.md records them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.fixtures.model import synthetic_checkpoint
from tests.fixtures.registry import LoopbackRegistry
from tools.dev.bench.peers import cores, openssl_sha256_per_core_mb_s, require
from tools.model.layers import stream_file_layer
from tools.model.pack import load_lock_bytes, pack
from tools.oci.build.image import assemble
from tools.oci.format.layout import OCI_LAYER_TAR


def _timed_child(argv: list[str]) -> tuple[float, int, str]:
    """(seconds, peak RSS in MB, stdout) of a child process. The peak is the child's VmHWM, read
    from /proc while it runs (rusage's ru_maxrss would count the benchmark's own memory, which
    the child holds between fork and exec)."""
    peak = [0]

    def watch(pid: int) -> None:
        while True:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return
            found = re.search(r"VmHWM:\s+(\d+) kB", status)
            if found is None:  # a zombie: it has exited
                return
            peak[0] = max(peak[0], int(found.group(1)))
            time.sleep(0.02)

    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors)
        watcher = threading.Thread(target=watch, args=(process.pid,), daemon=True)
        watcher.start()
        output = process.stdout.read()
        status = process.wait()
        seconds = time.perf_counter() - started
        watcher.join()
        if status != 0:
            errors.seek(0)
            raise SystemExit(f"{' '.join(argv[:5])} failed: {errors.read().decode()[-3000:]}")
    return seconds, peak[0] // 1024, output.decode()


def _model(*args: str) -> list[str]:
    return [sys.executable, "-m", "tools.model.cli", *args]


def _crane_layout(work: Path, root: Path, lock_path: Path) -> Path:
    """The artifact's layer blobs written out as an OCI image layout, for crane."""
    lock, data = load_lock_bytes(lock_path)
    artifact = pack(root, lock, data, platform="linux/amd64", quiet=True)
    descriptors = []
    for layer in artifact.files:
        blob = work / f"{layer.digest[7:]}.tar"
        with blob.open("wb") as handle:
            for piece in stream_file_layer(root, layer.item):
                handle.write(piece)
        descriptor = {"mediaType": OCI_LAYER_TAR, "digest": layer.digest, "size": layer.size, "diff_id": layer.digest}
        descriptors.append((descriptor, blob))
    assemble(work / "crane-layout", {"os": "linux", "architecture": "amd64"}, descriptors, None)
    for _, blob in descriptors:
        blob.unlink()
    return work / "crane-layout"


def _pull_in_memory(work: Path, size: int) -> tuple[float, int, str]:
    """An artifact of `size` bytes (1 GB: small enough to stay in the page cache here) pulled into
    tmpfs: the hashing path without the disk."""
    root, lock = work / "memory", work / "memory.lock.json"
    synthetic_checkpoint(root, lock, files=2, total_bytes=size)
    place = Path("/dev/shm") / f"omni-bench-{os.getpid()}"
    with LoopbackRegistry() as registry:
        _timed_child(_model("pack", "--model", str(root), "--lock", str(lock), "--output", str(work / "memory-pack")))
        out = _timed_child(_model("push", str(work / "memory-pack"), f"{registry.host}/bench/memory:1", "--unsigned"))[
            2
        ]
        os.sync()
        try:
            return _timed_child(_model("pull", json.loads(out)["image"], str(place), "--lock", str(lock)))
        finally:
            shutil.rmtree(place, ignore_errors=True)


def _disk_write_mb_s(dd: str, work: Path, megabytes: int) -> str:
    done = subprocess.run(
        [dd, "if=/dev/zero", f"of={work / 'dd'}", "bs=1M", f"count={megabytes}", "conv=fdatasync"],
        capture_output=True,
        text=True,
    )
    (work / "dd").unlink(missing_ok=True)
    return done.stderr.strip().splitlines()[-1].split(",")[-1].strip()


def _small_files(work: Path, count: int) -> list[tuple[str, str]]:
    """A push of `count` 1 MB files, then the same push again (every blob present)."""
    small, small_lock = work / "small", work / "small.lock.json"
    synthetic_checkpoint(small, small_lock, files=count, total_bytes=count << 20)
    with LoopbackRegistry() as registry:
        _timed_child(
            _model("pack", "--model", str(small), "--lock", str(small_lock), "--output", str(work / "small-pack"))
        )
        target = f"{registry.host}/bench/small:1"
        first_s, _, _ = _timed_child(_model("push", str(work / "small-pack"), target, "--unsigned"))
        again_s, _, out = _timed_child(_model("push", str(work / "small-pack"), target, "--unsigned"))
    uploaded = json.loads(out)["uploaded"]
    return [
        (f"push of {count} files (1 MB each), first", f"{first_s:.2f} s"),
        (f"re-push, every blob present ({uploaded} uploaded)", f"{again_s:.2f} s"),
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=4.0)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--small-files", type=int, default=100)
    parser.add_argument("--memory-gb", type=float, default=1.0, help="the artifact pulled into tmpfs")
    parser.add_argument("--speed-seconds", type=int, default=3, help="how long openssl speed measures the limit")
    parser.add_argument("--dd-mb", type=int, default=1024, help="what dd writes to measure the disk")
    return parser


def _pull_rows(pulls: dict, ceiling: float) -> list[tuple[str, str]]:
    """A row per pull: its time, its rate against openssl's sha256 on every core, its RSS."""
    rows = []
    for (where, size), (pull_s, pull_rss, _) in pulls.items():
        rate = size / pull_s / 1e6
        rows.append(
            (
                f"tools/model pull + verify of {size / 1e9:.2g} GB, to {where}",
                f"{pull_s:.2f} s, {rate:.0f} MB/s ({rate / ceiling * 100:.0f}% of openssl), {pull_rss} MB RSS",
            )
        )
    return rows


def main() -> int:
    args = _parser().parse_args()
    peers = require("model_artifact", "crane", "docker-registry", "openssl", "dd")
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        work = Path(tmp)
        root, lock = work / "checkpoint", work / "lock.json"
        print(f"model_artifact: writing {args.size_gb:g} GB in {args.files} files ...", file=sys.stderr, flush=True)
        synthetic_checkpoint(root, lock, files=args.files, total_bytes=int(args.size_gb * 1e9))
        total = sum(p.stat().st_size for p in root.iterdir())
        layout = _crane_layout(work, root, lock)
        with LoopbackRegistry() as theirs:
            crane_s, crane_rss, _ = _timed_child(
                [peers["crane"], "push", "--insecure", str(layout), f"{theirs.host}/bench/crane:1"]
            )
        shutil.rmtree(layout)
        with LoopbackRegistry() as ours:
            one_s, one_rss, out = _timed_child(
                _model("push", "--model", str(root), "--lock", str(lock), f"{ours.host}/bench/one:1", "--unsigned")
            )
            image = json.loads(out)["image"]
        with LoopbackRegistry() as ours:
            pack_s, pack_rss, _ = _timed_child(
                _model("pack", "--model", str(root), "--lock", str(lock), "--output", str(work / "pack"))
            )
            push_s, push_rss, out = _timed_child(
                _model("push", str(work / "pack"), f"{ours.host}/bench/model:1", "--unsigned")
            )
            image = json.loads(out)["image"]
            os.sync()  # the registry's writes reach the disk first: the pulls then read, not fight writeback
            pulls = {}
            pulls["disk", total] = _timed_child(_model("pull", image, str(work / "pulled"), "--lock", str(lock)))
            shutil.rmtree(work / "pulled")
        memory = int(args.memory_gb * 1e9)
        pulls["tmpfs, page cache warm", memory] = _pull_in_memory(work, memory)
        rows += [
            ("crane push (layout already written)", f"{crane_s:.2f} s, {crane_rss} MB RSS"),
            ("tools/model push --model --lock (one pass)", f"{one_s:.2f} s, {one_rss} MB RSS"),
            ("one pass / crane push", f"{one_s / crane_s:.2f}x"),
            (
                "tools/model pack, then push of the pack",
                f"{pack_s:.2f} s + {push_s:.2f} s, {max(pack_rss, push_rss)} MB RSS",
            ),
            ("pack + push / crane push", f"{(pack_s + push_s) / crane_s:.2f}x"),
        ]
        ceiling = openssl_sha256_per_core_mb_s(peers["openssl"], args.speed_seconds) * cores()
        rows += _pull_rows(pulls, ceiling)
        rows.append((f"openssl speed sha256 ({cores()} cores)", f"{ceiling:.0f} MB/s"))
        rows.append(("disk write (dd, fdatasync)", _disk_write_mb_s(peers["dd"], work, args.dd_mb)))
        rows += _small_files(work, args.small_files)
    width = max(len(name) for name, _ in rows)
    print(f"{total / 1e9:.2f} GB in {args.files} files, loopback docker-registry, {os.cpu_count()} cores")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
