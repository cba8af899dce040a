"""A small OCI distribution client on httpx: manifests and blobs by digest (verified),
HEAD checks, cross-repository mounts; uploads (monolithic, chunked, resumed, hashed as they go)
are omni_oci.remote.uploads.

Plain HTTP is used only for loopback registries; anything else is HTTPS. Who may see the
credential, and the token dance: omni_oci.remote.auth.

Deadlines: every answer's status line and headers arrive within DOCUMENT_DEADLINE_S
(attest.edge.transport); a document (manifest, token, small blob) is read within
DOCUMENT_DEADLINE_S in all, body included; a streamed blob, through the data plane
(attest.edge.data_plane), within its size at BLOB_MIN_BYTES_PER_S (at least BLOB_MIN_DEADLINE_S);
a peer trickling bytes cannot hold a read open past them.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import httpx

from attest.edge.bodies import DETAIL_READ_BYTES, error_detail, read_bounded
from attest.edge.data_plane import BodyBroken, DataPlaneTransport, blob_extensions, content_range, read_blob
from attest.edge.transport import RETRY_STATUS, ProxyRefused, answer_deadline, retry_after
from omni_oci.format.errors import OciError
from omni_oci.format.layout import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, sha256_digest
from omni_oci.format.reference import DIGEST_RE, api_path
from omni_oci.remote.auth import LOOKUP, RegistryAuth, is_loopback, origin
from omni_oci.remote.credentials import Credential
from omni_oci.remote.uploads import ATTEMPTS, CHUNKED_UPLOAD_THRESHOLD, UPLOAD_CHUNK_BYTES, BlobUploads, attempt_failed

ACCEPT_MANIFESTS = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
# Registries are untrusted: every read is bounded. A blob is never read past its descriptor's
# size; documents read without a descriptor (manifests) have a per-kind cap.
MAX_MANIFEST_BYTES = 4 << 20
MAX_UNSIZED_BLOB_BYTES = 16 << 20
DOCUMENT_DEADLINE_S = 120.0
BLOB_MIN_DEADLINE_S = 120.0
BLOB_MIN_BYTES_PER_S = 256 << 10


def _replayable(content: object) -> bool:
    """Whether a request body can be sent again as it is (bytes), not a stream read once."""
    return content is None or isinstance(content, (bytes, str))


class RegistryClient(BlobUploads):
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
                transport = DataPlaneTransport()
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
        connection errors with backoff, each failed attempt named on stderr. A 429 (the request
        was not served) is retried for any request whose body can be sent again; a 429's or
        503's Retry-After is the wait, held to the operation's deadline and one answer's budget."""
        retry = method in ("GET", "HEAD") or (method == "PUT" and "/manifests/" in url)
        for attempt in range(1, ATTEMPTS + 1):
            self._within_operation(f"{method} {url}")
            try:
                response = self._send(method, url, repository=repository, push=push, **kwargs)
                if not stream:
                    response = self._settled(response, f"{method} {url}")
            except OciError as exc:
                if not retry or attempt == ATTEMPTS or exc.final:
                    raise
                attempt_failed(attempt, f"{method} {url}: {exc}")
                continue
            status = response.status_code
            again = (retry and status in RETRY_STATUS) or (status == 429 and _replayable(kwargs.get("content")))
            if again and attempt < ATTEMPTS:
                response.close()
                wait = self._retry_after(response, f"{method} {url}")
                attempt_failed(attempt, f"{method} {url}: HTTP {status}", wait=wait)
                continue
            return response
        raise AssertionError("unreachable")

    def _retry_after(self, response: httpx.Response, what: str) -> float | None:
        """The wait a 429 or 503 asks for (None: none asked); one past the operation's deadline
        or one answer's budget (document_deadline_s) is a refusal naming both."""
        wait = retry_after(response.headers) if response.status_code in (429, 503) else None
        if wait is None:
            return None
        left = self.operation_deadline - time.monotonic()
        if wait > min(left, self.document_deadline_s):
            bound = (
                f"the operation's deadline ({left:.0f} s left)"
                if left <= self.document_deadline_s
                else f"the {self.document_deadline_s:g} s one wait may take"
            )
            raise OciError(
                f"{self.registry}: {what}: HTTP {response.status_code} asks to retry after {wait:g} s "
                f"(Retry-After), past {bound}",
                field="Retry-After",
            )
        return wait

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
                response,
                MAX_MANIFEST_BYTES,
                f"{self.registry}: the answer to {what}",
                deadline=deadline,
                error=OciError,
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
        scopes = (f"repository:{repository}:{'pull,push' if push else 'pull'}",)
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
        known = self.auth.known(scopes, self.document_deadline_s)
        if known:
            headers["Authorization"] = known
        try:
            response = send()
            answer = self.auth.answer(response, scopes, self.document_deadline_s)
            if answer:
                if not _replayable(kwargs.get("content")):
                    # The body was a stream, read as it went: the caller's attempt is tried
                    # again from its source, with the answer the auth now holds.
                    raise OciError(
                        f"{self.registry}: {method} {url} was refused (HTTP 401) while its body was "
                        "streamed; the credential is renewed for the next attempt",
                        field="registry",
                    )
                headers["Authorization"] = answer
                response = send()
                if response.status_code == 401:
                    response.close()
                    if answer.startswith("Basic "):
                        raise self.auth.refused(self.auth.credential(), 401, " ".join(scopes))
                    raise self.auth.refused_token(response, scopes)
        except httpx.HTTPError as exc:
            raise OciError(f"{self.registry} cannot be reached ({method} {url}): {exc}", field="registry") from None
        return response

    def _expect(self, response: httpx.Response, ok: tuple[int, ...], what: str) -> httpx.Response:
        if response.status_code not in ok:
            detail = error_detail(self._detail(response, what))
            raise OciError(
                f"{self.registry}: {what} failed with HTTP {response.status_code} {detail}".strip(),
                field=what,
                digest_refused=is_digest_refusal(response.status_code, detail),
            )
        return response

    def _detail(self, response: httpx.Response, what: str) -> bytes:
        """The start of a refusal's body: read already, or read now within a document's deadline."""
        try:
            return response.content
        except httpx.ResponseNotRead:
            pass
        try:
            return read_bounded(
                response, DETAIL_READ_BYTES, what, truncate=True, deadline=self._document_deadline(), error=OciError
            )
        except (OciError, httpx.HTTPError, httpx.StreamError):
            return b""

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


# The distribution spec's error code (HTTP 400) for a blob whose bytes do not have the digest named.
DIGEST_INVALID = "DIGEST_INVALID"


def is_digest_refusal(status: int, detail: str) -> bool:
    return status == 400 and DIGEST_INVALID in detail


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
