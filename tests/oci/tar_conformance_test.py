"""Pin's view of a base against the runtime's: each class of hostile layer is pushed to a
loopback registry on top of an engine layer, pulled by skopeo and unpacked by umoci (Go's
archive/tar, as containerd and CRI-O read layers), and the engine identity is computed inside
the unpacked tree (chroot) as the launcher computes it at start. Pin must refuse the image, or
read exactly that identity; whatever umoci refuses, pin refuses.

Each row also says which of the two it expects, so that a reader grown lenient fails here."""

from __future__ import annotations

import gzip
import multiprocessing
import os
import shutil
import zlib
from pathlib import Path

import pytest
import zstandard

from attest.engine import ENGINE_DISTRIBUTIONS, find_installed
from attest.errors import AttestError
from omni_oci.format.errors import OciError
from omni_oci.format.layout import OCI_LAYER_GZIP, OCI_LAYER_ZSTD, sha256_digest
from omni_oci.remote.layers.files import read_layer_files
from omni_oci.remote.registry import RegistryClient
from tests.fixtures.oci import CRANE, SKOPEO, UMOCI, run
from tests.fixtures.raw_tar import BLOCK, EOA, archive, gnu_long, header, member, pax
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.vendor_base import installed_engine, layer, put_image
from tools.pin.engine_files import engine_identity, wanted_files

SITE = "usr/local/lib/python3.12/dist-packages"
DIST = f"{SITE}/vllm-0.32.0.dist-info"
OTHER_SITE = "opt/other/site-packages"


def _engine(site: str, marker: str) -> dict[str, bytes]:
    files = installed_engine(site, "vllm", "0.32.0", package="vllm", extra={"vllm/marker.py": marker.encode()})
    return {name.lstrip("/"): data for name, data in files.items()}


A = _engine(SITE, "A")
B = _engine(SITE, "B")
RECORD_B = B[f"{DIST}/RECORD"]
BASE = layer(sorted(A.items()))


def gz(tar: bytes) -> bytes:
    return gzip.compress(tar, mtime=0)


def _b_members() -> bytes:
    """B's files (B's RECORD included) as raw members: they match A's except marker.py."""
    return b"".join(member(name, data) for name, data in sorted(B.items()))


def _gzip_with_header_crc(tar: bytes, crc: int) -> bytes:
    head = b"\x1f\x8b\x08\x02" + bytes(4) + b"\x00\xff"
    deflate = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(tar) + deflate.flush()
    return (
        head + crc.to_bytes(2, "little") + body + zlib.crc32(tar).to_bytes(4, "little") + len(tar).to_bytes(4, "little")
    )


# (id, upper layers as blobs, "agrees" or the refusal pin must give)
CASES = [
    # Layers Go and CPython read alike: pin must read what umoci unpacks.
    ("plain-upgrade", [gz(archive(_b_members()))], "agrees"),
    (
        "pax-size-hides-a-header",
        [gz(archive(pax({"size": "0"}), member("x", member(f"{DIST}/RECORD", RECORD_B))))],
        "agrees",
    ),
    ("opaque-site-then-b", [gz(archive(member(f"{SITE}/.wh..wh..opq"), _b_members()))], "agrees"),
    ("whiteout-dist-then-b", [gz(archive(member(f"{SITE}/.wh.vllm-0.32.0.dist-info"), _b_members()))], "agrees"),
    ("long-pax-paths", [gz(archive(*(pax({"path": n}) + member("short", d) for n, d in sorted(B.items()))))], "agrees"),
    (
        "gnu-long-names",
        [gz(archive(*(gnu_long(n) + member("short", d, form="gnu") for n, d in sorted(B.items()))))],
        "agrees",
    ),
    (
        "hard-link-to-lower-wanted",
        [gz(archive(header(f"{DIST}/RECORD.bak", typeflag=b"1", linkname=f"{DIST}/RECORD")))],
        "agrees",
    ),
    ("zstd-upgrade", [zstandard.ZstdCompressor().compress(archive(_b_members()))], "agrees"),
    # Stacked and conflicting extended headers.
    (
        "two-pax-headers",
        [gz(archive(pax({"path": f"{DIST}/RECORD"}), pax({"path": "decoy"}), member("x", RECORD_B)))],
        "second pax header",
    ),
    (
        "two-gnu-long-names",
        [gz(archive(gnu_long(f"{DIST}/RECORD"), gnu_long("decoy" * 30), member("x", RECORD_B)))],
        "second GNU long name",
    ),
    (
        "long-name-and-pax-path",
        [gz(archive(gnu_long("decoy" * 30), pax({"path": f"{DIST}/RECORD"}), member("x", RECORD_B)))],
        "GNU long name and a pax path",
    ),
    (
        "pax-path-then-long-name",
        [gz(archive(pax({"path": "decoy"}), gnu_long(f"{DIST}/RECORD"), member("x", RECORD_B)))],
        "GNU long name and a pax path",
    ),
    (
        "sparse-name",
        [gz(archive(pax({"GNU.sparse.name": f"{DIST}/RECORD"}), member("decoy", RECORD_B)))],
        "sparse pax key",
    ),
    (
        "sparse-1.0",
        [
            gz(
                archive(
                    pax({"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "9"}),
                    member(f"{DIST}/RECORD", RECORD_B),
                )
            )
        ],
        "sparse pax key",
    ),
    (
        "old-gnu-sparse",
        [gz(archive(member(f"{DIST}/RECORD", RECORD_B, typeflag=b"S", form="gnu")))],
        "GNU sparse member",
    ),
    (
        "global-pax-path",
        [gz(archive(pax({"path": f"{DIST}/RECORD"}, typeflag=b"g"), member("decoy", RECORD_B)))],
        "global pax header",
    ),
    ("empty-pax-path", [gz(archive(pax({"path": ""}), member(f"{DIST}/RECORD", RECORD_B)))], "empty pax path"),
    ("dangling-pax", [gz(archive(member("ok", b"1"), pax({"path": f"{DIST}/RECORD"})))], "no member follows"),
    # Header fields read differently.
    (
        "gnu-prefix",
        [gz(archive(member("RECORD", RECORD_B, form="gnu", prefix=DIST.encode())))],
        "GNU header with bytes in its prefix",
    ),
    ("v7-prefix", [gz(archive(member("RECORD", RECORD_B, form="v7", prefix=DIST.encode())))], "V7 header with bytes"),
    ("star-prefix", [gz(archive(member("RECORD", RECORD_B, form="star", prefix=DIST.encode())))], "star header"),
    (
        "nul-then-size",
        [
            gz(
                archive(
                    header(f"{DIST}/RECORD", fields={124: b"\x00" + b"%010o\x00" % len(RECORD_B)})
                    + RECORD_B
                    + bytes(-len(RECORD_B) % BLOCK)
                )
            )
        ],
        "not plain octal",
    ),
    ("negative-size", [gz(archive(header(f"{DIST}/RECORD", fields={124: b"\xff" * 12})))], "negative size"),
    (
        "dir-with-size",
        [gz(archive(header(f"{SITE}/", typeflag=b"5", size=BLOCK) + member(f"{DIST}/RECORD", RECORD_B)))],
        "dir with a size",
    ),
    # The end of the archive.
    (
        "member-after-one-zero-block",
        [gz(member("ok", b"1") + bytes(BLOCK) + member(f"{DIST}/RECORD", RECORD_B) + EOA)],
        "single zero block",
    ),
    (
        "member-after-end",
        [gz(archive(member("ok", b"1")) + member(f"{DIST}/RECORD", RECORD_B) + EOA)],
        "after the tar's end-of-archive",
    ),
    ("gzip-zero-padding", [gz(archive(_b_members())) + bytes(512)], "not another gzip member"),
    ("gzip-bad-header-crc", [_gzip_with_header_crc(archive(_b_members()), 0x1234)], "header CRC"),
    # Paths through links, and directories replaced.
    (
        "write-through-symlink",
        [gz(archive(header("x", typeflag=b"2", linkname=f"/{DIST}"), member("x/RECORD", RECORD_B)))],
        "through the symbolic link x",
    ),
    (
        "write-through-relative-symlink",
        [gz(archive(header("x", typeflag=b"2", linkname=DIST), member("x/RECORD", RECORD_B)))],
        "through the symbolic link x",
    ),
    (
        "write-through-lower-layer-symlink",
        [
            gz(archive(header("usr/py", typeflag=b"2", linkname="/usr/local/lib/python3.12"))),
            gz(archive(member("usr/py/dist-packages/vllm-0.32.0.dist-info/RECORD", RECORD_B))),
        ],
        "through the symbolic link usr/py",
    ),
    (
        "whiteout-through-symlink",
        [gz(archive(header("x", typeflag=b"2", linkname=f"/{DIST}"), member("x/.wh.RECORD")))],
        "through the symbolic link x",
    ),
    (
        "opaque-through-symlink",
        [gz(archive(header("x", typeflag=b"2", linkname=f"/{SITE}"), member("x/.wh..wh..opq")))],
        "through the symbolic link x",
    ),
    (
        "hard-link-through-symlink",
        [
            gz(
                archive(
                    header("x", typeflag=b"2", linkname="/tmp"),
                    member("x/r", RECORD_B),
                    header(f"{DIST}/RECORD", typeflag=b"1", linkname="x/r"),
                )
            )
        ],
        "through the symbolic link x",
    ),
    ("dir-replaced-by-file", [gz(archive(_b_members(), member(DIST, b"a file now")))], "holds no installed vllm"),
    (
        "dir-replaced-by-symlink",
        [gz(archive(_b_members(), header(DIST, typeflag=b"2", linkname="/nowhere")))],
        "holds no installed vllm",
    ),
    (
        "dir-replaced-then-written-through",
        [gz(archive(header(DIST, typeflag=b"2", linkname="/tmp"), member(f"{DIST}/RECORD", RECORD_B)))],
        "through the symbolic link",
    ),
    (
        "whiteout-of-own-member",
        [gz(archive(_b_members(), member(f"{SITE}/.wh.vllm-0.32.0.dist-info")))],
        "which its own layer wrote",
    ),
    (
        "other-site-too",
        [gz(archive(*(member(n.replace(SITE, OTHER_SITE), d) for n, d in sorted(B.items()))))],
        "2 installed vllm",
    ),
]


def _push(client: RegistryClient, repository: str, uppers: list[bytes]) -> list[dict]:
    descriptors, diff_ids = [], []
    for blob in [BASE, *uppers]:
        client.upload(repository, sha256_digest(blob), blob, len(blob))
        zstd = blob.startswith(b"\x28\xb5\x2f\xfd")
        media = OCI_LAYER_ZSTD if zstd else OCI_LAYER_GZIP
        descriptors.append({"mediaType": media, "digest": sha256_digest(blob), "size": len(blob)})
        try:
            plain = zstandard.ZstdDecompressor().decompressobj().decompress(blob) if zstd else gzip.decompress(blob)
        except (OSError, EOFError, zstandard.ZstdError):
            plain = blob  # a diff_id nobody can compute: the runtime refuses the layer anyway
        diff_ids.append(sha256_digest(plain))
    put_image(client, repository, "t", "linux/amd64", descriptors, diff_ids)
    return descriptors


def _pin_view(client: RegistryClient, repository: str, descriptors: list[dict]) -> tuple[str, object]:
    try:
        files = read_layer_files(
            client,
            repository,
            descriptors,
            wanted=wanted_files("vllm"),
            max_file_bytes=1 << 20,
            label="base",
            progress=False,
        )
        installed = engine_identity(files, "vllm", "base")
    except (OciError, AttestError) as exc:
        return "refused", str(exc)
    return "identity", (installed.version, installed.record_sha256, installed.commit)


def _identities_inside(rootfs: Path, sender) -> None:
    """In a forked child: chroot into the unpacked image and read every installed vllm as the
    launcher would, each site searched on its own."""
    try:
        os.chroot(rootfs)
        os.chdir("/")
        found = set()
        for site in (SITE, OTHER_SITE):
            installed = find_installed(ENGINE_DISTRIBUTIONS["vllm"], "vllm", ["/" + site])
            if installed is not None:
                found.add((installed.version, installed.record_sha256, installed.commit))
        sender.send(("ok", sorted(found)))
    except Exception as exc:  # the launcher refuses such a tree: reported, not raised in the child
        sender.send(("refused", repr(exc)))


def _runtime_view(registry: LoopbackRegistry, repository: str, work: Path) -> tuple[str, object]:
    layout, rootfs = work / "layout", work / "rootfs"
    copied = run(
        [SKOPEO, "copy", "--src-tls-verify=false", f"docker://{registry.host}/{repository}:t", f"oci:{layout}:t"]
    )
    if copied.returncode != 0:
        return "refused", copied.stderr[-400:]
    unpacked = run([UMOCI, "raw", "unpack", "--rootless", "--image", f"{layout}:t", str(rootfs)])
    if "is not correct mediatype" in unpacked.stderr:  # umoci 0.4.7 has no zstd: crane flattens, GNU tar unpacks
        flat = work / "flat.tar"
        unpacked = run([CRANE, "export", "--insecure", f"{registry.host}/{repository}:t", str(flat)])
        if unpacked.returncode == 0:
            rootfs.mkdir()
            unpacked = run(["tar", "-xf", str(flat), "-C", str(rootfs)])
    if unpacked.returncode != 0:
        return "refused", unpacked.stderr[-400:]
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_identities_inside, args=(rootfs, sender))
    child.start()
    outcome = receiver.recv() if receiver.poll(60) else ("refused", "the chroot child did not answer")
    child.join(10)
    if outcome[0] == "refused" or len(outcome[1]) != 1:
        return "refused", outcome[1]
    return "identity", outcome[1][0]


@pytest.fixture(scope="module")
def registry():
    if os.geteuid() != 0:
        pytest.fail(
            f"reading the unpacked image as the launcher does needs chroot (root); this runs as uid {os.geteuid()}"
        )
    with LoopbackRegistry() as started:
        yield started


@pytest.mark.parametrize("uppers, expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_pin_refuses_or_reads_what_the_runtime_unpacks(registry, tmp_path: Path, uppers, expected) -> None:
    repository = f"conformance/{tmp_path.name.lower()}"
    with RegistryClient(registry.host, credential=None) as client:
        descriptors = _push(client, repository, uppers)
        pin = _pin_view(client, repository, descriptors)
    runtime = _runtime_view(registry, repository, tmp_path)
    shutil.rmtree(tmp_path / "rootfs", ignore_errors=True)
    if runtime[0] == "refused":
        assert pin[0] == "refused", f"umoci or the launcher refuses ({runtime[1]}) but pin read {pin[1]}"
    if pin[0] == "identity":
        assert pin == runtime, f"pin read {pin[1]}, the unpacked image holds {runtime[1]}"
    if expected == "agrees":
        assert pin[0] == "identity", pin[1]
    else:
        assert pin[0] == "refused" and expected in pin[1], pin[1]
