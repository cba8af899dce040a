"""Pin's layer reading stays under 200 MB however a layer is built to exhaust memory: each
hostile base is pushed to a loopback registry and read by a fresh process (the registry stack,
the strict tar reader and the overlay, as tools/pin runs them), whose peak resident size is
measured by the kernel."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_oci.format.layout import sha256_digest
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.raw_tar import EOA, header, member, pax
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.vendor_base import image_manifest

LIMIT_MB = 200

# The reader's process: read the base as tools/pin does, print the outcome and the peak RSS.
DRIVER = """
import json, sys
from omni_oci.format.errors import OciError
from omni_oci.format.layout import sha256_digest
from omni_oci.remote.registry import RegistryClient
from omni_oci.remote.layers.files import read_layer_files
from tools.pin.engine_files import engine_identity, wanted_files
from tools.pin.upstream import MAX_ENGINE_FILE_BYTES
host, repository, layers = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    with RegistryClient(host, credential=None) as client:
        files = read_layer_files(client, repository, layers, wanted=wanted_files("vllm"),
                                 max_file_bytes=MAX_ENGINE_FILE_BYTES, label="base", progress=False)
    engine_identity(files, "vllm", "base")
    outcome = "read"
except OciError as exc:
    outcome = str(exc)[:300]
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so it would count the forked test process.
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"outcome": outcome, "peak_mb": peak_kb / 1024}))
"""


def _gz(parts) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=1, mtime=0) as stream:
        for part in parts:
            stream.write(part)
        stream.write(EOA)
    return out.getvalue()


def _symlinks(count: int):
    for number in range(count):
        yield header(f"l/{number}", typeflag=b"2", linkname=f"/usr/lib/{number}")


def _deep_symlinks(count: int):
    for number in range(count):
        name = f"{number}/" + "/".join(["d"] * 2000) + "/link"
        yield pax({"path": name}) + header("x", typeflag=b"2", linkname="t")


def _empty_files(count: int):
    template = header("f", size=0)
    for number in range(count):
        yield header(f"f/{number}") if number % 50_000 == 0 else template


def _wanted_records(count: int, size: int):
    for number in range(count):
        yield member(f"site/vllm-{number}.dist-info/RECORD", b"r" * size)


def _pax_records(count: int):
    for number in range(count):
        yield pax({"comment": "c" * ((1 << 20) - 64)}) + member(f"p/{number}", b"1")


def _sparse_map() -> bytes:
    """A pax sparse file whose map claims a terabyte of holes: a few KiB of layer."""
    records = {
        "GNU.sparse.major": "1",
        "GNU.sparse.minor": "0",
        "GNU.sparse.name": "s",
        "GNU.sparse.realsize": "1" + "0" * 12,
    }
    sparse_map = ("100000\n" + "".join(f"{n * 10_000_000}\n1\n" for n in range(100_000))).encode()[:4096]
    return pax(records) + member("GNUSparseFile.0/s", sparse_map)


HOSTILE = {
    "300k-symlinks": lambda: [_gz(_symlinks(300_000))],
    "deep-symlinks": lambda: [_gz(_deep_symlinks(400))],
    "400k-members": lambda: [_gz(_empty_files(400_000))],
    "100MB-of-wanted-files": lambda: [_gz(_wanted_records(12, 8 << 20))],
    "1MiB-pax-records": lambda: [_gz(_pax_records(200))],
    "four-layers-of-members": lambda: [_gz(_empty_files(100_000)) for _ in range(4)],
    "sparse-map-of-a-few-kib": lambda: [_gz([_sparse_map()])],
}


@pytest.fixture(scope="module")
def registry():
    with LoopbackRegistry() as started:
        yield started


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_pin_reads_a_hostile_base_in_bounded_memory(registry, name: str) -> None:
    blobs = HOSTILE[name]()
    with RegistryClient(registry.host, credential=None) as client:
        image_manifest(client, f"memory/{name.lower()}", "linux/amd64", blobs)
        descriptors = [{"digest": sha256_digest(blob), "size": len(blob)} for blob in blobs]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, registry.host, f"memory/{name.lower()}", json.dumps(descriptors)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path.cwd(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{name}: peak {result['peak_mb']:.0f} MB: {result['outcome']}")
    assert result["outcome"] != "read"  # none of them holds an engine: each ends in a refusal
    assert result["peak_mb"] <= LIMIT_MB, result
