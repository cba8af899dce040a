"""A layer's bytes as tarfile reads them: decompressed piece by piece as they arrive, and read
forward only.

gzip, zstd and plain tar are told apart by their first bytes, not by the media type a registry
claims. Every piece is at most READ_BYTES, whatever the ratio, so a compression bomb costs time,
never memory.

`ForwardFile` gives tarfile's random-access mode what it needs (tell, read, and seek forward).
A forward seek drops the pieces it passes without copying them: a member nobody wants costs
only its inflating. tarfile's stream mode ("r|") copies every skipped byte through its own
buffer, which made those copies, not zlib, the cost of reading a multi-GB base.
"""
from __future__ import annotations

import io
import struct
import zlib
from typing import Any, Iterator

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
READ_BYTES = 1 << 20
# A gzip header's optional name and comment end at a zero byte; past this the stream is refused.
MAX_GZIP_HEADER_BYTES = 64 * 1024
_DEFLATE = 8
_FHCRC, _FEXTRA, _FNAME, _FCOMMENT, _RESERVED = 0x02, 0x04, 0x08, 0x10, 0xE0
_TRAILER = struct.Struct("<II")  # CRC-32 and the member's size modulo 2**32


class _Source:
    """The compressed chunks, with the few bytes a header needs pulled ahead of the rest."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self.pending = b""

    def fill(self, count: int) -> bool:
        """At least `count` bytes pending, unless the stream ends first."""
        while len(self.pending) < count:
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            self.pending += chunk
        return True

    def take(self, count: int, what: str) -> bytes:
        if not self.fill(count):
            raise EOFError(f"the stream ends inside the gzip {what}")
        taken, self.pending = self.pending[:count], self.pending[count:]
        return taken

    def skip_through_zero(self, what: str) -> None:
        scanned = 0
        while (end := self.pending.find(b"\0", scanned)) < 0:
            scanned = len(self.pending)
            if scanned > MAX_GZIP_HEADER_BYTES:
                raise OSError(f"not a valid gzip stream: its header's {what} runs past {MAX_GZIP_HEADER_BYTES} bytes")
            if not self.fill(scanned + 1):
                raise EOFError(f"the stream ends inside the gzip header's {what}")
        self.pending = self.pending[end + 1:]

    def next_piece(self) -> bytes:
        """What is pending, else the next chunk; b"" at the end."""
        if self.pending:
            piece, self.pending = self.pending, b""
            return piece
        return next(self._chunks, b"")


def _gzip_header(source: _Source) -> bool:
    """Consumes one member's header (RFC 1952 2.3); False at the end of the stream. Zero bytes
    between members are padding, as gzip(1) and Python's gzip module accept."""
    while True:
        if not source.fill(1):
            return False
        source.pending = source.pending.lstrip(b"\0")
        if source.pending:
            break
    if not source.fill(len(GZIP_MAGIC)) or not source.pending.startswith(GZIP_MAGIC):
        raise OSError("not a valid gzip stream: a member does not start with the gzip magic bytes")
    head = source.take(10, "header")
    if head[2] != _DEFLATE:
        raise OSError(f"not a valid gzip stream: compression method {head[2]}, expected 8 (deflate)")
    flags = head[3]
    if flags & _RESERVED:
        raise OSError(f"not a valid gzip stream: reserved header flags are set ({flags:#04x})")
    if flags & _FEXTRA:
        (length,) = struct.unpack("<H", source.take(2, "header"))
        source.take(length, "header's extra field")
    if flags & _FNAME:
        source.skip_through_zero("file name")
    if flags & _FCOMMENT:
        source.skip_through_zero("comment")
    if flags & _FHCRC:
        source.take(2, "header")
    return True


def _gunzip(source: _Source) -> Iterator[bytes]:
    """Every member inflated. Written by hand around zlib's raw inflater, not gzip.GzipFile or
    zlib's gzip mode: those check each member's CRC-32, which costs as much as inflating and adds
    nothing here, since every byte of the layer is checked against its sha256 digest before
    anything read from it is used. The member's size in the trailer is still checked."""
    while _gzip_header(source):
        inflate = zlib.decompressobj(wbits=-zlib.MAX_WBITS)
        produced = 0
        while not inflate.eof:
            compressed = inflate.unconsumed_tail or source.next_piece()
            if not compressed:
                raise EOFError("the gzip stream ends inside a member")
            try:
                piece = inflate.decompress(compressed, READ_BYTES)
            except zlib.error as exc:
                raise OSError(f"not a valid gzip stream: {exc}") from None
            if piece:
                produced += len(piece)
                yield piece
        source.pending = inflate.unused_data + source.pending
        _, size = _TRAILER.unpack(source.take(_TRAILER.size, "trailer"))
        if size != produced & 0xFFFFFFFF:
            raise OSError(f"not a valid gzip stream: a member's trailer gives {size} bytes, "
                          f"it inflated to {produced}")


class _SourceFile(io.RawIOBase):
    """The compressed chunks as a file, for zstandard's reader."""

    def __init__(self, source: _Source) -> None:
        super().__init__()
        self._source = source
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._pending:
            self._pending = memoryview(self._source.next_piece())
        count = min(len(buffer), len(self._pending))
        buffer[:count] = self._pending[:count]
        self._pending = self._pending[count:]
        return count


def _unzstd(source: _Source) -> Iterator[bytes]:
    import zstandard  # the locked zstd binding: Python 3.11's standard library has none

    # read_across_frames: a layer may hold several frames (zstd:chunked writes one per file group).
    reader = zstandard.ZstdDecompressor().stream_reader(_SourceFile(source), read_size=READ_BYTES,
                                                        read_across_frames=True)
    while piece := reader.read(READ_BYTES):
        yield piece


def _plain(source: _Source) -> Iterator[bytes]:
    while piece := source.next_piece():
        yield piece


def decompressed(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The layer's tar bytes in pieces of at most READ_BYTES (a plain layer's chunks as they come)."""
    source = _Source(chunks)
    source.fill(len(ZSTD_MAGIC))
    if source.pending.startswith(GZIP_MAGIC):
        return _gunzip(source)
    if source.pending.startswith(ZSTD_MAGIC):
        return _unzstd(source)
    return _plain(source)


class ForwardFile:
    """Pieces of bytes as a file read forward only. A read larger than `max_read` is refused:
    tarfile reads a pax or long-name header whole, at the size the archive claims for it."""

    def __init__(self, pieces: Iterator[bytes], max_read: int) -> None:
        self._pieces, self._max_read = pieces, max_read
        self._piece = b""
        self._at = 0  # the read position inside _piece
        self._passed = 0  # bytes before _piece
        self.last_read = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._passed + self._at

    def _advance(self) -> bool:
        self._passed += len(self._piece)
        self._piece, self._at = next(self._pieces, b""), 0
        return bool(self._piece)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence != io.SEEK_SET or offset < self.tell():
            raise io.UnsupportedOperation(f"a layer is read forward only (from byte {self.tell()} to {offset})")
        while offset - self._passed > len(self._piece):
            if not self._advance():
                return self.tell()  # past the end: the next read gives nothing
        self._at = offset - self._passed
        return offset

    def read(self, size: int = -1) -> bytes:
        if size is None or not 0 <= size <= self._max_read:
            raise OSError(f"a tar record of {size} bytes is larger than the {self._max_read} bytes read for one")
        parts = []
        while size:
            available = len(self._piece) - self._at
            if not available:
                if not self._advance():
                    break
                continue
            count = min(size, available)
            parts.append(self._piece[self._at:self._at + count])
            self._at += count
            size -= count
        self.last_read = b"".join(parts)
        return self.last_read
