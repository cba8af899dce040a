"""The Sigstore (keyless) method of OpenSSF Model Signing signatures, verified offline: what
`model_signing sign` writes by default, a short-lived Fulcio certificate naming the publisher's
OIDC identity and a Rekor transparency-log entry proving when it signed.

Verified by sigstore-python's own verifier (not hand-written: the chain to Fulcio, the log
entry's inclusion proof and signed timestamp, the certificate's identity and issuer extensions
are its job), against a trusted root the caller supplies and pins, so nothing is fetched: no TUF
refresh, no log lookup. The statement the envelope carries is then read by oms.signed_facts like
every other method's.

Threat model: the signature file, its certificate and its log entry are the publisher's or an
attacker's; only the trusted root (pinned by sha256 by the caller) and the expected identity and
issuer are the user's word. An identity or issuer that differs by a character is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from attest.errors import AttestError
from attest.reader import loads_object
from omni_oci.model.artifact import MAX_SIGNATURE_BYTES
from omni_oci.model.errors import ModelError
from omni_oci.model.oms import ModelSignature, read, signed_facts

MAX_TRUSTED_ROOT_BYTES = 1 << 20


@dataclass(frozen=True)
class KeylessSigner:
    """Who must have signed: the certificate's identity (its SAN: an e-mail or URI) and the OIDC
    issuer that vouched for it, trusted through `trusted_root` (a Sigstore trusted_root.json)."""

    identity: str
    issuer: str
    trusted_root: bytes


def _refuse(what: str, message: str, field: str) -> ModelError:
    return ModelError(f"{what}: {message}", field=field)


def verified_keyless(data: bytes, signer: KeylessSigner, what: str) -> tuple[ModelSignature, bytes]:
    """The signature's facts and its signing certificate (DER), once sigstore-python verifies the
    bundle offline against `signer`."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle, TrustedRoot
    from sigstore.verify import Verifier, policy

    document, method = read(data, what)
    if method != "certificate" or "certificate" not in document["verificationMaterial"]:
        raise _refuse(what, f"it is signed by the {method} method, not Sigstore's (keyless)", "verificationMaterial")
    from sigstore_models.trustroot import v1 as trustroot

    try:
        # TrustedRoot.from_file's own parse, from the bytes the caller read once and pinned.
        root = TrustedRoot(trustroot.TrustedRoot.from_json(signer.trusted_root))
    except (SigstoreError, ValueError) as exc:
        raise ModelError(f"the Sigstore trusted root is not a trusted_root.json: {exc}", field="trusted root") from None
    try:
        bundle = Bundle.from_json(data)
        identity = policy.Identity(identity=signer.identity, issuer=signer.issuer)
        payload_type, payload = Verifier(trusted_root=root).verify_dsse(bundle, identity)
    except (SigstoreError, ValueError) as exc:
        raise _refuse(what, f"Sigstore refuses it: {exc}", "verificationMaterial") from None
    if payload_type != "application/vnd.in-toto+json":
        raise _refuse(what, f"its envelope carries {payload_type!r}, not an in-toto statement", "dsseEnvelope")
    try:
        about: dict[str, Any] = loads_object(payload, label=f"{what} statement", max_bytes=MAX_SIGNATURE_BYTES)
    except AttestError as exc:
        raise ModelError(str(exc), field="statement") from None
    from cryptography.hazmat.primitives.serialization import Encoding

    return signed_facts(about, "sigstore", what), bundle.signing_certificate.public_bytes(Encoding.DER)
