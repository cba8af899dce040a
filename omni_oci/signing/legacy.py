"""cosign's legacy signature tags, so Debian's `cosign verify --key` and
`cosign verify-attestation --key` (cosign 2) accept them offline.

- Image: a "simple signing" payload naming the manifest digest, signed ECDSA P-256 /
  SHA-256, stored as an image at tag `sha256-<hex>.sig` (the signature in the layer's
  `dev.cosignproject.cosign/signature` annotation).
- Attestations: DSSE envelopes of in-toto statements (the SLSA provenance, the SPDX SBOM), one
  layer each, stored at tag `sha256-<hex>.att`.

The keys are signing/keys.py's, the envelopes signing/dsse.py's.
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from omni_oci.format.layout import OCI_CONFIG, OCI_MANIFEST, canonical, descriptor, sha256_digest
from omni_oci.format.statement import SLSA_PROVENANCE
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing import dsse
from omni_oci.signing.keys import sign

SIMPLESIGNING_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_TYPE = "application/vnd.dsse.envelope.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_ANNOTATION = "predicateType"  # on each layer of a legacy `.att` image


def simple_signing_payload(reference: str, digest: str) -> bytes:
    return json.dumps(
        {
            "critical": {
                "identity": {"docker-reference": reference},
                "image": {"docker-manifest-digest": digest},
                "type": "cosign container image signature",
            },
            "optional": None,
        },
        separators=(",", ":"),
    ).encode()


def dsse_envelope(key: ec.EllipticCurvePrivateKey, statement: dict[str, Any]) -> bytes:
    """A legacy `.att` layer: the envelope as cosign 2 writes it (an empty keyid)."""
    return json.dumps(dsse.envelope(key, statement, keyid=""), separators=(",", ":")).encode()


def tag_for(digest: str, suffix: str) -> str:
    return digest.replace(":", "-") + "." + suffix


def _push_layers_image(
    client: RegistryClient, repository: str, tag: str, layers: list[tuple[bytes, str, dict[str, str]]]
) -> str:
    """Cosign's signature/attestation image: one annotated layer per (payload, media type,
    annotations), a minimal config."""
    diff_ids = [sha256_digest(payload) for payload, _, _ in layers]
    config = canonical(
        {
            "architecture": "",
            "config": {},
            "created": "0001-01-01T00:00:00Z",
            "history": [{"created": "0001-01-01T00:00:00Z"}],
            "os": "",
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
    )
    for blob in (*(payload for payload, _, _ in layers), config):
        if not client.has_blob(repository, sha256_digest(blob)):
            client.upload(repository, sha256_digest(blob), blob, len(blob))
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": descriptor(OCI_CONFIG, config),
            "layers": [
                descriptor(media_type, payload, annotations=annotations) for payload, media_type, annotations in layers
            ],
        }
    )
    return client.put_manifest(repository, tag, manifest, OCI_MANIFEST)


def push_image_signature(client: RegistryClient, repository: str, digest: str, key: ec.EllipticCurvePrivateKey) -> str:
    payload = simple_signing_payload(f"{client.registry}/{repository}", digest)
    return _push_layers_image(
        client,
        repository,
        tag_for(digest, "sig"),
        [(payload, SIMPLESIGNING_TYPE, {SIGNATURE_ANNOTATION: sign(key, payload)})],
    )


def push_attestations(client: RegistryClient, repository: str, digest: str, envelopes: dict[str, bytes]) -> str:
    """Cosign's legacy `.att` image: one DSSE envelope layer per predicate type (its
    `predicateType` annotation), as `cosign attest` adds them, so cosign 2, which reads only
    this layout, finds every attestation a bundle also carries (`--type spdxjson` included)."""
    layers = [
        (envelope, DSSE_TYPE, {SIGNATURE_ANNOTATION: "", PREDICATE_ANNOTATION: predicate})
        for predicate, envelope in envelopes.items()
    ]
    return _push_layers_image(client, repository, tag_for(digest, "att"), layers)


def push_attestation(client: RegistryClient, repository: str, digest: str, envelope: bytes) -> str:
    """The legacy `.att` image holding only the SLSA provenance."""
    return push_attestations(client, repository, digest, {SLSA_PROVENANCE: envelope})
