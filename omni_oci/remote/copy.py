"""A blob's bytes handed to an upload (omni_oci.remote.uploads) from a source that is not
trusted: another registry (streamed, never touching disk) or a file someone else wrote (an
offline mirror's directory). Every byte is hashed in order as it is handed on, and the piece
that completes the blob is handed on only once the digest is right: an upload never receives
the last byte of a blob whose bytes differ from its digest, so no registry, however lax, can
commit it.

A registry read that is cut, stalls or ends early resumes with a Range from the byte it
reached (RESUMES times per blob), so a cut costs what was in flight, not the blob. The upload
may ask again from an earlier offset (its chunk was cut): the last piece is kept to serve the
offset a chunk boundary falls in; from further back the source is read again from byte 0, all
of it hashed again.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import sys
import time
from pathlib import Path
from typing import Iterator

from attest.edge.redact import redact_known
from omni_oci.format.errors import OciError
from omni_oci.remote.registry import RegistryClient

RESUMES = 3  # cut reads of one blob resumed before the copy gives up
READ_BYTES = 2 << 20  # file reads per piece (omni_oci.remote.uploads.UPLOAD_READ_BYTES)


class HashedSource:
    """An OffsetStream over `size` bytes that must hash to `digest`; `_open(offset)` gives the
    source's pieces from an offset."""

    def __init__(self, digest: str, size: int, what: str) -> None:
        self.digest, self.size, self.what = digest, size, what
        self._hasher = hashlib.sha256()
        self._hashed = 0  # bytes hashed, in order, from byte 0
        self._last = b""  # the last piece handed on: it ends at byte _hashed
        self._live: Iterator[bytes] | None = None
        self.resumed = 0  # reads that broke off and were resumed

    def _open(self, offset: int) -> Iterator[bytes]:
        raise NotImplementedError

    def _resumable(self, exc: OciError) -> bool:
        return False

    def from_offset(self, offset: int) -> Iterator[bytes]:
        """Every byte from `offset` to the end, the last one only once the digest is checked."""
        if offset < self._hashed - len(self._last):
            self._restart()
        if offset < self._hashed:
            yield self._last[offset - (self._hashed - len(self._last)) :]
        while self._hashed < self.size:
            start = self._hashed
            piece = self._next()
            if self._hashed > offset:
                yield piece[max(0, offset - start) :]

    def _restart(self) -> None:
        self._close_live()
        self._hasher, self._hashed, self._last = hashlib.sha256(), 0, b""

    def _close_live(self) -> None:
        if self._live is not None:
            close = getattr(self._live, "close", None)
            if close is not None:
                close()
            self._live = None

    def _next(self) -> bytes:
        """The next piece, hashed; the one completing the blob only once its digest is right."""
        piece = self._read_piece()
        if self._hashed + len(piece) > self.size:
            raise OciError(f"{self.what}: more than its {self.size} bytes", field=self.digest, final=True)
        self._hasher.update(piece)
        self._hashed += len(piece)
        self._last = piece
        if self._hashed == self.size:
            self._close_live()
            found = "sha256:" + self._hasher.hexdigest()
            if found != self.digest:
                raise OciError(
                    f"{self.what}: its {self.size} bytes hash to {found}, not {self.digest}",
                    field=self.digest,
                    final=True,
                )
        return piece

    def _read_piece(self) -> bytes:
        while True:
            if self._live is None:
                self._live = self._open(self._hashed)
            try:
                piece = next(self._live, b"")
            except OciError as exc:
                self._live = None
                if not self._resumable(exc) or self.resumed >= RESUMES:
                    raise
                self.resumed += 1
                print(
                    redact_known(f"{self.what}: the read broke off ({exc}); resuming at byte {self._hashed}"),
                    file=sys.stderr,
                    flush=True,
                )
                continue
            if not piece:
                self._live = None
                raise OciError(
                    f"{self.what}: the source ended at byte {self._hashed} of {self.size}",
                    field=self.digest,
                    final=True,
                )
            return piece


class RegistryBlob(HashedSource):
    """A blob of another registry, read through its data plane; cut reads resumed by Range."""

    def __init__(self, client: RegistryClient, repository: str, digest: str, size: int) -> None:
        super().__init__(digest, size, f"{client.registry}/{repository}: blob {digest}")
        self.client, self.repository = client, repository

    def _open(self, offset: int) -> Iterator[bytes]:
        return self.client.stream_blob(self.repository, self.digest, self.size, hashed=False, offset=offset)

    def _resumable(self, exc: OciError) -> bool:
        return not exc.final


class FileBlob(HashedSource):
    """A blob in a file nobody vouches for: its size and digest are checked as it is read, the
    file must be a regular one (a FIFO, device or socket is refused without blocking), and no
    read goes past `deadline` (time.monotonic(); a mirror's --deadline)."""

    def __init__(self, path: Path, digest: str, size: int, *, deadline: float = math.inf) -> None:
        super().__init__(digest, size, f"{path}")
        self.path, self.deadline = path, deadline

    def _open(self, offset: int) -> Iterator[bytes]:
        try:
            # O_NOFOLLOW: a link in a directory nobody vouches for could name any file of this host;
            # O_NONBLOCK: the open of a FIFO planted there returns at once instead of waiting.
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise OciError(f"{self.path} cannot be read: {exc.strerror}", field=str(self.path), final=True) from None
        handle = os.fdopen(fd, "rb")
        with handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OciError(
                    f"{self.path} is not a regular file (a FIFO, device, socket or directory)",
                    field=str(self.path),
                    final=True,
                )
            os.set_blocking(fd, True)
            handle.seek(offset)
            while block := handle.read(READ_BYTES):
                if time.monotonic() > self.deadline:
                    raise OciError(f"{self.path}: still being read at the deadline", field="deadline", final=True)
                yield block

    def pieces(self) -> Iterator[bytes]:
        return self.from_offset(0)
