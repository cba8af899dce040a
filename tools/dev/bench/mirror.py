"""Benchmark: mirroring a whole release, tools/release against the tools a user would script.

    bazel run //tools/dev/bench:mirror -- [--size-gb 2] [--files 4]

A signed release (tests/fixtures/release.py: an image whose pins name a `--size-gb` model
artifact, bundles and legacy tags on both) on a loopback docker-registry, copied to a fresh one
each time:
1. `crane copy` of the image, then `oras cp -r` of the model artifact (its referrers with it),
   one after the other: what a user scripts today (and it leaves the legacy tags behind);
2. `tools/release mirror --pins` of the same release (legacy tags included, every blob hashed);
3. the same mirror again, everything present: HEADs only.

Each run is a child process: wall time, its own CPU time and peak RSS. The goal: (2) at or
below 1.0x of (1), and (3) under 2 s. docs/release.md#mirroring-a-release records the results.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tests.fixtures.model import synthetic_checkpoint
from tests.fixtures.pins import key_pair
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.release import IMAGE_REPOSITORY, MODEL_REPOSITORY, signed_release
from tools.dev.bench.children import Run, oras_env, timed_child
from tools.dev.bench.peers import optional, require


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=2.0, help="the model artifact's size")
    parser.add_argument("--files", type=int, default=4, help="its weight files")
    return parser


def _peers_copy(peers: dict[str, str], oras: str | None, source: str, release, target: str) -> dict[str, Run]:
    """crane copy of the image, then oras cp -r of the model artifact (where oras is here)."""
    runs = {
        "crane": timed_child(
            [peers["crane"], "copy", "--insecure", release.image, f"{target}/{IMAGE_REPOSITORY}"], env=oras_env()
        )
    }
    if oras:
        runs["oras"] = timed_child(
            [oras, "cp", "-r", "--from-plain-http", "--to-plain-http"]
            + [f"{source}/{MODEL_REPOSITORY}@{release.model.digest}", f"{target}/{MODEL_REPOSITORY}"],
            env=oras_env(),
        )
    return runs


def _mirror(release, target: str) -> list[str]:
    return [sys.executable, "-m", "tools.release.cli", "mirror", release.image, f"{target}/{IMAGE_REPOSITORY}"] + [
        "--pins",
        str(release.pins_path),
    ]


def _rows(total: int, runs: dict[str, Run], missing: str) -> list[tuple[str, str]]:
    peers_seconds = runs["crane"].seconds + (runs["oras"].seconds if "oras" in runs else 0)
    both = "oras" in runs
    return [
        ("crane copy (the image)", runs["crane"].row(total)),
        ("oras cp -r (the model artifact and its referrers)", runs["oras"].row(total) if both else missing),
        ("crane copy + oras cp -r", f"{peers_seconds:.2f} s" if both else missing),
        ("tools/release mirror --pins (the whole release)", runs["mirror"].row(total)),
        (
            "mirror / (crane copy + oras cp -r)",
            f"{runs['mirror'].seconds / peers_seconds:.2f}x (goal <= 1.0x)" if both else missing,
        ),
        ("mirror again, everything present", f"{runs['again'].seconds:.2f} s (goal < 2 s)"),
    ]


def main() -> int:
    args = _parser().parse_args()
    peers = require("mirror", "crane", "docker-registry")
    oras, missing = optional("oras")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp, LoopbackRegistry() as source:
        work = Path(tmp)
        print(f"mirror: writing a {args.size_gb:g} GB release ...", file=sys.stderr, flush=True)
        synthetic_checkpoint(
            work / "checkpoint", work / "lock.json", files=args.files, total_bytes=int(args.size_gb * 1e9)
        )
        private, _ = key_pair(work, "signer")
        release = signed_release(source.host, work, work / "checkpoint", work / "lock.json", private)
        total = sum(path.stat().st_size for path in (work / "checkpoint").iterdir())
        os.sync()
        with LoopbackRegistry() as theirs:
            runs = _peers_copy(peers, oras, source.host, release, theirs.host)
        os.sync()
        with LoopbackRegistry() as ours:
            runs["mirror"] = timed_child(_mirror(release, ours.host))
            runs["again"] = timed_child(_mirror(release, ours.host))
    rows = _rows(total, runs, missing)
    width = max(len(name) for name, _ in rows)
    print(
        f"{total / 1e9:.2f} GB model artifact in {args.files} files, loopback docker-registry, {os.cpu_count()} cores"
    )
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
