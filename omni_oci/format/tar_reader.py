"""The one reader for tar bytes Omni did not write: members exactly as Go's archive/tar reads
them, and a refusal wherever tar readers could disagree.

containerd, CRI-O, umoci and go-containerregistry all unpack layers with Go's archive/tar, so
what this reader yields is what a node unpacks. Go's reader.go is followed field by field
(checksum, formats, base-256 and octal numbers, pax records, GNU long names, the end of the
archive), and these are refused although some reader accepts them, because readers take them
differently: two pax headers or two GNU long names (or long links) for one member; a GNU long
name together with a pax `path` (or a long link with `linkpath`); an extended header that no
member follows; any `GNU.sparse.*` key and sparse members; global pax headers (Go ignores them,
CPython applies them to every later member); non-zero bytes in the prefix field of V7 and GNU
headers (Go reads GNU atime/ctime there, CPython a path prefix); star headers; numeric fields
that are not plain octal (digits after a NUL, signs, spaces inside) or negative sizes; a
directory, link or special file with a size; empty pax `path`, `linkpath` or `size`; duplicate
pax keys; bytes other than zeros after the end-of-archive blocks.

Memory stays bounded: a header record (pax or long name) is at most MAX_HEADER_RECORD_BYTES,
Go's own limit, and member data is never read unless the caller asks for it.

Why by hand and not `tarfile`: CPython's tarfile and Go's archive/tar read the same bytes
differently on each construct above, so an identity computed with tarfile could describe a
file that no runtime unpacks; no library on PyPI reads tar as Go does. tarfile still writes
Omni's own tars (tools.oci.build), whose members are fixed by the build.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import BinaryIO, Iterator

from omni_oci.format.errors import OciError

BLOCK = 512
ZERO_BLOCK = bytes(BLOCK)
MAX_HEADER_RECORD_BYTES = 1 << 20  # Go's maxSpecialFileSize, for pax and GNU long-name records
READ_BYTES = 1 << 20
_USTAR_MAGIC, _GNU_MAGIC, _GNU_VERSION, _STAR_TRAILER = b"ustar\x00", b"ustar ", b" \x00", b"tar\x00"
_KINDS = {b"0": "file", b"\x00": "file", b"1": "hardlink", b"2": "symlink"}
_KINDS.update({b"3": "char", b"4": "block", b"5": "dir", b"6": "fifo"})
_HEADER_ONLY = frozenset({"hardlink", "symlink", "char", "block", "dir", "fifo"})
_EXTENDED = {b"x": "pax header", b"L": "GNU long name", b"K": "GNU long link"}
_DECIMAL = re.compile(rb"[0-9]+")
_OCTAL = re.compile(rb"[0-7]+")
_ASCII = bytes(range(0x80))
_PAX_TIME = re.compile(rb"-?[0-9]+(\.[0-9]+)?")
_PAX_NUMBERS = {b"size": _DECIMAL, b"uid": _DECIMAL, b"gid": _DECIMAL}
_PAX_NUMBERS.update({b"mtime": _PAX_TIME, b"atime": _PAX_TIME, b"ctime": _PAX_TIME})
_PAX_NO_NUL = frozenset({b"path", b"linkpath", b"uname", b"gname"})


@dataclass(frozen=True)
class TarMember:
    """One member as Go's reader gives it: `name` and `linkname` raw (decoded as UTF-8 with
    surrogate escapes, so every byte string keeps its own name); `kind` is file, dir, symlink,
    hardlink, char, block or fifo; `offset` is where its header starts in the tar."""

    name: str
    kind: str
    size: int
    mode: int
    linkname: str
    offset: int


class TarStream:
    """Tar bytes read forward only, from pieces (an iterator of bytes) or a binary file.
    Skipped bytes are dropped piece by piece, never copied."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._piece = memoryview(b"")
        self.position = 0

    @classmethod
    def of_file(cls, handle: BinaryIO) -> "TarStream":
        return cls(iter(lambda: handle.read(READ_BYTES), b""))

    def _next(self) -> bool:
        piece = next(self._pieces, b"")
        self._piece = memoryview(piece)
        return bool(piece)

    def read(self, count: int) -> bytes:
        """Up to `count` bytes: fewer only at the end of the stream."""
        parts = []
        while count and (self._piece or self._next()):
            part = self._piece[:count]
            self._piece = self._piece[len(part) :]
            parts.append(part)
            count -= len(part)
        data = b"".join(parts)
        self.position += len(data)
        return data

    def skip(self, count: int) -> int:
        """Drops up to `count` bytes; how many were there."""
        skipped = 0
        while count > skipped and (self._piece or self._next()):
            step = min(count - skipped, len(self._piece))
            self._piece = self._piece[step:]
            skipped += step
        self.position += skipped
        return skipped


class MemberData:
    """A member's data, read at most to its size; what the caller leaves is skipped."""

    def __init__(self, stream: TarStream, size: int) -> None:
        self._stream, self.left = stream, size

    def read(self, count: int) -> bytes:
        data = self._stream.read(min(count, self.left))
        self.left -= len(data)
        return data


@dataclass(frozen=True)
class _Tar:
    """How refusals name the tar: `where` starts the message, `field` is the field they carry."""

    where: str
    field: str

    def refuse(self, offset: int, what: str) -> OciError:
        return OciError(f"{self.where}: the tar header at byte {offset} {what}", field=self.field)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _c_string(field: bytes) -> bytes:
    """A NUL-terminated field's bytes before its first NUL (Go's parseString)."""
    return field.split(b"\x00", 1)[0]


def _number(field: bytes, name: str, tar: _Tar, offset: int, *, signed: bool = False) -> int:
    """A numeric field: plain octal padded with spaces or NULs, or base-256 when its first bit
    is set (Go's parseNumeric, without what Go reads past a NUL)."""
    if field[0] < 0x80:
        digits = field.lstrip(b" ").rstrip(b" \x00")
        if not digits:
            return 0
        if not _OCTAL.fullmatch(digits):  # a NUL inside: Go reads past it, CPython stops
            raise tar.refuse(offset, f"has a {name} field {bytes(field)!r} that is not plain octal")
        return int(digits, 8)
    value = int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    if field[0] & 0x40:
        value -= 1 << (8 * len(field) - 1)
    if value < 0 and not signed:
        raise tar.refuse(offset, f"has a negative {name} ({value})")
    if not -(1 << 63) <= value < 1 << 63:
        raise tar.refuse(offset, f"has a {name} that overflows 64 bits")
    return value


def _checksum_matches(block: bytes, tar: _Tar, offset: int) -> bool:
    """Go accepts the unsigned or the signed byte sum, the checksum field counted as spaces."""
    stored = _number(block[148:156], "checksum", tar, offset)
    unsigned = sum(block) - sum(block[148:156]) + 8 * 0x20
    if stored == unsigned:
        return True
    high_bytes = len(block[:148].translate(None, _ASCII)) + len(block[156:].translate(None, _ASCII))
    return stored == unsigned - 256 * high_bytes


def _format(block: bytes, tar: _Tar, offset: int) -> str:
    """ustar (also pax), gnu or v7; star is refused, and so are bytes in fields v7 and gnu do not have."""
    if not _checksum_matches(block, tar, offset):
        raise tar.refuse(offset, "has a bad checksum (not a tar header)")
    magic, version = block[257:263], block[263:265]
    if magic == _USTAR_MAGIC and block[508:512] == _STAR_TRAILER:
        raise tar.refuse(offset, "is a star header (its prefix and times are read differently by tar readers)")
    if magic == _USTAR_MAGIC:
        return "ustar"
    if magic == _GNU_MAGIC and version == _GNU_VERSION:
        if any(block[345:500]):
            raise tar.refuse(offset, "is a GNU header with bytes in its prefix field (atime/ctime or a prefix)")
        return "gnu"
    if any(block[257:329]) or any(block[345:500]):  # GNU tar's v7 writes device numbers; Go ignores them
        raise tar.refuse(offset, "is a V7 header with bytes past its link name (no ustar or GNU magic)")
    return "v7"


@dataclass
class _Header:
    typeflag: bytes
    name: bytes
    linkname: bytes
    size: int
    mode: int
    offset: int


def _header(block: bytes, tar: _Tar, offset: int) -> _Header:
    form = _format(block, tar, offset)
    name = _c_string(block[0:100])
    if form == "ustar" and (prefix := _c_string(block[345:500])):
        name = prefix + b"/" + name
    for field, start, end in (("mode", 100, 108), ("uid", 108, 116), ("gid", 116, 124)):
        _number(block[start:end], field, tar, offset)
    _number(block[136:148], "mtime", tar, offset, signed=True)
    if form != "v7":
        _number(block[329:337], "devmajor", tar, offset)
        _number(block[337:345], "devminor", tar, offset)
    return _Header(
        typeflag=block[156:157],
        name=name,
        linkname=_c_string(block[157:257]),
        size=_number(block[124:136], "size", tar, offset),
        mode=_number(block[100:108], "mode", tar, offset),
        offset=offset,
    )


def _pax_records(data: bytes, tar: _Tar, offset: int) -> dict[bytes, bytes]:
    """`LEN key=value\\n` records (Go's parsePAXRecord), refusing duplicates and sparse keys."""
    records: dict[bytes, bytes] = {}
    while data:
        length_text, space, _ = data.partition(b" ")
        if not space or not _DECIMAL.fullmatch(length_text) or not 5 <= int(length_text) <= len(data):
            raise tar.refuse(offset, "has a pax record whose length is malformed")
        record, data = data[: int(length_text)], data[int(length_text) :]
        key, equals, value = record[len(length_text) + 1 : -1].partition(b"=")
        if not record.endswith(b"\n") or not equals or not key:
            raise tar.refuse(offset, f"has a malformed pax record {record[:64]!r}")
        if b"\x00" in key or (key in _PAX_NO_NUL and b"\x00" in value):
            raise tar.refuse(offset, f"has a pax record {_text(key)!r} holding a NUL")
        if key.startswith(b"GNU.sparse."):
            raise tar.refuse(offset, f"has the sparse pax key {_text(key)!r}: sparse members are refused")
        if key in records:
            raise tar.refuse(offset, f"repeats the pax key {_text(key)!r}")
        if key in (b"path", b"linkpath", b"size") and not value:
            raise tar.refuse(offset, f"has an empty pax {_text(key)} (Go keeps the header's, CPython takes it)")
        if key in _PAX_NUMBERS and not _PAX_NUMBERS[key].fullmatch(value):
            raise tar.refuse(offset, f"has a pax {_text(key)} {value[:32]!r} that is not a decimal number")
        records[key] = value
    return records


class _Extensions:
    """Extended headers waiting for the member they describe: at most one of each kind."""

    def __init__(self) -> None:
        self.pax: dict[bytes, bytes] | None = None
        self.long_name: bytes | None = None
        self.long_link: bytes | None = None
        self.offset = -1

    def pending(self) -> bool:
        return self.pax is not None or self.long_name is not None or self.long_link is not None

    def add(self, typeflag: bytes, data: bytes, tar: _Tar, offset: int) -> None:
        slot = {b"x": "pax", b"L": "long_name", b"K": "long_link"}[typeflag]
        if getattr(self, slot) is not None:
            raise tar.refuse(offset, f"is a second {_EXTENDED[typeflag]} for one member")
        if typeflag == b"x":
            value: object = _pax_records(data, tar, offset)
        else:
            value = _c_string(data)
            if not value:
                raise tar.refuse(offset, f"is an empty {_EXTENDED[typeflag]}")
        setattr(self, slot, value)
        self.offset = offset if self.offset < 0 else self.offset

    def apply(self, header: _Header, tar: _Tar) -> None:
        pax = self.pax or {}
        if self.long_name is not None and b"path" in pax:
            raise tar.refuse(header.offset, "has both a GNU long name and a pax path")
        if self.long_link is not None and b"linkpath" in pax:
            raise tar.refuse(header.offset, "has both a GNU long link and a pax linkpath")
        header.name = self.long_name or pax.get(b"path", header.name)
        header.linkname = self.long_link or pax.get(b"linkpath", header.linkname)
        if b"size" in pax:
            header.size = int(pax[b"size"])


def _read_record(stream: TarStream, size: int, tar: _Tar, offset: int, what: str) -> bytes:
    if size > MAX_HEADER_RECORD_BYTES:
        raise tar.refuse(offset, f"is a {what} of {size} bytes; at most {MAX_HEADER_RECORD_BYTES} are read")
    data = stream.read(size)
    if len(data) < size or stream.skip(-size % BLOCK) < -size % BLOCK:
        raise tar.refuse(offset, f"is a {what} cut short by the end of the stream")
    return data


def _member(header: _Header, tar: _Tar) -> TarMember:
    kind = _KINDS.get(header.typeflag)
    if kind is None:
        what = {b"g": "a global pax header", b"S": "a GNU sparse member", b"7": "a contiguous file"}
        found = what.get(header.typeflag, f"type {header.typeflag!r}")
        raise tar.refuse(header.offset, f"is {found}; expected a file, directory, link, device or FIFO")
    if header.typeflag == b"\x00" and header.name.endswith(b"/"):
        kind = "dir"
    if kind in _HEADER_ONLY and header.size:
        raise tar.refuse(header.offset, f"is a {kind} with a size of {header.size} bytes; expected none")
    if not header.name:
        raise tar.refuse(header.offset, "has an empty name")
    return TarMember(_text(header.name), kind, header.size, header.mode, _text(header.linkname), header.offset)


def _end_of_archive(stream: TarStream, tar: _Tar, offset: int) -> None:
    """After the first zero block: a second one (or the end), then nothing but zeros."""
    second = stream.read(BLOCK)
    if second and second != ZERO_BLOCK:
        raise tar.refuse(offset + BLOCK, "follows a single zero block (expected the end-of-archive blocks)")
    while rest := stream.read(READ_BYTES):
        if rest.strip(b"\x00"):
            raise OciError(f"{tar.where}: there are bytes after the tar's end-of-archive blocks", field=tar.field)


def read_members(stream: TarStream, where: str, *, field: str = "") -> Iterator[tuple[TarMember, MemberData]]:
    """Each member with its data, in the order of the tar. The data must be read, if at all,
    before the next member is asked for. Refusals name `where` and the header's byte offset;
    their field is `field` (default: `where`)."""
    tar = _Tar(where, field or where)
    extensions = _Extensions()
    while True:
        offset = stream.position
        block = stream.read(BLOCK)
        if not block or block == ZERO_BLOCK:
            if extensions.pending():
                raise tar.refuse(extensions.offset, "is an extended header that no member follows")
            if block:
                _end_of_archive(stream, tar, offset)
            return
        if len(block) < BLOCK:
            raise tar.refuse(offset, "is cut short by the end of the stream")
        header = _header(block, tar, offset)
        if header.typeflag in _EXTENDED:
            extensions.add(
                header.typeflag, _read_record(stream, header.size, tar, offset, "header record"), tar, offset
            )
            continue
        extensions.apply(header, tar)
        extensions = _Extensions()
        member = _member(header, tar)
        data = MemberData(stream, 0 if member.kind in _HEADER_ONLY else member.size)
        yield member, data
        padded = data.left + (-member.size % BLOCK if member.kind not in _HEADER_ONLY else 0)
        if stream.skip(padded) < padded:
            raise tar.refuse(offset, f"is member {member.name!r}, cut short by the end of the stream")
