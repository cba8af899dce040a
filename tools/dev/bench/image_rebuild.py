"""Benchmark: image rebuild after a one-line launcher change, against base size.

    bazel run //tools/dev/bench:image_rebuild -- [--sizes 0.5,2,4] [--rebuilds 3]

For each synthetic base (held in a loopback docker-registry) it times:
  ours  - the app layer action + image assembly on the shallow base (manifest and config
          fetched once, as Bazel's repository cache holds them), each a fresh process;
  (d)   - the same two actions answered by warm persistent workers (tools/oci/build/worker.py),
          as Bazel runs them;
  (a)   - `crane append` of the same new layer onto the same remote base (crane's floor);
  (b)   - the copy-based design: base pulled into an OCI layout, its blobs copied into the
          output layout, then the layer appended.
It reports the base bytes in our output and what a push after the change uploads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omni_oci.format.layout import canonical, descriptor, read_layout, sha256_digest
from omni_oci.remote.push import push
from omni_oci.remote.registry import RegistryClient
from omni_oci.remote.shallow_base import fetch_base
from tests.fixtures.registry import LoopbackRegistry
from tools.dev.bench.peers import require
from tools.oci.build.image import assemble
from tools.oci.build.layer import write_layer

CHUNK_LAYER = 256 * 1024 * 1024


def _synthetic_base(registry: LoopbackRegistry, work: Path, size: int, repo: str) -> str:
    """A base of incompressible layer blobs (registries never look inside layers)."""
    layers, diff_ids = [], []
    with RegistryClient(registry.host) as client:
        remaining = size
        while remaining > 0:
            part = min(CHUNK_LAYER, remaining)
            blob = work / "base-layer"
            data = os.urandom(part)
            blob.write_bytes(data)
            data_digest = sha256_digest(data)
            del data
            client.upload(repo, data_digest, blob, part)
            layers.append(
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": data_digest, "size": part}
            )
            diff_ids.append(data_digest)
            remaining -= part
        config = canonical(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Env": ["PATH=/usr/bin:/bin"]},
                "rootfs": {"type": "layers", "diff_ids": diff_ids},
            }
        )
        client.upload(repo, sha256_digest(config), config, len(config))
        manifest = canonical(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": descriptor("application/vnd.oci.image.config.v1+json", config),
                "layers": layers,
            }
        )
        return client.put_manifest(repo, "base", manifest, "application/vnd.oci.image.manifest.v1+json")


def _app_entries(source: Path) -> list[dict]:
    return [{"src": str(p), "dest": f"/opt/omni/app/{p.relative_to(source)}"} for p in sorted(source.rglob("*.py"))]


def ours(work: Path, shallow: Path, source: Path) -> float:
    """The two build actions as Bazel runs them: separate processes, inputs from files."""
    (work / "app.spec.json").write_text(json.dumps({"entries": _app_entries(source)}))
    (work / "image.spec.json").write_text(json.dumps({"entrypoint": ["/usr/bin/python3", "-m", "launcher"]}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.oci.build.layer",
            "--spec",
            str(work / "app.spec.json"),
            "--output",
            str(work / "app.tar.gz"),
            "--descriptor",
            str(work / "app.json"),
        ],
        check=True,
        env=env,
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.oci.build.image",
            "--output",
            str(work / "ours"),
            "--config-spec",
            str(work / "image.spec.json"),
            "--base",
            str(shallow),
            "--layer",
            f"{work / 'app.json'}={work / 'app.tar.gz'}",
        ],
        check=True,
        env=env,
    )
    return time.perf_counter() - started


class Workers:
    """The layer and image tools as Bazel keeps them: warm processes speaking the JSON protocol."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.processes = {
            tool: subprocess.Popen(
                [sys.executable, "-m", f"tools.oci.build.{tool}", "--persistent_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for tool in ("layer", "image")
        }

    def request(self, tool: str, arguments: list[str]) -> None:
        process = self.processes[tool]
        process.stdin.write(json.dumps({"arguments": arguments, "requestId": 1}) + "\n")
        process.stdin.flush()
        response = json.loads(process.stdout.readline())
        if response["exitCode"] != 0:
            raise RuntimeError(f"{tool} worker: {response['output']}")

    def close(self) -> None:
        for process in self.processes.values():
            process.stdin.close()
            process.wait(timeout=30)


def _ours_with_workers(work: Path, shallow: Path, source: Path, workers: Workers) -> float:
    (work / "app.spec.json").write_text(json.dumps({"entries": _app_entries(source)}))
    started = time.perf_counter()
    workers.request(
        "layer",
        [
            "--spec",
            str(work / "app.spec.json"),
            "--output",
            str(work / "app.tar.gz"),
            "--descriptor",
            str(work / "app.json"),
        ],
    )
    workers.request(
        "image",
        [
            "--output",
            str(work / "ours"),
            "--config-spec",
            str(work / "image.spec.json"),
            "--base",
            str(shallow),
            "--layer",
            f"{work / 'app.json'}={work / 'app.tar.gz'}",
        ],
    )
    return time.perf_counter() - started


def _crane_append(crane: str, registry: LoopbackRegistry, work: Path, base_ref: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [
            crane,
            "--insecure",
            "append",
            "-f",
            str(work / "app.tar.gz"),
            "-b",
            base_ref,
            "-t",
            f"{registry.host}/bench/crane-append:latest",
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return time.perf_counter() - started


def _copy_based(crane: str, work: Path, base_ref: str) -> float:
    started = time.perf_counter()
    pulled = work / "pulled"
    subprocess.run(
        [crane, "--insecure", "pull", "--format", "oci", base_ref, str(pulled)],
        check=True,
        capture_output=True,
        timeout=1200,
    )
    out = work / "copy-based"
    (out / "blobs" / "sha256").mkdir(parents=True)
    for blob in (pulled / "blobs" / "sha256").iterdir():
        shutil.copyfile(blob, out / "blobs" / "sha256" / blob.name)
    shutil.copyfile(pulled / "index.json", out / "index.json")
    shutil.copyfile(pulled / "oci-layout", out / "oci-layout")
    layer = write_layer(_app_entries(work / "src"), work / "app-copy.tar.gz")
    assemble(
        work / "copy-based-final",
        {"entrypoint": ["/usr/bin/python3", "-m", "launcher"]},
        [(layer, work / "app-copy.tar.gz")],
        out,
    )
    return time.perf_counter() - started


def measure(size_gb: float, work: Path, launcher_src: Path, crane: str, rebuilds: int = 3) -> tuple:
    # A fresh registry per size: one base's storage never slows the next measurement.
    print(
        f"image_rebuild: {size_gb:g} GB base: building, pushing, rebuilding 3 times, crane and copy-based ...",
        file=sys.stderr,
        flush=True,
    )
    with LoopbackRegistry() as registry:
        work.mkdir()
        repo = f"bench/base{str(size_gb).replace('.', '_')}"
        digest = _synthetic_base(registry, work, int(size_gb * 1e9), repo)
        base_ref = f"{registry.host}/{repo}@{digest}"
        fetch_base(f"{registry.host}/{repo}", digest, "linux/amd64", work / "shallow")
        shutil.copytree(launcher_src, work / "src" / "launcher")
        ours(work, work / "shallow", work / "src")  # the image before the change, pushed
        push(work / "ours", f"{registry.host}/bench/app")
        with (work / "src/launcher/cli.py").open("a") as handle:
            handle.write("# one-line change\n")
        timings, warm = [], []
        for _ in range(rebuilds):
            shutil.rmtree(work / "ours")
            timings.append(ours(work, work / "shallow", work / "src"))
        workers = Workers()
        try:
            for _ in range(rebuilds + 1):  # the first request warms the imports, as Bazel's first action does
                shutil.rmtree(work / "ours")
                warm.append(_ours_with_workers(work, work / "shallow", work / "src", workers))
        finally:
            workers.close()
        manifest = read_layout(work / "ours")[1]
        base_bytes_out = sum(
            (work / "ours/blobs/sha256" / layer["digest"].split(":")[1]).stat().st_size
            for layer in manifest["layers"][:-1]
            if (work / "ours/blobs/sha256" / layer["digest"].split(":")[1]).exists()
        )
        report = push(work / "ours", f"{registry.host}/bench/app")
        crane_s = _crane_append(crane, registry, work, base_ref)
        copy_s = _copy_based(crane, work, base_ref)
    shutil.rmtree(work)
    return size_gb, min(timings), min(warm[1:]), crane_s, copy_s, base_bytes_out, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="0.5,2,4", help="base sizes in GB")
    parser.add_argument("--rebuilds", type=int, default=3, help="timed rebuilds per way (the best is shown)")
    args = parser.parse_args()
    crane = require("image_rebuild", "crane", "docker-registry")["crane"]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        rows = [
            measure(float(size), Path(tmp) / f"base-{size}", Path("launcher"), crane, args.rebuilds)
            for size in args.sizes.split(",")
        ]
    print(
        f"{'base':>6} {'ours':>8} {'(d) workers':>12} {'(a) crane append':>17} {'(b) copy-based':>15} "
        f"{'(d)/(a)':>8} {'(b)/ours':>9} {'base bytes in output':>21}  push after the change"
    )
    for size_gb, ours_s, warm_s, crane_s, copy_s, base_bytes, report in rows:
        print(
            f"{size_gb:>5}G {ours_s * 1000:>6.0f}ms {warm_s * 1000:>10.0f}ms {crane_s * 1000:>15.0f}ms "
            f"{copy_s * 1000:>13.0f}ms {warm_s / crane_s:>8.2f} {copy_s / ours_s:>9.0f}x {base_bytes:>21}  "
            f"{len(report.uploaded)} blobs uploaded ({report.uploaded_bytes} bytes), "
            f"{len(report.present)} present, {len(report.mounted)} mounted"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
