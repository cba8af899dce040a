"""Fetch a base image SHALLOW: its manifest and config only, never its layers.

    python -m tools.oci.base --image docker.io/rocm/vllm --digest sha256:... \
        --platform linux/amd64 --output DIR [--registry MIRROR]

Both digests are verified; an index is resolved to the pinned platform. DIR receives
manifest.json and config.json (exact bytes) and base.json (where the layers live).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from attest.errors import report_refusal, report_unexpected
from tools.oci.errors import OciError
from tools.oci.layout import INDEX_TYPES, canonical, sha256_digest
from tools.oci.registry import Reference, RegistryClient, json_object


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
    raise OciError(f"{where}: platform {wanted} is missing from the index (it has {sorted(set(available))})",
                   field="platform")


MAX_CONFIG_BYTES = 8 << 20


def fetch_base(image: str, digest: str, platform: str, output: Path, *, registry: str = "",
               client: RegistryClient | None = None) -> dict[str, Any]:
    if not digest:
        raise OciError(f"base {image} is not pinned: its digest is empty", field="digest")
    ref = Reference.parse(f"{image}@{digest}", require_digest=True)
    if ref.tag:
        raise OciError(f"base {image} names a tag; pin it by digest only", field="image")
    wanted = _platform(platform)
    owned = client is None
    client = client or RegistryClient(registry or ref.registry)
    try:
        data, media_type = client.manifest(ref.repository, ref.digest)
        document = json_object(data, f"base {ref} manifest")
        media_type = document.get("mediaType") or media_type
        if media_type in INDEX_TYPES or "manifests" in document:
            manifest_digest = _pick(document, wanted, str(ref))
            data, media_type = client.manifest(ref.repository, manifest_digest)
            document = json_object(data, f"base {ref} manifest")
        descriptor = document.get("config")
        if not isinstance(descriptor, dict) or not isinstance(descriptor.get("digest"), str) \
                or not isinstance(descriptor.get("size"), int):
            raise OciError(f"base {ref}: the manifest has no config descriptor", field="config")
        # Never read past the descriptor's size, and never a "config" larger than configs are.
        config = client.blob(ref.repository, descriptor["digest"], size=descriptor["size"],
                             max_bytes=MAX_CONFIG_BYTES)
    finally:
        if owned:
            client.close()
    config_platform = json_object(config, f"base {ref} config")
    if config_platform.get("os") != wanted["os"] or config_platform.get("architecture") != wanted["architecture"]:
        raise OciError(f"base {ref} is {config_platform.get('os')}/{config_platform.get('architecture')}, "
                       f"not the pinned {platform}", field="platform")
    output.mkdir(parents=True, exist_ok=True)
    (output / "manifest.json").write_bytes(data)
    (output / "config.json").write_bytes(config)
    source = {"image": image, "registry": client.registry, "repository": ref.repository, "digest": ref.digest,
              "manifest_digest": sha256_digest(data), "platform": platform}
    (output / "base.json").write_bytes(canonical(source))
    return source


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="base", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", required=True)
    parser.add_argument("--digest", default="")
    parser.add_argument("--platform", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--registry", default="", help="fetch from this mirror instead (same digests)")
    args = parser.parse_args(argv)
    try:
        fetch_base(args.image, args.digest, args.platform, args.output, registry=args.registry)
    except OciError as exc:
        return report_refusal(exc)
    except Exception as exc:  # a bug is still a refusal: one JSON line, no traceback, no secret
        return report_unexpected(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
