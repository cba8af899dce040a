"""The request policy of a registry client, apart from its verbs: one registry's HTTP session,
its credential (omni_oci.remote.auth.authorization: who may see it, the token dance), retries with backoff,
Retry-After, and the deadlines every answer and document read keeps.

Deadlines: every answer's status line and headers arrive within DOCUMENT_DEADLINE_S
(attest.edge.transport); a document (manifest, token, small blob) is read within
DOCUMENT_DEADLINE_S in all, body included; a streamed blob, through the data plane
(attest.edge.data_plane), within its size at the registry client's BLOB_MIN_BYTES_PER_S; a peer
trickling bytes cannot hold a read open past them; no answer, body or retry passes the whole
operation's deadline. Plain HTTP is used only for loopback registries; anything else is HTTPS.
"""

from __future__ import annotations

import math
import sys
import time

import httpx

from attest.edge.bodies import DETAIL_READ_BYTES, error_detail, read_bounded
from attest.edge.data_plane import DataPlaneTransport
from attest.edge.redact import redact_known
from attest.edge.transport import RETRY_STATUS, ProxyRefused, answer_deadline, retry_after
from omni_oci.format.errors import OciError
from omni_oci.remote.auth.authorization import LOOKUP, RegistryAuth, is_loopback, origin
from omni_oci.remote.auth.credentials import Credential

ATTEMPTS = 3
# Registries are untrusted: every read is bounded. Documents read without a descriptor
# (manifests, the answers to writes and HEADs) have this cap.
MAX_MANIFEST_BYTES = 4 << 20
DOCUMENT_DEADLINE_S = 120.0


def _replayable(content: object) -> bool:
    """Whether a request body can be sent again as it is (bytes), not a stream read once."""
    return content is None or isinstance(content, (bytes, str))


def attempt_failed(attempt: int, what: str, *, wait: float | None = None) -> None:
    """Says so on stderr, then waits: `wait` (what the registry asked for), else a backoff."""
    pause = min(0.2 * 2 ** (attempt - 1), 5) if wait is None else wait
    asked = f" in {pause:g} s, as Retry-After asks" if wait is not None else ""
    print(
        redact_known(f"registry: attempt {attempt}/{ATTEMPTS} failed: {what}; retrying{asked}"),
        file=sys.stderr,
        flush=True,
    )
    time.sleep(pause)


# The distribution spec's error code (HTTP 400) for a blob whose bytes do not have the digest named.
DIGEST_INVALID = "DIGEST_INVALID"


def is_digest_refusal(status: int, detail: str) -> bool:
    return status == 400 and DIGEST_INVALID in detail


class RegistrySession:
    """One registry's session: requests with the retry and deadline policy; RegistryClient's
    verbs and uploads are built on it."""

    def __init__(
        self,
        registry: str,
        *,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        credential: Credential | None | object = LOOKUP,
    ) -> None:
        """`credential`: by default looked up (omni_oci/remote/auth/credentials.py) when the registry first
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

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "RegistrySession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
