"""DSSE envelopes (https://github.com/secure-systems-lab/dsse/blob/master/envelope.md), the one
home: the pre-authentication encoding, the signed envelope of an in-toto statement (cosign's
legacy `.att` layers and the Sigstore bundles' dsseEnvelope), and opening one from untrusted
bytes against a public key."""

from __future__ import annotations

import base64
import json
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from omni_oci.format.errors import OciError
from omni_oci.signing.keys import sign, verify

INTOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the envelope's signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


def envelope(
    key: ec.EllipticCurvePrivateKey, statement: dict[str, Any], *, keyid: str | None = None, deterministic: bool = False
) -> dict[str, Any]:
    """The envelope of `statement` (canonical JSON: sorted keys, no spaces), signed with `key`.
    `keyid` None writes no keyid at all, as cosign does in bundles: cosign 3's DSSE verifier skips
    a signature whose keyid is not its own empty one. `deterministic`: keys.sign's."""
    body = json.dumps(statement, separators=(",", ":"), sort_keys=True).encode()
    signature: dict[str, str] = {} if keyid is None else {"keyid": keyid}
    signature["sig"] = sign(key, pae(INTOTO_PAYLOAD_TYPE, body), deterministic=deterministic)
    return {"payloadType": INTOTO_PAYLOAD_TYPE, "payload": base64.b64encode(body).decode(), "signatures": [signature]}


def opened(
    document: Any,
    key: ec.EllipticCurvePublicKey,
    what: str,
    field: str,
    malformed_field: str = "",
    algorithm: hashes.HashAlgorithm | None = None,
) -> bytes:
    """The payload of an untrusted envelope: well formed, an in-toto payload type, and a signature
    that verifies with `key` (ECDSA over `algorithm`, SHA-256 unless given); else an OciError
    naming `field` (`malformed_field`, where given, for an envelope that is not one)."""
    try:
        body = base64.b64decode(str(document["payload"]), validate=True)
        signatures = [str(item["sig"]) for item in document["signatures"]]
        payload_type = str(document["payloadType"])
    except (TypeError, KeyError, ValueError):
        raise OciError(f"{what}: the DSSE envelope is malformed", field=malformed_field or field) from None
    if payload_type != INTOTO_PAYLOAD_TYPE:
        raise OciError(f"{what}: the DSSE envelope carries {payload_type!r}, not an in-toto statement", field=field)
    if not any(verify(key, pae(payload_type, body), signature, algorithm) for signature in signatures):
        raise OciError(f"{what}: the signature does not verify with the given public key", field=field)
    return body
