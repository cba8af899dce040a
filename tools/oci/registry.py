"""A small OCI distribution client on httpx: manifests and blobs by digest (verified),
HEAD checks, cross-repository mounts, monolithic and streamed uploads.

Plain HTTP is used only for loopback registries; anything else is HTTPS. Anonymous
bearer tokens (the `WWW-Authenticate: Bearer realm=...` challenge) are fetched on demand.
"""
from __future__ import annotations

import hashlib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

from tools.oci.errors import OciError
from tools.oci.layout import DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST, sha256_digest

ACCEPT_MANIFESTS = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
CHUNK = 1 << 20
DOCKER_HUB = "registry-1.docker.io"


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str = ""
    digest: str = ""

    @classmethod
    def parse(cls, text: str, *, require_digest: bool = False) -> "Reference":
        rest, _, digest = text.partition("@")
        if digest and not DIGEST_RE.fullmatch(digest):
            raise OciError(f"{text}: digest must be sha256:<64 hex>", field="digest")
        first, slash, remainder = rest.partition("/")
        if not slash or not ("." in first or ":" in first or first == "localhost"):
            registry, path = "docker.io", rest
        else:
            registry, path = first, remainder
        name, colon, tag = path.rpartition(":")
        if not colon or "/" in tag:
            name, tag = path, ""
        if registry in ("docker.io", "index.docker.io"):
            registry = DOCKER_HUB
            if "/" not in name:
                name = "library/" + name
        if not name or name != name.lower():
            raise OciError(f"{text}: repository name must be lower case and non-empty", field="reference")
        if require_digest and not digest:
            raise OciError(f"{text} is not pinned: a base must be referenced by @sha256:<digest>", field="digest")
        return cls(registry, name, tag, digest)

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}" + (f":{self.tag}" if self.tag else "") + \
            (f"@{self.digest}" if self.digest else "")


def _is_loopback(registry: str) -> bool:
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RegistryClient:
    """One registry; counters record what crossed the wire (for tests and summaries)."""

    def __init__(self, registry: str, *, timeout: float = 60.0, transport: httpx.BaseTransport | None = None) -> None:
        self.registry = registry
        scheme = "http" if _is_loopback(registry) else "https"
        self.client = httpx.Client(base_url=f"{scheme}://{registry}", timeout=timeout, follow_redirects=True,
                                   transport=transport)
        self._tokens: dict[str, str] = {}
        self.uploaded_bytes = 0
        self.uploaded_blobs: list[str] = []
        self.mounted_blobs: list[str] = []

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "RegistryClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport ---------------------------------------------------------------
    def _token(self, challenge: str, scope: str) -> str:
        fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if "realm" not in fields:
            raise OciError(f"{self.registry}: unsupported auth challenge {challenge!r}", field="registry")
        params = {"scope": scope, **({"service": fields["service"]} if "service" in fields else {})}
        response = httpx.get(fields["realm"], params=params, timeout=30)
        if response.status_code != 200:
            raise OciError(f"{self.registry}: anonymous token refused ({response.status_code}) for {scope}",
                           field="registry")
        body = response.json()
        return body.get("token") or body.get("access_token") or ""

    def request(self, method: str, url: str, *, repository: str, push: bool = False, stream: bool = False,
                **kwargs) -> httpx.Response:
        scope = f"repository:{repository}:{'pull,push' if push else 'pull'}"
        headers = dict(kwargs.pop("headers", {}) or {})
        if scope in self._tokens:
            headers["Authorization"] = f"Bearer {self._tokens[scope]}"
        try:
            request = self.client.build_request(method, url, headers=headers, **kwargs)
            response = self.client.send(request, stream=stream)
            if response.status_code == 401 and "bearer" in response.headers.get("WWW-Authenticate", "").lower() \
                    and scope not in self._tokens:
                response.close()
                self._tokens[scope] = self._token(response.headers["WWW-Authenticate"], scope)
                headers["Authorization"] = f"Bearer {self._tokens[scope]}"
                request = self.client.build_request(method, url, headers=headers, **kwargs)
                response = self.client.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise OciError(f"{self.registry} cannot be reached ({method} {url}): {exc}", field="registry") from None
        return response

    def _expect(self, response: httpx.Response, ok: tuple[int, ...], what: str) -> httpx.Response:
        if response.status_code not in ok:
            detail = response.text[:300] if not response.is_stream_consumed or response.is_closed else ""
            raise OciError(f"{self.registry}: {what} failed with HTTP {response.status_code} {detail}".strip(),
                           field=what)
        return response

    # --- reads -------------------------------------------------------------------
    def manifest(self, repository: str, reference: str) -> tuple[bytes, str]:
        response = self.request("GET", f"/v2/{repository}/manifests/{reference}", repository=repository,
                                headers={"Accept": ACCEPT_MANIFESTS})
        self._expect(response, (200,), f"manifest {repository}@{reference}")
        data = response.content
        if DIGEST_RE.fullmatch(reference) and sha256_digest(data) != reference:
            raise OciError(f"{self.registry}/{repository}: manifest bytes do not match the requested digest "
                           f"{reference} (got {sha256_digest(data)})", field="manifest")
        media_type = response.headers.get("Content-Type", "").split(";")[0]
        return data, media_type

    def blob(self, repository: str, digest: str) -> bytes:
        response = self.request("GET", f"/v2/{repository}/blobs/{digest}", repository=repository)
        self._expect(response, (200,), f"blob {digest}")
        if sha256_digest(response.content) != digest:
            raise OciError(f"{self.registry}/{repository}: blob {digest} is corrupt "
                           f"(its bytes hash to {sha256_digest(response.content)})", field=digest)
        return response.content

    def has_blob(self, repository: str, digest: str) -> bool:
        response = self.request("HEAD", f"/v2/{repository}/blobs/{digest}", repository=repository, push=True)
        return response.status_code == 200

    def stream_blob(self, repository: str, digest: str, size: int) -> Iterator[bytes]:
        """The blob's bytes in chunks, verified against `digest` and `size` at the end."""
        response = self.request("GET", f"/v2/{repository}/blobs/{digest}", repository=repository, stream=True)
        try:
            self._expect(response, (200,), f"blob {digest}")
            hasher, count = hashlib.sha256(), 0
            for chunk in response.iter_bytes(CHUNK):
                hasher.update(chunk)
                count += len(chunk)
                yield chunk
            if "sha256:" + hasher.hexdigest() != digest or count != size:
                raise OciError(f"{self.registry}/{repository}: streamed blob {digest} is corrupt", field=digest)
        finally:
            response.close()

    # --- writes ------------------------------------------------------------------
    def mount(self, repository: str, digest: str, from_repository: str) -> bool:
        response = self.request("POST", f"/v2/{repository}/blobs/uploads/", repository=repository, push=True,
                                params={"mount": digest, "from": from_repository})
        if response.status_code == 201:
            self.mounted_blobs.append(digest)
            return True
        if response.status_code == 202 and response.headers.get("Location"):
            # The registry opened an upload instead; cancel it so no session dangles.
            self.request("DELETE", response.headers["Location"], repository=repository, push=True)
        return False

    def upload(self, repository: str, digest: str, content: bytes | Path | Iterator[bytes], size: int) -> None:
        start = self.request("POST", f"/v2/{repository}/blobs/uploads/", repository=repository, push=True)
        self._expect(start, (202,), f"upload start for {digest}")
        location = start.headers["Location"]
        if isinstance(content, Path):
            def chunks(path: Path = content) -> Iterator[bytes]:
                with path.open("rb") as handle:
                    while block := handle.read(CHUNK):
                        yield block
            body: bytes | Iterator[bytes] = chunks()
        else:
            body = content
        separator = "&" if "?" in location else "?"
        response = self.request("PUT", f"{location}{separator}digest={digest}", repository=repository, push=True,
                                content=body, headers={"Content-Type": "application/octet-stream",
                                                       "Content-Length": str(size)})
        self._expect(response, (201,), f"upload of {digest}")
        self.uploaded_bytes += size
        self.uploaded_blobs.append(digest)

    def put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> str:
        response = self.request("PUT", f"/v2/{repository}/manifests/{reference}", repository=repository, push=True,
                                content=data, headers={"Content-Type": media_type})
        self._expect(response, (201,), f"manifest push {repository}:{reference}")
        digest = sha256_digest(data)
        returned = response.headers.get("Docker-Content-Digest")
        if returned and returned != digest:
            raise OciError(f"{self.registry} stored the manifest as {returned}, expected {digest}", field="manifest")
        return digest
