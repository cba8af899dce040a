"""Push an OCI layout by digest: `python -m tools.oci.push LAYOUT REGISTRY/REPO[:TAG]`.

Up to four blobs go up at once. Blobs already in the target are skipped (HEAD). Base layers a
shallow layout only references are mounted from the base's repository when it is on the same
registry, else streamed from the base's registry straight into the target, never touching
disk. Blobs over 256 MB go up in 64 MB chunks (PATCH); a failed upload is retried from the
start with backoff, each attempt named on stderr; progress is printed per blob.
Prints REGISTRY/REPO@sha256:... on stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from omni_oci.format.errors import OciError
from omni_oci.format.layout import BASE_SIDECAR, OCI_INDEX, OCI_MANIFEST, blob_path, read_blob, read_layout
from omni_oci.format.reference import TAG_RE, Reference
from omni_oci.remote.copy import RegistryBlob
from omni_oci.remote.parallel import PushReport, blob_progress, in_parallel
from omni_oci.remote.registry import RegistryClient, client_for
from tools.oci.build.index import read_index
from tools.oci.push_record import record_push

PLACEHOLDER_RE = re.compile(r"\{([A-Z][A-Z0-9_]*)\}")


def read_tags(path: Path) -> list[str]:
    """Tags from a file: one per line; blank lines and `#` comments skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OciError(f"tags file {path} cannot be read: {exc}", field=str(path)) from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def read_status(paths: list[Path]) -> dict[str, str]:
    """Bazel's workspace status files (`KEY value` lines): what stamped tags may use."""
    status: dict[str, str] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(" ")
            if key:
                status[key] = value
    return status


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


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    parser = argparse.ArgumentParser(
        prog="push", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("layout", type=Path)
    parser.add_argument("target", help="REGISTRY/REPO[:TAG]")
    args = parser.parse_args(argv)
    report = push(args.layout, args.target, progress=lambda line: print(f"push: {line}", file=sys.stderr, flush=True))
    print(
        f"pushed: {len(report.uploaded)} uploaded ({report.uploaded_bytes} bytes), {len(report.mounted)} mounted, "
        f"{len(report.streamed)} streamed from the base registry, {len(report.present)} already present",
        file=sys.stderr,
    )
    record_push(report.reference, report.digest)
    print(report.reference)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
