"""Artifacts that refer to an image (SBOM, provenance): pushed with `subject`, found
through the registry's referrers API or, where it has none, the OCI 1.1 fallback tag
`sha256-<hex>` whose index lists them."""

from __future__ import annotations

from typing import Any

from tools.oci.errors import OciError, refusing_object
from tools.oci.layout import OCI_INDEX, OCI_MANIFEST, canonical, descriptor, sha256_digest
from tools.oci.remote.registry import RegistryClient

EMPTY_CONFIG_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"
MAX_REFERRERS_BYTES = 4 << 20  # an index of thousands of referrers; a registry cannot make it more


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
    """(descriptors, "api" or "tag") of the artifacts referring to `subject_digest`."""
    response = client.request("GET", f"/v2/{repository}/referrers/{subject_digest}", repository=repository)
    if response.status_code == 200 and response.headers.get("Content-Type", "").startswith(OCI_INDEX):
        return _listed(response.content, f"the referrers of {subject_digest} (referrers API)"), "api"
    tagged = client.request(
        "GET",
        f"/v2/{repository}/manifests/{_fallback_tag(subject_digest)}",
        repository=repository,
        headers={"Accept": OCI_INDEX},
    )
    if tagged.status_code == 200:
        return _listed(
            tagged.content, f"the referrers of {subject_digest} (tag {_fallback_tag(subject_digest)})"
        ), "tag"
    return [], "tag"


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


def put_referrer(client: RegistryClient, repository: str, data: bytes) -> str:
    """Put a manifest that names a subject, and list it where the registry lacks the referrers
    API: in the tag-schema index `sha256-<hex>` of its subject. Returns its digest."""
    manifest = refusing_object(data, "the referrer's manifest")
    subject, artifact_type = manifest["subject"], manifest.get("artifactType", "")
    annotations = manifest.get("annotations")
    digest = client.put_manifest(repository, sha256_digest(data), data, OCI_MANIFEST)
    listed, how = referrers(client, repository, subject["digest"])
    if how == "api" and any(item["digest"] == digest for item in listed):
        return digest
    entry = descriptor(
        OCI_MANIFEST, data, artifactType=artifact_type, **({"annotations": annotations} if annotations else {})
    )
    if not any(item["digest"] == digest for item in listed):
        listed = [*listed, entry]
        index = canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": listed})
        client.put_manifest(repository, _fallback_tag(subject["digest"]), index, OCI_INDEX)
    return digest
