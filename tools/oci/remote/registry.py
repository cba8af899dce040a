"""A small OCI distribution client on httpx: manifests and blobs by digest (verified),
HEAD checks, cross-repository mounts, monolithic and streamed uploads.

Plain HTTP is used only for loopback registries; anything else is HTTPS. Who may see the
credential, and the token dance: tools.oci.remote.auth.

Deadlines: every answer's status line and headers arrive within DOCUMENT_DEADLINE_S
(attest.transport); a document (manifest, token, small blob) is read within
DOCUMENT_DEADLINE_S in all, body included; a streamed blob within its size at
BLOB_MIN_BYTES_PER_S (at least BLOB_MIN_DEADLINE_S); a peer trickling bytes cannot hold a read
open past them.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Protocol

import httpx

from attest.redact import redact_known
from attest.transport import DeadlineTransport, ProxyRefused, answer_deadline
from tools.oci.errors import OciError
from tools.oci.layout import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, sha256_digest
from tools.oci.reference import DIGEST_RE
from tools.oci.remote.auth import LOOKUP, RegistryAuth, is_loopback, origin
from tools.oci.remote.bodies import DETAIL_READ_BYTES, error_detail, read_bounded
from tools.oci.remote.credentials import Credential

ACCEPT_MANIFESTS = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
# Registries are untrusted: every read is bounded. A blob is never read past its descriptor's
# size; documents read without a descriptor (manifests) have a per-kind cap.
MAX_MANIFEST_BYTES = 4 << 20
MAX_UNSIZED_BLOB_BYTES = 16 << 20
ATTEMPTS = 3
CHUNKED_UPLOAD_THRESHOLD = 256 << 20
UPLOAD_CHUNK_BYTES = 64 << 20
UPLOAD_READ_BYTES = 8 << 20  # file reads per upload write: fewer, larger writes to the socket
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
DOCUMENT_DEADLINE_S = 120.0
BLOB_MIN_DEADLINE_S = 120.0
BLOB_MIN_BYTES_PER_S = 256 << 10


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
                yield start, _bounded(self._from(start), min(chunk, size - start))
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


def _bounded(pieces: Iterator[bytes], length: int) -> Iterator[bytes]:
    """The first `length` bytes of `pieces`, and no more."""
    for block in pieces:
        if length <= 0:
            break
        block = block[:length]
        length -= len(block)
        yield block


def _attempt_failed(attempt: int, what: str) -> None:
    print(redact_known(f"registry: attempt {attempt}/{ATTEMPTS} failed: {what}; retrying"), file=sys.stderr, flush=True)
    time.sleep(min(0.2 * 2 ** (attempt - 1), 5))


class RegistryClient:
    """One registry; counters record what crossed the wire (for tests and summaries)."""

    def __init__(
        self,
        registry: str,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        credential: Credential | None | object = LOOKUP,
    ) -> None:
        """`credential`: by default looked up (tools/oci/credentials.py) when the registry first
        asks for one; None forces anonymous access."""
        self.registry = registry
        scheme = "http" if is_loopback(registry) else "https"
        if transport is None:  # a transport given from outside (a test's MockTransport) is used as it is
            try:
                transport = DeadlineTransport()
            except ProxyRefused as exc:
                raise OciError(f"{registry}: {exc}", field=exc.variable) from None
        self.client = httpx.Client(
            base_url=f"{scheme}://{registry}", timeout=timeout, follow_redirects=True, transport=transport
        )
        self.auth = RegistryAuth(registry, self.client, credential)
        self.origin = origin(self.client.base_url)
        self.document_deadline_s = DOCUMENT_DEADLINE_S
        # The deadline (time.monotonic()) of the whole operation this client serves (tools/pin
        # --deadline): no answer, body or retry goes past it.
        self.operation_deadline = math.inf
        self.uploaded_bytes = 0
        self.uploaded_blobs: list[str] = []
        self.mounted_blobs: list[str] = []
        self._lock = threading.Lock()
        # Blobs larger than this go up in chunks of chunk_size (PATCH), the rest in one PUT.
        self.chunked_threshold = CHUNKED_UPLOAD_THRESHOLD
        self.chunk_size = UPLOAD_CHUNK_BYTES

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "RegistryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport ---------------------------------------------------------------
    def request(
        self, method: str, url: str, *, repository: str, push: bool = False, stream: bool = False, **kwargs
    ) -> httpx.Response:
        """One request; idempotent ones (GET, HEAD, PUT of a manifest) are retried on 5xx and
        connection errors with backoff, each failed attempt named on stderr."""
        retry = method in ("GET", "HEAD") or (method == "PUT" and "/manifests/" in url)
        for attempt in range(1, ATTEMPTS + 1):
            self._within_operation(f"{method} {url}")
            try:
                response = self._send(method, url, repository=repository, push=push, **kwargs)
                if not stream:
                    response = self._settled(response, f"{method} {url}")
            except OciError as exc:
                if not retry or attempt == ATTEMPTS:
                    raise
                _attempt_failed(attempt, f"{method} {url}: {exc}")
                continue
            if retry and response.status_code in RETRY_STATUS and attempt < ATTEMPTS:
                response.close()
                _attempt_failed(attempt, f"{method} {url}: HTTP {response.status_code}")
                continue
            return response
        raise AssertionError("unreachable")

    def _within_operation(self, what: str) -> None:
        if time.monotonic() >= self.operation_deadline:
            raise OciError(f"{self.registry}: {what}: the operation passed its deadline", field="deadline")

    def _document_deadline(self) -> float:
        """When a document read now must end: its own budget, within the operation's."""
        return min(time.monotonic() + self.document_deadline_s, self.operation_deadline)

    def _settled(self, response: httpx.Response, what: str) -> httpx.Response:
        """A streamed response read whole, bounded in size and time (an answer to a write or a
        HEAD is small; httpx's own read would wait on a trickling body forever)."""
        deadline = self._document_deadline()
        try:
            data = read_bounded(
                response, MAX_MANIFEST_BYTES, f"{self.registry}: the answer to {what}", deadline=deadline
            )
        except httpx.HTTPError as exc:
            raise OciError(f"{self.registry}: the answer to {what} broke off: {exc}", field="registry") from None
        finally:
            response.close()
        return httpx.Response(response.status_code, headers=response.headers, content=data, request=response.request)

    def _send(self, method: str, url: str, *, repository: str, push: bool, **kwargs) -> httpx.Response:
        """The request, streamed: the caller reads (or settles) the body. Each answer's status
        line and headers (a token's body too) arrive within document_deadline_s."""
        with answer_deadline(self.document_deadline_s, ends=self.operation_deadline):
            try:
                return self._send_within(method, url, repository=repository, push=push, **kwargs)
            except OciError:
                self._within_operation(f"{method} {url}")  # the deadline is the answer, when it passed
                raise

    def _send_within(self, method: str, url: str, *, repository: str, push: bool, **kwargs) -> httpx.Response:
        scope = f"repository:{repository}:{'pull,push' if push else 'pull'}"
        headers = dict(kwargs.pop("headers", {}) or {})
        try:
            ours = origin(self.client.base_url.join(url)) == self.origin
        except httpx.InvalidURL:
            raise OciError(f"{self.registry}: {url!r} is not a URL", field="registry") from None

        def send() -> httpx.Response:
            return self.client.send(self.client.build_request(method, url, headers=headers, **kwargs), stream=True)

        if not ours:
            # Another host (an upload Location, a blob store): no credential of ours goes there.
            try:
                return send()
            except httpx.HTTPError as exc:
                raise OciError(f"{self.registry}: {method} to another host failed: {exc}", field="registry") from None
        known = self.auth.known(scope)
        if known:
            headers["Authorization"] = known
        try:
            response = send()
            answer = self.auth.answer(response, scope, self.document_deadline_s)
            if answer:
                headers["Authorization"] = answer
                response = send()
                if response.status_code == 401 and answer.startswith("Basic "):
                    response.close()
                    raise self.auth.refused(self.auth.credential(), 401, scope)
        except httpx.HTTPError as exc:
            raise OciError(f"{self.registry} cannot be reached ({method} {url}): {exc}", field="registry") from None
        return response

    def _expect(self, response: httpx.Response, ok: tuple[int, ...], what: str) -> httpx.Response:
        if response.status_code not in ok:
            detail = error_detail(response.content) if not response.is_stream_consumed or response.is_closed else ""
            raise OciError(
                f"{self.registry}: {what} failed with HTTP {response.status_code} {detail}".strip(), field=what
            )
        return response

    # --- reads -------------------------------------------------------------------
    def _read(self, url: str, repository: str, what: str, limit: int, **kwargs) -> tuple[bytes, httpx.Response]:
        deadline = self._document_deadline()
        response = self.request("GET", url, repository=repository, stream=True, **kwargs)
        try:
            if response.status_code != 200:
                detail = error_detail(read_bounded(response, DETAIL_READ_BYTES, what, truncate=True, deadline=deadline))
                raise OciError(
                    f"{self.registry}: {what} failed with HTTP {response.status_code} {detail}".strip(), field=what
                )
            return read_bounded(response, limit, f"{self.registry}/{repository}: {what}", deadline=deadline), response
        except OciError:
            self._within_operation(what)  # the deadline is the answer, when it passed
            raise
        except httpx.HTTPError as exc:
            raise OciError(f"{self.registry}: {what} broke off: {exc}", field=what) from None
        finally:
            response.close()

    def manifest(self, repository: str, reference: str) -> tuple[bytes, str]:
        data, response = self._read(
            f"/v2/{repository}/manifests/{reference}",
            repository,
            f"manifest {repository}@{reference}",
            MAX_MANIFEST_BYTES,
            headers={"Accept": ACCEPT_MANIFESTS},
        )
        if DIGEST_RE.fullmatch(reference) and sha256_digest(data) != reference:
            raise OciError(
                f"{self.registry}/{repository}: manifest bytes do not match the requested digest "
                f"{reference} (got {sha256_digest(data)})",
                field="manifest",
            )
        media_type = response.headers.get("Content-Type", "").split(";")[0]
        return data, media_type

    def blob(
        self, repository: str, digest: str, *, size: int | None = None, max_bytes: int = MAX_UNSIZED_BLOB_BYTES
    ) -> bytes:
        """A blob, never read past its descriptor's `size` (or `max_bytes`), verified by digest."""
        if size is not None and (not isinstance(size, int) or size < 0 or size > max_bytes):
            raise OciError(
                f"{self.registry}/{repository}: blob {digest} declares {size} bytes; at most {max_bytes} "
                "are read for it",
                field=digest,
            )
        data, _ = self._read(
            f"/v2/{repository}/blobs/{digest}", repository, f"blob {digest}", size if size is not None else max_bytes
        )
        if (size is not None and len(data) != size) or sha256_digest(data) != digest:
            raise OciError(
                f"{self.registry}/{repository}: blob {digest} is corrupt "
                f"({len(data)} bytes hashing to {sha256_digest(data)})",
                field=digest,
            )
        return data

    def has_blob(self, repository: str, digest: str) -> bool:
        response = self.request("HEAD", f"/v2/{repository}/blobs/{digest}", repository=repository, push=True)
        return response.status_code == 200

    def stream_blob(self, repository: str, digest: str, size: int) -> Iterator[bytes]:
        """The blob's bytes in chunks, never past `size`, verified against `digest` at the end."""
        seconds = max(BLOB_MIN_DEADLINE_S, size / BLOB_MIN_BYTES_PER_S)
        deadline = min(time.monotonic() + seconds, self.operation_deadline)
        response = self.request("GET", f"/v2/{repository}/blobs/{digest}", repository=repository, stream=True)
        try:
            self._expect(response, (200,), f"blob {digest}")
            hasher, count = hashlib.sha256(), 0
            for chunk in response.iter_bytes():  # as they arrive: a chunk size would wait to fill it
                if time.monotonic() > deadline:
                    self._within_operation(f"blob {digest}")
                    raise OciError(
                        f"{self.registry}/{repository}: blob {digest} was still arriving after "
                        f"{seconds:.0f} s ({count} of {size} bytes)",
                        field=digest,
                    )
                count += len(chunk)
                if count > size:
                    raise OciError(
                        f"{self.registry}/{repository}: blob {digest} sends more than the {size} bytes "
                        "its descriptor declares",
                        field=digest,
                    )
                hasher.update(chunk)
                yield chunk
            if "sha256:" + hasher.hexdigest() != digest or count != size:
                raise OciError(f"{self.registry}/{repository}: streamed blob {digest} is corrupt", field=digest)
        finally:
            response.close()

    # --- writes ------------------------------------------------------------------
    def mount(self, repository: str, digest: str, from_repository: str) -> bool:
        response = self.request(
            "POST",
            f"/v2/{repository}/blobs/uploads/",
            repository=repository,
            push=True,
            params={"mount": digest, "from": from_repository},
        )
        if response.status_code == 201:
            with self._lock:
                self.mounted_blobs.append(digest)
            return True
        if response.status_code == 202 and response.headers.get("Location"):
            # The registry opened an upload instead; cancel it so no session dangles.
            self.request("DELETE", response.headers["Location"], repository=repository, push=True)
        return False

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
                if attempt == ATTEMPTS:
                    raise
                _attempt_failed(attempt, f"upload of {digest}: {exc}")
        if not self.has_blob(repository, digest):
            raise OciError(
                f"{self.registry} acknowledged {digest} but does not have it (HEAD after upload)", field=digest
            )
        with self._lock:  # uploads run in parallel threads (tools/oci/push.py)
            self.uploaded_bytes += size
            self.uploaded_blobs.append(digest)

    def _upload_once(self, repository: str, digest: str, source: "_UploadSource", size: int) -> None:
        start = self.request("POST", f"/v2/{repository}/blobs/uploads/", repository=repository, push=True)
        self._expect(start, (202,), f"upload start for {digest}")
        location = start.headers.get("Location", "")
        if not location:
            raise OciError(
                f"{self.registry}: the upload start for {digest} answered 202 without a Location "
                "header (the distribution spec requires one)",
                field=f"upload of {digest}",
            )
        body: bytes | Iterator[bytes] = source.pieces(0)
        if size > self.chunked_threshold:
            location = self._patch_chunks(repository, digest, location, source, size)
            body, size = b"", 0
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
                    self._expect(response, (202,), f"chunk {start}-{end} of {digest}")
                    offset = end + 1
                    location = response.headers.get("Location", location)
            except OciError as exc:
                cuts += 1
                if cuts >= ATTEMPTS or exc.field == "deadline":
                    raise
                offset, location = self._upload_status(repository, location, digest)
                print(
                    redact_known(f"registry: upload of {digest} broke off ({exc}); resuming at byte {offset}"),
                    file=sys.stderr,
                    flush=True,
                )
        return location

    def put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> str:
        response = self.request(
            "PUT",
            f"/v2/{repository}/manifests/{reference}",
            repository=repository,
            push=True,
            content=data,
            headers={"Content-Type": media_type},
        )
        self._expect(response, (201,), f"manifest push {repository}:{reference}")
        digest = sha256_digest(data)
        returned = response.headers.get("Docker-Content-Digest")
        if returned and returned != digest:
            raise OciError(f"{self.registry} stored the manifest as {returned}, expected {digest}", field="manifest")
        # Read it back by digest: a registry that acknowledged but did not store is caught here.
        try:
            stored, _ = self.manifest(repository, digest)
        except OciError as exc:
            raise OciError(
                f"{self.registry} acknowledged manifest {digest} but does not serve it: {exc}", field="manifest"
            ) from None
        if stored != data:
            raise OciError(f"{self.registry} serves other bytes for manifest {digest}", field="manifest")
        return digest
