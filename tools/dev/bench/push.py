"""Benchmark: pushing a complete image to a loopback registry, ours against crane.

    bazel run //tools/dev/bench:push -- [--size-gb 1] [--layers 8]

An image of `--layers` incompressible layers (`--size-gb` in all) is pushed three ways, each
to a fresh repository of a fresh docker-registry: ours with the default parallelism (4 blobs
in flight), ours one blob at a time (what push did before), and `crane push` of the same
layout. A second push of ours (everything present) shows what an unchanged push costs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omni_oci.remote.push import PUSH_JOBS, push
from tests.fixtures.registry import LoopbackRegistry
from tools.dev.bench.peers import require
from tools.oci.build.image import assemble
from tools.oci.build.layer import write_layer


def make_image(work: Path, size: int, layers: int) -> Path:
    descriptors = []
    for index in range(layers):
        data = work / f"layer-{index}.bin"
        with data.open("wb") as handle:
            for _ in range(size // layers // (1 << 20)):
                handle.write(os.urandom(1 << 20))
        blob = work / f"layer-{index}.tar"
        descriptors.append(
            (write_layer([{"src": str(data), "dest": f"/data/{index}.bin"}], blob, compression="none"), blob)
        )
        data.unlink()
    assemble(work / "layout", {"os": "linux", "architecture": "amd64", "entrypoint": ["/bin/true"]}, descriptors, None)
    return work / "layout"


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    crane = require("push", "crane", "docker-registry")["crane"]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        print(f"push: making a {args.size_gb:g} GB image of {args.layers} layers ...", file=sys.stderr, flush=True)
        layout = make_image(Path(tmp), int(args.size_gb * 1e9), args.layers)
        rows = []
        for name, run in (
            (f"ours, {PUSH_JOBS} in flight", lambda host: push(layout, f"{host}/bench/ours:1")),
            ("ours, one at a time", lambda host: push(layout, f"{host}/bench/serial:1", jobs=1)),
            (
                "crane push",
                lambda host: subprocess.run(
                    [crane, "--insecure", "push", str(layout), f"{host}/bench/crane:1"],
                    check=True,
                    capture_output=True,
                    timeout=1800,
                ),
            ),
        ):
            with LoopbackRegistry() as registry:
                seconds = timed(lambda: run(registry.host))
                again = (
                    timed(lambda: push(layout, f"{registry.host}/bench/ours:1")) if name.startswith("ours, 4") else None
                )
            rows.append((name, seconds, again))
            print(f"push: {name}: {seconds:.1f} s", file=sys.stderr, flush=True)
    crane_s = rows[2][1]
    print(f"{'push of ' + format(args.size_gb, 'g') + ' GB':<24} {'seconds':>8} {'/ crane':>8}  second push")
    for name, seconds, again in rows:
        print(
            f"{name:<24} {seconds:>8.1f} {seconds / crane_s:>8.2f}  "
            + (f"{again:.2f} s (nothing uploaded)" if again is not None else "-")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
