"""A publisher's OpenSSF Model Signing signature (tools/model/oms.py) checked against the lock
`tools/pin` resolved: `--model-signature FILE --model-signer-key PEM`.

The signature must verify with the key (the key method) and name exactly the lock's files with
the sha256 of their bytes: an LFS file's sha256 is the lock's; for the others the lock holds a
git blob sha1, so each is fetched from the hub at the pinned revision (verified against that
sha1 as boot downloads it, into a temporary directory) and hashed. A file the lock lists and the
signature lacks, or the reverse, or another digest, is refused by name. Lock files the
signature's own ignore_paths leave out (and the signature file `model.sig` in the repository)
are not compared, but one the engine would load is refused: a publisher-signed lock must not
carry unsigned weights, configs or code.

Threat model: the signature file and the hub are untrusted; only the key is the user's word.
The file is read once, bounded; the subject digest is recomputed, never taken from it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from attest.errors import AttestError
from attest.hashing import SHA256
from attest.lock import ARTIFACT_SIGNATURE, CheckpointLock, LockedFile
from attest.reader import read_file
from boot.checkpoint import ENGINE_LOADED_SUFFIXES, Limits, download_file, download_progress
from tools.model import oms
from tools.model.artifact import MAX_SIGNATURE_BYTES
from tools.model.errors import ModelError
from tools.model.sign import file_sha256
from tools.oci.signing.keys import load_public_key

FIELD = "model.signature"
HUB_LIMITS = Limits(stall_s=120.0, deadline_s=3600.0, attempts=3, workers=1)


@dataclass(frozen=True)
class PublisherSignature:
    """What the pins record, and what the check left out."""

    signer: str  # key:<hex sha256 of the PEM public key>
    sha256: str  # of the signature file's bytes
    files: int
    unsigned: tuple[str, ...]  # lock files the signature's ignore_paths leave out

    def pin(self) -> dict[str, str]:
        return {"signer": self.signer, "sha256": self.sha256}


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
    signature: Path, signer_key: Path, lock: CheckpointLock, *, endpoint: str, deadline: float
) -> PublisherSignature:
    """The signature, verified with `signer_key` and compared with `lock`'s files."""
    read = read_file(signature, label="--model-signature", max_bytes=MAX_SIGNATURE_BYTES)
    try:
        key = load_public_key(signer_key)
        facts = oms.verified(read.data, key, f"--model-signature {signature}")
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
    return PublisherSignature(f"key:{oms.key_hint(key)}", read.sha256, len(expected), tuple(sorted(unsigned)))
