"""Layers from tar files other rules made (`oci_layer(tars = ...)`): plain, gzip and zstd tars
give the same normalised layer; hostile members are refused naming the tar and the member;
`compression = "none"` writes a plain tar whose digest is its diff_id, and umoci unpacks it."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import zstandard

from omni_oci.format.errors import OciError
from omni_oci.format.layout import OCI_LAYER_GZIP, OCI_LAYER_TAR
from tests.fixtures.oci import UMOCI, make_image, run
from tools.oci.build.layer import main as layer_main
from tools.oci.build.layer import write_layer


def _member(tar: tarfile.TarFile, name: str, data: bytes = b"", **fields) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime, info.uid, info.gid, info.uname, info.mode = 1_700_000_000, 1234, 5678, "someone", 0o664
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _site_tar(path: Path) -> Path:
    """A tar as another tool writes it: owners, times and odd modes, unsorted, a hard link."""
    with tarfile.open(path, "w") as tar:
        _member(tar, "./pkg/zeta.py", b"Z = 1\n")
        _member(tar, "./pkg", type=tarfile.DIRTYPE, mode=0o700)
        _member(tar, "./pkg/tool", b"#!/bin/sh\n", mode=0o4775)
        _member(tar, "./pkg/alpha.py", b"A = 1\n")
        _member(tar, "./pkg/alias.py", type=tarfile.LNKTYPE, linkname="./pkg/alpha.py")
        _member(tar, "./pkg/latest", type=tarfile.SYMTYPE, linkname="alpha.py")
    return path


def _listing(blob: Path) -> dict[str, tuple]:
    with tarfile.open(blob) as tar:
        return {
            m.name: (
                m.type,
                oct(m.mode),
                m.uid,
                m.gid,
                m.uname,
                m.mtime,
                m.linkname,
                tar.extractfile(m).read() if m.isfile() else None,
            )
            for m in tar.getmembers()
        }


def test_a_tar_becomes_a_normalised_layer_under_its_prefix(tmp_path: Path) -> None:
    desc = write_layer(
        [],
        tmp_path / "layer.tar.gz",
        tars=[{"src": str(_site_tar(tmp_path / "site.tar")), "prefix": "/usr/local/lib/site"}],
    )
    listing = _listing(tmp_path / "layer.tar.gz")
    assert list(listing) == sorted(listing)  # sorted, parents first
    assert listing["usr/local/lib/site/pkg"][:2] == (tarfile.DIRTYPE, "0o755")
    assert listing["usr/local/lib/site/pkg/tool"][:2] == (tarfile.REGTYPE, "0o755")  # no setuid bit
    assert listing["usr/local/lib/site/pkg/zeta.py"][:2] == (tarfile.REGTYPE, "0o644")
    # The hard link is a copy of its target: the layer never depends on member order.
    assert listing["usr/local/lib/site/pkg/alias.py"][0] == tarfile.REGTYPE
    assert listing["usr/local/lib/site/pkg/alias.py"][-1] == b"A = 1\n"
    assert listing["usr/local/lib/site/pkg/latest"][0] == tarfile.SYMTYPE
    assert listing["usr/local/lib/site/pkg/latest"][-2] == "alpha.py"
    assert {entry[2:6] for entry in listing.values()} == {(0, 0, "", 0)}
    assert desc["mediaType"] == OCI_LAYER_GZIP


def test_plain_gzip_and_zstd_tars_give_the_same_layer(tmp_path: Path) -> None:
    plain = _site_tar(tmp_path / "site.tar")
    gzipped = tmp_path / "site.tar.gz"
    gzipped.write_bytes(gzip.compress(plain.read_bytes()))
    zstd = tmp_path / "site.tar.zst"
    zstd.write_bytes(zstandard.ZstdCompressor(level=3).compress(plain.read_bytes()))
    sources = [plain, gzipped, zstd]
    digests = {
        write_layer([], tmp_path / f"out-{i}.tar.gz", tars=[{"src": str(s), "prefix": "/x"}])["digest"]
        for i, s in enumerate(sources)
    }
    assert len(digests) == 1
    assert not list(tmp_path.glob(".out-*.inputs"))  # the decompressed copies are gone


def test_tars_and_files_merge_and_a_clash_is_refused(tmp_path: Path) -> None:
    site = _site_tar(tmp_path / "site.tar")
    (tmp_path / "extra.py").write_text("E = 1\n")
    write_layer(
        [{"src": str(tmp_path / "extra.py"), "dest": "/x/pkg/extra.py"}],
        tmp_path / "ok.tar.gz",
        tars=[{"src": str(site), "prefix": "/x"}],
    )
    assert "x/pkg/extra.py" in _listing(tmp_path / "ok.tar.gz")
    with pytest.raises(OciError, match="two different entries for x/pkg/zeta.py"):
        write_layer(
            [{"src": str(tmp_path / "extra.py"), "dest": "/x/pkg/zeta.py"}],
            tmp_path / "clash.tar.gz",
            tars=[{"src": str(site), "prefix": "/x"}],
        )


def _hostile(path: Path, build) -> Path:
    with tarfile.open(path, "w") as tar:
        build(tar)
    return path


@pytest.mark.parametrize(
    "name, build, message",
    [
        ("absolute", lambda t: _member(t, "/etc/passwd", b"x"), "member '/etc/passwd' is absolute or leaves"),
        ("climbing", lambda t: _member(t, "a/../../etc/passwd", b"x"), "member 'a/../../etc/passwd' is absolute or"),
        ("device", lambda t: _member(t, "dev/sda", type=tarfile.BLKTYPE), "member 'dev/sda' is a device, FIFO"),
        ("fifo", lambda t: _member(t, "pipe", type=tarfile.FIFOTYPE), "member 'pipe' is a device, FIFO"),
        (
            "dangling hard link",
            lambda t: _member(t, "a", type=tarfile.LNKTYPE, linkname="missing"),
            "hard link 'a' points to 'missing', which is not a regular file",
        ),
        (
            "hard link to a directory",
            lambda t: (_member(t, "d", type=tarfile.DIRTYPE), _member(t, "a", type=tarfile.LNKTYPE, linkname="d")),
            "hard link 'a' points to 'd'",
        ),
    ],
)
def test_hostile_tar_members_are_refused_naming_tar_and_member(tmp_path: Path, name: str, build, message: str) -> None:
    source = _hostile(tmp_path / f"{name.replace(' ', '-')}.tar", build)
    with pytest.raises(OciError, match=message) as refused:
        write_layer([], tmp_path / "out.tar.gz", tars=[{"src": str(source), "prefix": "/x"}])
    assert refused.value.field.startswith(str(source) + ":")
    assert str(source) in str(refused.value)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x1f\x8b\x08\x00garbage", "is not a valid gzip stream"),
        (b"\x28\xb5\x2f\xfdgarbage", "is not a valid zstd stream"),
        (b"neither a tar nor compressed" * 30, "the tar header at byte 0 has a checksum field"),
    ],
)
def test_a_corrupt_tar_is_refused_naming_it(tmp_path: Path, content: bytes, message: str) -> None:
    source = tmp_path / "bad.tar"
    source.write_bytes(content)
    with pytest.raises(OciError, match=message) as refused:
        write_layer([], tmp_path / "out.tar.gz", tars=[{"src": str(source), "prefix": "/x"}])
    assert refused.value.field == str(source)


def test_a_missing_tar_and_an_unknown_compression_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OciError, match="is unreadable") as refused:
        write_layer([], tmp_path / "out.tar", tars=[{"src": str(tmp_path / "absent.tar"), "prefix": "/x"}])
    assert refused.value.field == str(tmp_path / "absent.tar")
    with pytest.raises(OciError, match="compression must be one of gzip, zstd, none, got 'xz'"):
        write_layer([], tmp_path / "out.tar", compression="xz")


def test_an_uncompressed_layer_is_a_plain_tar_whose_digest_is_its_diff_id(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "entries": [],
                "compression": "none",
                "tars": [{"src": str(_site_tar(tmp_path / "site.tar")), "prefix": "/opt/site"}],
            }
        )
    )
    assert (
        layer_main(
            ["--spec", str(spec), "--output", str(tmp_path / "layer.tar"), "--descriptor", str(tmp_path / "layer.json")]
        )
        == 0
    )
    desc = json.loads((tmp_path / "layer.json").read_text())
    data = (tmp_path / "layer.tar").read_bytes()
    assert desc == {
        "mediaType": OCI_LAYER_TAR,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "diff_id": "sha256:" + hashlib.sha256(data).hexdigest(),
        "size": len(data),
    }
    gzipped = write_layer(
        [], tmp_path / "layer.tar.gz", tars=[{"src": str(tmp_path / "site.tar"), "prefix": "/opt/site"}]
    )
    assert gzipped["diff_id"] == desc["diff_id"]  # the same tar, compressed or not

    # umoci (an independent implementation) unpacks the plain layer of an image.
    make_image(tmp_path / "layout", [(desc, tmp_path / "layer.tar")], entrypoint=["/bin/true"])
    unpacked = run(
        [UMOCI, "raw", "unpack", "--rootless", "--image", f"{tmp_path / 'layout'}:latest", str(tmp_path / "rootfs")]
    )
    assert unpacked.returncode == 0, unpacked.stderr
    assert (tmp_path / "rootfs/opt/site/pkg/alias.py").read_bytes() == b"A = 1\n"


def test_a_zstd_layer_is_deterministic_and_unpacks_like_the_gzip_one(tmp_path: Path) -> None:
    site = _site_tar(tmp_path / "site.tar")
    zstd = write_layer([], tmp_path / "layer.tar.zst", tars=[{"src": str(site), "prefix": "/opt"}], compression="zstd")
    again = write_layer([], tmp_path / "again.tar.zst", tars=[{"src": str(site), "prefix": "/opt"}], compression="zstd")
    gz = write_layer([], tmp_path / "layer.tar.gz", tars=[{"src": str(site), "prefix": "/opt"}])
    assert zstd == again and zstd["mediaType"] == "application/vnd.oci.image.layer.v1.tar+zstd"
    assert zstd["diff_id"] == gz["diff_id"] and zstd["digest"] != gz["digest"]  # same tar, other compression
    plain = zstandard.ZstdDecompressor().stream_reader(io.BytesIO((tmp_path / "layer.tar.zst").read_bytes())).read()
    assert "sha256:" + hashlib.sha256(plain).hexdigest() == zstd["diff_id"]
    # skopeo (containers/image, an independent implementation) reads the zstd layer of an image.
    make_image(tmp_path / "layout", [(zstd, tmp_path / "layer.tar.zst")], entrypoint=["/bin/true"])
    copied = run(
        ["skopeo", "copy", "--dest-decompress", f"oci:{tmp_path / 'layout'}:latest", f"dir:{tmp_path / 'copied'}"]
    )
    assert copied.returncode == 0, copied.stderr
