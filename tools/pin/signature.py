"""A publisher's OpenSSF Model Signing signature (omni_oci/model/oms.py) checked against the lock
`tools/pin` resolved: `--model-signature FILE` with `--model-signer-key PEM` (the key method),
`--model-signer-chain PEM` (the certificate method: the root certificates you trust), or
`--model-signer-identity ID --model-signer-issuer URL` (Sigstore's keyless method, what
`model_signing sign` writes by default: verified offline by sigstore-python against a trusted
root pinned by sha256, Sigstore's public one committed as TRUSTED_ROOT, omni_oci/model/oms_keyless.py).

The signature must verify as the signer says (omni_oci/model/oms.py) and name exactly the lock's files with
the sha256 of their bytes: an LFS file's sha256 is the lock's; for the others the lock holds a
git blob sha1, so each is fetched from the hub at the pinned revision (verified against that
sha1 as boot downloads it, into a temporary directory) and hashed. A file the lock lists and the
signature lacks, or the reverse, or another digest, is refused by name. Lock files the
signature's own ignore_paths leave out (and the signature file `model.sig` in the repository)
are not compared, but one the engine would load is refused: a publisher-signed lock must not
carry unsigned weights, configs or code.

Threat model: the signature file (with the certificates it carries) and the hub are untrusted;
only the key or the root certificates are the user's word.
The file is read once, bounded; the subject digest is recomputed, never taken from it.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from attest.errors import AttestError
from attest.hashing import SHA256
from attest.lock import ARTIFACT_SIGNATURE, CheckpointLock, LockedFile
from attest.reader import read_file
from boot.checkpoint import ENGINE_LOADED_SUFFIXES, Limits, download_file, download_progress
from omni_oci.model import oms
from omni_oci.model.artifact import MAX_SIGNATURE_BYTES
from omni_oci.model.errors import ModelError
from omni_oci.model.oms_keyless import MAX_TRUSTED_ROOT_BYTES, KeylessSigner, verified_keyless
from omni_oci.model.sign import file_sha256
from omni_oci.signing.keys import load_public_key

FIELD = "model.signature"
MAX_ROOTS_BYTES = 1 << 20
# Sigstore's public trusted root (Fulcio CAs, Rekor and CT log keys), as sigstore-python 4.5.1
# ships it; refresh: tools/pin/trust/SOURCE.md.
TRUSTED_ROOT = Path(__file__).resolve().parent / "trust" / "sigstore-production.trusted_root.json"
TRUSTED_ROOT_SHA256 = "6494e21ea73fa7ee769f85f57d5a3e6a08725eae1e38c755fc3517c9e6bc0b66"
HUB_LIMITS = Limits(stall_s=120.0, deadline_s=3600.0, attempts=3, workers=1)


@dataclass(frozen=True)
class PublisherSignature:
    """What the pins record, and what the check left out."""

    signer: str  # key:<hex sha256 of the PEM public key>, cert:<hex sha256 of the certificate>
    sha256: str  # of the signature file's bytes
    files: int
    unsigned: tuple[str, ...]  # lock files the signature's ignore_paths leave out
    identity: str = ""  # the certificate method: who the signing certificate names

    def pin(self) -> dict[str, str]:
        return {"signer": self.signer, "sha256": self.sha256, **({"identity": self.identity} if self.identity else {})}


@dataclass(frozen=True)
class Signer:
    """Whom the user trusts to have signed: a public key (the key method), or root certificates
    a certificate chain must lead to (the certificate method)."""

    key: Path | None = None
    roots: Path | None = None
    keyless: KeylessSigner | None = None

    def verified(self, data: bytes, what: str) -> tuple[oms.ModelSignature, str, str]:
        """(the facts, the signer as the pins record it, the certificate's identity or "")."""
        if self.keyless is not None:
            facts, der = verified_keyless(data, self.keyless, what)
            who = f"{self.keyless.identity} (issuer {self.keyless.issuer}, Sigstore)"
            return facts, f"cert:{hashlib.sha256(der).hexdigest()}", who
        if self.key is not None:
            key = load_public_key(self.key)
            return oms.verified(data, key, what), f"key:{oms.key_hint(key)}", ""
        roots = _roots(self.roots)
        facts, certificate = oms.verified_by_chain(data, roots, what)
        der = certificate.public_bytes(Encoding.DER)
        return facts, f"cert:{hashlib.sha256(der).hexdigest()}", oms.certificate_identity(certificate)


def keyless_signer(identity: str, issuer: str, trust_root: Path | None, trust_root_sha256: str) -> KeylessSigner:
    """The keyless signer the flags name; the trusted root refused unless its bytes are pinned
    (Omni's committed one by TRUSTED_ROOT_SHA256, another by --model-trust-root-sha256)."""
    path, pinned = (trust_root, trust_root_sha256.lower()) if trust_root else (TRUSTED_ROOT, TRUSTED_ROOT_SHA256)
    if not pinned:
        raise AttestError(
            f"--model-trust-root {path} needs --model-trust-root-sha256: a trusted root is trusted only by its pin",
            field="--model-trust-root-sha256",
        )
    read = read_file(path, label="--model-trust-root", max_bytes=MAX_TRUSTED_ROOT_BYTES)
    if read.sha256 != pinned:
        raise AttestError(
            f"the Sigstore trusted root {path} has sha256 {read.sha256}, its pin is {pinned}",
            field="--model-trust-root",
        )
    return KeylessSigner(identity, issuer, read.data)


def _roots(path: Path) -> list[x509.Certificate]:
    read = read_file(path, label="--model-signer-chain", max_bytes=MAX_ROOTS_BYTES)
    try:
        return x509.load_pem_x509_certificates(read.data)
    except ValueError:
        raise AttestError(f"--model-signer-chain {path}: no PEM certificates", field="--model-signer-chain") from None


def _ignored(path: str, ignore_paths: tuple[str, ...]) -> bool:
    parts = PurePosixPath(path).parts
    return any(PurePosixPath(ignored).parts == parts[: len(PurePosixPath(ignored).parts)] for ignored in ignore_paths)


def _hub_sha256(lock: CheckpointLock, items: list[LockedFile], endpoint: str, deadline: float) -> dict[str, str]:
    """Each non-LFS file's sha256, its bytes fetched from the hub and checked against the lock."""
    found: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="omni-pin-signature-") as work:
        root, partial = Path(work) / "model", Path(work) / "partial"
        root.mkdir()
        partial.mkdir()
        progress = download_progress(sum(item.size for item in items), len(items), enabled=False)
        for item in items:
            download_file(lock.repo, lock.revision, item, root, partial, HUB_LIMITS, deadline, progress, endpoint)
            found[item.path] = file_sha256(root, item)
    return found


def publisher_signature(
    signature: Path, signer: Signer, lock: CheckpointLock, *, endpoint: str, deadline: float
) -> PublisherSignature:
    """The signature, verified as `signer` says and compared with `lock`'s files."""
    read = read_file(signature, label="--model-signature", max_bytes=MAX_SIGNATURE_BYTES)
    try:
        facts, signed_by, identity = signer.verified(read.data, f"--model-signature {signature}")
    except (ModelError, AttestError) as exc:
        raise AttestError(str(exc), field=FIELD) from None
    left_out = [
        item
        for item in lock.files
        if _ignored(item.path, facts.ignore_paths)
        or (item.path == ARTIFACT_SIGNATURE and ARTIFACT_SIGNATURE not in facts.resources)
    ]
    unsigned = {item.path for item in left_out}
    loaded = [item.path for item in left_out if item.path.lower().endswith(ENGINE_LOADED_SUFFIXES)]
    if loaded:
        raise AttestError(
            f"--model-signature leaves out {loaded[0]} (its ignore_paths), which the engine would load: a "
            "publisher-signed lock must not carry unsigned weights, configs or code",
            field=loaded[0],
        )
    compared = [item for item in lock.files if item.path not in unsigned]
    expected = {item.path: item.digest for item in compared if item.algorithm == SHA256}
    expected |= _hub_sha256(lock, [item for item in compared if item.algorithm != SHA256], endpoint, deadline)
    problems = oms.differences(facts.resources, expected)
    if problems:
        raise AttestError(
            f"--model-signature does not sign the files of {lock.repo}@{lock.revision}: {'; '.join(problems[:5])}"
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""),
            field=FIELD,
        )
    return PublisherSignature(signed_by, read.sha256, len(expected), tuple(sorted(unsigned)), identity)
