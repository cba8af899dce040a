"""Signatures as Sigstore bundles (v0.3) attached as OCI referrers, the layout cosign 3 writes
and prefers, and that policy-controller and Kyverno read.

Each bundle holds a DSSE envelope of an in-toto v1 statement about one manifest digest, signed
with the release key (ECDSA P-256), and verification material naming that key by its hint
(base64 of the SHA-256 of its DER public key) and an empty `tlogEntries` list: no
transparency-log entry (offline: verifiers pass `--insecure-ignore-tlog`, docs/release.md), and
the list present as the bundle schema requires (sigstore-models parses the bundle). This module's
`bundle_document` is Omni's one bundle writer: OMS model signatures (omni_oci/model/oms.py) use it
with model_signing's hint form; the readers accept either form (keys.names_key). Three predicates: the image signature
(cosign's `https://sigstore.dev/cosign/sign/v1`), the SLSA v1 provenance and the SPDX SBOM.
A bundle is pushed as an artifact manifest whose subject is the image, listed by the
referrers API or its fallback tag (omni_oci/remote/referrers.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from omni_oci.format.errors import OciError, refusing_object
from omni_oci.format.statement import (  # noqa: F401 (the predicate types, re-exported for the signers)
    CYCLONEDX_PREDICATE,
    SIGN_PREDICATE,
    SLSA_PROVENANCE,
    SPDX_PREDICATE,
    STATEMENT_TYPE,
    subject_digests,
)
from omni_oci.format.statement import statement as in_toto_statement
from omni_oci.remote.referrers import push_referrer, referrers
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing import dsse
from omni_oci.signing.keys import key_hint, names_key
from omni_oci.signing.legacy import dsse_envelope, push_attestations, push_image_signature

BUNDLE_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"
CONTENT_ANNOTATION = "dev.sigstore.bundle.content"
MAX_BUNDLE_BYTES = 8 << 20  # an SBOM's statement is the largest
# What a push without the legacy tags costs (docs/release.md#what-each-cosign-verifies, measured).
BUNDLES_ONLY_WARNING = (
    "warning: --no-legacy-signatures: cosign < 3 (Debian 13's 2.5, most admission controllers today) "
    "finds no signature in Sigstore bundles alone; docs/release.md#what-each-cosign-verifies"
)
MAX_BUNDLES = 64  # referrers read at most: a registry cannot make verify fetch without end


def statement(digest: str, predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    """A bundle's statement: about one manifest digest, named by that digest alone."""
    return in_toto_statement([("", digest)], predicate_type, predicate)


def bundle_document(
    key: ec.EllipticCurvePrivateKey,
    about: dict[str, Any],
    *,
    hint: str,
    keyid: str | None = None,
    deterministic: bool = False,
) -> dict[str, Any]:
    """A Sigstore bundle v0.3 of `about` (an in-toto statement), DSSE-signed with `key` (the key
    method: `hint` names the key, no log entry); `keyid` and `deterministic` are dsse.envelope's."""
    return {
        "mediaType": BUNDLE_TYPE,
        "verificationMaterial": {"publicKey": {"hint": hint}, "tlogEntries": []},
        "dsseEnvelope": dsse.envelope(key, about, keyid=keyid, deterministic=deterministic),
    }


def bundle(key: ec.EllipticCurvePrivateKey, about: dict[str, Any]) -> bytes:
    """An image bundle of `about`, as pushed: compact JSON, cosign's hint form."""
    document = bundle_document(key, about, hint=key_hint(key.public_key()))
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def push_bundle(
    client: RegistryClient, repository: str, subject: dict[str, Any], key: ec.EllipticCurvePrivateKey, about: dict
) -> str:
    """The bundle of `about` as a referrer of `subject`; returns the referrer's digest."""
    annotations = {CONTENT_ANNOTATION: "dsse-envelope", PREDICATE_ANNOTATION: about["predicateType"]}
    return push_referrer(client, repository, subject, BUNDLE_TYPE, bundle(key, about), BUNDLE_TYPE, annotations)


def attestations(
    digest: str, provenance: dict | None, sbom: dict | None, cyclonedx: dict | None = None
) -> dict[str, dict[str, Any]]:
    """predicate type -> in-toto statement about `digest`, for each piece of evidence given."""
    made: dict[str, dict[str, Any]] = {}
    if provenance is not None:
        made[SLSA_PROVENANCE] = provenance
    if sbom is not None:
        made[SPDX_PREDICATE] = statement(digest, SPDX_PREDICATE, sbom)
    if cyclonedx is not None:
        made[CYCLONEDX_PREDICATE] = statement(digest, CYCLONEDX_PREDICATE, cyclonedx)
    return made


@dataclass
class Signed:
    """What one signing pushed: bundle referrers by predicate, and the legacy tags' digests."""

    bundles: dict[str, str]
    signature_tag: str = ""
    attestations_tag: str = ""


def push_signatures(
    client: RegistryClient,
    repository: str,
    subject: dict[str, Any],
    key: ec.EllipticCurvePrivateKey,
    provenance: dict[str, Any] | None = None,
    sbom: dict[str, Any] | None = None,
    legacy: bool = True,
    cyclonedx: dict[str, Any] | None = None,
) -> Signed:
    """The image signature, and the provenance and SBOM statements (SPDX, CycloneDX) where given,
    as bundles; with
    `legacy` also cosign's `.sig` and an `.att` holding every attestation a bundle holds: cosign 2
    reads only those tags, so what it can verify is the whole release."""
    digest = subject["digest"]
    evidence = attestations(digest, provenance, sbom, cyclonedx)
    bundles = {SIGN_PREDICATE: statement(digest, SIGN_PREDICATE, {}), **evidence}
    signed = Signed({p: push_bundle(client, repository, subject, key, about) for p, about in bundles.items()})
    if legacy:
        signed.signature_tag = push_image_signature(client, repository, digest, key)
        envelopes = {p: dsse_envelope(key, about) for p, about in evidence.items()}
        if envelopes:
            signed.attestations_tag = push_attestations(client, repository, digest, envelopes)
    return signed


# --- reading ------------------------------------------------------------------------------


def _document(data: bytes, what: str) -> dict[str, Any]:
    return refusing_object(data, what, field="bundle")


def _bundle_blob(client: RegistryClient, repository: str, digest: str, subject_digest: str) -> tuple[bytes, str]:
    """The referrer's one bundle layer and the predicate type its manifest announces."""
    what = f"bundle referrer {digest}"
    manifest = _document(client.manifest(repository, digest)[0], what)
    named = (manifest.get("subject") or {}).get("digest") if isinstance(manifest.get("subject"), dict) else None
    if named != subject_digest:
        raise OciError(f"{what} names the subject {named}, not {subject_digest}", field="bundle.subject")
    layers = [item for item in manifest.get("layers") or [] if isinstance(item, dict)]
    if len(layers) != 1 or layers[0].get("mediaType") != BUNDLE_TYPE:
        raise OciError(f"{what} must hold exactly one {BUNDLE_TYPE} layer", field="bundle")
    try:
        data = client.blob(
            repository, str(layers[0].get("digest")), size=layers[0].get("size"), max_bytes=MAX_BUNDLE_BYTES
        )
    except OciError as exc:
        raise OciError(f"{what}: its bundle blob cannot be read: {exc}", field="bundle") from None
    annotations = manifest.get("annotations") if isinstance(manifest.get("annotations"), dict) else {}
    return data, str(annotations.get(PREDICATE_ANNOTATION, ""))


def open_bundle(data: bytes, key: ec.EllipticCurvePublicKey, subject_digest: str, what: str) -> dict[str, Any]:
    """The statement of a bundle signed by `key` about `subject_digest`; refused naming the field."""
    document = _document(data, what)
    if document.get("mediaType") != BUNDLE_TYPE:
        raise OciError(f"{what} is not a {BUNDLE_TYPE} document", field="bundle.mediaType")
    hint = ((document.get("verificationMaterial") or {}).get("publicKey") or {}).get("hint")
    if hint is not None and not names_key(hint, key):
        raise OciError(f"{what} names the key {hint}, not the given public key", field="bundle.verificationMaterial")
    body = dsse.opened(document.get("dsseEnvelope"), key, what, "bundle.signature", "bundle.dsseEnvelope")
    about = _document(body, f"{what} statement")
    subjects = subject_digests(about)
    if about.get("_type") != STATEMENT_TYPE or subject_digest.split(":", 1)[1] not in subjects:
        raise OciError(f"{what} is about {subjects}, not {subject_digest}", field="bundle.subject")
    return about


def signed_statements(
    client: RegistryClient, repository: str, subject_digest: str, key: ec.EllipticCurvePublicKey
) -> dict[str, dict[str, Any]] | None:
    """predicate type -> verified statement, from every bundle referring to the digest; None
    where there is none (the legacy layout). A bad bundle refuses the whole image."""
    listed, _ = referrers(client, repository, subject_digest)
    found = [item for item in listed if isinstance(item, dict) and item.get("artifactType") == BUNDLE_TYPE]
    if not found:
        return None
    if len(found) > MAX_BUNDLES:
        raise OciError(f"{len(found)} bundles refer to {subject_digest}; at most {MAX_BUNDLES}", field="bundle")
    statements: dict[str, dict[str, Any]] = {}
    for item in found:
        digest = str(item.get("digest"))
        data, announced = _bundle_blob(client, repository, digest, subject_digest)
        about = open_bundle(data, key, subject_digest, f"bundle {digest}")
        if about.get("predicateType") != announced:
            raise OciError(
                f"bundle {digest} announces {announced!r} but signs {about.get('predicateType')!r}",
                field="bundle.predicateType",
            )
        statements.setdefault(announced, about)
    return statements
