"""--output-dir: the manifests as a kustomize base a site patches without editing generated
YAML: one file per resource, and a kustomization.yaml that names them, the image by digest
(`images:`, where an overlay points at a mirror) and the what-runs annotations as
commonAnnotations. `kubectl kustomize DIR` gives exactly the single-file output
(tests/deploy/kustomize_test.py)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable

from attest.files import write_atomic
from tools.deploy.emit import GENERATED_MARKER
from tools.deploy.errors import DeployError

KUSTOMIZATION = "kustomization.yaml"
FLAG = "--output-dir"

Render = Callable[[list[dict[str, Any]]], str]


def resource_file(item: dict[str, Any]) -> str:
    return f"{item['kind'].lower()}-{item['metadata']['name']}.yaml"


def _image_name(image: str) -> tuple[str, str]:
    """REGISTRY/REPO[:TAG]@sha256:... as kustomize's `images:` entry reads it: the name, the digest."""
    rest, _, digest = image.partition("@")
    _, colon, tag = rest.rpartition(":")
    if colon and "/" not in tag:
        raise DeployError(
            f"{FLAG}: the image {image!r} carries a tag beside its digest, which kustomize's images: would "
            "drop; pass --image REGISTRY/REPO@sha256:... or --repository",
            field=FLAG,
        )
    return rest, digest


def kustomization(files: list[str], image: str, annotations: dict[str, str]) -> dict[str, Any]:
    name, digest = _image_name(image)
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": files,
        "images": [{"name": name, "newName": name, "digest": digest}],
        "commonAnnotations": dict(annotations),
    }


def _ours(path: Path) -> bool:
    """A regular file whose first line is the marker deploy writes (read bounded)."""
    if path.is_symlink() or not path.is_file():
        return False
    with path.open("rb") as handle:
        return handle.read(len(GENERATED_MARKER)) == GENERATED_MARKER.encode()


def _existing(directory: Path) -> list[Path]:
    """What deploy wrote there before; a directory holding anything else is refused whole."""
    if not os.path.lexists(directory):
        return []
    if directory.is_symlink() or not directory.is_dir():
        raise DeployError(f"{FLAG} {directory} exists and is not a directory", field=FLAG)
    entries = sorted(directory.iterdir())
    foreign = [entry.name for entry in entries if not _ours(entry)]
    if foreign:
        raise DeployError(
            f"{FLAG} {directory} holds files deploy did not write ({', '.join(foreign[:5])}); it was left as it "
            "is (choose an empty or new directory)",
            field=FLAG,
        )
    return entries


def write_base(
    directory: Path, items: list[dict[str, Any]], *, render: Render, image: str, annotations: dict[str, str]
) -> list[str]:
    """Every file of the base, written atomically, the kustomization last; files an earlier run
    wrote that this one does not are removed. Returns the file names."""
    earlier = _existing(directory)
    files = [resource_file(item) for item in items]
    if len(set(files)) != len(files):
        raise DeployError(f"{FLAG}: two resources share a file name ({files})", field=FLAG)
    base = kustomization(files, image, annotations)
    for name, item in zip(files, items):
        plain = copy.deepcopy(item)
        plain["metadata"].pop("annotations", None)  # commonAnnotations puts them back
        write_atomic(directory / name, render([plain]).encode(), field=FLAG)
    write_atomic(directory / KUSTOMIZATION, render([base]).encode(), field=FLAG)
    for stale in earlier:
        if stale.name not in files and stale.name != KUSTOMIZATION:
            stale.unlink()
    return [*files, KUSTOMIZATION]
