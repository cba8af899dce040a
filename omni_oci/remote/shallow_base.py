"""Fetch a base image SHALLOW: its manifest and config only, never its layers (the command is
tools/oci/base.py, which the release bases' repository rule runs).

Both digests are verified; an index is resolved to the pinned platform. DIR receives
manifest.json and config.json (exact bytes) and base.json (where the layers live).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_oci.format.errors import OciError, refusing_object
from omni_oci.format.layout import INDEX_TYPES, canonical, sha256_digest
from omni_oci.format.reference import Reference
from omni_oci.remote.registry import RegistryClient, client_for


def _platform(text: str) -> dict[str, str]:
    parts = text.split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise OciError(f"platform must be os/arch[/variant], got {text!r}", field="platform")
    return {"os": parts[0], "architecture": parts[1], **({"variant": parts[2]} if len(parts) == 3 else {})}


def _pick(index: dict[str, Any], platform: dict[str, str], where: str) -> str:
    available = []
    entries = index.get("manifests")
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str):
            continue
        found = entry.get("platform") if isinstance(entry.get("platform"), dict) else {}
        available.append("/".join(filter(None, (found.get("os"), found.get("architecture"), found.get("variant")))))
        if all(found.get(key) == value for key, value in platform.items()):
            return entry["digest"]
    wanted = "/".join(platform.values())
    raise OciError(
        f"{where}: platform {wanted} is missing from the index (it has {sorted(set(available))})", field="platform"
    )


MAX_CONFIG_BYTES = 8 << 20


@dataclass(frozen=True)
class ResolvedImage:
    """One platform's image: the manifest digest (computed here from the bytes), the manifest
    and config as received, and the config's parsed form."""

    digest: str
    manifest_bytes: bytes
    manifest: dict[str, Any]
    config_bytes: bytes
    config: dict[str, Any]

    @property
    def layers(self) -> list[dict[str, Any]]:
        layers = self.manifest.get("layers")
        return [layer for layer in layers if isinstance(layer, dict)] if isinstance(layers, list) else []


def resolve_image(client: RegistryClient, repository: str, reference: str, platform: str, label: str) -> ResolvedImage:
    """The manifest of `platform` that `reference` (a tag or digest) names, an index resolved to
    that platform; both manifests are checked against their digests, the config against its
    descriptor, and the config must declare the platform."""
    wanted = _platform(platform)
    data, media_type = client.manifest(repository, reference)
    document = refusing_object(data, f"{label} manifest")
    media_type = document.get("mediaType") or media_type
    if media_type in INDEX_TYPES or "manifests" in document:
        data, media_type = client.manifest(repository, _pick(document, wanted, label))
        document = refusing_object(data, f"{label} manifest")
    descriptor = document.get("config")
    if (
        not isinstance(descriptor, dict)
        or not isinstance(descriptor.get("digest"), str)
        or not isinstance(descriptor.get("size"), int)
    ):
        raise OciError(f"{label}: the manifest has no config descriptor", field="config")
    # Never read past the descriptor's size, and never a "config" larger than configs are.
    config_bytes = client.blob(repository, descriptor["digest"], size=descriptor["size"], max_bytes=MAX_CONFIG_BYTES)
    config = refusing_object(config_bytes, f"{label} config")
    if config.get("os") != wanted["os"] or config.get("architecture") != wanted["architecture"]:
        raise OciError(
            f"{label} is {config.get('os')}/{config.get('architecture')}, not the pinned {platform}", field="platform"
        )
    return ResolvedImage(sha256_digest(data), data, document, config_bytes, config)


def fetch_base(
    image: str, digest: str, platform: str, output: Path, *, registry: str = "", client: RegistryClient | None = None
) -> dict[str, Any]:
    if not digest:
        raise OciError(f"base {image} is not pinned: its digest is empty", field="digest")
    ref = Reference.parse(f"{image}@{digest}", require_digest=True)
    if ref.tag:
        raise OciError(f"base {image} names a tag; pin it by digest only", field="image")
    with client_for(registry or ref.registry, client) as client:
        resolved = resolve_image(client, ref.repository, ref.digest, platform, f"base {ref}")
    output.mkdir(parents=True, exist_ok=True)
    (output / "manifest.json").write_bytes(resolved.manifest_bytes)
    (output / "config.json").write_bytes(resolved.config_bytes)
    source = {
        "image": image,
        "registry": client.registry,
        "repository": ref.repository,
        "digest": ref.digest,
        "manifest_digest": resolved.digest,
        "platform": platform,
    }
    (output / "base.json").write_bytes(canonical(source))
    return source
