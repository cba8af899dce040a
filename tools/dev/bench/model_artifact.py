"""Benchmark: a model checkpoint as an OCI artifact, tools/model against the tools a user has.

    bazel run //tools/dev/bench:model_artifact -- [--size-gb 4] [--files 8] [--small-files 100]

Side by side in one run, each push to a fresh loopback docker-registry:
1. push of a synthetic checkpoint (`--files` incompressible shards, `--size-gb` in all): ours in
   one pass (`push --model --lock`), and as pack then push; `oras push` of the same files; `crane
   push` of the same layer blobs already written out as an OCI layout.
2. pull, every byte checked against a known digest: ours (files written and fsynced, each hashed
   against the lock as it arrives) against `oras pull` + `sync`, to disk; `boot prepare` with
   MODEL_SOURCE=registry (what the init container runs: the same pull, then the receipt) against
   that pull; and both into tmpfs (`--memory-gb`, page cache warm): the path without the disk.
3. what bounds them here: `openssl speed sha256` on all cores and `dd` with fdatasync.
4. re-push of a `--small-files` checkpoint whose blobs are all there: HEADs only.

Each run is a child process: its wall time, its own CPU time (user + system, from wait4) per GB,
and its peak RSS. oras is optional (Debian 13 packages it; set-up does not install it): without
it the oras rows say so. docs/models.md#performance records the results.
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
from pathlib import Path

from boot.settings import REPO as BOOT_REPO
from boot.settings import REVISION as BOOT_REVISION
from omni_oci.format.layout import OCI_LAYER_TAR
from omni_oci.model.layers import stream_file_layer
from omni_oci.model.pack import load_lock_bytes, pack
from tests.fixtures.model import synthetic_checkpoint
from tests.fixtures.registry import LoopbackRegistry
from tools.dev.bench.children import Run, oras_env, timed_child
from tools.dev.bench.peers import cores, openssl_sha256_per_core_mb_s, optional, require
from tools.oci.build.image import assemble


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


def _oras_push(oras: str, root: Path, target: str) -> Run:
    """oras pushing the checkpoint's files as they are (one layer each, hashed by oras)."""
    files = sorted(path.name for path in root.iterdir())
    return timed_child([oras, "push", "--plain-http", target, *files], cwd=root, env=oras_env())


def _oras_pull(oras: str, reference: str, dest: Path, *, sync: bool) -> Run:
    """oras pulling (each layer checked against its digest) into `dest`; `sync` adds the flush
    to disk that tools/model pull does per file (fsync), so both have their bytes on disk."""
    pulled = timed_child([oras, "pull", "--plain-http", "-o", str(dest), reference], env=oras_env())
    if not sync:
        return pulled
    synced = timed_child(["sync"])  # a child of its own: the peak RSS stays oras's
    return Run(pulled.seconds + synced.seconds, pulled.cpu_s + synced.cpu_s, pulled.rss_mb, pulled.out)


def _pulls_in_memory(work: Path, size: int, oras: str | None) -> dict[str, Run]:
    """An artifact of `size` bytes (small enough to stay in the page cache here) pulled into
    tmpfs by tools/model and by oras: the hashing path without the disk."""
    root, lock = work / "memory", work / "memory.lock.json"
    synthetic_checkpoint(root, lock, files=2, total_bytes=size)
    place = Path("/dev/shm") / f"omni-bench-{os.getpid()}"
    with LoopbackRegistry() as registry:
        timed_child(_model("pack", "--model", str(root), "--lock", str(lock), "--output", str(work / "memory-pack")))
        out = timed_child(_model("push", str(work / "memory-pack"), f"{registry.host}/bench/memory:1", "--unsigned"))
        if oras:
            _oras_push(oras, root, f"{registry.host}/bench/oras-memory:1")
        os.sync()
        try:
            runs = {"tmpfs": timed_child(_model("pull", json.loads(out.out)["image"], str(place), "--lock", str(lock)))}
            shutil.rmtree(place, ignore_errors=True)
            if oras:
                runs["oras tmpfs"] = _oras_pull(oras, f"{registry.host}/bench/oras-memory:1", place, sync=False)
        finally:
            shutil.rmtree(place, ignore_errors=True)
    return runs


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
        timed_child(
            _model("pack", "--model", str(small), "--lock", str(small_lock), "--output", str(work / "small-pack"))
        )
        target = f"{registry.host}/bench/small:1"
        first = timed_child(_model("push", str(work / "small-pack"), target, "--unsigned"))
        again = timed_child(_model("push", str(work / "small-pack"), target, "--unsigned"))
    uploaded = json.loads(again.out)["uploaded"]
    return [
        (f"push of {count} files (1 MB each), first", f"{first.seconds:.2f} s"),
        (f"re-push, every blob present ({uploaded} uploaded)", f"{again.seconds:.2f} s"),
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


def _pushes(work: Path, root: Path, lock: Path, peers: dict[str, str], oras: str | None) -> dict[str, Run]:
    """Each push to its own fresh registry: crane (of a ready layout), oras, ours in one pass, and
    ours as pack then push (which leaves the registry up for the pulls: see _pulls_to_disk)."""
    runs: dict[str, Run] = {}
    layout = _crane_layout(work, root, lock)
    with LoopbackRegistry() as theirs:
        runs["crane push"] = timed_child([peers["crane"], "push", "--insecure", str(layout), f"{theirs.host}/b/c:1"])
    shutil.rmtree(layout)
    if oras:
        with LoopbackRegistry() as theirs:
            runs["oras push"] = _oras_push(oras, root, f"{theirs.host}/bench/oras:1")
    with LoopbackRegistry() as ours:
        runs["one pass"] = timed_child(
            _model("push", "--model", str(root), "--lock", str(lock), f"{ours.host}/bench/one:1", "--unsigned")
        )
    return runs


def _pulls_to_disk(work: Path, root: Path, lock: Path, oras: str | None) -> dict[str, Run]:
    """pack, push, then both pulls from one registry (the registry's writes synced first, so the
    pulls read, not fight writeback)."""
    runs: dict[str, Run] = {}
    with LoopbackRegistry() as ours:
        runs["pack"] = timed_child(
            _model("pack", "--model", str(root), "--lock", str(lock), "--output", str(work / "pack"))
        )
        runs["push of the pack"] = timed_child(
            _model("push", str(work / "pack"), f"{ours.host}/bench/model:1", "--unsigned")
        )
        if oras:
            _oras_push(oras, root, f"{ours.host}/bench/oras:1")
        os.sync()
        image = json.loads(runs["push of the pack"].out)["image"]
        runs["pull"] = timed_child(_model("pull", image, str(work / "pulled"), "--lock", str(lock)))
        shutil.rmtree(work / "pulled")
        os.sync()
        runs["boot prepare"] = timed_child([sys.executable, "-m", "boot", "prepare"], env=_boot_env(work, image, lock))
        shutil.rmtree(work / "boot")
        if oras:
            os.sync()
            runs["oras pull"] = _oras_pull(oras, f"{ours.host}/bench/oras:1", work / "pulled", sync=True)
            shutil.rmtree(work / "pulled")
    return runs


def _boot_env(work: Path, image: str, lock: Path) -> dict[str, str]:
    """boot as the init container of --model-source registry runs it: the artifact by digest, the
    pinned lock, its own model and state directories."""
    return {
        **os.environ,
        "MODEL_SOURCE": "registry",
        "MODEL_ARTIFACT": image,
        "MODEL_PATH": str(work / "boot" / "model"),
        "STATE_PATH": str(work / "boot" / "state"),
        "CHECKPOINT_LOCK": str(lock),
        "CHECKPOINT_LOCK_SHA256": hashlib.sha256(lock.read_bytes()).hexdigest(),
    }


def _ratio(runs: dict[str, Run], ours: str, theirs: str, missing: str) -> str:
    if theirs not in runs:
        return missing
    return f"{runs[ours].seconds / runs[theirs].seconds:.2f}x"


def _rows(total: int, memory: int, runs: dict[str, Run], ceiling: float, missing: str) -> list[tuple[str, str]]:
    """The table: each run's time, client CPU per GB and peak RSS, and ours against each peer's."""
    oras = {
        name: runs[name].row(size) if name in runs else missing
        for name, size in (("oras push", total), ("oras pull", total), ("oras tmpfs", memory))
    }
    pack_push = runs["pack"].seconds + runs["push of the pack"].seconds
    return [
        ("crane push (layout already written)", runs["crane push"].row(total)),
        ("oras push (the files, hashed by oras)", oras["oras push"]),
        ("tools/model push --model --lock (one pass)", runs["one pass"].row(total)),
        ("one pass / oras push", _ratio(runs, "one pass", "oras push", missing)),
        ("one pass / crane push", _ratio(runs, "one pass", "crane push", missing)),
        (
            "tools/model pack, then push of the pack",
            f"{runs['pack'].seconds:.2f} s + {runs['push of the pack'].row(total)}",
        ),
        ("pack + push / crane push", f"{pack_push / runs['crane push'].seconds:.2f}x"),
        (f"tools/model pull + verify, to disk ({total / 1e9:.2g} GB)", runs["pull"].row(total)),
        ("oras pull + sync, to disk", oras["oras pull"]),
        ("pull / oras pull, to disk", _ratio(runs, "pull", "oras pull", missing)),
        ("boot prepare, MODEL_SOURCE=registry (the init container)", runs["boot prepare"].row(total)),
        ("boot prepare / tools/model pull", _ratio(runs, "boot prepare", "pull", missing)),
        (f"tools/model pull to tmpfs ({memory / 1e9:.2g} GB, page cache warm)", runs["tmpfs"].row(memory)),
        ("oras pull to tmpfs", oras["oras tmpfs"]),
        ("pull / oras pull, to tmpfs", _ratio(runs, "tmpfs", "oras tmpfs", missing)),
        ("pull to disk / openssl sha256 on all cores", f"{total / runs['pull'].seconds / 1e6 / ceiling * 100:.0f}%"),
    ]


def main() -> int:
    args = _parser().parse_args()
    peers = require("model_artifact", "crane", "docker-registry", "openssl", "dd")
    oras, missing = optional("oras")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        work = Path(tmp)
        root, lock = work / "checkpoint", work / "lock.json"
        print(f"model_artifact: writing {args.size_gb:g} GB in {args.files} files ...", file=sys.stderr, flush=True)
        # boot's own model and revision in the lock, so `boot prepare` takes it (MODEL_SOURCE=registry).
        synthetic_checkpoint(
            root, lock, files=args.files, total_bytes=int(args.size_gb * 1e9), repo=BOOT_REPO, revision=BOOT_REVISION
        )
        total = sum(p.stat().st_size for p in root.iterdir())
        runs = {**_pushes(work, root, lock, peers, oras), **_pulls_to_disk(work, root, lock, oras)}
        memory = int(args.memory_gb * 1e9)
        runs.update(_pulls_in_memory(work, memory, oras))
        ceiling = openssl_sha256_per_core_mb_s(peers["openssl"], args.speed_seconds) * cores()
        rows = _rows(total, memory, runs, ceiling, missing)
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
