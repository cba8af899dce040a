"""A small OCI distribution client on httpx, the registry's verbs: manifests and blobs by digest
(verified), HEAD checks, cross-repository mounts; uploads (monolithic, chunked, resumed, hashed
as they go) are omni_oci.remote.uploads; the request policy (retries, Retry-After, deadlines,
the credential) is omni_oci.remote.session. A streamed blob is read through the data plane
(attest.edge.data_plane) within its size at BLOB_MIN_BYTES_PER_S (at least BLOB_MIN_DEADLINE_S).
"""

from __future__ import annotations

import hashlib
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

import httpx

from attest.edge.bodies import DETAIL_READ_BYTES, error_detail, read_bounded
from attest.edge.data_plane import BodyBroken, blob_extensions, content_range, read_blob
from omni_oci.format.errors import OciError
from omni_oci.format.layout import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, sha256_digest
from omni_oci.format.reference import DIGEST_RE, api_path
from omni_oci.remote.session import MAX_MANIFEST_BYTES, RegistrySession
from omni_oci.remote.uploads import CHUNKED_UPLOAD_THRESHOLD, UPLOAD_CHUNK_BYTES, BlobUploads

ACCEPT_MANIFESTS = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
# A blob is never read past its descriptor's size; one read without a descriptor has this cap.
MAX_UNSIZED_BLOB_BYTES = 16 << 20
BLOB_MIN_DEADLINE_S = 120.0
BLOB_MIN_BYTES_PER_S = 256 << 10


class RegistryClient(RegistrySession, BlobUploads):
    """One registry; counters record what crossed the wire (for tests and summaries)."""

    def __init__(self, registry: str, **session: Any) -> None:
        """`session`: RegistrySession's timeout, transport and credential."""
        super().__init__(registry, **session)
        self.uploaded_bytes = 0
        self.uploaded_blobs: list[str] = []
        self.mounted_blobs: list[str] = []
        self._lock = threading.Lock()
        # Blobs larger than this go up in chunks of chunk_size (PATCH), the rest in one PUT.
        self.chunked_threshold = CHUNKED_UPLOAD_THRESHOLD
        self.chunk_size = UPLOAD_CHUNK_BYTES

    # --- reads -------------------------------------------------------------------
    def _read(self, url: str, repository: str, what: str, limit: int, **kwargs) -> tuple[bytes, httpx.Response]:
        deadline = self._document_deadline()
        response = self.request("GET", url, repository=repository, stream=True, **kwargs)
        try:
            if response.status_code != 200:
                detail = error_detail(
                    read_bounded(response, DETAIL_READ_BYTES, what, truncate=True, deadline=deadline, error=OciError)
                )
                raise OciError(
                    f"{self.registry}: {what} failed with HTTP {response.status_code} {detail}".strip(), field=what
                )
            return read_bounded(
                response, limit, f"{self.registry}/{repository}: {what}", deadline=deadline, error=OciError
            ), response
        except OciError:
            self._within_operation(what)  # the deadline is the answer, when it passed
            raise
        except httpx.HTTPError as exc:
            raise OciError(f"{self.registry}: {what} broke off: {exc}", field=what) from None
        finally:
            response.close()

    def manifest(self, repository: str, reference: str) -> tuple[bytes, str]:
        data, response = self._read(
            api_path(repository, "manifests", reference),
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
            api_path(repository, "blobs", digest), repository, f"blob {digest}", size if size is not None else max_bytes
        )
        if (size is not None and len(data) != size) or sha256_digest(data) != digest:
            raise OciError(
                f"{self.registry}/{repository}: blob {digest} is corrupt "
                f"({len(data)} bytes hashing to {sha256_digest(data)})",
                field=digest,
            )
        return data

    def has_blob(self, repository: str, digest: str) -> bool:
        response = self.request("HEAD", api_path(repository, "blobs", digest), repository=repository, push=True)
        return response.status_code == 200

    def manifest_digest(self, repository: str, reference: str) -> str | None:
        """The digest the registry names (HEAD, Docker-Content-Digest) for a tag or digest, or
        None where it has no such manifest. The registry's word only: a caller writing or
        trusting on it reads the manifest by digest."""
        response = self.request(
            "HEAD",
            api_path(repository, "manifests", reference),
            repository=repository,
            headers={"Accept": ACCEPT_MANIFESTS},
        )
        if response.status_code == 404:
            return None
        self._expect(response, (200,), f"manifest {repository}:{reference}")
        if DIGEST_RE.fullmatch(reference):
            return reference
        named = response.headers.get("Docker-Content-Digest", "")
        if not DIGEST_RE.fullmatch(named):
            raise OciError(
                f"{self.registry}/{repository}: the answer for {reference} names no sha256 digest "
                f"(Docker-Content-Digest {named[:80]!r})",
                field=f"{repository}:{reference}",
            )
        return named

    def stream_blob(
        self, repository: str, digest: str, size: int, *, hashed: bool = True, offset: int = 0
    ) -> Iterator[bytes]:
        """The blob's bytes in pieces, through the data plane (attest.edge.data_plane): exactly
        `size` of them (from `offset`: the rest, asked with a Range), within the blob's deadline,
        verified against `digest` at the end. `hashed=False` leaves the digest to the caller, who
        checks every byte otherwise (a model layer against its lock: one pass over the bytes, not
        two; a resumed copy, omni_oci.remote.copy); the size is still exact.

        A refusal is `final` where asking again cannot help (more bytes than the size, the
        deadline passed); a cut, a stall or an early end is not: the caller may resume."""
        if offset and hashed:
            raise ValueError("a blob read from an offset is hashed by its caller")
        seconds = max(BLOB_MIN_DEADLINE_S, (size - offset) / BLOB_MIN_BYTES_PER_S)
        deadline = min(time.monotonic() + seconds, self.operation_deadline)
        what = f"{self.registry}/{repository}: blob {digest}"
        response = self.request(
            "GET",
            api_path(repository, "blobs", digest),
            repository=repository,
            stream=True,
            headers={"Range": f"bytes={offset}-"} if offset else None,
            extensions=blob_extensions(deadline),
        )
        try:
            self._expect(response, (200, 206) if offset else (200,), f"blob {digest}")
            skip = self._range_skip(response, offset, size, what)
            hasher = hashlib.sha256()
            for piece in read_blob(response, size - offset + skip, deadline, what):
                if skip:
                    dropped = min(skip, len(piece))
                    piece, skip = piece[dropped:], skip - dropped
                    if not piece:
                        continue
                if hashed:
                    hasher.update(piece)
                yield piece
            if hashed and "sha256:" + hasher.hexdigest() != digest:
                raise OciError(
                    f"{what}: the streamed blob is corrupt (sha256:{hasher.hexdigest()})", field=digest, final=True
                )
        except BodyBroken as exc:
            if exc.reason == "late":
                self._within_operation(f"blob {digest}")
            again = "; run again to fetch it" if exc.reason in ("cut", "stalled", "short") else ""
            raise OciError(f"{exc}{again}", field=digest, final=exc.reason in ("long", "late")) from None
        finally:
            response.close()

    @staticmethod
    def _range_skip(response: httpx.Response, offset: int, size: int, what: str) -> int:
        """The bytes to drop before `offset`: none for a 206 continuing exactly there (checked
        against its Content-Range), `offset` for a 200 (the registry ignored the range)."""
        if not offset or response.status_code == 200:
            return offset
        if content_range(response) != (offset, size - 1, size):
            raise OciError(
                f"{what}: the partial answer ({response.headers.get('Content-Range', 'no Content-Range')[:80]}) "
                f"does not continue at byte {offset} of {size}",
                field="Content-Range",
                final=True,
            )
        return 0

    # --- writes ------------------------------------------------------------------
    def mount(self, repository: str, digest: str, from_repository: str) -> bool:
        response = self.request(
            "POST",
            api_path(repository, "blobs/uploads"),
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

    def put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> str:
        response = self.request(
            "PUT",
            api_path(repository, "manifests", reference),
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


@contextmanager
def client_for(registry: str, given: RegistryClient | None = None) -> Iterator[RegistryClient]:
    """`given`, left open for whoever made it; else a client of `registry`, closed on the way out
    whatever happens inside."""
    if given is not None:
        yield given
        return
    client = RegistryClient(registry)
    try:
        yield client
    finally:
        client.close()
