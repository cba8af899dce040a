"""The one safe tar extraction (omni_oci/format/tar_members.py) that product and tests use on every
supported Python, Debian 12's 3.11.2 (no extraction filters) included: a tar as other tools
write it is reproduced exactly; each hostile member is refused naming the tar and the member,
and nothing is written outside the destination."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from omni_oci.format.errors import OciError
from omni_oci.format.tar_members import extract_all, member_path
from omni_oci.format.tar_reader import TarStream


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **fields) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.uid, info.gid, info.mode = 4321, 8765, 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data else None)


def _tar(path: Path, *members) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data, fields in members:
            _add(tar, name, data, **fields)
    return path


def _extract(source: Path, dest: Path) -> list[str]:
    with source.open("rb") as handle:
        return extract_all(TarStream.of_file(handle), dest, source=source)


def test_a_well_formed_tar_is_written_as_its_members_say(tmp_path: Path) -> None:
    source = _tar(
        tmp_path / "ok.tar",
        ("./pkg", b"", {"type": tarfile.DIRTYPE, "mode": 0o750}),
        ("./pkg/alpha.py", b"A = 1\n", {}),
        ("./pkg/tool", b"#!/bin/sh\n", {"mode": 0o4755}),
        ("./pkg/alias.py", b"", {"type": tarfile.LNKTYPE, "linkname": "./pkg/alpha.py"}),
        ("./pkg/latest", b"", {"type": tarfile.SYMTYPE, "linkname": "alpha.py"}),
        ("./top", b"", {"type": tarfile.SYMTYPE, "linkname": "pkg/../pkg/alpha.py"}),
        ("./pkg/alpha.py", b"A = 2\n", {}),
    )  # a later member replaces an earlier one
    root = tmp_path / "root"
    assert _extract(source, root) == [
        "pkg",
        "pkg/alpha.py",
        "pkg/tool",
        "pkg/alias.py",
        "pkg/latest",
        "top",
        "pkg/alpha.py",
    ]
    assert (root / "pkg/alpha.py").read_bytes() == b"A = 2\n"
    assert (root / "pkg/alias.py").read_bytes() == b"A = 1\n"
    assert os.readlink(root / "pkg/latest") == "alpha.py" and (root / "top").read_bytes() == b"A = 2\n"
    assert stat.S_IMODE((root / "pkg/tool").stat().st_mode) == 0o755  # set-id bits dropped
    assert stat.S_IMODE((root / "pkg").stat().st_mode) == 0o750
    assert (root / "pkg/alpha.py").stat().st_uid == os.getuid()  # owners are never applied


@pytest.mark.parametrize(
    "members, message",
    [
        ([("/etc/passwd", b"x", {})], "member '/etc/passwd' is absolute or leaves"),
        ([("a/../../escape", b"x", {})], "member 'a/../../escape' is absolute or leaves"),
        ([("a/../b", b"x", {})], "member 'a/../b' is absolute or leaves"),  # no `..` at all, even inside
        ([("dev/sda", b"", {"type": tarfile.BLKTYPE})], "member 'dev/sda' is a device, FIFO"),
        ([("tty", b"", {"type": tarfile.CHRTYPE})], "member 'tty' is a device, FIFO"),
        ([("pipe", b"", {"type": tarfile.FIFOTYPE})], "member 'pipe' is a device, FIFO"),
        (
            [("out", b"", {"type": tarfile.SYMTYPE, "linkname": "/etc/passwd"})],
            "symbolic link 'out' points to '/etc/passwd'; expected a relative target",
        ),
        (
            [("a/out", b"", {"type": tarfile.SYMTYPE, "linkname": "../../escape"})],
            "symbolic link 'a/out' points to '../../escape', outside",
        ),
        ([("empty", b"", {"type": tarfile.SYMTYPE, "linkname": ""})], "symbolic link 'empty' points to ''"),
        (
            [("dir", b"", {"type": tarfile.SYMTYPE, "linkname": "."}), ("dir/file", b"x", {})],
            "member 'dir/file' would be written through the symbolic link dir",
        ),
        (
            [("d", b"", {"type": tarfile.DIRTYPE}), ("d", b"file now", {})],
            "member 'd' would replace a directory written before it",
        ),
        (
            [("d/x", b"1", {}), ("d", b"", {"type": tarfile.SYMTYPE, "linkname": "."})],
            "member 'd' would replace a directory written before it",
        ),
        (
            [("hard", b"", {"type": tarfile.LNKTYPE, "linkname": "missing"})],
            "hard link 'hard' points to 'missing', which is not a regular file written before it",
        ),
        (
            [("d", b"", {"type": tarfile.DIRTYPE}), ("hard", b"", {"type": tarfile.LNKTYPE, "linkname": "d"})],
            "hard link 'hard' points to 'd'",
        ),
        (
            [("hard", b"", {"type": tarfile.LNKTYPE, "linkname": "/etc/passwd"})],
            "member '/etc/passwd' is absolute or leaves",
        ),
        ([("hard", b"", {"type": tarfile.LNKTYPE, "linkname": "../escape"})], "member '../escape' is absolute"),
    ],
)
def test_hostile_members_are_refused_naming_tar_and_member(tmp_path: Path, members, message: str) -> None:
    source = _tar(tmp_path / "hostile.tar", *members)
    outside = set(tmp_path.iterdir())
    with pytest.raises(OciError, match=message) as refused:
        _extract(source, tmp_path / "root")
    assert str(source) in str(refused.value) and refused.value.field.startswith(f"{source}:")
    assert set(tmp_path.iterdir()) == outside | {tmp_path / "root"}  # nothing beside the destination


def test_member_path_cleans_names_and_names_the_kind() -> None:
    assert str(member_path("x.tar", "./a//b/./c")) == "a/b/c"
    assert str(member_path("x.tar", "./")) == "."
    with pytest.raises(OciError, match=r"^base layer sha256:1: member '\.\./a'") as refused:
        member_path("sha256:1", "../a", kind="base layer")
    assert refused.value.field == "sha256:1:../a"
