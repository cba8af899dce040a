"""--output-dir: the manifests as a kustomize base a site patches without editing generated
YAML: one file per resource, and a kustomization.yaml that names them, the image by digest
(`images:`, where an overlay points at a mirror) and the what-runs annotations as
commonAnnotations. `kubectl kustomize DIR` gives exactly the single-file output
(tests/deploy/cluster_test.py)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Callable

import yaml

from attest.errors import AttestError
from attest.files import write_atomic
from attest.reader import read_file
from tools.deploy.emit import MAX_GENERATED_BYTES, is_sealed
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


def generated_by_deploy(path: Path) -> bytes | None:
    """The file's bytes when deploy wrote it and nobody changed it since (a regular file, not a
    link, read once and bounded, starting with the marker and ending with its seal), else None."""
    try:
        data = read_file(path, label=str(path), max_bytes=MAX_GENERATED_BYTES, follow_symlinks=False).data
    except AttestError:
        return None
    return data if is_sealed(data) else None


def _listed(directory: Path) -> list[str] | None:
    """The files deploy's own, unchanged kustomization.yaml names there (None: there is none)."""
    data = generated_by_deploy(directory / KUSTOMIZATION)
    document = yaml.safe_load(data) if data is not None else None
    resources = document.get("resources") if isinstance(document, dict) else None
    if not isinstance(resources, list) or not all(isinstance(name, str) for name in resources):
        return None
    return resources


def _existing(directory: Path) -> list[Path]:
    """What deploy wrote there before, each file unchanged since and named by deploy's own
    kustomization.yaml; anything else (a user's copy of a generated file under another name, a
    generated file the user edited, a link) refuses the run, naming it, before anything changes."""
    if not os.path.lexists(directory):
        return []
    if directory.is_symlink() or not directory.is_dir():
        raise DeployError(f"{FLAG} {directory} exists and is not a directory", field=FLAG)
    entries = sorted(directory.iterdir())
    if not entries:
        return []
    listed = _listed(directory)
    if listed is None:
        raise DeployError(
            f"{FLAG} {directory} holds {', '.join(entry.name for entry in entries[:5])} and no {KUSTOMIZATION} that "
            "deploy wrote and nobody changed; it was left as it is (choose an empty or new directory)",
            field=FLAG,
        )
    for entry in entries:
        if entry.name != KUSTOMIZATION and entry.name not in listed:
            raise DeployError(
                f"{FLAG} {directory} holds {entry.name}, which deploy did not write there (its {KUSTOMIZATION} does "
                "not list it); it was left as it is, and nothing else changed",
                field=FLAG,
            )
        if generated_by_deploy(entry) is None:
            raise DeployError(
                f"{FLAG}: {entry} was changed since deploy wrote it (or is a link); it was left as it is, and "
                "nothing else changed: keep edits in an overlay, or move the file aside",
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
        # commonAnnotations puts the shared ones back; a resource's own (an admission policy's note) stay.
        own = {k: v for k, v in plain["metadata"].pop("annotations", {}).items() if k not in annotations}
        if own:
            plain["metadata"]["annotations"] = own
        write_atomic(directory / name, render([plain]).encode(), field=FLAG)
    write_atomic(directory / KUSTOMIZATION, render([base]).encode(), field=FLAG)
    for stale in earlier:
        if stale.name not in files and stale.name != KUSTOMIZATION:
            stale.unlink()
    return [*files, KUSTOMIZATION]
