"""Artifacts that refer to an image (SBOM, provenance): pushed with `subject`, found
through the registry's referrers API (every page) or, where it has none, the OCI 1.1 fallback
tag `sha256-<hex>` whose index lists them."""

from __future__ import annotations

from typing import Any

import httpx

from omni_oci.format.errors import OciError, refusing_object
from omni_oci.format.layout import OCI_INDEX, OCI_MANIFEST, canonical, descriptor, sha256_digest
from omni_oci.format.reference import api_path
from omni_oci.remote.auth.authorization import origin
from omni_oci.remote.registry import RegistryClient

EMPTY_CONFIG_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
MAX_REFERRERS_BYTES = 4 << 20  # an index of thousands of referrers, all pages together
MAX_REFERRERS_PAGES = 64  # a registry paging a handful of referrers at a time still ends


def _ensure_blob(client: RegistryClient, repository: str, data: bytes) -> None:
    digest = sha256_digest(data)
    if not client.has_blob(repository, digest):
        client.upload(repository, digest, data, len(data))


def _fallback_tag(subject_digest: str) -> str:
    return subject_digest.replace(":", "-")


def _listed(data: bytes, what: str) -> list[dict[str, Any]]:
    """The descriptors of a referrers index (the API's answer or the fallback tag's), read by the
    strict reader and bounded: anything else is a refusal naming the document."""
    if len(data) > MAX_REFERRERS_BYTES:
        raise OciError(f"{what} is over {MAX_REFERRERS_BYTES} bytes", field=what)
    manifests = refusing_object(data, what).get("manifests", [])
    if not isinstance(manifests, list) or not all(
        isinstance(item, dict) and isinstance(item.get("digest"), str) for item in manifests
    ):
        raise OciError(f"{what}: manifests must be a list of descriptors with a digest", field=what)
    return manifests


def referrers(client: RegistryClient, repository: str, subject_digest: str) -> tuple[list[dict[str, Any]], str]:
    """(descriptors, "api" or "tag") of the artifacts referring to `subject_digest`: every page
    of the referrers API, else the fallback tag's index."""
    first = client.request("GET", _api_path(repository, subject_digest), repository=repository)
    if first.status_code == 200 and first.headers.get("Content-Type", "").startswith(OCI_INDEX):
        return _pages(client, repository, subject_digest, first), "api"
    tag = _fallback_tag(subject_digest)
    tagged = client.request(
        "GET", api_path(repository, "manifests", tag), repository=repository, headers={"Accept": OCI_INDEX}
    )
    if tagged.status_code == 200:
        return _listed(tagged.content, f"the referrers of {subject_digest} (tag {tag})"), "tag"
    return [], "tag"


def _api_path(repository: str, subject_digest: str) -> str:
    return api_path(repository, "referrers", subject_digest)


def _pages(
    client: RegistryClient, repository: str, subject_digest: str, response: httpx.Response
) -> list[dict[str, Any]]:
    """Every page of a referrers answer, following `Link: <...>; rel="next"` (the distribution
    spec's pagination): at most MAX_REFERRERS_PAGES pages and MAX_REFERRERS_BYTES in all, each
    on the registry's own referrers path, each read strictly; within the client's deadline."""
    listed: list[dict[str, Any]] = []
    seen: set[str] = set()
    total = 0
    for page in range(1, MAX_REFERRERS_PAGES + 1):
        what = f"the referrers of {subject_digest} (referrers API, page {page})"
        if response.status_code != 200 or not response.headers.get("Content-Type", "").startswith(OCI_INDEX):
            raise OciError(
                f"{client.registry}: {what} answered HTTP {response.status_code} "
                f"({response.headers.get('Content-Type', 'no Content-Type')}), not an OCI index",
                field=what,
            )
        total += len(response.content)
        if total > MAX_REFERRERS_BYTES:
            raise OciError(f"{what}: the pages so far are over {MAX_REFERRERS_BYTES} bytes", field=what)
        listed += _listed(response.content, what)
        following = _next_page(client, repository, subject_digest, response, what)
        if following is None:
            return listed
        if following in seen:
            raise OciError(f"{what}: its next page {following} was read already (a loop)", field=what)
        seen.add(following)
        response = client.request("GET", following, repository=repository)
    raise OciError(
        f"{client.registry}: the referrers of {subject_digest} run past {MAX_REFERRERS_PAGES} pages",
        field=f"the referrers of {subject_digest}",
    )


def _next_page(
    client: RegistryClient, repository: str, subject_digest: str, response: httpx.Response, what: str
) -> str | None:
    """The next page's path and query from the Link header (httpx parses it), or None; a next page
    on another host or path is refused: the credential and the subject stay the registry's own."""
    link = response.links.get("next")
    if link is None:
        return None
    try:
        target = client.client.base_url.join(link.get("url", ""))
    except httpx.InvalidURL:
        target = None
    if target is None or origin(target) != client.origin or target.path != _api_path(repository, subject_digest):
        raise OciError(
            f"{client.registry}: {what}: its next page {link.get('url', '')[:200]!r} is not this registry's "
            f"{_api_path(repository, subject_digest)}",
            field=what,
        )
    return target.raw_path.decode("ascii")


def push_referrer(
    client: RegistryClient,
    repository: str,
    subject: dict[str, Any],
    artifact_type: str,
    payload: bytes,
    payload_type: str,
    annotations: dict[str, str] | None = None,
) -> str:
    """Push `payload` as an artifact whose subject is `subject`; returns its digest."""
    _ensure_blob(client, repository, EMPTY_CONFIG)
    _ensure_blob(client, repository, payload)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": descriptor(EMPTY_CONFIG_TYPE, EMPTY_CONFIG),
        "layers": [descriptor(payload_type, payload)],
        "subject": {"mediaType": subject["mediaType"], "digest": subject["digest"], "size": subject["size"]},
        **({"annotations": dict(sorted(annotations.items()))} if annotations else {}),
    }
    return put_referrer(client, repository, canonical(manifest))


def put_referrer(client: RegistryClient, repository: str, data: bytes, media_type: str = OCI_MANIFEST) -> str:
    """Put a manifest that names a subject, and list it where the registry lacks the referrers
    API: in the tag-schema index `sha256-<hex>` of its subject. Returns its digest."""
    manifest = refusing_object(data, "the referrer's manifest")
    subject, artifact_type = manifest.get("subject"), manifest.get("artifactType", "")
    if not isinstance(subject, dict) or not isinstance(subject.get("digest"), str):
        raise OciError(f"referrer {sha256_digest(data)} names no subject", field="subject")
    annotations = manifest.get("annotations")
    digest = client.put_manifest(repository, sha256_digest(data), data, media_type)
    listed, how = referrers(client, repository, subject["digest"])
    if how == "api" and any(item["digest"] == digest for item in listed):
        return digest
    entry = descriptor(
        media_type, data, artifactType=artifact_type, **({"annotations": annotations} if annotations else {})
    )
    if not any(item["digest"] == digest for item in listed):
        listed = [*listed, entry]
        index = canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": listed})
        client.put_manifest(repository, _fallback_tag(subject["digest"]), index, OCI_INDEX)
    return digest
