"""push: a packed model artifact to a registry, file layers streamed from the checkpoint, then
both manifests, the tags, and (with a key) a cosign signature and a signed provenance for each.

Blobs the registry already has are skipped after a HEAD each (a re-push sends no layer). A file
layer is streamed from the checkpoint (chunk by chunk for large ones: memory stays flat), and a
file changed since `pack` never becomes a blob: the registry takes the bytes only under the
digest `pack` computed from the lock-checked file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from cryptography.hazmat.primitives.asymmetric import ec

from attest.lock import ARTIFACT_LOCK, ARTIFACT_SIGNATURE, CheckpointLock
from omni_oci.format.errors import OciError
from omni_oci.format.layout import OCI_MANIFEST, descriptor
from omni_oci.format.reference import TAG_RE, Reference
from omni_oci.format.statement import BUILDER_ID, MODEL_BUILD_TYPE, SLSA_PROVENANCE, TOOLKIT_VERSION, statement
from omni_oci.model import oms
from omni_oci.model.artifact import Artifact, build, hub_url
from omni_oci.model.errors import ModelError
from omni_oci.model.layers import FileLayer, FileLayerStream, layer_size, stream_file_layer
from omni_oci.model.sign import model_signature
from omni_oci.remote.parallel import PushReport, blob_progress, in_parallel
from omni_oci.remote.referrers import put_referrer
from omni_oci.remote.registry import RegistryClient, client_for
from omni_oci.signing.bundles import push_signatures

PUSH_JOBS = 4


def push_summary(report: PushReport) -> dict[str, Any]:
    """A model push's result as `tools/model push` prints it."""
    return {
        "image": report.reference,
        "modelpack": f"{report.repository}@{report.model_digest}",
        "uploaded": len(report.uploaded),
        "uploaded_bytes": report.uploaded_bytes,
        "already_present": len(report.present),
        "signed": report.signed,
        "model_signature": ARTIFACT_SIGNATURE if report.model_signed else None,
        "tags": report.tags,
    }


def provenance(artifact: Artifact, name: str) -> dict[str, Any]:
    """The in-toto statement of both manifests: made from this lock's files, nothing else."""
    lock = artifact.lock
    predicate = {
        "buildDefinition": {
            "buildType": MODEL_BUILD_TYPE,
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
                {"name": "checkpoint-lock", "uri": f"file:{ARTIFACT_LOCK}", "digest": {"sha256": artifact.lock_sha256}},
            ],
        },
        "runDetails": {"builder": {"id": BUILDER_ID}},
    }
    subjects = [(name, artifact.image_digest), (name, artifact.model_digest)]
    return statement(subjects, SLSA_PROVENANCE, predicate)


def _target(target: str, tags: list[str]) -> tuple[Reference, list[str]]:
    ref = Reference.parse(target)
    if ref.digest:
        raise ModelError(f"{target}: push to a repository (optionally :tag), not a digest", field="reference")
    tags = [*([ref.tag] if ref.tag else []), *tags]
    for tag in tags:
        if not TAG_RE.fullmatch(tag):
            raise ModelError(f"tag {tag!r} is not a valid tag", field="--tag")
    return ref, tags


def _send_packed(client: RegistryClient, repository: str, layer: FileLayer, model: Path) -> bool:
    """A packed file's layer; a registry refusing its bytes under the digest pack recorded means
    the file changed since pack, and the refusal names the file."""
    try:
        return _send(client, repository, layer.digest, layer.size, FileLayerStream(model, layer.item))
    except OciError as exc:
        if not exc.digest_refused:
            raise
        raise ModelError(
            f"{layer.item.path} changed since `pack`: the registry refused its bytes under the layer digest pack "
            f"recorded ({layer.digest}); run pack again",
            field=layer.item.path,
        ) from None


def _send(client: RegistryClient, repository: str, digest: str, size: int, content: Any) -> bool:
    """The blob, unless the registry has it; whether it had."""
    if client.has_blob(repository, digest):
        return True
    client.upload(repository, digest, content, size)
    return False


def _publish(
    client: RegistryClient,
    ref: Reference,
    artifact: Artifact,
    tags: list[str],
    key,
    report: PushReport,
    legacy_signatures: bool = True,
) -> PushReport:
    """The small blobs, both manifests, the tags, then the signatures and provenance: Sigstore
    bundles referring to each manifest, and cosign's legacy tags unless told not to."""
    for digest, data in artifact.small_blobs().items():
        (report.present if _send(client, ref.repository, digest, len(data), data) else report.uploaded).append(digest)
    client.put_manifest(ref.repository, artifact.image_digest, artifact.image_manifest, OCI_MANIFEST)
    put_referrer(client, ref.repository, artifact.model_manifest)
    for tag in tags:
        client.put_manifest(ref.repository, tag, artifact.image_manifest, OCI_MANIFEST)
    report.digest, report.model_digest, report.tags = artifact.image_digest, artifact.model_digest, tags
    report.model_signed = artifact.signature is not None
    report.uploaded_bytes = client.uploaded_bytes  # the artifact's own blobs, not the signatures'
    if key is not None:
        statement = provenance(artifact, report.repository)
        for manifest in (artifact.image_manifest, artifact.model_manifest):
            subject = descriptor(OCI_MANIFEST, manifest)
            push_signatures(client, ref.repository, subject, key, provenance=statement, legacy=legacy_signatures)
        report.signed = True
    return report


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
    legacy_signatures: bool = True,
) -> PushReport:
    """A pack: each file layer skipped after a HEAD when the registry has it, else streamed from
    the checkpoint. A pack's model signature must be `key`'s, the key that signs the manifests."""
    ref, tags = _target(target, list(tags))
    _same_signer(artifact, key, progress)
    with client_for(ref.registry, client) as client:
        report = PushReport(
            f"{ref.registry}/{ref.repository}", artifact.image_digest, model_digest=artifact.model_digest
        )
        shown = blob_progress(sum(layer.size for layer in artifact.files), len(artifact.files), progress)

        def send(layer) -> tuple[None, int, str]:
            present = _send_packed(client, ref.repository, layer, model)
            (report.present if present else report.uploaded).append(layer.digest)
            return None, layer.size, f"{'present' if present else 'uploaded'} {layer.digest[:19]}…"

        in_parallel(list(artifact.files), send, jobs=jobs, progress=shown)
        return _publish(client, ref, artifact, tags, key, report, legacy_signatures)


def _same_signer(artifact: Artifact, key: ec.EllipticCurvePrivateKey | None, progress) -> None:
    """A signed push of a pack: its model signature verifies with the push's key, or it has none
    (and says so)."""
    if key is None:
        return
    if artifact.signature is None:
        if progress is not None:
            progress(f"note: the pack carries no model signature ({ARTIFACT_SIGNATURE}); pack --signing-key makes one")
        return
    try:
        oms.verified(artifact.signature, key.public_key(), f"the pack's {ARTIFACT_SIGNATURE}")
    except ModelError as exc:
        raise ModelError(
            f"{exc}: the pack was signed with another key than this push's; pack again with --signing-key",
            field=ARTIFACT_SIGNATURE,
        ) from None


def push_checkpoint(
    model: Path,
    lock: CheckpointLock,
    lock_bytes: bytes,
    target: str,
    *,
    platform: str,
    client: RegistryClient | None = None,
    key: ec.EllipticCurvePrivateKey | None = None,
    tags: list[str] = (),
    jobs: int = PUSH_JOBS,
    progress: Callable[[str], None] | None = None,
    legacy_signatures: bool = True,
    model_signed: bool = True,
) -> PushReport:
    """pack and push in one pass over the files: each file's layer goes up as it is read,
    checked against the lock and hashed, its digest learned as it goes (no HEAD first: use a
    pack to skip what the registry has). With `key`, the model signature too, unless not
    `model_signed`: the same artifact `pack --signing-key` makes."""
    ref, tags = _target(target, list(tags))
    with client_for(ref.registry, client) as client:
        report = PushReport(f"{ref.registry}/{ref.repository}")
        shown = blob_progress(sum(layer_size(item.size) for item in lock.files), len(lock.files), progress)

        def send(item) -> tuple[FileLayer, int, str]:
            size = layer_size(item.size)
            digest = client.upload_hashing(ref.repository, lambda: stream_file_layer(model, item), size)
            report.uploaded.append(digest)
            return FileLayer(item, digest, size), size, f"uploaded {digest[:19]}…"

        files = in_parallel(list(lock.files), send, jobs=jobs, progress=shown)
        signature = model_signature(model, lock, key) if key is not None and model_signed else None
        artifact = build(lock, lock_bytes, files, platform, signature)
        return _publish(client, ref, artifact, tags, key, report, legacy_signatures)
