"""Signing keys: the release key (PEM ECDSA P-256, from OMNI_SIGNING_KEY_FILE, OMNI_SIGNING_KEY
or --signing-key; never printed) and the public key verifiers are given, ECDSA P-256 / SHA-256
signatures, and the key hint Sigstore bundles name a key by. Written on `cryptography`:
hand-rolled ECDSA would be wrong.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from omni_oci.format.errors import OciError
from tools.settings import SIGNING_KEY, SIGNING_KEY_FILE, SIGNING_KEY_PASSWORD


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
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()
