"""Benchmark: whole-process wall time of `python -m launcher --inspect-only` on a synthetic
64-shard checkpoint (target: under 300 ms).

    bazel run //tools/bench:launcher_inspect -- [--runs 20] [--shards 64]

Each run is a fresh interpreter, as at container start, so imports count.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fixtures.qwen import LauncherWorld, attest_checkpoint, make_checkpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--shards", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        world = LauncherWorld(Path(tmp))
        make_checkpoint(world.model, shards=args.shards)
        for stale in world.model.glob("model-*-of-00002.safetensors"):
            stale.unlink()
        world.env["QWEN_CHECKPOINT_MANIFEST_SHA256"] = attest_checkpoint(world.model)
        env = dict(world.env, PYTHONPATH=os.pathsep.join([str(world.site), *[p for p in sys.path if p]]))
        argv = [sys.executable, "-m", "launcher", "--inspect-only"]
        timings = []
        for _ in range(args.runs):
            started = time.perf_counter()
            completed = subprocess.run(argv, env=env, capture_output=True, text=True)
            timings.append((time.perf_counter() - started) * 1000)
            if completed.returncode != 0:
                print(completed.stderr, file=sys.stderr)
                return 1
        report = json.loads(completed.stdout)
        assert report["checkpoint"]["shard_count"] == args.shards
        print(f"launcher --inspect-only, {args.shards} shards, {args.runs} fresh processes: "
              f"median {statistics.median(timings):.0f} ms, min {min(timings):.0f} ms, "
              f"max {max(timings):.0f} ms (target < 300 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
