"""Benchmark: reading the engine's identity and the installed packages from a vendor base on
loopback, against crane export.

    bazel run //tools/dev/bench:pin -- [--size-gb 2] [--layers 6] [--runs 3]

A synthetic base of `--layers` gzip layers (`--size-gb` compressed in all: files of random
bytes, as weights and shared objects are, plus an installed engine, a decoy that a later layer
whites out, and what a large vendor base installs: PACKAGES dpkg entries with their copyright
files and DISTRIBUTIONS Python distributions with METADATA, RECORD and a license file) is
pushed to a fresh docker-registry. Then, `--runs` times each, one after the other: `tools/pin`'s
base resolution (manifest, config, every layer streamed, hashed and walked; a fresh process)
with the base's contents (what pin does) and without them (the engine's identity alone, as
before issue 69), and `crane export IMAGE - > /dev/null` (the streaming bound: the same bytes
fetched, decompressed and flattened). Reported: the best of each, the ratios, and our peak
resident memory (the targets: at most 1.0x crane, under 200 MB, and the contents under 5% more).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from attest.hashing import sha256_file
from omni_oci.format.layout import OCI_LAYER_GZIP
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.vendor_base import installed_engine, put_image
from tools.dev.bench.peers import require

FILE_BYTES = 4 << 20
ENGINE_SITE = "/usr/local/lib/python3.12/dist-packages"
PACKAGES, DISTRIBUTIONS = 800, 400  # about a ROCm vLLM image's
RESOLVE = """
import sys, time
from attest.pins import load_pins
from tools.pin.upstream import resolve_base
pins = load_pins(__import__("pathlib").Path(sys.argv[1]))
started = time.perf_counter()
found = resolve_base(pins, "bench", sys.argv[2], contents=sys.argv[3] == "contents")
seconds = time.perf_counter() - started
# The process's own high-water mark: wait4's maxrss would count the forked parent's pages too.
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(seconds, peak_kb, found.engine.record_sha256)
"""


def _write_layer(path: Path, index: int, size: int, extra: dict[str, bytes]) -> tuple[str, int, str]:
    """A gzip layer of random files totalling about `size` bytes; (digest, size, diff_id)."""
    raw_hash = hashlib.sha256()

    class Hashing(io.RawIOBase):
        def __init__(self, sink) -> None:
            self.sink = sink

        def writable(self) -> bool:
            return True

        def write(self, data) -> int:
            raw_hash.update(data)
            return self.sink.write(data)

    with path.open("wb") as out, gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0) as compressed:
        with tarfile.open(fileobj=Hashing(compressed), mode="w|", format=tarfile.PAX_FORMAT) as tar:
            files = {f"opt/vendor/{index}/blob-{n:05d}.bin": None for n in range(max(1, size // FILE_BYTES))}
            for name, data in [*files.items(), *extra.items()]:
                data = os.urandom(FILE_BYTES) if data is None else data
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return "sha256:" + sha256_file(path), path.stat().st_size, "sha256:" + raw_hash.hexdigest()


def _installed_packages() -> dict[str, bytes]:
    """A large vendor base's package records: dpkg's database, copyright files, dist-infos."""
    status, files = [], {"etc/os-release": b"ID=ubuntu\nVERSION_ID=22.04\nNAME=Ubuntu\n"}
    copyright = (
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
        "Files: *\nCopyright: 2001-2024 The Authors\nLicense: GPL-2+\n .\n"
        + " This program is free software; you can redistribute it.\n"
        * 40
    )
    for n in range(PACKAGES):
        status.append(
            f"Package: pkg{n}\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.{n}-1\n"
            f"Maintainer: Ubuntu Developers <devel@example.org>\nDescription: package {n}\n" + " more text\n" * 10
        )
        files[f"usr/share/doc/pkg{n}/copyright"] = copyright.encode()
    files["var/lib/dpkg/status"] = "\n".join(status).encode()
    for n in range(DISTRIBUTIONS):
        dist_info = f"usr/local/lib/python3.12/dist-packages/dist{n}-1.0.dist-info"
        files[f"{dist_info}/METADATA"] = (
            f"Metadata-Version: 2.4\nName: dist{n}\nVersion: 1.0\nLicense-Expression: MIT\nAuthor: A\n\n"
            + "A long description.\n" * 200
        ).encode()
        files[f"{dist_info}/RECORD"] = "".join(f"dist{n}/m{i}.py,sha256=abc,10\n" for i in range(300)).encode()
        files[f"{dist_info}/licenses/LICENSE"] = b"Copyright (c) 2024 A\n" + b"Permission is granted.\n" * 40
    return files


def _make_base(work: Path, registry: str, size: int, layers: int) -> None:
    engine = {
        name.lstrip("/"): data
        for name, data in installed_engine(
            ENGINE_SITE, "vllm", "0.34.0", package="vllm", version_py="__commit_id__ = 'g62d4bc3c7'\n"
        ).items()
    }
    decoy = {
        name.lstrip("/"): data
        for name, data in installed_engine(
            "/usr/lib/python3/dist-packages", "vllm", "0.1.0", package="vllm_decoy"
        ).items()
    }
    descriptors, diff_ids = [], []
    with RegistryClient(registry, credential=None) as client:
        for index in range(layers):
            extra = (
                {**decoy, **engine, **_installed_packages()}
                if index == layers - 2
                else {"usr/lib/python3/dist-packages/.wh.vllm-0.1.0.dist-info": b""}
                if index == layers - 1
                else {}
            )
            path = work / f"layer-{index}.tar.gz"
            digest, blob_size, diff_id = _write_layer(path, index, size // layers, extra)
            client.upload("bench/base", digest, path, blob_size)
            path.unlink()
            descriptors.append({"mediaType": OCI_LAYER_GZIP, "digest": digest, "size": blob_size})
            diff_ids.append(diff_id)
            print(
                f"pin bench: layer {index + 1}/{layers} pushed ({blob_size / 1e6:.0f} MB)", file=sys.stderr, flush=True
            )
        put_image(client, "bench/base", "bench", "linux/amd64", descriptors, diff_ids)


def _run(argv: list[str], **kwargs) -> tuple[float, int, str]:
    """(wall seconds, peak resident KB, stdout) of one child process."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, **kwargs)
    out = process.stdout.read() if process.stdout else b""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        log = kwargs.get("stderr")
        tail = b""
        if hasattr(log, "seek"):
            log.seek(0)
            tail = log.read()[-2000:]
        raise SystemExit(
            f"pin bench: {argv[0]} failed with exit code {process.returncode}\n{tail.decode(errors='replace')}"
        )
    return time.perf_counter() - started, usage.ru_maxrss, out.decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-gb", type=float, default=2.0)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    crane_path = require("pin", "crane", "docker-registry")["crane"]
    if args.layers < 2:
        parser.error("--layers must be at least 2 (the engine and the whiteout sit in the last two)")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp, LoopbackRegistry() as registry:
        work = Path(tmp)
        _make_base(work, registry.host, int(args.size_gb * 1e9), args.layers)
        pins = work / "bench.pins.json"
        pins.write_text(
            json.dumps(
                {
                    "schema_version": "1",
                    "image": "bench",
                    "base": {"image": "docker.io/bench/base", "digest": "", "platform": "linux/amd64"},
                    "engine": {"name": "vllm", "repository": "https://github.com/vllm-project/vllm", "commit": ""},
                    "model": {"id": "bench/model", "revision": ""},
                    "speculator": None,
                    "hardware": {"profile": "cpu_x86_64", "gpu_arch": ""},
                }
            )
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        log = (work / "resolve.log").open("w+b")  # shown when a run fails
        ours, alone, crane = [], [], []
        for run in range(args.runs):
            for mode, results in (("contents", ours), ("engine", alone)):
                wall, _, out = _run(
                    [sys.executable, "-c", RESOLVE, str(pins), registry.host, mode], env=env, stderr=log
                )
                seconds_text, peak_text = out.split()[:2]
                results.append((float(seconds_text), wall, int(peak_text)))
            seconds = _crane(crane_path, registry.host)
            crane.append(seconds)
            print(
                f"pin bench: run {run + 1}: ours {ours[-1][0]:.2f} s (process {ours[-1][1]:.2f} s, peak "
                f"{ours[-1][2] / 1024:.0f} MB), engine alone {alone[-1][0]:.2f} s, crane export {seconds:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    best_ours = min(item[0] for item in ours)
    best_alone = min(item[0] for item in alone)
    best_process = min(item[1] for item in ours)
    peak = max(item[2] for item in ours) / 1024
    best_crane = min(crane)
    title = f"engine identity and packages of a {args.size_gb:g} GB base"
    print(f"{title:<48} {'seconds':>8} {'/ crane':>8}")
    print(f"{'ours (resolve + stream all layers + contents)':<48} {best_ours:>8.2f} {best_ours / best_crane:>8.2f}")
    print(f"{'ours, the engine identity alone':<48} {best_alone:>8.2f} {best_alone / best_crane:>8.2f}")
    print(f"{'ours, whole process (imports included)':<48} {best_process:>8.2f} {best_process / best_crane:>8.2f}")
    print(f"{'crane export IMAGE - > /dev/null':<48} {best_crane:>8.2f} {1:>8.2f}")
    print(f"the contents' added time: {(best_ours / best_alone - 1) * 100:+.1f}% ({PACKAGES} dpkg packages, ", end="")
    print(f"{DISTRIBUTIONS} Python distributions)")
    print(f"peak resident memory of ours: {peak:.0f} MB")
    return 0


def _crane(crane: str, host: str) -> float:
    """Seconds of `crane export IMAGE - > /dev/null`."""
    started = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(
            [crane, "--insecure", "export", f"{host}/bench/base:bench", "-"],
            stdout=sink,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=3600,
        )
    return time.perf_counter() - started


if __name__ == "__main__":
    raise SystemExit(main())
