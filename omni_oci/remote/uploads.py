"""Blob uploads of the registry client: monolithic and chunked (PATCH with Content-Range),
streamed from bytes, files, offset-seekable streams or a factory of fresh streams, resumed from
the offset the registry reports after a cut, or hashed as they go when the digest is not known
in advance. A mixin of omni_oci.remote.registry.RegistryClient: it uses the session's request and
_expect, the client's has_blob, its counters and its chunk sizes.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from attest.edge.redact import redact_known
from omni_oci.format.errors import OciError
from omni_oci.format.reference import api_path
from omni_oci.remote.pieces import Pieces
from omni_oci.remote.session import ATTEMPTS, attempt_failed

if TYPE_CHECKING:
    import threading

    import httpx

CHUNKED_UPLOAD_THRESHOLD = 256 << 20
UPLOAD_CHUNK_BYTES = 64 << 20
# File reads per upload write: few enough writes to the socket, and memory flat in the layer's
# size (2 MB as tools/model's READ_BYTES, where the measurement is).
UPLOAD_READ_BYTES = 2 << 20


class OffsetStream(Protocol):
    """Bytes that can be read again from any offset, cheaply (a file-backed stream)."""

    def from_offset(self, offset: int) -> Iterator[bytes]: ...


class _UploadSource:
    """A blob's bytes from any offset: a file (seeked), bytes (sliced), an OffsetStream, or a
    factory of fresh streams (the bytes before the offset read again and dropped: they are not
    sent). Chunks of all but the factory are streamed, never held whole: memory stays at one
    read per upload in flight, whatever the chunk size."""

    def __init__(self, content: "bytes | Path | OffsetStream | Callable[[], Iterator[bytes]]") -> None:
        self._content = content

    def _from(self, offset: int) -> Iterator[bytes]:
        content = self._content
        if isinstance(content, bytes):
            view = memoryview(content)
            for start in range(offset, len(content), UPLOAD_READ_BYTES):
                yield bytes(view[start : start + UPLOAD_READ_BYTES])
        elif isinstance(content, Path):
            with content.open("rb") as handle:
                handle.seek(offset)
                while block := handle.read(UPLOAD_READ_BYTES):
                    yield block
        else:
            yield from content.from_offset(offset)

    def pieces(self, offset: int) -> Iterator[bytes]:
        """Every byte from `offset`, in pieces."""
        if isinstance(self._content, (bytes, Path)) or hasattr(self._content, "from_offset"):
            yield from self._from(offset)
            return
        skip = offset
        for block in self._content():
            if skip:
                dropped = min(skip, len(block))
                block, skip = block[dropped:], skip - dropped
            if block:
                yield block

    def chunks(self, offset: int, size: int, chunk: int) -> Iterator[tuple[int, Iterator[bytes] | bytes]]:
        """(start, body) of each chunk of at most `chunk` bytes from `offset` to `size`: a
        seekable source's body is a stream opened at its start; a factory's is gathered (its
        stream cannot be opened again cheaply)."""
        if isinstance(self._content, (bytes, Path)) or hasattr(self._content, "from_offset"):
            for start in range(offset, size, chunk):
                yield start, Pieces(self._from(start)).upto(min(chunk, size - start))
            return
        pending, start = bytearray(), offset
        for block in self.pieces(offset):
            pending += block
            while len(pending) >= chunk:
                yield start, bytes(pending[:chunk])
                del pending[:chunk]
                start += chunk
        if pending:
            yield start, bytes(pending)


class BlobUploads:
    """The upload half of RegistryClient."""

    registry: str
    chunked_threshold: int
    chunk_size: int
    uploaded_bytes: int
    uploaded_blobs: list[str]
    _lock: "threading.Lock"

    def request(self, method: str, url: str, **kwargs) -> "httpx.Response":  # RegistryClient's
        raise NotImplementedError

    def _expect(self, response: "httpx.Response", ok: tuple[int, ...], what: str) -> "httpx.Response":
        raise NotImplementedError

    def has_blob(self, repository: str, digest: str) -> bool:
        raise NotImplementedError

    def upload(
        self,
        repository: str,
        digest: str,
        content: bytes | Path | OffsetStream | Callable[[], Iterator[bytes]],
        size: int,
    ) -> None:
        """Upload a blob (bytes, a file, an OffsetStream, or a factory of a fresh byte stream per attempt),
        retrying a failed session from the start (a chunked one resumes where the registry says
        it stopped), then confirm the registry has it."""
        source = _UploadSource(content)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self._upload_once(repository, digest, source, size)
                break
            except OciError as exc:
                if attempt == ATTEMPTS or exc.final:
                    raise
                attempt_failed(attempt, f"upload of {digest}: {exc}")
        if not self.has_blob(repository, digest):
            raise OciError(
                f"{self.registry} acknowledged {digest} but does not have it (HEAD after upload)", field=digest
            )
        with self._lock:  # uploads run in parallel threads (tools/oci/push.py)
            self.uploaded_bytes += size
            self.uploaded_blobs.append(digest)

    def upload_hashing(self, repository: str, stream: Callable[[], Iterator[bytes]], size: int) -> str:
        """Upload a blob whose digest is learned as it goes up, one pass over its bytes (a model
        file's layer: read, checked and hashed once): PATCH chunks streamed from a fresh
        `stream()`, then the closing PUT names the digest computed. A failed attempt starts
        again from a fresh session and stream (a hash cannot be rewound to where the registry
        stopped). Returns the digest, confirmed by a HEAD."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                digest = self._upload_hashing_once(repository, stream, size)
                break
            except OciError as exc:
                if attempt == ATTEMPTS or exc.final:
                    raise
                attempt_failed(attempt, f"upload of a {size}-byte blob: {exc}")
        if not self.has_blob(repository, digest):
            raise OciError(
                f"{self.registry} acknowledged {digest} but does not have it (HEAD after upload)", field=digest
            )
        with self._lock:
            self.uploaded_bytes += size
            self.uploaded_blobs.append(digest)
        return digest

    def _upload_hashing_once(self, repository: str, stream: Callable[[], Iterator[bytes]], size: int) -> str:
        location = self._start_upload(repository, "a blob")
        hasher = hashlib.sha256()

        def hashed() -> Iterator[bytes]:
            for piece in stream():
                hasher.update(piece)
                yield piece

        pieces = Pieces(hashed())
        for offset in range(0, size, self.chunk_size):
            end = min(offset + self.chunk_size, size) - 1
            location = self._patch(repository, location, offset, end, pieces.upto(end - offset + 1), "a blob")
        if pieces.take(1):
            raise OciError(f"{self.registry}: the blob's stream holds more than its {size} bytes", field="upload")
        digest = "sha256:" + hasher.hexdigest()
        self._close_upload(repository, location, digest, b"", 0)
        return digest

    def _upload_once(self, repository: str, digest: str, source: "_UploadSource", size: int) -> None:
        location = self._start_upload(repository, digest)
        body: bytes | Iterator[bytes] = source.pieces(0)
        if size > self.chunked_threshold:
            location = self._patch_chunks(repository, digest, location, source, size)
            body, size = b"", 0
        self._close_upload(repository, location, digest, body, size)

    def _start_upload(self, repository: str, what: str) -> str:
        """A new upload session; its Location."""
        start = self.request("POST", api_path(repository, "blobs/uploads"), repository=repository, push=True)
        self._expect(start, (202,), f"upload start for {what}")
        location = start.headers.get("Location", "")
        if not location:
            raise OciError(
                f"{self.registry}: the upload start for {what} answered 202 without a Location "
                "header (the distribution spec requires one)",
                field=f"upload of {what}",
            )
        return location

    def _close_upload(self, repository: str, location: str, digest: str, body, size: int) -> None:
        """The closing PUT naming the digest (with the rest of the bytes, if any)."""
        separator = "&" if "?" in location else "?"
        response = self.request(
            "PUT",
            f"{location}{separator}digest={digest}",
            repository=repository,
            push=True,
            content=body,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        self._expect(response, (201,), f"upload of {digest}")

    def _patch(self, repository: str, location: str, start: int, end: int, body, what: str) -> str:
        """One chunk, bytes start..end; where the upload continues."""
        response = self.request(
            "PATCH",
            location,
            repository=repository,
            push=True,
            content=body,
            headers={
                "Content-Type": "application/octet-stream",
                "Content-Length": str(end - start + 1),
                "Content-Range": f"{start}-{end}",
            },
        )
        self._expect(response, (202,), f"chunk {start}-{end} of {what}")
        return response.headers.get("Location", location)

    def _upload_status(self, repository: str, location: str, digest: str) -> tuple[int, str]:
        """(bytes the registry holds, where to continue) of an upload session (GET on it: 204
        with `Range: 0-<last byte>`); a session the registry lost raises."""
        response = self.request("GET", location, repository=repository, push=True)
        self._expect(response, (204,), f"upload status of {digest}")
        found = re.fullmatch(r"(?:bytes=)?0-(\d+)", response.headers.get("Range", ""))
        if found is None:
            raise OciError(f"{self.registry}: the upload status of {digest} has no Range", field=f"upload of {digest}")
        # distribution says 0-0 both for nothing and for one byte: resuming at 0 is the safe reading.
        held = int(found.group(1)) + 1 if int(found.group(1)) else 0
        return held, response.headers.get("Location", location)

    def _patch_chunks(self, repository: str, digest: str, location: str, source: "_UploadSource", size: int) -> str:
        """The distribution spec's chunked upload: PATCH each chunk with its Content-Range, following
        the Location each answer gives; the closing PUT carries the digest. Large blobs then never
        ride on one request, and a registry's request-size limits do not apply. A chunk that
        breaks off resumes from the offset the registry reports (the upload's status), so a cut
        costs at most that chunk."""
        offset, cuts = 0, 0
        while offset < size:
            try:
                for start, body in source.chunks(offset, size, self.chunk_size):
                    end = min(start + self.chunk_size, size) - 1
                    location = self._patch(repository, location, start, end, body, digest)
                    offset = end + 1
            except OciError as exc:
                cuts += 1
                if cuts >= ATTEMPTS or exc.final:
                    raise
                offset, location = self._upload_status(repository, location, digest)
                print(
                    redact_known(f"registry: upload of {digest} broke off ({exc}); resuming at byte {offset}"),
                    file=sys.stderr,
                    flush=True,
                )
        return location
