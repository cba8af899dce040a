"""Benchmark: a cut connection in the middle of a large checkpoint file.

    bazel run //tools/dev/bench:boot_resume -- [--gb 1] [--cut 0.5]

One file of `--gb` GB (random, an LFS shard) from the tests' loopback hub (a process of its
own), through a TCP proxy on loopback that counts the bytes it forwards and cuts the
connection once `--cut` of the file has gone through. Four runs, each into an empty directory:
  (a) ours, uncut: `boot prepare` against a reviewed lock;
  (b) ours, cut: the same, resumed by a Range request after the cut;
  (c) huggingface_hub's hf_hub_download, uncut;
  (d) hf_hub_download, cut (it resumes an interrupted transfer within the call).
Each is run `--runs` times (default 3), interleaved; the best time of each is compared.
Targets (issue #43): (b) sends at most 1.01x the file and takes at most 1.1x (a).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from unittest import mock

from boot.checkpoint.sources import prepare
from boot.settings import REPO, REVISION, BootSettings
from tests.fixtures.deepseek import boot_env, write_lock
from tests.fixtures.fault_proxy import FaultProxy, Step
from tests.fixtures.hub import HubRepo, hub_in_child

SHARD = "model-00001-of-00001.safetensors"


def _run(label: str, hub_port: int, plan: list[Step], fetch) -> tuple[float, int]:
    with FaultProxy(("127.0.0.1", hub_port), plan) as proxy:
        started = time.perf_counter()
        fetch(proxy.url)
        seconds = time.perf_counter() - started
        sent = proxy.to_client
    print(f"  {label:<34} {seconds:7.2f} s  {sent / 1e9:6.3f} GB sent", flush=True)
    return seconds, sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--cut", type=float, default=0.5, help="fraction of the file sent before the cut")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    from huggingface_hub import hf_hub_download

    size = int(args.gb * 1e9)
    block = random.Random(3).randbytes(1 << 20)
    repo = HubRepo(REPO, REVISION, {SHARD: (block * (size // len(block) + 1))[:size]}, lfs={SHARD})
    cut = [Step("cut", after=int(size * args.cut))]
    print(f"boot_resume: one file of {size / 1e9:.2f} GB, cut after {args.cut:.0%}, {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp, hub_in_child(repo) as hub:
        base = Path(tmp)
        lock = base / "checkpoint.lock.json"
        sha = write_lock(lock, repo)

        def ours(url: str) -> None:
            env = boot_env(base, HF_ENDPOINT=url, CHECKPOINT_LOCK=str(lock), CHECKPOINT_LOCK_SHA256=sha)
            with mock.patch.dict(os.environ, env, clear=True):
                prepare(BootSettings.from_env())
            shutil.rmtree(base / "model")
            shutil.rmtree(base / "state", ignore_errors=True)

        def theirs(url: str) -> None:
            hf_hub_download(REPO, SHARD, revision=REVISION, local_dir=str(base / "hf"), endpoint=url)
            shutil.rmtree(base / "hf")

        best: dict[str, tuple[float, int]] = {}
        for _ in range(args.runs):
            for label, plan, fetch in (
                ("(a) ours, uncut", [], ours),
                ("(b) ours, cut and resumed", cut, ours),
                ("(c) hf_hub_download, uncut", [], theirs),
                ("(d) hf_hub_download, cut", cut, theirs),
            ):
                result = _run(label, hub.port, list(plan), fetch)
                best[label[:3]] = min(result, best.get(label[:3], result))
    (a, _), (b, b_sent), (c, _), (d, d_sent) = (best[key] for key in ("(a)", "(b)", "(c)", "(d)"))
    print(f"  best of {args.runs}: (a) {a:.2f} s, (b) {b:.2f} s, (c) {c:.2f} s, (d) {d:.2f} s")
    print(f"  (b) sent {b_sent / size:.3f}x the file (target <= 1.01); (b)/(a) = {b / a:.2f} (target <= 1.1)")
    print(f"  (d) sent {d_sent / size:.3f}x the file; (d)/(c) = {d / c:.2f}; (a)/(c) = {a / c:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
