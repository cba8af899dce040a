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
import zlib
from typing import Any, Iterator

from isal import isal_zlib

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
READ_BYTES = 1 << 20
GZIP_WBITS = 16 + zlib.MAX_WBITS  # gzip mode: header, deflate body and trailer checked
_DEFLATE = 8
_RESERVED_FLAGS = 0xE0


class _Source:
    """The compressed chunks, with the few bytes a member's start needs pulled ahead of the rest."""

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

    def next_piece(self) -> bytes:
        """What is pending, else the next chunk; b"" at the end."""
        if self.pending:
            piece, self.pending = self.pending, b""
            return piece
        return next(self._chunks, b"")


def _member_start(source: _Source) -> None:
    """A member's first bytes named exactly when wrong (the inflater's own words are vaguer)."""
    if not source.fill(4) or not source.pending.startswith(GZIP_MAGIC):
        raise OSError("not a valid gzip stream: what follows a member is not another gzip member")
    if source.pending[2] != _DEFLATE:
        raise OSError(f"not a valid gzip stream: compression method {source.pending[2]}, expected 8 (deflate)")
    if source.pending[3] & _RESERVED_FLAGS:
        raise OSError(f"not a valid gzip stream: reserved header flags are set ({source.pending[3]:#04x})")


def _gunzip_member(source: _Source) -> Iterator[bytes]:
    _member_start(source)
    inflate = isal_zlib.decompressobj(wbits=GZIP_WBITS)
    while not inflate.eof:
        compressed = inflate.unconsumed_tail or source.next_piece()
        if not compressed:
            raise EOFError("the gzip stream ends inside a member")
        try:
            piece = inflate.decompress(compressed, READ_BYTES)
        except isal_zlib.error as exc:
            raise OSError(f"not a valid gzip stream: {exc}") from None
        if piece:
            yield piece
    source.pending = inflate.unused_data + source.pending


def _gunzip(source: _Source) -> Iterator[bytes]:
    """Every member inflated in gzip mode, which checks each header (its CRC when the header has
    one) and each trailer (CRC-32 and size), as Go's compress/gzip does for the container
    runtimes. Members follow one another directly: anything else after a member, zero padding
    included, is refused, as the runtimes refuse it.

    ISA-L (the `isal` package) inflates, not the standard library's zlib: measured here on a
    real layer (/usr, gzip -6) it inflates at 588 MB/s of input against zlib's 290, and on
    incompressible layers its CRC-32 keeps gzip mode as fast as raw inflating (7.4 GB/s against
    zlib's 2.9)."""
    while True:
        yield from _gunzip_member(source)
        if not source.fill(1):
            return


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
    reader = zstandard.ZstdDecompressor().stream_reader(
        _SourceFile(source), read_size=READ_BYTES, read_across_frames=True
    )
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
            parts.append(self._piece[self._at : self._at + count])
            self._at += count
            size -= count
        self.last_read = b"".join(parts)
        return self.last_read
