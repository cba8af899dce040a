"""OCI media types, digests and the image-layout directory format."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from omni_oci.format.errors import OciError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
TITLE = "org.opencontainers.image.title"  # the annotation naming a layer's file or place
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
# Docker's layer types carry the same bytes as OCI's; an OCI manifest names the OCI type.
LAYER_TYPE_TO_OCI = {
    DOCKER_LAYER_GZIP: OCI_LAYER_GZIP,
    OCI_LAYER_GZIP: OCI_LAYER_GZIP,
    OCI_LAYER_TAR: OCI_LAYER_TAR,
    "application/vnd.docker.image.rootfs.diff.tar": OCI_LAYER_TAR,
    OCI_LAYER_ZSTD: OCI_LAYER_ZSTD,
}
BASE_SIDECAR = "omni-base.json"  # where a shallow layout's base layers can be fetched from


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(value: Any) -> bytes:
    """Compact, key-sorted JSON: the same document always has the same digest."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": sha256_digest(data), "size": len(data), **extra}


def blob_path(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or len(hexdigest) != 64:
        raise OciError(f"unsupported digest {digest!r}", field="digest")
    return layout / "blobs" / "sha256" / hexdigest


def write_blob(layout: Path, data: bytes) -> str:
    digest = sha256_digest(data)
    path = blob_path(layout, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return digest


def link_blob(layout: Path, source: Path, digest: str) -> None:
    """Place an existing blob file in the layout (hard link when possible: no copy)."""
    target = blob_path(layout, digest)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        return
    # Bazel hands action inputs over as symlinks; link the file they point to, never a
    # symlink into the sandbox.
    real = os.path.realpath(source)
    try:
        os.link(real, target)
    except OSError:
        shutil.copyfile(real, target)


REF_NAME = "latest"  # the index's org.opencontainers.image.ref.name: `oci:LAYOUT:latest`


def write_layout(layout: Path, manifest: bytes) -> str:
    layout.mkdir(parents=True, exist_ok=True)
    digest = write_blob(layout, manifest)
    entry = descriptor(OCI_MANIFEST, manifest, annotations={"org.opencontainers.image.ref.name": REF_NAME})
    (layout / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_bytes(canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry]}))
    return digest


def read_layout(layout: Path) -> tuple[str, dict[str, Any], bytes]:
    """(manifest digest, manifest, manifest bytes) of a single-image layout."""
    try:
        index = json.loads((layout / "index.json").read_text())
        entry = index["manifests"][0]
        data = blob_path(layout, entry["digest"]).read_bytes()
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise OciError(f"{layout} is not a readable OCI image layout: {exc}", field=str(layout)) from None
    if sha256_digest(data) != entry["digest"]:
        raise OciError(f"{layout}: manifest blob does not match its digest {entry['digest']}", field="index.json")
    return entry["digest"], json.loads(data), data


def read_blob(layout: Path, digest: str) -> bytes:
    data = blob_path(layout, digest).read_bytes()
    if sha256_digest(data) != digest:
        raise OciError(f"{layout}: blob {digest} is corrupt", field=digest)
    return data


def read_index(layout: Path) -> tuple[str, dict[str, Any], bytes] | None:
    """(digest, index, bytes) when the layout's one entry is an image index; None for an image."""
    try:
        entry = json.loads((layout / "index.json").read_text())["manifests"][0]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise OciError(f"{layout} is not a readable OCI layout: {exc}", field=str(layout)) from None
    if entry.get("mediaType") != OCI_INDEX:
        return None
    data = blob_path(layout, entry["digest"]).read_bytes()
    if sha256_digest(data) != entry["digest"]:
        raise OciError(f"{layout}: index blob does not match its digest {entry['digest']}", field="index.json")
    return entry["digest"], json.loads(data), data
