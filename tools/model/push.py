"""push: a packed model artifact to a registry, file layers streamed from the checkpoint, then
both manifests, the tags, and (with a key) a cosign signature and a signed provenance for each.

Blobs the registry already has are skipped after a HEAD each (a re-push sends no layer). A file
layer is streamed from the checkpoint (chunk by chunk for large ones: memory stays flat), and a
file changed since `pack` never becomes a blob: the registry takes the bytes only under the
digest `pack` computed from the lock-checked file.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cryptography.hazmat.primitives.asymmetric import ec

from attest.lock import ARTIFACT_LOCK
from tools.model.artifact import Artifact, hub_url
from tools.model.errors import ModelError
from tools.model.layers import FileLayerStream
from tools.oci.build.image import TOOLKIT_VERSION
from tools.oci.build.provenance import BUILDER_ID, PREDICATE_TYPE, STATEMENT_TYPE
from tools.oci.layout import OCI_MANIFEST
from tools.oci.push import TAG_RE
from tools.oci.reference import Reference
from tools.oci.remote.referrers import put_referrer
from tools.oci.remote.registry import RegistryClient
from tools.oci.sign import dsse_envelope, push_attestation, push_image_signature

PUSH_JOBS = 4
BUILD_TYPE = "https://omni.invalid/build-types/model-artifact/v1"


@dataclass
class PushReport:
    repository: str
    image_digest: str
    model_digest: str
    uploaded: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    uploaded_bytes: int = 0
    signed: bool = False
    tags: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "image": f"{self.repository}@{self.image_digest}",
            "modelpack": f"{self.repository}@{self.model_digest}",
            "uploaded": len(self.uploaded),
            "uploaded_bytes": self.uploaded_bytes,
            "already_present": len(self.present),
            "signed": self.signed,
            "tags": self.tags,
        }


def provenance(artifact: Artifact, name: str) -> dict[str, Any]:
    """The in-toto statement of both manifests: made from this lock's files, nothing else."""
    lock = artifact.lock
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": name, "digest": {"sha256": digest.split(":", 1)[1]}}
            for digest in (artifact.image_digest, artifact.model_digest)
        ],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "model": {
                        "id": lock.repo,
                        "revision": lock.revision,
                        "lock_sha256": artifact.lock_sha256,
                        "trust": lock.trust,
                    },
                    "platform": artifact.platform,
                },
                "internalParameters": {"toolkit_version": TOOLKIT_VERSION},
                "resolvedDependencies": [
                    {"name": "model", "uri": hub_url(lock.repo), "digest": {"gitCommit": lock.revision}},
                    {
                        "name": "checkpoint-lock",
                        "uri": f"file:{ARTIFACT_LOCK}",
                        "digest": {"sha256": artifact.lock_sha256},
                    },
                ],
            },
            "runDetails": {"builder": {"id": BUILDER_ID}},
        },
    }


def _blobs(artifact: Artifact, model: Path) -> list[tuple[str, int, Any]]:
    """(digest, size, content) of every blob: file layers streamed from the checkpoint, the rest bytes."""
    blobs: list[tuple[str, int, Any]] = [
        (layer.digest, layer.size, FileLayerStream(model, layer.item)) for layer in artifact.files
    ]
    blobs += [(digest, len(data), data) for digest, data in artifact.small_blobs().items()]
    return blobs


def push_artifact(
    artifact: Artifact,
    model: Path,
    target: str,
    *,
    client: RegistryClient | None = None,
    key: ec.EllipticCurvePrivateKey | None = None,
    tags: list[str] = (),
    jobs: int = PUSH_JOBS,
    progress: Callable[[str], None] | None = None,
) -> PushReport:
    ref = Reference.parse(target)
    if ref.digest:
        raise ModelError(f"{target}: push to a repository (optionally :tag), not a digest", field="reference")
    tags = [*([ref.tag] if ref.tag else []), *tags]
    for tag in tags:
        if not TAG_RE.fullmatch(tag):
            raise ModelError(f"tag {tag!r} is not a valid tag", field="--tag")
    owned = client is None
    client = client or RegistryClient(ref.registry)
    report = PushReport(f"{ref.registry}/{ref.repository}", artifact.image_digest, artifact.model_digest)
    blobs = _blobs(artifact, model)
    total, lock, done = sum(size for _, size, _ in blobs), threading.Lock(), [0, 0]

    def send(blob: tuple[str, int, Any]) -> None:
        digest, size, content = blob
        present = client.has_blob(ref.repository, digest)
        if not present:
            client.upload(ref.repository, digest, content, size)
        with lock:
            (report.present if present else report.uploaded).append(digest)
            done[0], done[1] = done[0] + 1, done[1] + size
            if progress is not None:
                progress(
                    f"{done[0]}/{len(blobs)} blobs, {done[1] / 1e6:.1f}/{total / 1e6:.1f} MB "
                    f"({'present' if present else 'uploaded'} {digest[:19]}…)"
                )

    try:
        with ThreadPoolExecutor(max(1, min(jobs, len(blobs)))) as pool:
            list(pool.map(send, blobs))
        client.put_manifest(ref.repository, artifact.image_digest, artifact.image_manifest, OCI_MANIFEST)
        put_referrer(client, ref.repository, artifact.model_manifest)
        for tag in tags:
            client.put_manifest(ref.repository, tag, artifact.image_manifest, OCI_MANIFEST)
        report.tags = tags
        report.uploaded_bytes = client.uploaded_bytes  # the artifact's own blobs, not the signatures'
        if key is not None:
            envelope = dsse_envelope(key, provenance(artifact, report.repository))
            for digest in (artifact.image_digest, artifact.model_digest):
                push_image_signature(client, ref.repository, digest, key)
                push_attestation(client, ref.repository, digest, envelope)
            report.signed = True
    finally:
        if owned:
            client.close()
    return report
