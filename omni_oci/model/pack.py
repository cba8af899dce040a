"""pack: a checkpoint directory and its lock made into a model artifact, every file read once
(checked against the lock and hashed into its layer digest), nothing copied.

The pack directory is an OCI layout whose small blobs (configs, manifests, the lock's layer)
are files and whose file layers stay in the checkpoint: `omni-model-files.json` names the
checkpoint directory and which file makes which layer. `push` sends from it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from attest.documents import parse_document
from attest.errors import AttestError
from attest.files import canonical_json, refuse_shared_directory, write_atomic
from attest.lock import ARTIFACT_SIGNATURE, MAX_LOCK_BYTES, CheckpointLock, load_lock
from attest.progress import Progress
from attest.reader import loads_object, read_file, read_json_file
from omni_oci.format.layout import OCI_INDEX, OCI_MANIFEST, canonical, descriptor, sha256_digest
from omni_oci.model.artifact import (
    MAX_SIGNATURE_BYTES,
    Artifact,
    build,
    read_lock_layer,
    read_signature_layer,
    signature_descriptor,
)
from omni_oci.model.errors import ModelError
from omni_oci.model.layers import FileLayer, hash_file_layer

SIDECAR = "omni-model-files.json"
REF_NAMES = {"image": "image", "modelpack": "modelpack"}
PACK_JOBS = 4


def load_lock_bytes(path: Path, field: str = "--lock") -> tuple[CheckpointLock, bytes]:
    try:
        lock, read = load_lock(path)
    except AttestError as exc:
        raise ModelError(str(exc), field=exc.field or field) from None
    return lock, read.data


def parse_lock(data: bytes, where: str) -> CheckpointLock:
    try:
        return parse_document(CheckpointLock, loads_object(data, label=where, max_bytes=MAX_LOCK_BYTES), label=where)
    except AttestError as exc:
        raise ModelError(str(exc), field=exc.field or where) from None


def pack(
    model: Path, lock: CheckpointLock, lock_bytes: bytes, *, platform: str, jobs: int = PACK_JOBS, quiet: bool = False
) -> Artifact:
    """Every locked file read once, checked against the lock and hashed into its layer (signed
    by omni_oci/model/sign.py's signed_artifact, where the caller holds a key)."""
    if not model.is_dir():
        raise ModelError(f"--model {model} is not a directory", field="--model")
    total = sum(item.size for item in lock.files)
    progress = Progress(total, len(lock.files), "packing", enabled=False if quiet else None)

    def one(item) -> FileLayer:
        try:
            return hash_file_layer(model, item, progress.add)
        finally:
            progress.item_done()

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        files = list(pool.map(one, lock.files))
    return build(lock, lock_bytes, files, platform)


def _index(artifact: Artifact) -> bytes:
    entries = []
    for name, manifest in (("image", artifact.image_manifest), ("modelpack", artifact.model_manifest)):
        entry = descriptor(OCI_MANIFEST, manifest, annotations={"org.opencontainers.image.ref.name": REF_NAMES[name]})
        if name == "modelpack":
            entry["artifactType"] = json.loads(manifest)["artifactType"]
        entries.append(entry)
    return canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})


def write_pack(artifact: Artifact, model: Path, output: Path) -> None:
    """The pack directory; refuses a directory another user could write, and a non-empty `output`
    that is not an earlier pack."""
    try:
        refuse_shared_directory(output, field="--output")
    except AttestError as exc:
        raise ModelError(str(exc), field="--output") from None
    for folder in (output / "blobs", output / "blobs" / "sha256"):
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise ModelError(f"--output: {folder} is not a directory of a pack's (a link or a file)", field="--output")
    if output.exists() and any(output.iterdir()) and not (output / SIDECAR).is_file():
        raise ModelError(
            f"--output {output} is not empty and not a pack directory; it was left as it is", field="--output"
        )
    blobs = {**artifact.small_blobs(), artifact.image_digest: artifact.image_manifest}
    blobs[artifact.model_digest] = artifact.model_manifest
    for digest, data in blobs.items():
        write_atomic(output / "blobs" / "sha256" / digest.split(":", 1)[1], data, field="--output")
    sidecar = {
        "model": str(model.resolve()),
        "platform": artifact.platform,
        "layers": [{"digest": layer.digest, "size": layer.size, "path": layer.item.path} for layer in artifact.files],
    }
    write_atomic(output / SIDECAR, canonical_json(sidecar), field="--output")
    write_atomic(output / "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', field="--output")
    write_atomic(output / "index.json", _index(artifact), field="--output")


# A pack's own small blobs (manifests, configs, the lock's and the signature's layers): read
# bounded, never through a link, never blocking on a FIFO; a pack may come from anyone.
MAX_PACK_BLOB_BYTES = max(MAX_LOCK_BYTES, MAX_SIGNATURE_BYTES) + (1 << 20)


def _blob(output: Path, digest: str) -> bytes:
    path = output / "blobs" / "sha256" / digest.split(":", 1)[-1]
    try:
        data = read_file(
            path, label=f"{output}: blob {digest}", max_bytes=MAX_PACK_BLOB_BYTES, follow_symlinks=False
        ).data
    except AttestError as exc:
        raise ModelError(str(exc), field=str(path)) from None
    if sha256_digest(data) != digest:
        raise ModelError(f"{output}: blob {digest} does not hash to its name", field=str(path))
    return data


def _document(output: Path, name: str) -> dict[str, Any]:
    try:
        value, _ = read_json_file(output / name, label=f"{output}/{name}", follow_symlinks=False)
    except AttestError as exc:
        raise ModelError(f"{output} is not a pack directory (`pack --output`): {exc}", field=str(output)) from None
    return value


def read_pack(output: Path) -> tuple[Artifact, Path]:
    """An earlier pack: its documents rebuilt from its lock and layer digests, and compared
    with the ones it holds (a pack edited by hand is refused)."""
    try:
        sidecar, index = _document(output, SIDECAR), _document(output, "index.json")
        image_entry = next(
            entry
            for entry in index["manifests"]
            if entry["annotations"]["org.opencontainers.image.ref.name"] == REF_NAMES["image"]
        )
        manifest = loads_object(_blob(output, image_entry["digest"]), label=f"{output}: the image manifest")
        lock_blob = _blob(output, manifest["layers"][-1]["digest"])
        model = Path(sidecar["model"])
        layers = sidecar["layers"]
    except (AttestError, ValueError, KeyError, TypeError, StopIteration) as exc:
        raise ModelError(f"{output} is not a pack directory (`pack --output`): {exc}", field=str(output)) from None
    lock_bytes = read_lock_layer(lock_blob, f"{output}: the lock's layer")
    lock = parse_lock(lock_bytes, f"{output}: the checkpoint lock")
    signed = signature_descriptor(manifest, lock)
    where = f"{output}: the {ARTIFACT_SIGNATURE} layer"
    signature = read_signature_layer(_blob(output, signed["digest"]), signed, where) if signed else None
    by_path = lock.by_path
    try:
        files = [FileLayer(by_path[entry["path"]], entry["digest"], entry["size"]) for entry in layers]
    except (KeyError, TypeError) as exc:
        raise ModelError(f"{output}/{SIDECAR} names a file the lock does not: {exc}", field=SIDECAR) from None
    artifact = build(lock, lock_bytes, files, sidecar.get("platform", ""), signature)
    if artifact.image_digest != image_entry["digest"]:
        raise ModelError(f"{output}: the pack's documents do not match its lock and layers", field=str(output))
    return artifact, model


def summary(artifact: Artifact) -> dict[str, Any]:
    return {
        "image_manifest": artifact.image_digest,
        "modelpack_manifest": artifact.model_digest,
        "lock_sha256": artifact.lock_sha256,
        "repo": artifact.lock.repo,
        "revision": artifact.lock.revision,
        "files": len(artifact.files),
        "model_signature": ARTIFACT_SIGNATURE if artifact.signature is not None else None,
        "bytes": sum(layer.item.size for layer in artifact.files),
        "platform": artifact.platform,
    }
