"""The closure of one root digest in a registry: what a mirror copies and `--check` expects.

Contract: from the root (an image, an index, a model artifact's plain image), every manifest it
reaches (an index's children), each one's config and layers; every referrer of each of those
manifests, and of each referrer (the ModelPack manifest refers to the plain image, the bundles
to both), through the referrers API or its fallback tag (omni_oci.remote.referrers); and
cosign's legacy `sha256-<hex>.sig`, `.att` and `.sbom` tags beside each. Nothing else: no
other tag, no other repository.

Threat model: the source registry is untrusted. Every manifest is read by digest (the client
checks the bytes against it), bounded, parsed by the strict reader; a descriptor with no
sha256 digest or no size is refused; a referrer whose own `subject` is not the manifest it is
listed for is refused, naming both (a registry cannot graft another image's signature onto
this release); the walk ends at MAX_MANIFESTS manifests and MAX_BLOBS blobs. A legacy tag
names no subject: its signature is checked by `--check --key`, never trusted by the walk.

The manifests are kept in the order a mirror writes them: a manifest after everything it names,
the root's images first, then the referrers (each after its subject), the legacy tags last.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from omni_oci.format.errors import OciError, refusing_object
from omni_oci.format.layout import DOCKER_LIST, OCI_INDEX
from omni_oci.format.reference import DIGEST_RE
from omni_oci.remote.referrers import referrers
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.legacy import tag_for

LEGACY_SUFFIXES = ("sig", "att", "sbom")  # cosign's signature, attestation and SBOM tags
MAX_MANIFESTS = 512
MAX_BLOBS = 8192
MAX_INDEX_DEPTH = 2  # an index of indexes, no deeper
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)

IMAGE, REFERRER, LEGACY = "image", "referrer", "legacy"


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """One manifest of the closure, its exact bytes; `subject` is the manifest a referrer refers
    to or a legacy tag signs, `tag` a legacy tag's name."""

    digest: str
    media_type: str
    data: bytes
    kind: str  # IMAGE, REFERRER or LEGACY
    subject: str = ""
    tag: str = ""


@dataclass
class Closure:
    """What one root reaches in `repository` (REGISTRY/REPO, or where it was read from)."""

    repository: str
    root: str
    manifests: list[Manifest] = field(default_factory=list)
    blobs: dict[str, Blob] = field(default_factory=dict)

    def add(self, manifest: Manifest, blobs: list[Blob]) -> None:
        if len(self.manifests) >= MAX_MANIFESTS:
            raise OciError(
                f"{self.repository}@{self.root}: the release reaches more than {MAX_MANIFESTS} manifests",
                field=self.root,
            )
        self.manifests.append(manifest)
        for blob in blobs:
            known = self.blobs.setdefault(blob.digest, blob)
            if known.size != blob.size:
                raise OciError(
                    f"{self.repository}: blob {blob.digest} is described as {known.size} and as {blob.size} bytes",
                    field=blob.digest,
                )
        if len(self.blobs) > MAX_BLOBS:
            raise OciError(f"{self.repository}@{self.root}: more than {MAX_BLOBS} blobs", field=self.root)

    def has(self, digest: str) -> bool:
        return any(item.digest == digest for item in self.manifests)

    @property
    def root_manifest(self) -> Manifest:
        return next(item for item in self.manifests if item.digest == self.root and item.kind == IMAGE)

    @property
    def bytes(self) -> int:
        return sum(blob.size for blob in self.blobs.values())


def descriptor_of(value: Any, what: str) -> tuple[str, int, str]:
    """(digest, size, media type) of a descriptor; anything else is refused naming `what`."""
    if not isinstance(value, dict):
        raise OciError(f"{what} is not a descriptor", field=what)
    digest, size, media_type = value.get("digest"), value.get("size"), value.get("mediaType", "")
    if not isinstance(digest, str) or not DIGEST_RE.fullmatch(digest):
        raise OciError(f"{what}: digest {str(digest)[:80]!r} is not sha256:<64 hex>", field=what)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise OciError(f"{what}: size {str(size)[:40]!r} is not a whole number of bytes", field=what)
    if not isinstance(media_type, str):
        raise OciError(f"{what}: mediaType is not a string", field=what)
    return digest, size, media_type


def parts(data: bytes, digest: str, media_type: str) -> tuple[dict[str, Any], list[tuple[str, int, str]], bool]:
    """A manifest's document, the descriptors it names (an index's children, else its config and
    layers) and whether it is an index."""
    document = refusing_object(data, f"manifest {digest}")
    declared = document.get("mediaType", media_type)
    if declared in INDEX_TYPES or (not declared and "manifests" in document):
        children = document.get("manifests")
        if not isinstance(children, list):
            raise OciError(f"index {digest}: manifests is not a list", field=digest)
        return document, [descriptor_of(item, f"index {digest} manifest {n}") for n, item in enumerate(children)], True
    layers = document.get("layers", [])
    if not isinstance(layers, list):
        raise OciError(f"manifest {digest}: layers is not a list", field=digest)
    named = [descriptor_of(document.get("config"), f"manifest {digest} config")]
    named += [descriptor_of(item, f"manifest {digest} layer {n}") for n, item in enumerate(layers)]
    return document, named, False


def subject_of(document: dict[str, Any]) -> str:
    subject = document.get("subject")
    return str(subject.get("digest", "")) if isinstance(subject, dict) else ""


class _Walk:
    def __init__(self, client: RegistryClient, repository: str, root: str) -> None:
        self.client, self.repository = client, repository
        self.closure = Closure(f"{client.registry}/{repository}", root)

    def manifest(
        self, digest: str, kind: str, subject: str = "", tag: str = "", depth: int = 0, listed_by: str = ""
    ) -> None:
        """`digest` and everything it names, children first. `listed_by`: the listing that named
        it a referrer of `subject`, which its own `subject` must then be."""
        if self.closure.has(digest):
            return
        data, media_type = self.client.manifest(self.repository, digest)
        document, named, is_index = parts(data, digest, media_type)
        if listed_by and subject_of(document) != subject:
            raise OciError(
                f"{self.closure.repository}: referrer {digest}, listed for {subject} ({listed_by}), names the "
                f"subject {subject_of(document) or 'none'}",
                field=f"referrer {digest}",
            )
        if is_index:
            if depth >= MAX_INDEX_DEPTH:
                raise OciError(f"index {digest} is nested more than {MAX_INDEX_DEPTH} deep", field=digest)
            for child, _, _ in named:
                self.manifest(child, kind, depth=depth + 1)
            named = []
        media_type = str(document.get("mediaType") or media_type)
        blobs = [Blob(item, size) for item, size, _ in named]
        self.closure.add(Manifest(digest, media_type, data, kind, subject, tag), blobs)

    def referrers_of(self, subject: str) -> None:
        listed, how = referrers(self.client, self.repository, subject)
        for number, item in enumerate(listed):
            digest, _, _ = descriptor_of(item, f"referrer {number} of {subject}")
            if self.closure.has(digest):
                continue
            if self.client.manifest_digest(self.repository, digest) is None:
                # A listing left behind when its referrer was deleted: nothing to copy. A missing
                # signature is still caught where it matters: --key verifies the release.
                print(
                    f"mirror: {self.closure.repository}: referrer {digest}, listed for {subject}, is not in the "
                    "registry (a stale listing): left out",
                    file=sys.stderr,
                    flush=True,
                )
                continue
            listing = "referrers API" if how == "api" else "fallback tag"
            self.manifest(digest, REFERRER, subject=subject, listed_by=listing)

    def legacy_of(self, subject: str) -> None:
        for suffix in LEGACY_SUFFIXES:
            tag = tag_for(subject, suffix)
            digest = self.client.manifest_digest(self.repository, tag)
            if digest is not None and not self.closure.has(digest):
                self.manifest(digest, LEGACY, subject=subject, tag=tag)


def walk(client: RegistryClient, repository: str, root: str) -> Closure:
    """The closure of `root` in `repository`, in write order (the module's contract)."""
    if not DIGEST_RE.fullmatch(root):
        raise OciError(f"{root!r}: a release is mirrored by digest (sha256:...)", field="reference")
    walker = _Walk(client, repository, root)
    walker.manifest(root, IMAGE)
    subjects = [item.digest for item in walker.closure.manifests]
    seen = 0
    while seen < len(subjects):  # referrers of referrers too, each after its subject
        before = len(walker.closure.manifests)
        walker.referrers_of(subjects[seen])
        subjects += [item.digest for item in walker.closure.manifests[before:] if item.kind == REFERRER]
        seen += 1
    for subject in subjects:
        walker.legacy_of(subject)
    return walker.closure
