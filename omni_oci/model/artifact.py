"""The model artifact's documents: the ModelPack config and manifest, the plain image config and
manifest over the same layers, and the check that a manifest holds exactly a lock's files.

Layers, in order: one per locked file, sorted by path; where the artifact is signed, its
OpenSSF Model Signing signature (ARTIFACT_SIGNATURE, omni_oci/model/sign.py); then the lock itself
(ARTIFACT_LOCK, the exact bytes whose sha256 an image pins as model.lock_sha256). The ModelPack
manifest names the plain one as its subject, so the registry lists it as a referrer of the
digest images mount.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import Any

from attest.errors import AttestError
from attest.lock import ARTIFACT_LOCK, ARTIFACT_SIGNATURE, CheckpointLock
from attest.reader import loads_object
from omni_oci.format.layout import OCI_CONFIG, OCI_MANIFEST, TITLE, canonical, descriptor, sha256_digest
from omni_oci.format.reference import DIGEST_RE
from omni_oci.model.errors import ModelError
from omni_oci.model.layers import (
    DOC,
    END_OF_ARCHIVE,
    FILE_DIGEST,
    FILEPATH,
    IMAGE_LAYER,
    WEIGHT,
    FileLayer,
    layer_size,
    media_type,
    padding,
    tar_header,
)

MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
PLATFORMS = ("linux/amd64", "linux/arm64")
# A model signature's bytes at most: a resource line per file, so a checkpoint of 100k files fits.
MAX_SIGNATURE_BYTES = 64 << 20

# Manifest annotations: what the artifact is, readable without pulling anything.
LOCK_SHA256 = "omni.model.lock_sha256"
MODEL_ID = "omni.model.id"
MODEL_REVISION = "omni.model.revision"
SOURCE = "org.opencontainers.image.source"
REVISION = "org.opencontainers.image.revision"


def hub_url(repo: str) -> str:
    return f"https://huggingface.co/{repo}"


def one_file_layer(name: str, data: bytes) -> bytes:
    """A layer of one small file: `data` at `name`, as omni_oci/model/layers.py makes every layer."""
    return tar_header(name, len(data)) + data + padding(len(data)) + END_OF_ARCHIVE


def lock_layer(lock_bytes: bytes) -> bytes:
    """The lock's own layer: the lock file's exact bytes at ARTIFACT_LOCK."""
    return one_file_layer(ARTIFACT_LOCK, lock_bytes)


@dataclass(frozen=True)
class Artifact:
    """Every document of one artifact, and the layers' sources."""

    lock: CheckpointLock
    lock_bytes: bytes
    files: tuple[FileLayer, ...]
    platform: str
    lock_blob: bytes
    image_config: bytes
    image_manifest: bytes
    model_config: bytes
    model_manifest: bytes
    signature: bytes | None = None  # the OMS bundle (model.sig), where the artifact is signed

    @property
    def lock_sha256(self) -> str:
        return hashlib.sha256(self.lock_bytes).hexdigest()

    @property
    def image_digest(self) -> str:
        return sha256_digest(self.image_manifest)

    @property
    def model_digest(self) -> str:
        return sha256_digest(self.model_manifest)

    def small_blobs(self) -> dict[str, bytes]:
        """The blobs held in memory (configs, the lock's layer), by digest."""
        blobs = (self.lock_blob, self.image_config, self.model_config)
        if self.signature is not None:
            blobs += (one_file_layer(ARTIFACT_SIGNATURE, self.signature),)
        return {sha256_digest(blob): blob for blob in blobs}


def annotations(lock: CheckpointLock, lock_sha256: str) -> dict[str, str]:
    return {
        LOCK_SHA256: lock_sha256,
        MODEL_ID: lock.repo,
        MODEL_REVISION: lock.revision,
        REVISION: lock.revision,
        SOURCE: hub_url(lock.repo),
        TITLE: lock.repo,
    }


def _own_descriptor(name: str, blob: bytes, image: bool, sha256: str) -> dict[str, Any]:
    """The descriptor of one of the artifact's own files' layers (the lock, the signature)."""
    return descriptor(
        IMAGE_LAYER if image else DOC, blob, annotations={FILE_DIGEST: f"sha256:{sha256}", FILEPATH: name, TITLE: name}
    )


def _own_layers(lock_bytes: bytes, signature: bytes | None) -> list[tuple[str, bytes, str]]:
    """(name, layer, the file's sha256) of the signature, where there is one, then the lock:
    made once, described in both manifests."""
    owned = [(ARTIFACT_SIGNATURE, signature)] if signature is not None else []
    return [
        (name, one_file_layer(name, data), hashlib.sha256(data).hexdigest())
        for name, data in (*owned, (ARTIFACT_LOCK, lock_bytes))
    ]


def _model_format(files: tuple[FileLayer, ...]) -> str:
    suffixes = {item.item.path.rsplit(".", 1)[-1] for item in files if item.media_type == WEIGHT}
    return suffixes.pop() if len(suffixes) == 1 else ""


def build(
    lock: CheckpointLock, lock_bytes: bytes, files: list[FileLayer], platform: str, signature: bytes | None = None
) -> Artifact:
    """The documents of the artifact of `files` (one per locked file, any order), signed by
    `signature` (omni_oci/model/sign.py) where given."""
    if platform not in PLATFORMS:
        raise ModelError(f"--platform {platform!r}: expected one of {', '.join(PLATFORMS)}", field="--platform")
    ordered = tuple(sorted(files, key=lambda layer: layer.item.path))
    if [layer.item.path for layer in ordered] != sorted(item.path for item in lock.files):
        raise ModelError("the layers are not exactly the checkpoint lock's files", field="checkpoint lock.files")
    if signature is not None and ARTIFACT_SIGNATURE in lock.by_path:
        raise ModelError(f"the checkpoint lock lists {ARTIFACT_SIGNATURE} itself", field=ARTIFACT_SIGNATURE)
    own = _own_layers(lock_bytes, signature)
    _, blob, lock_sha256 = own[-1]  # the lock's layer, and its file's sha256

    def described(image: bool) -> list[dict[str, Any]]:
        return [_own_descriptor(name, layer, image, sha256) for name, layer, sha256 in own]

    image_own = described(True)
    diff_ids = [layer.digest for layer in ordered] + [layer["digest"] for layer in image_own]
    notes = annotations(lock, lock_sha256)
    os_name, architecture = platform.split("/")
    image_config = canonical(
        {
            "architecture": architecture,
            "os": os_name,
            "config": {"Labels": notes},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }
    )
    image_manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": descriptor(OCI_CONFIG, image_config),
            "layers": [layer.descriptor(image=True) for layer in ordered] + image_own,
            "annotations": notes,
        }
    )
    model_config = canonical(
        {
            "descriptor": {"name": lock.repo, "revision": lock.revision, "sourceURL": hub_url(lock.repo)},
            "config": {"format": _model_format(ordered)} if _model_format(ordered) else {},
            "modelfs": {"type": "layers", "diffIds": diff_ids},
        }
    )
    model_manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": MODEL_ARTIFACT,
            "config": descriptor(MODEL_CONFIG, model_config),
            "layers": [layer.descriptor(image=False) for layer in ordered] + described(False),
            "subject": descriptor(OCI_MANIFEST, image_manifest),
            "annotations": notes,
        }
    )
    return Artifact(
        lock, lock_bytes, ordered, platform, blob, image_config, image_manifest, model_config, model_manifest, signature
    )


# --- checking a manifest someone else served ------------------------------------------------


def _field(value: Any, name: str, where: str) -> Any:
    if not isinstance(value, dict) or name not in value:
        raise ModelError(f"{where} has no {name}", field=where)
    return value[name]


def notes_of(value: Any) -> dict[str, Any]:
    """A manifest's or descriptor's annotations: a mapping, or nothing."""
    notes = value.get("annotations") if isinstance(value, dict) else None
    return notes if isinstance(notes, dict) else {}


def _layers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's layers, each a descriptor with a sha256 digest and a whole size."""
    layers = _field(manifest, "layers", "manifest")
    if not isinstance(layers, list) or not layers:
        raise ModelError("the manifest has no layers", field="manifest.layers")
    for index, layer in enumerate(layers):
        size = layer.get("size") if isinstance(layer, dict) else None
        if (
            not isinstance(layer, dict)
            or not isinstance(layer.get("digest"), str)
            or not DIGEST_RE.fullmatch(layer["digest"])
            or not isinstance(size, int)
            or isinstance(size, bool)
            or size < 0
        ):
            raise ModelError(
                f"the manifest's layer {index} is not a descriptor (sha256 digest, size)", field="manifest.layers"
            )
    return layers


def lock_descriptor(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's last layer, which must be the lock's."""
    last = _layers(manifest)[-1]
    if notes_of(last).get(FILEPATH) != ARTIFACT_LOCK:
        raise ModelError(f"the manifest's last layer is not the checkpoint lock ({ARTIFACT_LOCK})", field=ARTIFACT_LOCK)
    return last


def read_one_file_layer(blob: bytes, name: str, where: str) -> bytes:
    """The bytes of the file `name` out of its layer (read by the strict tar reader): one regular
    file of that name and nothing else."""
    from omni_oci.format.tar_reader import TarStream, read_members

    found = None
    for member, data in read_members(TarStream.of_file(io.BytesIO(blob)), where, field=name):
        if found is not None or member.kind != "file" or member.name != name:
            raise ModelError(f"{where}: holds {member.kind} {member.name!r}; expected only the file {name}", field=name)
        found = data.read(member.size)
    if found is None:
        raise ModelError(f"{where}: holds no {name}", field=name)
    return found


def read_lock_layer(blob: bytes, where: str) -> bytes:
    """The lock file's bytes out of its layer: ARTIFACT_LOCK and nothing else."""
    return read_one_file_layer(blob, ARTIFACT_LOCK, where)


def signature_descriptor(manifest: dict[str, Any], lock: CheckpointLock) -> dict[str, Any] | None:
    """The signature's layer: the one before the lock's, where it names ARTIFACT_SIGNATURE and
    the lock does not list that name (a publisher's own model.sig is a locked file). Anywhere
    else such a layer is a file the lock does not list, and check_manifest refuses it."""
    layers = _layers(manifest)
    if len(layers) < 2 or ARTIFACT_SIGNATURE in lock.by_path:
        return None
    candidate = layers[-2]
    if notes_of(candidate).get(FILEPATH) != ARTIFACT_SIGNATURE:
        return None
    digest = notes_of(candidate).get(FILE_DIGEST)
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise ModelError(f"the {ARTIFACT_SIGNATURE} layer names no sha256 of its file", field=ARTIFACT_SIGNATURE)
    if candidate.get("mediaType") not in (IMAGE_LAYER, DOC):
        raise ModelError(
            f"{ARTIFACT_SIGNATURE}: layer media type {candidate.get('mediaType')!r}", field=ARTIFACT_SIGNATURE
        )
    return candidate


def read_signature_layer(blob: bytes, descriptor_: dict[str, Any], where: str) -> bytes:
    """The signature's bytes out of its layer, which must hash to what its descriptor says."""
    data = read_one_file_layer(blob, ARTIFACT_SIGNATURE, where)
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != notes_of(descriptor_).get(FILE_DIGEST):
        raise ModelError(
            f"{where}: {ARTIFACT_SIGNATURE} is not the file its layer's annotation names", field=ARTIFACT_SIGNATURE
        )
    return data


def check_manifest(manifest: dict[str, Any], lock: CheckpointLock, lock_sha256: str) -> list[dict[str, Any]]:
    """Refuse unless the manifest's layers are exactly the lock's files, sorted by path, each
    annotated with its path and lock digest and sized as its layer must be, then the signature's
    layer where there is one, then the lock's layer; and its annotations name this lock. Returns
    the file layers' descriptors."""
    notes = notes_of(manifest)
    for key, expected in ((LOCK_SHA256, lock_sha256), (MODEL_ID, lock.repo), (MODEL_REVISION, lock.revision)):
        if notes.get(key) != expected:
            raise ModelError(
                f"the manifest annotation {key} is {notes.get(key)!r}; the checkpoint lock says {expected!r}", field=key
            )
    layers = _layers(manifest)[: -2 if signature_descriptor(manifest, lock) is not None else -1]
    wanted = sorted(lock.files, key=lambda item: item.path)
    paths = [notes_of(layer).get(FILEPATH) for layer in layers]
    missing = sorted({item.path for item in wanted} - set(paths))
    extra = sorted({str(path) for path in paths} - {item.path for item in wanted})
    if missing:
        raise ModelError(f"the artifact lacks {missing[0]}, which the checkpoint lock lists", field=missing[0])
    if extra:
        raise ModelError(f"the artifact holds {extra[0]}, which the checkpoint lock does not list", field=extra[0])
    if paths != [item.path for item in wanted]:
        raise ModelError("the artifact's layers are not in the lock's path order", field="manifest.layers")
    for layer, item in zip(layers, wanted):
        digest = notes_of(layer).get(FILE_DIGEST)
        if digest != f"{item.algorithm}:{item.digest}":
            raise ModelError(
                f"{item.path}: the layer says its file is {digest}; the checkpoint lock says "
                f"{item.algorithm}:{item.digest}",
                field=item.path,
            )
        if layer.get("size") != layer_size(item.size):
            raise ModelError(
                f"{item.path}: a layer of {layer.get('size')} bytes; a file of {item.size} bytes makes "
                f"{layer_size(item.size)}",
                field=item.path,
            )
        if layer.get("mediaType") not in (IMAGE_LAYER, media_type(item.path)):
            raise ModelError(f"{item.path}: layer media type {layer.get('mediaType')!r}", field=item.path)
    return layers


def parse_manifest(data: bytes, where: str) -> tuple[dict[str, Any], bool]:
    """(manifest, is the ModelPack one) of a served model artifact manifest."""
    try:
        manifest = loads_object(data, label=f"{where}: the manifest")
    except AttestError as exc:
        raise ModelError(str(exc), field="manifest") from None
    if manifest.get("mediaType") != OCI_MANIFEST:
        raise ModelError(f"{where}: not an OCI image manifest", field="manifest")
    config_type = (manifest.get("config") or {}).get("mediaType") if isinstance(manifest.get("config"), dict) else None
    modelpack = manifest.get("artifactType") == MODEL_ARTIFACT
    if config_type != (MODEL_CONFIG if modelpack else OCI_CONFIG):
        raise ModelError(f"{where}: config media type {config_type!r} is not a model artifact's", field="manifest")
    return manifest, modelpack
