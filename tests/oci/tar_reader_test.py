"""omni_oci/format/tar_reader.py: well-formed tars from GNU tar and CPython in every format read as
they were written; each construct on which tar readers disagree is refused, naming the header's
byte offset; memory stays bounded by the header-record cap."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from omni_oci.format.errors import OciError
from omni_oci.format.tar_reader import MAX_HEADER_RECORD_BYTES, TarStream, read_members
from tests.fixtures.raw_tar import BLOCK, EOA, archive, gnu_long, header, member, padded, pax

LONG = "d/" + "n" * 120 + "/file.txt"


def _read(data: bytes, *, piece: int = 7 * BLOCK + 3) -> list[tuple[str, str, str, bytes]]:
    pieces = iter([data[i : i + piece] for i in range(0, len(data), piece)])
    return [
        (found.name, found.kind, found.linkname, content.read(found.size))
        for found, content in read_members(TarStream(pieces), "test.tar")
    ]


@pytest.mark.parametrize("form", ["ustar", "gnu", "pax", "oldgnu", "posix", "v7"])
def test_gnu_tar_archives_in_every_format_read_as_written(tmp_path: Path, form: str) -> None:
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d/a.txt").write_bytes(b"alpha")
    (tree / "d/empty").write_bytes(b"")
    (tree / "d/link").symlink_to("a.txt")
    (tree / "d/hard").hardlink_to(tree / "d/a.txt")
    if form not in ("ustar", "v7"):
        (tree / "d" / ("n" * 120)).mkdir()
        (tree / LONG).write_bytes(b"long name")
    out = tmp_path / "out.tar"
    subprocess.run(["tar", f"--format={form}", "--sort=name", "-C", str(tree), "-cf", str(out), "d"], check=True)
    members = {name: (kind, linkname, data) for name, kind, linkname, data in _read(out.read_bytes())}
    assert members["d/a.txt"] == ("file", "", b"alpha") and members["d/empty"] == ("file", "", b"")
    assert members["d/link"] == ("symlink", "a.txt", b"")
    assert members.get("d/hard", members.get("d/a.txt"))[0] in ("hardlink", "file")
    assert members["d/"][0] == "dir" if "d/" in members else members["d"][0] == "dir"
    if form not in ("ustar", "v7"):
        assert members[LONG] == ("file", "", b"long name")


@pytest.mark.parametrize("form", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_cpython_tars_read_as_tarfile_reads_them(form: int) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=form) as tar:
        for name, data in [("a.txt", b"1" * 700), ("b/" + "x" * 90 + "/c.txt", b"deep"), ("é.txt", b"utf-8")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw.write(bytes(10240))  # the record padding tar writers add: zeros after the end are fine
    assert [(name, data) for name, _, _, data in _read(raw.getvalue())] == [
        ("a.txt", b"1" * 700),
        ("b/" + "x" * 90 + "/c.txt", b"deep"),
        ("é.txt", b"utf-8"),
    ]


def test_go_reads_a_member_with_no_end_of_archive_and_a_single_zero_block() -> None:
    assert _read(member("a", b"1"))[0][3] == b"1"
    assert _read(member("a", b"1") + bytes(BLOCK))[0][3] == b"1"


def test_a_pax_path_and_size_apply_and_a_gnu_long_link_too() -> None:
    found = _read(
        archive(
            pax({"path": "p/" + "q" * 200, "size": "3", "mtime": "1.5", "SCHILY.xattr.user.x": "y"}),
            member("short", b"abc", fields={124: b"00000000777\x00"}),
            gnu_long("t/" + "k" * 150, typeflag=b"K"),
            header("link", typeflag=b"2"),
        )
    )
    assert found == [("p/" + "q" * 200, "file", "", b"abc"), ("link", "symlink", "t/" + "k" * 150, b"")]


def _big_pax() -> bytes:
    return header("PaxHeaders/x", typeflag=b"x", size=MAX_HEADER_RECORD_BYTES + 1)


HOSTILE = [
    (archive(pax({"path": "a"}), pax({"path": "b"}), member("c", b"1")), "byte 1024 is a second pax header"),
    (archive(gnu_long("a" * 101), gnu_long("b" * 101), member("c", b"1")), "is a second GNU long name"),
    (archive(gnu_long("l" * 101, typeflag=b"K"), gnu_long("m" * 101, typeflag=b"K"), member("c")), "GNU long link"),
    (archive(gnu_long("a" * 101), pax({"path": "b"}), member("c", b"1")), "both a GNU long name and a pax path"),
    (archive(pax({"path": "b"}), gnu_long("a" * 101), member("c", b"1")), "both a GNU long name and a pax path"),
    (
        archive(pax({"linkpath": "b"}), gnu_long("a" * 101, typeflag=b"K"), header("c", typeflag=b"2")),
        "both a GNU long link and a pax linkpath",
    ),
    (archive(pax({"GNU.sparse.name": "x"}), member("c", b"1")), "sparse pax key 'GNU.sparse.name'"),
    (archive(pax({"GNU.sparse.major": "1"}), member("c", b"1")), "sparse pax key"),
    (archive(member("s", b"x" * 512, typeflag=b"S", form="gnu")), "is a GNU sparse member"),
    (archive(pax({"path": "g"}, typeflag=b"g"), member("c", b"1")), "is a global pax header"),
    (archive(member("c", b"1", form="gnu", prefix=b"hidden")), "GNU header with bytes in its prefix field"),
    (archive(member("c", b"1", form="gnu", fields={345: b"00000000001\x00"})), "GNU header with bytes in its prefix"),
    (archive(member("c", b"1", form="v7", prefix=b"hidden")), "V7 header with bytes past its link name"),
    (archive(member("c", b"1", form="v7", fields={257: b"ustar!"})), "V7 header with bytes past its link name"),
    (archive(member("c", b"1", form="star")), "is a star header"),
    (member("a", b"1") + bytes(BLOCK) + member("b", b"2"), "follows a single zero block"),
    (archive(member("a", b"1")) + member("b", b"2"), "bytes after the tar's end-of-archive blocks"),
    (archive(member("a", b"1")) + bytes(4096) + b"\x01", "bytes after the tar's end-of-archive blocks"),
    (archive(header("a", fields={124: b"\xff" + b"\xff" * 10 + b"\xfe"})), "has a negative size"),
    (archive(header("a", fields={124: b"\x80" + b"\x7f" + b"\xff" * 10})), "size that overflows 64 bits"),
    (archive(header("a", fields={124: b"\x00000000012\x00"}) + padded(b"x" * 10)), "size field .* not plain octal"),
    (archive(header("a", fields={124: b"0000000001 2"})), "size field .* not plain octal"),
    (archive(header("a", fields={124: b"-0000000012\x00"})), "size field .* not plain octal"),
    (archive(header("a", fields={124: b"00000000089\x00"})), "size field .* not plain octal"),
    (archive(header("a", fields={100: b"07\x0055\x00\x00\x00"})), "mode field .* not plain octal"),
    (archive(header("a", fields={329: b"zz"})), "devmajor field .* not plain octal"),
    (archive(header("a", checksum=b"0000000\x00")), "has a bad checksum"),
    (archive(header("d/", typeflag=b"5", size=512) + bytes(512)), "is a dir with a size of 512 bytes"),
    (archive(header("l", typeflag=b"2", size=10, linkname="x") + padded(b"x" * 10)), "is a symlink with a size"),
    (archive(header("h", typeflag=b"1", size=10, linkname="x") + padded(b"x" * 10)), "is a hardlink with a size"),
    (archive(pax({"path": "a"})), "is an extended header that no member follows"),
    (pax({"path": "a"}), "is an extended header that no member follows"),
    (archive(gnu_long("")), "is an empty GNU long name"),
    (archive(pax({"path": ""}), member("c")), "has an empty pax path"),
    (archive(pax({"size": ""}), member("c")), "has an empty pax size"),
    (archive(pax({"size": "-1"}), member("c")), "pax size b'-1' that is not a decimal number"),
    (archive(pax({"size": "+1"}), member("c")), "pax size b'\\+1' that is not a decimal number"),
    (archive(pax({"uid": "0x10"}), member("c")), "pax uid"),
    (archive(pax({"mtime": "1e9"}), member("c")), "pax mtime"),
    (
        archive(header("PaxHeaders/x", typeflag=b"x", size=20) + padded(b"10 path=a\n10 path=b\n"), member("c")),
        "repeats the pax key 'path'",
    ),
    (archive(header("PaxHeaders/x", typeflag=b"x", size=8) + padded(b"9 path=a"), member("c")), "length is malformed"),
    (archive(header("PaxHeaders/x", typeflag=b"x", size=9) + padded(b"9 patha\n\n"), member("c")), "malformed pax"),
    (archive(header("PaxHeaders/x", typeflag=b"x", size=10) + padded(b"10 path=a\x00"), member("c")), "malformed"),
    (
        archive(header("PaxHeaders/x", typeflag=b"x", size=12) + padded(b"12 path=a\x00b\n"), member("c")),
        "pax record 'path' holding a NUL",
    ),
    (
        archive(header("PaxHeaders/x", typeflag=b"x", size=20) + padded(b"10 path=a\n" + bytes(10)), member("c")),
        "length",
    ),
    (_big_pax() + bytes(BLOCK), "is a header record of 1048577 bytes; at most 1048576"),
    (archive(member("c", b"1", typeflag=b"7")), "is a contiguous file"),
    (archive(member("c", b"1", typeflag=b"V")), "is type b'V'"),
    (archive(header("", typeflag=b"0")), "has an empty name"),
    (member("a", b"x" * 100)[: BLOCK + 50], "is member 'a', cut short by the end of the stream"),
    (member("a", b"1")[:300], "is cut short by the end of the stream"),
    (pax({"path": "a" * 600})[: BLOCK + 100], "is a header record cut short"),
]


@pytest.mark.parametrize("data, message", HOSTILE, ids=[f"hostile-{n}" for n in range(len(HOSTILE))])
def test_constructs_readers_disagree_on_are_refused_naming_the_header(data: bytes, message: str) -> None:
    with pytest.raises(OciError, match=message) as refused:
        _read(data)
    assert refused.value.field == "test.tar" and str(refused.value).startswith("test.tar: ")


def test_the_reader_never_holds_more_than_one_header_record() -> None:
    """A member's data is skipped piece by piece, never read whole: 64 MB of data pass through."""
    huge = header("big", size=64 << 20)
    pieces = iter([huge] + [bytes(1 << 20)] * 64 + [EOA])
    seen = [(found.name, found.size) for found, _ in read_members(TarStream(pieces), "t")]
    assert seen == [("big", 64 << 20)]
