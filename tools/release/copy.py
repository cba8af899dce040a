"""Copy a release's closures into a target registry, in the order that keeps every reader safe.

Order: every blob first (skipped where the target has it, mounted across repositories of one
registry, else streamed from the source, hashed as it goes and resumed after a cut); then the
images' manifests by digest, each after the manifests it names; then the referrers (each after
its subject, listed by the referrers API or the fallback tag); then cosign's legacy tags; the
release's own tags last. A reader who resolves the tag finds a whole, signed release; one who
resolves a digest early finds every blob it names.

Before anything is written, every tag the copy would write is read on the target: a tag that
holds another manifest is refused, naming both digests (nothing of the target is overwritten).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol

from omni_oci.format.errors import OciError
from omni_oci.format.layout import sha256_digest
from omni_oci.remote.copy import HashedSource, RegistryBlob
from omni_oci.remote.parallel import blob_progress, in_parallel
from omni_oci.remote.referrers import put_referrer, referrers
from omni_oci.remote.registry import RegistryClient
from tools.release.closure import IMAGE, LEGACY, REFERRER, Blob, Closure, Manifest

MIRROR_JOBS = 4  # blobs in flight (tools/oci/push.py's PUSH_JOBS)


class Source(Protocol):
    """Where a closure's bytes come from: a registry or an offline mirror's directory."""

    def blob_stream(self, blob: Blob) -> HashedSource: ...

    def mount_from(self, registry: str) -> str | None:
        """The repository to mount blobs from, where the target is `registry`; else None."""
        ...


@dataclass
class Route:
    """One closure, from its source to `repository` of the target, then tagged with `tags`."""

    closure: Closure
    source: Source
    target: RegistryClient
    repository: str
    tags: list[str] = field(default_factory=list)

    @property
    def reference(self) -> str:
        return f"{self.target.registry}/{self.repository}@{self.closure.root}"


@dataclass
class Copied:
    """What one route's copy did, each blob and manifest by how it got there."""

    reference: str
    source: str
    blobs_copied: list[str] = field(default_factory=list)
    blobs_mounted: list[str] = field(default_factory=list)
    blobs_present: list[str] = field(default_factory=list)
    bytes_copied: int = 0
    resumed_reads: int = 0
    manifests_written: list[str] = field(default_factory=list)
    manifests_present: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # blobs copy in threads

    def summary(self) -> dict:
        return {
            "reference": self.reference,
            "source": self.source,
            "blobs": {
                "copied": len(self.blobs_copied),
                "mounted": len(self.blobs_mounted),
                "present": len(self.blobs_present),
            },
            "bytes_copied": self.bytes_copied,
            "resumed_reads": self.resumed_reads,
            "manifests": {"written": len(self.manifests_written), "present": len(self.manifests_present)},
            "tags": self.tags,
        }


def tags_to_write(route: Route) -> list[tuple[str, str]]:
    """(tag, digest) of every tag the route writes: the legacy ones and the release's own."""
    legacy = [(item.tag, item.digest) for item in route.closure.manifests if item.kind == LEGACY]
    return legacy + [(tag, route.closure.root) for tag in route.tags]


def refuse_taken_tags(routes: list[Route]) -> None:
    """Every tag the copy would write is free on the target or holds the same manifest."""
    for route in routes:
        for tag, digest in tags_to_write(route):
            held = route.target.manifest_digest(route.repository, tag)
            if held is not None and held != digest:
                raise OciError(
                    f"{route.target.registry}/{route.repository}:{tag} holds {held}, not {digest} (the "
                    "release's): nothing was written; remove that tag or mirror into another repository",
                    field=f"{route.repository}:{tag}",
                )


def _copy_blob(route: Route, blob: Blob, report: Copied) -> tuple[str, int, str]:
    target, repository = route.target, route.repository
    if target.has_blob(repository, blob.digest):
        report.blobs_present.append(blob.digest)
        return "present", 0, f"present {blob.digest[:19]}…"
    mount = route.source.mount_from(target.registry)
    if mount and mount != repository and target.mount(repository, blob.digest, mount):
        report.blobs_mounted.append(blob.digest)
        return "mounted", blob.size, f"mounted {blob.digest[:19]}…"
    stream = route.source.blob_stream(blob)
    target.upload(repository, blob.digest, stream, blob.size)
    with report.lock:
        report.blobs_copied.append(blob.digest)
        report.bytes_copied += blob.size
        report.resumed_reads += stream.resumed
    return "copied", blob.size, f"copied {blob.digest[:19]}…"


def copy_blobs(routes: list[Route], reports: list[Copied], jobs: int, progress: Callable[[str], None] | None) -> None:
    """Every blob of every route once per target repository, `jobs` at a time."""
    work: list[tuple[Route, Blob, Copied]] = []
    seen: set[tuple[str, str, str]] = set()
    for route, report in zip(routes, reports):
        for blob in route.closure.blobs.values():
            key = (route.target.registry, route.repository, blob.digest)
            if key not in seen:
                seen.add(key)
                work.append((route, blob, report))
    shown = blob_progress(sum(blob.size for _, blob, _ in work), len(work), progress)
    in_parallel(work, lambda item: _copy_blob(*item), jobs=jobs, progress=shown)


def _put(route: Route, item: Manifest, report: Copied) -> None:
    """One manifest, unless the target has it already: a legacy tag holding it, a manifest by
    digest, a referrer by digest and listed for its subject."""
    target, repository = route.target, route.repository
    if item.kind == LEGACY:
        there = target.manifest_digest(repository, item.tag) == item.digest
    else:
        there = target.manifest_digest(repository, item.digest) == item.digest
        if there and item.kind == REFERRER:
            listed, _ = referrers(target, repository, item.subject)
            there = any(entry.get("digest") == item.digest for entry in listed)
    if there:
        report.manifests_present.append(item.digest)
        return
    if item.kind == LEGACY:
        target.put_manifest(repository, item.tag, item.data, item.media_type)
    elif item.kind == REFERRER:
        put_referrer(target, repository, item.data, item.media_type)
    else:
        target.put_manifest(repository, item.digest, item.data, item.media_type)
    report.manifests_written.append(item.digest)


def write_manifests(routes: list[Route], reports: list[Copied], before_tags: Callable[[], None] | None = None) -> None:
    """Images, then referrers, then legacy tags, of every route; then `before_tags` (a check
    that refuses); the release's tags last."""
    for kind in (IMAGE, REFERRER, LEGACY):
        for route, report in zip(routes, reports):
            for item in route.closure.manifests:
                if item.kind == kind:
                    _put(route, item, report)
    if before_tags is not None:
        before_tags()
    for route, report in zip(routes, reports):
        root = route.closure.root_manifest
        for tag in route.tags:
            if route.target.manifest_digest(route.repository, tag) != root.digest:
                route.target.put_manifest(route.repository, tag, root.data, root.media_type)
            report.tags.append(tag)


def mirror(
    routes: list[Route],
    *,
    jobs: int = MIRROR_JOBS,
    progress: Callable[[str], None] | None = None,
    before_tags: Callable[[], None] | None = None,
) -> list[Copied]:
    """Copy every route's closure (the module's order); one report per route. `before_tags`
    runs once every manifest is written and before any of the release's tags is."""
    if jobs < 1:
        raise OciError(f"--jobs must be at least 1, got {jobs}", field="--jobs")
    for route in routes:
        for item in route.closure.manifests:  # what the walk or the directory gave is what is written
            if sha256_digest(item.data) != item.digest:
                raise OciError(f"manifest {item.digest}: its bytes hash otherwise", field=item.digest)
    refuse_taken_tags(routes)
    reports = [Copied(route.reference, route.closure.repository) for route in routes]
    copy_blobs(routes, reports, jobs, progress)
    write_manifests(routes, reports, before_tags)
    return reports


@dataclass
class RegistrySource:
    """A closure's bytes from the registry it was walked in."""

    client: RegistryClient
    repository: str

    def blob_stream(self, blob: Blob) -> HashedSource:
        return RegistryBlob(self.client, self.repository, blob.digest, blob.size)

    def mount_from(self, registry: str) -> str | None:
        return self.repository if registry == self.client.registry else None
