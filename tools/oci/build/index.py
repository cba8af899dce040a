"""One image index over the images of several platforms.

    python -m tools.oci.build.index --output DIR --image LAYOUT ... [--digest-file FILE]

Each image's platform is read from its own config (os, architecture, variant), never given
twice; two images of one platform are refused. The output is an OCI layout whose one entry is
the index: the index blob, every image's manifest, config and layers (hard-linked, not copied).
Shallow images (base layers only referenced) are refused: an index is pushed and loaded whole.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from omni_oci.format.errors import OciError
from omni_oci.format.layout import (
    BASE_SIDECAR,
    OCI_INDEX,
    OCI_MANIFEST,
    REF_NAME,
    blob_path,
    canonical,
    descriptor,
    link_blob,
    read_blob,
    read_layout,
    write_blob,
)


def platform_name(platform: dict[str, str]) -> str:
    """os/architecture[/variant], as `--platform` flags and messages write a platform."""
    return "/".join(platform[key] for key in ("os", "architecture", "variant") if platform.get(key))


def _platform_of(layout: Path, manifest: dict[str, Any]) -> dict[str, str]:
    config = json.loads(read_blob(layout, manifest["config"]["digest"]))
    platform = {key: config[key] for key in ("os", "architecture", "variant") if config.get(key)}
    if "os" not in platform or "architecture" not in platform:
        raise OciError(f"{layout}: its config names no os/architecture", field=str(layout))
    return platform


def write_index(output: Path, images: list[Path]) -> str:
    if not images:
        raise OciError("an index needs at least one image", field="images")
    entries, seen = [], {}
    output.mkdir(parents=True, exist_ok=True)
    for layout in images:
        if (layout / BASE_SIDECAR).is_file():
            raise OciError(
                f"{layout} is a shallow image (its base layers stay in the base's registry); an index "
                "holds complete images",
                field=str(layout),
            )
        digest, manifest, manifest_bytes = read_layout(layout)
        platform = _platform_of(layout, manifest)
        key = platform_name(platform)
        if key in seen:
            raise OciError(
                f"{layout} and {seen[key]} are both {key}: an index holds one image per platform", field="images"
            )
        seen[key] = layout
        for blob in [manifest["config"], *manifest["layers"]]:
            source = blob_path(layout, blob["digest"])
            if not source.is_file():
                raise OciError(f"{layout} lacks blob {blob['digest']}", field=blob["digest"])
            link_blob(output, source, blob["digest"])
        write_blob(output, manifest_bytes)
        entries.append(descriptor(manifest.get("mediaType", OCI_MANIFEST), manifest_bytes, platform=platform))
    entries.sort(
        key=lambda entry: (
            entry["platform"]["os"],
            entry["platform"]["architecture"],
            entry["platform"].get("variant", ""),
        )
    )
    index = canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
    digest = write_blob(output, index)
    (output / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
    (output / "index.json").write_bytes(
        canonical(
            {
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": [
                    descriptor(OCI_INDEX, index, annotations={"org.opencontainers.image.ref.name": REF_NAME})
                ],
            }
        )
    )
    return digest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="index", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--image", type=Path, action="append", default=[], help="an image layout (repeatable)")
    parser.add_argument("--digest-file", type=Path)
    args = parser.parse_args(argv)
    try:
        digest = write_index(args.output, args.image)
    except OciError as exc:
        print(f"index: {exc}", file=sys.stderr)
        return 2
    if args.digest_file:
        args.digest_file.write_text(digest + "\n")
    return 0


if __name__ == "__main__":
    from tools.oci.build.worker import run  # a persistent worker under Bazel, a command line otherwise

    raise SystemExit(run(main))
