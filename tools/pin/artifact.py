"""The model artifact pin: the digest a tag names now, taken only when the artifact carries the
checkpoint lock the image pins (or, for an image that pins no lock, a lock of the pinned model
and revision) and its layers are exactly that lock's files."""

from __future__ import annotations

import math
from dataclasses import dataclass

from attest.pins import ArtifactPin
from omni_oci.format.errors import OciError
from omni_oci.format.layout import sha256_digest
from omni_oci.format.reference import Reference
from omni_oci.model.artifact import check_manifest, notes_of, parse_manifest
from omni_oci.model.errors import ModelError
from omni_oci.model.pull import ExpectedLock, fetch_lock
from omni_oci.remote.registry import RegistryClient, client_for
from tools.pin.upstream import ModelUpstream

FIELD = "model.artifact.digest"


@dataclass(frozen=True)
class ArtifactUpstream:
    repository: str
    tag: str
    digest: str
    files: int


def resolve_artifact(
    pin: ArtifactPin,
    tag: str,
    model_id: str,
    model: ModelUpstream,
    *,
    client: RegistryClient | None = None,
    deadline: float = math.inf,
) -> ArtifactUpstream:
    """The manifest digest `tag` names in `pin.repository`, checked against the model pins."""
    tag = tag or pin.tag or "latest"
    ref = Reference.parse(f"{pin.repository}:{tag}")
    with client_for(ref.registry, client) as client:
        client.operation_deadline = deadline
        try:
            data, _ = client.manifest(ref.repository, tag)
            manifest, _ = parse_manifest(data, str(ref))
            notes = notes_of(manifest)
            # Without a pinned lock the expected one is whatever lock the artifact carries for this
            # model and revision: checked below against both before anything is taken.
            expected = ExpectedLock(model.lock_sha256 or str(notes.get("omni.model.lock_sha256", "")))
            lock, _ = fetch_lock(client, ref.repository, manifest, expected)
            if (lock.repo, lock.revision) != (model_id, model.revision):
                raise ModelError(
                    f"{ref}: the artifact holds {lock.repo}@{lock.revision}; the pins want {model_id}@{model.revision}",
                    field=FIELD,
                )
            layers = check_manifest(manifest, lock, expected.sha256)
        except (ModelError, OciError) as exc:
            field = exc.field if exc.field == "deadline" else FIELD
            raise OciError(f"model artifact {ref}: {exc}", field=field) from None
    return ArtifactUpstream(f"{ref.registry}/{ref.repository}", tag, sha256_digest(data), len(layers))
