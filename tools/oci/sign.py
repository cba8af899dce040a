"""Signatures in cosign's formats, so Debian's `cosign verify --key` and
`cosign verify-attestation --key` accept them offline.

- Image: a "simple signing" payload naming the manifest digest, signed ECDSA P-256 /
  SHA-256, stored as an image at tag `sha256-<hex>.sig` (the signature in the layer's
  `dev.cosignproject.cosign/signature` annotation).
- Attestations: DSSE envelopes of in-toto statements (the SLSA provenance, the SPDX SBOM), one
  layer each, stored at tag `sha256-<hex>.att`.

The private key (PEM, from OMNI_SIGNING_KEY_FILE, OMNI_SIGNING_KEY or a file) is never
printed. Written on `cryptography`: hand-rolled ECDSA would be wrong.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tools.oci.errors import OciError
from tools.oci.layout import OCI_CONFIG, OCI_MANIFEST, canonical, descriptor, sha256_digest
from tools.oci.remote.registry import RegistryClient
from tools.settings import SIGNING_KEY, SIGNING_KEY_FILE, SIGNING_KEY_PASSWORD

SIMPLESIGNING_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_TYPE = "application/vnd.dsse.envelope.v1+json"
INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SLSA_PREDICATE = "https://slsa.dev/provenance/v1"
PREDICATE_ANNOTATION = "predicateType"  # on each layer of a legacy `.att` image


def load_private_key(path: Path | None = None) -> ec.EllipticCurvePrivateKey:
    if path is not None or os.environ.get(SIGNING_KEY_FILE):
        source = str(path) if path is not None else os.environ[SIGNING_KEY_FILE]
        field = "--signing-key" if path is not None else SIGNING_KEY_FILE
        # A relative path means what it meant where the user typed it (`bazel run` changes directory).
        where = Path(os.environ.get("BUILD_WORKING_DIRECTORY", ".")) / source
        try:
            pem = where.read_bytes()
        except OSError as exc:
            raise OciError(
                f"{field}: the signing key {source} cannot be read ({exc.strerror}); a relative path "
                "is taken from the directory `bazel run` was started in",
                field=field,
            ) from None
    elif os.environ.get(SIGNING_KEY):
        source, pem = SIGNING_KEY, os.environ[SIGNING_KEY].encode()
    else:
        raise OciError(
            "no signing key: set OMNI_SIGNING_KEY_FILE (or OMNI_SIGNING_KEY, or --signing-key), "
            "or push with --unsigned",
            field="OMNI_SIGNING_KEY_FILE",
        )
    if b"ENCRYPTED SIGSTORE PRIVATE KEY" in pem:
        raise OciError(
            f"signing key from {source} is cosign's own encrypted format; Omni signs with a PEM ECDSA "
            "P-256 key that cosign also accepts: `openssl ecparam -name prime256v1 -genkey -noout -out "
            "omni.key` (then `cosign import-key-pair --key omni.key` where cosign needs its format)",
            field=source,
        )
    password = os.environ.get(SIGNING_KEY_PASSWORD, "").encode() or None
    try:
        key = serialization.load_pem_private_key(pem, password=password)
    except (ValueError, TypeError) as exc:
        raise OciError(f"signing key from {source} is not a PEM private key: {exc}", field=source) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise OciError(f"signing key from {source} must be ECDSA P-256", field=source)
    return key


def load_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise OciError(
            f"--key {path} cannot be read ({exc.strerror}); a relative path is taken from the directory "
            "`bazel run` was started in",
            field="--key",
        ) from None
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError as exc:
        raise OciError(f"--key {path} is not a PEM public key: {exc}", field="--key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise OciError(f"{path} is not an ECDSA public key", field=str(path))
    return key


def sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> str:
    return base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()


def verify(key: ec.EllipticCurvePublicKey, data: bytes, signature: str) -> bool:
    try:
        key.verify(base64.b64decode(signature), data, ec.ECDSA(hashes.SHA256()))
        return True
    except (InvalidSignature, ValueError):
        return False


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the envelope's signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


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
    body = json.dumps(statement, separators=(",", ":"), sort_keys=True).encode()
    return json.dumps(
        {
            "payloadType": INTOTO_PAYLOAD_TYPE,
            "payload": base64.b64encode(body).decode(),
            "signatures": [{"keyid": "", "sig": sign(key, pae(INTOTO_PAYLOAD_TYPE, body))}],
        },
        separators=(",", ":"),
    ).encode()


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
    return push_attestations(client, repository, digest, {SLSA_PREDICATE: envelope})
