"""sign: the OpenSSF Model Signing signature (omni_oci/model/oms.py) of a checkpoint's locked files,
made with the release key, which pack and push carry in the artifact as `model.sig`.

Its resources are exactly the lock's files, each with its sha256: the lock's own for LFS files;
for the others the lock holds a git blob sha1, so their bytes are read once more here and hashed
both ways, and a file whose sha1 is not the lock's is refused (it changed since the lock was
checked). Its ignore_paths name what Omni itself adds beside them in a pulled directory or an
image volume (the artifact's lock, boot's working files, `model.sig`), so that
`model_signing verify key DIR --signature DIR/model.sig` checks exactly the locked files.
The same key and lock give the same bytes (RFC 6979), so a signed artifact stays reproducible.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from attest.errors import AttestError
from attest.hashing import SHA256, new_digest
from attest.lock import ARTIFACT_SIGNATURE, WORKING_NAMES, CheckpointLock, LockedFile
from attest.tree import open_regular
from omni_oci.model import oms
from omni_oci.model.artifact import Artifact, build
from omni_oci.model.errors import ModelError
from omni_oci.model.layers import READ_BYTES

OMNI_FILES = tuple(sorted({*WORKING_NAMES, ARTIFACT_SIGNATURE}))


def file_sha256(root: Path, item: LockedFile) -> str:
    """The locked file's sha256: the lock's for an LFS file, else hashed from `root` while its
    git sha1 is checked against the lock."""
    if item.algorithm == SHA256:
        return item.digest
    checked, found, size = new_digest(item.algorithm, item.size), hashlib.sha256(), 0
    try:
        with open_regular(root, item.path) as fd:
            while block := os.read(fd, READ_BYTES):
                checked.update(block)
                found.update(block)
                size += len(block)
    except AttestError as exc:
        raise ModelError(str(exc), field=exc.field or item.path) from None
    except OSError as exc:
        raise ModelError(f"{item.path} cannot be read: {exc.strerror or exc}", field=item.path) from None
    if size != item.size or checked.hexdigest() != item.digest:
        raise ModelError(
            f"{item.path}: not the file the checkpoint lock names ({item.algorithm} {item.digest}); it changed "
            "since it was checked",
            field=item.path,
        )
    return found.hexdigest()


def model_signature(root: Path, lock: CheckpointLock, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The OMS bundle (the key method) over the lock's files in `root`."""
    if ARTIFACT_SIGNATURE in lock.by_path:
        raise ModelError(
            f"the checkpoint lock lists {ARTIFACT_SIGNATURE} (the publisher's own signature, kept as a locked "
            "file), the name Omni's model signature takes: push it with --no-model-signature",
            field=ARTIFACT_SIGNATURE,
        )
    resources = {item.path: file_sha256(root, item) for item in lock.files}
    return oms.sign(key, oms.statement(lock.repo, resources, OMNI_FILES))


def signed_artifact(artifact: Artifact, root: Path, key: ec.EllipticCurvePrivateKey) -> Artifact:
    """`artifact` (of the files in `root`) carrying its model signature made with `key`."""
    signature = model_signature(root, artifact.lock, key)
    return build(artifact.lock, artifact.lock_bytes, list(artifact.files), artifact.platform, signature)
