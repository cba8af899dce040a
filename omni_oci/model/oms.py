"""OpenSSF Model Signing (OMS v1.0, ossf/model-signing-spec) signatures of a checkpoint's files:
the one home for their statement, their bundle, and reading and checking one (the key method).

An OMS signature is a Sigstore bundle v0.3 whose DSSE envelope holds an in-toto Statement v1:
- subject: one entry, the model's name, whose sha256 is that of the resources' raw digests
  concatenated in name order;
- predicateType PREDICATE; predicate.resources: one {name, algorithm "sha256", digest} per
  file (a relative POSIX path); predicate.serialization: method "files", hash_type "sha256",
  allow_symlinks false, and the ignore_paths a verifier leaves out of the directory;
- verificationMaterial of the key method: publicKey.hint, the hex sha256 of the key's PEM
  SubjectPublicKeyInfo (what model_signing 1.1.1 writes and checks; Omni's image bundles name
  a key cosign's way, and either form is read: omni_oci/signing/keys.names_key), and no
  transparency-log entry. Written by Omni's one bundle writer (omni_oci/signing/bundles.py).
The certificate method (`verificationMaterial.x509CertificateChain`: the signing certificate,
then the chain its signer sent) is checked against root certificates the caller trusts: the
chain must lead to one of them, valid at the signing certificate's start (as model_signing
checks it, so a signature outlives its certificate), the signing certificate must allow
signing (a key usage present must list digitalSignature, an extended key usage present codeSigning,
and one of them must be present), and its EC key, with
its curve's hash, verifies the envelope. The Sigstore method is read (`method`), not checked.

Threat model: a signature file comes from a publisher or a disk nobody vouches for. It is read
once, bounded, by the strict JSON reader; every field is checked before it is used; the subject
digest is recomputed from the resources, never taken from the statement; a resource name that
is absolute, climbs out (`..`), repeats or is not a plain POSIX path is refused; the envelope's
signature must verify with the key the caller trusts (the hint only says which key it names).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import ExtensionPolicy, PolicyBuilder, Store, VerificationError

from attest.errors import AttestError
from attest.reader import loads_object
from omni_oci.format.errors import OciError
from omni_oci.format.statement import STATEMENT_TYPE
from omni_oci.model.artifact import MAX_SIGNATURE_BYTES
from omni_oci.model.errors import ModelError
from omni_oci.signing import dsse
from omni_oci.signing.bundles import BUNDLE_TYPE, bundle_document
from omni_oci.signing.keys import names_key, pem_hint

PREDICATE = "https://model_signing/signature/v1.0"
# What model_signing leaves out of every directory it signs; Omni adds its own files.
DEFAULT_IGNORE_PATHS = (".git", ".github", ".gitignore", ".gitattributes")
METHODS = {"publicKey": "key", "certificate": "certificate", "x509CertificateChain": "certificate"}
HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")
MAX_CHAIN = 8  # certificates a bundle's chain may list
CURVE_HASHES = {"secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}


@dataclass(frozen=True)
class ModelSignature:
    """What an OMS signature says: the model's name, each file's sha256, and what is ignored."""

    name: str
    resources: dict[str, str]  # relative POSIX path -> hex sha256
    ignore_paths: tuple[str, ...]
    method: str  # key, certificate (a chain or Sigstore's), as its verification material says


def key_hint(public_key: ec.EllipticCurvePublicKey) -> str:
    """The key method's hint, model_signing's form (keys.pem_hint): how pins name a signer."""
    return pem_hint(public_key)


def subject_digest(resources: dict[str, str]) -> str:
    """The statement's subject: sha256 of the raw resource digests concatenated in name order."""
    return hashlib.sha256(b"".join(bytes.fromhex(resources[name]) for name in sorted(resources))).hexdigest()


def statement(name: str, resources: dict[str, str], ignore_paths: tuple[str, ...] = ()) -> dict[str, Any]:
    """The in-toto statement an OMS signature signs, over `resources` (path -> hex sha256)."""
    for path, digest in resources.items():
        _check_resource(path, digest, "resources")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": subject_digest(resources)}}],
        "predicateType": PREDICATE,
        "predicate": {
            "resources": [
                {"name": path, "algorithm": "sha256", "digest": resources[path]} for path in sorted(resources)
            ],
            "serialization": {
                "method": "files",
                "hash_type": "sha256",
                "allow_symlinks": False,
                "ignore_paths": sorted({*DEFAULT_IGNORE_PATHS, *ignore_paths}),
            },
        },
    }


def sign(key: ec.EllipticCurvePrivateKey, about: dict[str, Any]) -> bytes:
    """The OMS bundle of `about`, signed with `key` (the key method): the same bytes for the same
    key and statement (RFC 6979), since the bundle becomes a layer of a reproducible artifact."""
    document = bundle_document(key, about, hint=key_hint(key.public_key()), keyid="", deterministic=True)
    return json.dumps(document, indent=2).encode() + b"\n"


def _refuse(what: str, message: str, field: str) -> ModelError:
    return ModelError(f"{what}: {message}", field=field)


def _check_resource(path: Any, digest: Any, what: str) -> None:
    if not isinstance(path, str) or not path:
        raise _refuse(what, f"a resource name {str(path)[:80]!r} is not a path", "predicate.resources")
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or str(pure) != path or "\\" in path or "\x00" in path:
        raise _refuse(what, f"resource {path[:200]!r} is not a relative POSIX path inside the model", path)
    if not isinstance(digest, str) or not HEX_DIGEST.fullmatch(digest):
        raise _refuse(what, f"resource {path!r} has no sha256 digest (64 lower-case hex)", path)


def read(data: bytes, what: str) -> tuple[dict[str, Any], str]:
    """The bundle document and its signing method, checked for shape (any method)."""
    try:
        document = loads_object(data, label=what, max_bytes=MAX_SIGNATURE_BYTES)
    except AttestError as exc:
        raise ModelError(str(exc), field=what) from None
    if document.get("mediaType") != BUNDLE_TYPE:
        raise _refuse(what, f"mediaType is not {BUNDLE_TYPE}", "mediaType")
    material = document.get("verificationMaterial")
    if not isinstance(material, dict):
        raise _refuse(what, "it has no verificationMaterial", "verificationMaterial")
    methods = [METHODS[name] for name in material if name in METHODS]
    if len(methods) != 1:
        raise _refuse(what, "verificationMaterial names no single key or certificate", "verificationMaterial")
    if "tlogEntries" not in material or not isinstance(material["tlogEntries"], list):
        raise _refuse(what, "verificationMaterial has no tlogEntries list", "verificationMaterial.tlogEntries")
    if not isinstance(document.get("dsseEnvelope"), dict):
        raise _refuse(what, "it has no dsseEnvelope", "dsseEnvelope")
    return document, methods[0]


def signed_facts(about: dict[str, Any], method: str, what: str) -> ModelSignature:
    """The statement's facts, each checked; the subject recomputed from the resources."""
    if about.get("_type") != STATEMENT_TYPE or about.get("predicateType") != PREDICATE:
        raise _refuse(what, f"the statement is not an in-toto v1 statement of {PREDICATE}", "predicateType")
    predicate = about.get("predicate") if isinstance(about.get("predicate"), dict) else {}
    serialization_ = predicate.get("serialization") if isinstance(predicate.get("serialization"), dict) else {}
    wanted = {"method": "files", "hash_type": "sha256", "allow_symlinks": False}
    if any(serialization_.get(key) != value for key, value in wanted.items()):
        raise _refuse(what, f"serialization must be {wanted} (found {serialization_})", "predicate.serialization")
    ignore = serialization_.get("ignore_paths", [])
    if not isinstance(ignore, list) or not all(isinstance(item, str) and item for item in ignore):
        raise _refuse(what, "ignore_paths is not a list of paths", "predicate.serialization.ignore_paths")
    listed = predicate.get("resources")
    if not isinstance(listed, list) or not all(isinstance(item, dict) for item in listed):
        raise _refuse(what, "resources is not a list", "predicate.resources")
    resources: dict[str, str] = {}
    for item in listed:
        name, digest = item.get("name"), item.get("digest")
        _check_resource(name, digest, what)
        if item.get("algorithm") != "sha256" or name in resources:
            raise _refuse(what, f"resource {name!r} is listed twice or is not sha256", name)
        resources[name] = digest
    subjects = about.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise _refuse(what, "the statement must name exactly one subject", "subject")
    digest = (subjects[0].get("digest") or {}).get("sha256") if isinstance(subjects[0].get("digest"), dict) else None
    if digest != subject_digest(resources):
        raise _refuse(what, f"the subject's sha256 {digest} is not that of its resources", "subject")
    return ModelSignature(str(subjects[0].get("name", "")), resources, tuple(ignore), method)


def verified(data: bytes, public_key: ec.EllipticCurvePublicKey, what: str) -> ModelSignature:
    """The signature's facts, once its envelope verifies with `public_key` (the key method)."""
    document, method = read(data, what)
    if method != "key":
        raise _refuse(what, f"it is signed by the {method} method; a public key verifies only the key method", method)
    named = document["verificationMaterial"]["publicKey"]
    hint = named.get("hint") if isinstance(named, dict) else None
    if hint is not None and not names_key(hint, public_key):
        raise _refuse(what, f"it names the key {str(hint)[:80]}, not the given one ({key_hint(public_key)})", "hint")
    return _opened(document, public_key, method, what)


def _opened(
    document: dict[str, Any],
    key: ec.EllipticCurvePublicKey,
    method: str,
    what: str,
    algorithm: hashes.HashAlgorithm | None = None,
) -> ModelSignature:
    """The statement of the envelope `key` verifies, its facts checked."""
    try:
        body = dsse.opened(document["dsseEnvelope"], key, what, "signature", "dsseEnvelope", algorithm)
    except OciError as exc:
        raise ModelError(str(exc), field=exc.field) from None
    try:
        about = loads_object(body, label=f"{what} statement", max_bytes=MAX_SIGNATURE_BYTES)
    except AttestError as exc:
        raise ModelError(str(exc), field="statement") from None
    return signed_facts(about, method, what)


def _certificates(document: dict[str, Any], what: str) -> list[x509.Certificate]:
    """The chain a certificate-method bundle carries, signing certificate first."""
    chain = document["verificationMaterial"].get("x509CertificateChain")
    listed = chain.get("certificates") if isinstance(chain, dict) else None
    if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_CHAIN:
        raise _refuse(
            what,
            f"x509CertificateChain must list 1 to {MAX_CHAIN} certificates",
            "verificationMaterial.x509CertificateChain",
        )
    try:
        return [x509.load_der_x509_certificate(base64.b64decode(item["rawBytes"], validate=True)) for item in listed]
    except (TypeError, KeyError, ValueError):
        raise _refuse(what, "a certificate of its chain is not base64 DER", "x509CertificateChain") from None


def _extension(certificate: x509.Certificate, kind: type) -> Any:
    try:
        return certificate.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


def _signing_refusal(certificate: x509.Certificate) -> str | None:
    """Why the signing certificate may not sign models, or None. RFC 5280 4.2.1.3 and 4.2.1.12:
    a key usage or extended key usage that is present limits the key to the purposes it lists,
    so a present extended key usage must list codeSigning (a TLS server's certificate signs no
    model) and a present key usage digitalSignature; one of them must be present."""
    usage, extended = _extension(certificate, x509.KeyUsage), _extension(certificate, x509.ExtendedKeyUsage)
    if extended is not None and ExtendedKeyUsageOID.CODE_SIGNING not in extended:
        listed = ", ".join(oid._name for oid in extended) or "none"
        return f"its signing certificate's extended key usage ({listed}) does not include codeSigning"
    if usage is not None and not usage.digital_signature:
        return "its signing certificate's key usage does not include digitalSignature"
    if usage is None and extended is None:
        return "its signing certificate allows no signing (no key usage digitalSignature, no codeSigning)"
    return None


def _chain_verified(certificates: list[x509.Certificate], roots: list[x509.Certificate], what: str) -> None:
    """The signing certificate leads to one of `roots` through the others (their CA rules as
    the Web PKI's; the signing certificate's own extensions as model_signing reads them)."""
    leaf = certificates[0]
    verifier = (
        PolicyBuilder()
        .store(Store(roots))
        .time(leaf.not_valid_before_utc)
        .extension_policies(ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=ExtensionPolicy.permit_all())
        .build_client_verifier()
    )
    try:
        verifier.verify(leaf, certificates[1:])
    except VerificationError as exc:
        raise _refuse(
            what, f"its certificate chain does not lead to a given root: {exc}", "x509CertificateChain"
        ) from None
    refusal = _signing_refusal(leaf)
    if refusal is not None:
        raise _refuse(what, refusal, "x509CertificateChain")


def certificate_identity(certificate: x509.Certificate) -> str:
    """Who a signing certificate names: its subject, and its SAN e-mail addresses and URIs."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        alternatives = [
            *names.get_values_for_type(x509.RFC822Name),
            *names.get_values_for_type(x509.UniformResourceIdentifier),
        ]
    except x509.ExtensionNotFound:
        alternatives = []
    return ", ".join([certificate.subject.rfc4514_string(), *alternatives])


def verified_by_chain(data: bytes, roots: list[x509.Certificate], what: str) -> tuple[ModelSignature, x509.Certificate]:
    """The signature's facts and its signing certificate, once its chain leads to one of `roots`
    and the certificate's key verifies the envelope (the certificate method)."""
    document, method = read(data, what)
    if method != "certificate" or "x509CertificateChain" not in document["verificationMaterial"]:
        raise _refuse(what, f"it is signed by the {method} method, not with a certificate chain", method)
    certificates = _certificates(document, what)
    _chain_verified(certificates, roots, what)
    key = certificates[0].public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in CURVE_HASHES:
        raise _refuse(what, "its signing certificate's key is not ECDSA P-256, P-384 or P-521", "x509CertificateChain")
    return _opened(document, key, method, what, CURVE_HASHES[key.curve.name]()), certificates[0]


def differences(signed: dict[str, str], expected: dict[str, str]) -> list[str]:
    """Each file the two disagree on, named: missing from the signature, not expected, or of
    another digest. [] when they are the same files with the same digests."""
    found = [f"{path}: expected, not in the signature" for path in sorted(set(expected) - set(signed))]
    found += [f"{path}: in the signature, not expected" for path in sorted(set(signed) - set(expected))]
    found += [
        f"{path}: the signature says sha256:{signed[path]}, expected sha256:{expected[path]}"
        for path in sorted(set(signed) & set(expected))
        if signed[path] != expected[path]
    ]
    return found
