"""Signing keys: the release key (PEM ECDSA P-256, never printed; where it comes from is the
program's choice: tools/signing_key.py) and the public key verifiers are given, ECDSA P-256 /
SHA-256 signatures, and the key hint Sigstore bundles name a key by. Written on `cryptography`:
hand-rolled ECDSA would be wrong.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from omni_oci.format.errors import OciError


def private_key_from_pem(pem: bytes, source: str, password: bytes | None = None) -> ec.EllipticCurvePrivateKey:
    """The ECDSA P-256 private key `pem` holds; `source` names where it came from in refusals."""
    if b"ENCRYPTED SIGSTORE PRIVATE KEY" in pem:
        raise OciError(
            f"signing key from {source} is cosign's own encrypted format; Omni signs with a PEM ECDSA "
            "P-256 key that cosign also accepts: `openssl ecparam -name prime256v1 -genkey -noout -out "
            "omni.key` (then `cosign import-key-pair --key omni.key` where cosign needs its format)",
            field=source,
        )
    try:
        key = serialization.load_pem_private_key(pem, password=password)
    except (ValueError, TypeError) as exc:
        raise OciError(f"signing key from {source} is not a PEM private key: {exc}", field=source) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
        raise OciError(f"signing key from {source} must be ECDSA P-256", field=source)
    return key


def load_private_key(
    path: Path, password: bytes | None = None, field: str = "--signing-key"
) -> ec.EllipticCurvePrivateKey:
    """The private key in the PEM file `path` (a program resolves the path and the password)."""
    try:
        pem = path.read_bytes()
    except OSError as exc:
        raise OciError(
            f"{field}: the signing key {path} cannot be read ({exc.strerror}); a relative path "
            "is taken from the directory `bazel run` was started in",
            field=field,
        ) from None
    return private_key_from_pem(pem, str(path), password)


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


def sign(key: ec.EllipticCurvePrivateKey, data: bytes, *, deterministic: bool = False) -> str:
    """`deterministic`: RFC 6979's k, so the same key and data give the same signature bytes (a
    signature that lies in a layer must not change the artifact's digest on every run)."""
    algorithm = ec.ECDSA(hashes.SHA256(), deterministic_signing=deterministic)
    return base64.b64encode(key.sign(data, algorithm)).decode()


def verify(
    key: ec.EllipticCurvePublicKey, data: bytes, signature: str, algorithm: hashes.HashAlgorithm | None = None
) -> bool:
    """ECDSA with SHA-256 (cosign's), or `algorithm` (a certificate's key of another curve)."""
    try:
        key.verify(base64.b64decode(signature), data, ec.ECDSA(algorithm or hashes.SHA256()))
        return True
    except (InvalidSignature, ValueError):
        return False


def key_hint(key: ec.EllipticCurvePublicKey) -> str:
    """cosign's hint in a bundle's publicKey: base64 of the sha256 of the DER SubjectPublicKeyInfo
    (Omni's image bundles)."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def pem_hint(key: ec.EllipticCurvePublicKey) -> str:
    """model_signing's hint: the hex sha256 of the PEM SubjectPublicKeyInfo (OMS signatures)."""
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def names_key(hint: object, key: ec.EllipticCurvePublicKey) -> bool:
    """Whether a bundle's hint names `key`, in either form Omni writes. A hint only says which
    key a bundle claims; the signature verifying with the caller's key is the proof."""
    return hint in (key_hint(key), pem_hint(key))
