"""Tarballs that `docker load` and `podman load` read, and loading them.

    python -m tools.oci.build.load --layout DIR --output FILE --format docker|oci [--tag REPO:TAG ...]
    python -m tools.oci.build.load --tarball FILE   # load into whichever of docker or podman is on PATH

`docker` writes a docker-archive: the config and layer blobs under `blobs/sha256/` (as
`docker save` writes them since Docker 25) and `manifest.json` naming the config, the layers
in order and the repo tags; docker and podman both read gzip layers as they are. `oci` writes
the layout itself as an OCI archive, the tags as `org.opencontainers.image.ref.name`
annotations. Either is deterministic: entries sorted, owner 0, time 0, modes fixed. A shallow
image (its base layers only referenced) is refused: a load needs every layer.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from attest.edge.refusal import refusing_main
from omni_oci.format.errors import OciError
from omni_oci.format.layout import BASE_SIDECAR, OCI_INDEX, blob_path, read_layout
from omni_oci.format.reference import Reference

FORMATS = ("docker", "oci")


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, source: Path | None = None) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if data is None and source is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        return
    info.mode = 0o644
    if source is not None:
        info.size = source.stat().st_size
        with source.open("rb") as handle:
            tar.addfile(info, handle)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _check_tag(tag: str) -> str:
    expected = f"repo tag {tag!r} must be REPOSITORY:TAG (lower-case repository, no digest)"
    try:
        ref = Reference.parse(tag)
    except OciError as exc:
        raise OciError(f"{expected}: {exc}", field="repo_tags") from None
    if not ref.tag or ref.digest:
        raise OciError(expected, field="repo_tags")
    return tag


def write_tarball(layout: Path, output: Path, *, tags: list[str], fmt: str = "docker") -> str:
    """Write the tarball (atomically: a failure leaves no partial file); returns the manifest digest."""
    if fmt not in FORMATS:
        raise OciError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}", field="format")
    tags = [_check_tag(tag) for tag in tags]
    if (layout / BASE_SIDECAR).is_file():
        raise OciError(
            f"{layout} is a shallow image: its base layers stay in the base's registry, so docker and "
            "podman cannot load it; build it on a complete base, or push it",
            field="image",
        )
    digest, manifest, manifest_bytes = read_layout(layout)
    blobs = [manifest["config"]["digest"], *[layer["digest"] for layer in manifest["layers"]]]
    missing = [blob for blob in blobs if not blob_path(layout, blob).is_file()]
    if missing:
        raise OciError(f"{layout} lacks blob {missing[0]}", field=missing[0])
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.omni-partial")
    with tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as tar:
        entries: dict[str, bytes | Path | None] = {"blobs": None, "blobs/sha256": None}
        for blob in [*blobs, digest]:
            entries[f"blobs/sha256/{blob.split(':', 1)[1]}"] = blob_path(layout, blob)
        if fmt == "docker":
            entries["manifest.json"] = json.dumps(
                [
                    {
                        "Config": f"blobs/sha256/{blobs[0].split(':', 1)[1]}",
                        "RepoTags": tags,
                        "Layers": [f"blobs/sha256/{blob.split(':', 1)[1]}" for blob in blobs[1:]],
                    }
                ],
                separators=(",", ":"),
            ).encode()
        else:
            entries["oci-layout"] = (layout / "oci-layout").read_bytes()
        # Both formats carry the index (Docker 25 writes it too): podman reads the tags from it.
        described = {"mediaType": manifest.get("mediaType"), "digest": digest, "size": len(manifest_bytes)}
        entries["index.json"] = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": [
                    {**described, **({"annotations": {"org.opencontainers.image.ref.name": tag}} if tag else {})}
                    for tag in (tags or [""])
                ],
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        for name in sorted(entries):
            value = entries[name]
            _add(tar, name, source=value) if isinstance(value, Path) else _add(tar, name, data=value)
    partial.replace(output)
    return digest


def load(tarball: Path) -> str:
    """`docker load` or `podman load` of the tarball; returns which one ran."""
    for tool in ("docker", "podman"):
        program = shutil.which(tool)
        if program is None:
            continue
        done = subprocess.run([program, "load", "--input", str(tarball)], capture_output=True, text=True)
        if done.returncode != 0:
            raise OciError(f"{tool} load failed ({done.returncode}): {done.stderr.strip()[:500]}", field=tool)
        print(done.stdout.strip(), file=sys.stderr)
        return tool
    raise OciError(
        f"neither docker nor podman is on PATH; the tarball is {tarball}: load it with "
        "`docker load -i` or `podman load -i` where one is installed",
        field="PATH",
    )


@refusing_main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="load", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layout", type=Path)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--format", choices=FORMATS, default="docker")
    parser.add_argument("--tag", action="append", default=[], help="REPOSITORY:TAG (repeatable)")
    parser.add_argument("--tarball", type=Path, help="load this tarball into docker or podman")
    args = parser.parse_args(argv)
    if args.layout is not None:
        if args.output is None:
            parser.error("--layout needs --output")
        digest = write_tarball(args.layout, args.output, tags=args.tag, fmt=args.format)
        print(f"load: wrote {args.output} ({args.format} archive of {digest})", file=sys.stderr)
    if args.tarball is not None:
        tarball = Path(os.environ.get("BUILD_WORKING_DIRECTORY", ".")) / args.tarball
        print(f"load: loaded into {load(tarball)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
