"""Push an OCI layout by digest: blobs first, up to `jobs` at a time (each skipped when the
target has it, else uploaded from the layout, mounted from a shallow base's repository on the
same registry, or streamed from the base's registry straight into the target, never touching
disk), then the manifests by digest, then the tags. `tools/oci:push` and `tools/oci:run` are the
commands over `push`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from omni_oci.format.errors import OciError
from omni_oci.format.layout import BASE_SIDECAR, OCI_INDEX, OCI_MANIFEST, blob_path, read_blob, read_index, read_layout
from omni_oci.format.reference import TAG_RE, Reference
from omni_oci.remote.copy import RegistryBlob
from omni_oci.remote.parallel import PushReport, blob_progress, in_parallel
from omni_oci.remote.registry import RegistryClient, client_for

PLACEHOLDER_RE = re.compile(r"\{([A-Z][A-Z0-9_]*)\}")


def expand_tags(tags: list[str], status: dict[str, str]) -> list[str]:
    """`{KEY}` placeholders replaced from the workspace status; every tag checked. An unknown
    key is refused (a tag is never pushed half-stamped): build with --stamp to have them."""
    expanded = []
    for tag in tags:
        missing = [key for key in PLACEHOLDER_RE.findall(tag) if key not in status]
        if missing:
            raise OciError(
                f"tag {tag!r} uses {{{missing[0]}}}, which the workspace status does not hold (build with "
                "--stamp, and check tools/workspace_status prints it)",
                field="remote_tags",
            )
        value = PLACEHOLDER_RE.sub(lambda match: status[match.group(1)], tag)
        if not TAG_RE.fullmatch(value):
            raise OciError(
                f"tag {value!r} is not a valid tag ([A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})", field="remote_tags"
            )
        if value not in expanded:
            expanded.append(value)
    return expanded


PUSH_JOBS = 4  # blobs in flight at once: enough to fill a link, few enough for any registry


def _documents(layout: Path) -> tuple[str, list[tuple[str, dict, bytes]], bytes, str, bool]:
    """The layout's top digest, its images (digest, manifest, bytes), the top document, its media
    type, and whether it is an image index."""
    index = read_index(layout)
    if index is None:
        digest, manifest, top_bytes = read_layout(layout)
        return digest, [(digest, manifest, top_bytes)], top_bytes, manifest.get("mediaType", OCI_MANIFEST), False
    digest, index_document, top_bytes = index
    children = []
    for entry in index_document["manifests"]:
        child_bytes = read_blob(layout, entry["digest"])
        children.append((entry["digest"], json.loads(child_bytes), child_bytes))
    return digest, children, top_bytes, OCI_INDEX, True


@dataclass
class _BlobSender:
    """One blob to the target: skipped when present, else uploaded from the layout, mounted from
    the base's repository, or streamed from the base's registry."""

    client: RegistryClient
    repository: str
    registry: str
    layout: Path
    sidecar: dict
    source_client: RegistryClient | None

    def send(self, blob: dict) -> tuple[str, str]:
        digest, size = blob["digest"], blob["size"]
        if self.client.has_blob(self.repository, digest):
            return "present", digest
        local = blob_path(self.layout, digest)
        if local.is_file():
            self.client.upload(self.repository, digest, local, size)
            return "uploaded", digest
        if digest not in (self.sidecar.get("shallow_layers") or ()):
            raise OciError(f"{self.layout}: blob {digest} is neither in the layout nor a base layer", field=digest)
        base_repository = self.sidecar["repository"]
        if self.sidecar["registry"] == self.registry and self.client.mount(self.repository, digest, base_repository):
            return "mounted", digest
        source = self.source_client or RegistryClient(self.sidecar["registry"])
        try:
            # Hashed as it goes, a cut read resumed by Range, a retried upload served from its offset.
            self.client.upload(self.repository, digest, RegistryBlob(source, base_repository, digest, size), size)
        finally:
            if self.source_client is None:
                source.close()
        return "streamed", digest


def _send_blobs(sender: _BlobSender, blobs: list[dict], jobs: int, progress: Callable[[str], None] | None) -> list:
    """Every blob, up to `jobs` at a time, with progress; outcomes in manifest order (the first
    failure is raised)."""
    shown = blob_progress(sum(blob["size"] for blob in blobs), len(blobs), progress)

    def tracked(blob: dict) -> tuple[tuple[str, str], int, str]:
        outcome = sender.send(blob)
        return outcome, blob["size"], f"{outcome[0]} {blob['digest'][:19]}…"

    return in_parallel(blobs, tracked, jobs=jobs, progress=shown)


def push(
    layout: Path,
    target: str,
    *,
    client: RegistryClient | None = None,
    source_client: RegistryClient | None = None,
    tags: list[str] = (),
    jobs: int = PUSH_JOBS,
    progress: Callable[[str], None] | None = None,
) -> PushReport:
    """Blobs first, up to `jobs` at a time (each skipped when present, else mounted, uploaded or
    streamed from the base's registry, with retries), then the manifest by digest, then the tags."""
    ref = Reference.parse(target)
    if ref.digest:
        raise OciError(f"{target}: push to a repository (optionally :tag), not a digest", field="reference")
    if jobs < 1:
        raise OciError(f"jobs must be at least 1, got {jobs}", field="jobs")
    tags = expand_tags([*([ref.tag] if ref.tag else []), *tags], {})
    digest, children, top_bytes, top_type, is_index = _documents(layout)
    sidecar = json.loads((layout / BASE_SIDECAR).read_text()) if (layout / BASE_SIDECAR).is_file() else {}
    with client_for(ref.registry, client) as client:
        report = PushReport(f"{ref.registry}/{ref.repository}", digest)
        blobs = list(
            {blob["digest"]: blob for _, child, _ in children for blob in [child["config"], *child["layers"]]}.values()
        )
        sender = _BlobSender(client, ref.repository, ref.registry, layout, sidecar, source_client)
        for kind, blob_digest in _send_blobs(sender, blobs, jobs, progress):
            getattr(report, kind).append(blob_digest)
        if is_index:
            for child_digest, child, child_bytes in children:
                client.put_manifest(ref.repository, child_digest, child_bytes, child.get("mediaType", OCI_MANIFEST))
        client.put_manifest(ref.repository, digest, top_bytes, top_type)
        for tag in tags:
            client.put_manifest(ref.repository, tag, top_bytes, top_type)
        report.tags = list(tags)
        report.uploaded_bytes = client.uploaded_bytes
    return report
