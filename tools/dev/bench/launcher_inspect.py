"""Benchmark: whole-process cost of `python -m launcher --inspect-only` on a synthetic
64-shard checkpoint, beside the seed launcher on the same checkpoint and interpreter.

    bazel run //tools/dev/bench:launcher_inspect -- [--runs 20] [--shards 64] [--seed PATH]

Each run is a fresh interpreter, as at container start, so imports count. Reported: wall
time (target under 300 ms) and CPU time (user + system of the child), and the CPU ratio of
ours to the seed's (target <= 1.5x). The seed is ../shared/seeds/qwen_mi300x_launcher.py
beside the checkout unless --seed names it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fixtures.qwen import LauncherWorld, attest_checkpoint, make_checkpoint


def _measure(argv: list[str], env: dict[str, str], runs: int) -> tuple[list[float], list[float], str]:
    """Wall and CPU milliseconds of `runs` fresh processes, and the last one's stdout."""
    walls, cpus, stdout = [], [], ""
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        completed = subprocess.run(argv, env=env, capture_output=True, text=True)
        walls.append((time.perf_counter() - started) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
        if completed.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{completed.stderr}")
        stdout = completed.stdout
    return walls, cpus, stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument(
        "--seed",
        type=Path,
        default=Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", "."))
        / ".."
        / "shared"
        / "seeds"
        / "qwen_mi300x_launcher.py",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        world = LauncherWorld(Path(tmp))
        make_checkpoint(world.model, shards=args.shards)
        for stale in world.model.glob("model-*-of-00002.safetensors"):
            stale.unlink()
        world.env["QWEN_CHECKPOINT_MANIFEST_SHA256"] = attest_checkpoint(world.model)
        env = dict(world.env, PYTHONPATH=os.pathsep.join([str(world.site), *[p for p in sys.path if p]]))
        print(f"launcher_inspect: {args.runs} runs of ours ...", file=sys.stderr, flush=True)
        walls, cpus, stdout = _measure([sys.executable, "-m", "launcher", "--inspect-only"], env, args.runs)
        report = json.loads(stdout)
        assert report["checkpoint"]["shard_count"] == args.shards
        print(
            f"launcher --inspect-only, {args.shards} shards, {args.runs} fresh processes: "
            f"median {statistics.median(walls):.0f} ms wall (min {min(walls):.0f}, max {max(walls):.0f}; "
            f"target < 300 ms), median {statistics.median(cpus):.0f} ms CPU"
        )
        if not args.seed.is_file():
            print(f"seed launcher not found at {args.seed}: pass --seed PATH for the CPU ratio")
            return 0
        print(f"launcher_inspect: {args.runs} runs of the seed ...", file=sys.stderr, flush=True)
        seed_walls, seed_cpus, seed_stdout = _measure(
            [sys.executable, str(args.seed), "--inspect-only"], env, args.runs
        )
        assert json.loads(seed_stdout)["checkpoint"]["shard_count"] == args.shards
        ratio = statistics.median(cpus) / statistics.median(seed_cpus)
        print(
            f"seed launcher, same checkpoint and interpreter: median {statistics.median(seed_walls):.0f} ms wall, "
            f"{statistics.median(seed_cpus):.0f} ms CPU"
        )
        print(f"CPU ratio ours / seed: {ratio:.2f}x (target <= 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
