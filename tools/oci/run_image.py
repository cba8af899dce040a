"""What `bazel run` of an image does: print its digest and a summary; optionally copy the
layout (--output), write an OCI archive tarball (--archive) and push (--push).

Nothing the user did not make with Omni is ever deleted: --output fills a new or empty
directory, and replaces an existing OCI layout only with --force; --archive writes a new
file, and replaces an existing one only with --force. Both are written beside the target
and renamed into place, so a failure leaves the old content as it was. Relative paths are
resolved against the directory `bazel run` was started from.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

from attest.edge.redact import redacting_output
from attest.edge.refusal import refusing_main
from omni_oci.format.errors import OciError
from omni_oci.format.layout import BASE_SIDECAR, OCI_MANIFEST, descriptor, read_blob, read_index, read_layout
from omni_oci.format.reference import Reference
from omni_oci.remote.push import expand_tags, push
from omni_oci.remote.referrers import push_referrer
from omni_oci.remote.registry import RegistryClient
from omni_oci.signing.bundles import BUNDLES_ONLY_WARNING, SIGN_PREDICATE, push_signatures
from omni_oci.signing.dsse import INTOTO_PAYLOAD_TYPE
from omni_oci.signing.legacy import DSSE_TYPE, dsse_envelope, tag_for
from tools.oci.build.index import platform_name
from tools.oci.push import read_status, read_tags
from tools.oci.push_record import record_push
from tools.settings import SIGNING, tools_help
from tools.signing_key import release_signing_key

SPDX_TYPE = "application/spdx+json"


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def summary(layout: Path, name: str) -> str:
    index = read_index(layout)
    if index is not None:
        digest, document, _ = index
        lines = [f"{name}  {digest}", f"image index of {len(document['manifests'])} platforms:"]
        for entry in document["manifests"]:
            lines.append(
                f"  {platform_name(entry.get('platform') or {})}  {entry['digest']}  {_mb(entry['size'])} manifest"
            )
        return "\n".join(lines)
    digest, manifest, _ = read_layout(layout)
    config = json.loads(read_blob(layout, manifest["config"]["digest"]))
    sidecar = json.loads((layout / BASE_SIDECAR).read_text()) if (layout / BASE_SIDECAR).is_file() else {}
    shallow = set(sidecar.get("shallow_layers") or [])
    labels = (config.get("config") or {}).get("Labels") or {}
    history = [h for h in config.get("history", []) if not h.get("empty_layer")]
    names = [h.get("created_by", "") for h in history][-len(manifest["layers"]) :] if history else []
    names = [""] * (len(manifest["layers"]) - len(names)) + names
    lines = [
        f"{name}  {digest}",
        f"platform: {config.get('os')}/{config.get('architecture')}"
        + (f"/{config['variant']}" if config.get("variant") else ""),
    ]
    if sidecar:
        lines.append(
            f"base: {sidecar.get('image')}@{sidecar.get('digest')} "
            f"(shallow: {len(shallow)} layers referenced by descriptor, none copied)"
        )
    else:
        lines.append(
            f"base: {labels.get('org.opencontainers.image.base.name') or labels.get('omni.base', 'none')}"
            " (built locally, complete)"
        )
    lines.append("layers:")
    for layer, label in zip(manifest["layers"], names):
        where = "base, not in layout" if layer["digest"] in shallow else label.replace("omni: ", "")
        lines.append(f"  {layer['digest'][:19]}…  {_mb(layer['size']):>10}  {where}")
    runtime = config.get("config") or {}
    lines.append(f"entrypoint: {json.dumps(runtime.get('Entrypoint'))}  cmd: {json.dumps(runtime.get('Cmd'))}")
    if labels:
        lines.append("labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return "\n".join(lines)


def _engine_line(layout: Path, name: str) -> str:
    """Whether the image carries an engine: the local base has none (its launcher refuses to
    start), the release's vendor base does."""
    if (layout / BASE_SIDECAR).is_file():
        sidecar = json.loads((layout / BASE_SIDECAR).read_text())
        return f"engine: from the vendor base {sidecar.get('image')}@{sidecar.get('digest')}"
    if read_index(layout) is not None:
        return "engine: as each platform's image says"
    _, manifest, _ = read_layout(layout)
    labels = (json.loads(read_blob(layout, manifest["config"]["digest"])).get("config") or {}).get("Labels") or {}
    record = labels.get("omni.engine.record_sha256", "unpinned")
    if record != "unpinned":
        return f"engine: in the image's own layers, pinned by its RECORD digest {record} (checked at start)"
    return (
        f"engine: none (local Debian base: the image's entrypoint refuses to start without one); "
        f"the deployable image: bazel run --config=release {name}"
    )


def _is_oci_layout(path: Path) -> bool:
    return (
        (path / "oci-layout").is_file()
        and (path / "index.json").is_file()
        and {child.name for child in path.iterdir()} <= {"oci-layout", "index.json", "blobs", BASE_SIDECAR}
    )


def _write_output(layout: Path, target: Path, *, force: bool) -> None:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise OciError(f"--output {target} exists and is not a directory; choose another path", field="--output")
    existing = target.is_dir() and any(target.iterdir())
    if existing and not _is_oci_layout(target):
        raise OciError(
            f"--output {target} is a non-empty directory that is not an OCI layout; Omni never "
            "deletes what it did not write: choose a new or empty directory",
            field="--output",
        )
    if existing and not force:
        raise OciError(f"--output {target} already holds an OCI layout; pass --force to replace it", field="--output")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.omni-partial"
    if staging.exists():
        shutil.rmtree(staging)  # our own leftover from an interrupted run
    shutil.copytree(layout, staging)
    for path in [staging, *staging.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    if target.is_dir():
        retired = target.parent / f".{target.name}.omni-replaced"
        target.rename(retired)
        staging.rename(target)
        shutil.rmtree(retired)
    else:
        staging.rename(target)


def _write_archive(layout: Path, archive: Path, *, force: bool = False) -> None:
    """An OCI archive: the layout as a tar, entries sorted, owners and times fixed."""
    if archive.is_symlink() or archive.is_dir():
        raise OciError(f"--archive {archive} is a directory or a symlink; name a file", field="--archive")
    if archive.exists() and not force:
        raise OciError(f"--archive {archive} exists; pass --force to replace it", field="--archive")
    archive.parent.mkdir(parents=True, exist_ok=True)
    staging = archive.parent / f".{archive.name}.omni-partial"
    with tarfile.open(staging, "w", format=tarfile.GNU_FORMAT) as tar:
        for path in sorted(layout.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(layout)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    staging.replace(archive)


def _push_evidence(layout: Path, args: argparse.Namespace, digest: str, key) -> None:
    """SBOM and provenance as artifacts referring to the image; the signature, provenance and
    SBOM as Sigstore bundles referring to it; cosign's legacy tags unless --no-legacy-signatures."""
    ref = Reference.parse(args.push)
    _, _, manifest_bytes = read_layout(layout)
    subject = descriptor(OCI_MANIFEST, manifest_bytes)
    where = f"{ref.registry}/{ref.repository}"
    with RegistryClient(ref.registry) as client:
        if args.sbom:
            sbom = push_referrer(client, ref.repository, subject, SPDX_TYPE, args.sbom.read_bytes(), SPDX_TYPE)
            print(f"sbom: {where}@{sbom} (refers to {digest})", file=sys.stderr)
        statement = json.loads(args.provenance.read_text()) if args.provenance else None
        if statement is not None:
            payload, payload_type = args.provenance.read_bytes(), INTOTO_PAYLOAD_TYPE
            if key is not None:
                payload, payload_type = dsse_envelope(key, statement), DSSE_TYPE
            provenance = push_referrer(client, ref.repository, subject, INTOTO_PAYLOAD_TYPE, payload, payload_type)
            print(f"provenance: {where}@{provenance} (refers to {digest})", file=sys.stderr)
        if key is not None:
            sbom = json.loads(args.sbom.read_text()) if args.sbom else None
            cyclonedx = json.loads(args.cyclonedx.read_text()) if args.cyclonedx else None
            signed = push_signatures(
                client,
                ref.repository,
                subject,
                key,
                provenance=statement,
                sbom=sbom,
                legacy=args.legacy_signatures,
                cyclonedx=cyclonedx,
            )
            for predicate, bundle in signed.bundles.items():
                print(f"bundle: {where}@{bundle} ({predicate}, refers to {digest})", file=sys.stderr)
            if signed.signature_tag:
                print(f"signature: {where}:{tag_for(digest, 'sig')} = {signed.signature_tag} (legacy)", file=sys.stderr)
            if signed.attestations_tag:
                print(
                    f"attestations: {where}:{tag_for(digest, 'att')} = {signed.attestations_tag} (legacy: "
                    f"{', '.join(p for p in signed.bundles if p != SIGN_PREDICATE)})",
                    file=sys.stderr,
                )
            if not args.legacy_signatures:
                print(f"push: {BUNDLES_ONLY_WARNING}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bazel run //images:<image> --",
        description=__doc__,
        epilog=tools_help(SIGNING),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--layout", type=Path, required=True, help=argparse.SUPPRESS)
    parser.add_argument("--name", default="image", help=argparse.SUPPRESS)
    parser.add_argument(
        "--output",
        type=Path,
        help="copy the OCI layout to this new or empty directory (relative to where bazel run started)",
    )
    parser.add_argument("--archive", type=Path, help="write the layout as an OCI archive tarball to this new file")
    parser.add_argument(
        "--force", action="store_true", help="replace an existing OCI layout at --output, or an existing --archive file"
    )
    parser.add_argument(
        "--allow-shallow",
        action="store_true",
        help="write --archive even for a shallow image (its base layers are not in it)",
    )
    parser.add_argument("--push", metavar="REGISTRY/REPO[:TAG]", help="push the image by digest (and its SBOM)")
    parser.add_argument(
        "--tag",
        action="append",
        default=[],
        metavar="TAG",
        help="also tag the pushed image (repeatable; {KEY} takes a workspace status value)",
    )
    parser.add_argument("--tags-file", type=Path, action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--status-file", type=Path, action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--sbom", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cyclonedx", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--provenance", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--signing-key",
        type=Path,
        help="PEM ECDSA P-256 private key signing the image and its provenance "
        "(default: $OMNI_SIGNING_KEY_FILE, else $OMNI_SIGNING_KEY)",
    )
    parser.add_argument("--unsigned", action="store_true", help="push without signatures (explicitly)")
    parser.add_argument(
        "--legacy-signatures",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also push cosign's legacy sha256-<hex>.sig and .att tags beside the Sigstore bundles "
        "(default on for this release; docs/release.md)",
    )
    return parser


def _push_signed(layout: Path, args: argparse.Namespace) -> None:
    """The image pushed by digest, then its signature, provenance and SBOM, the tags, and the push
    recorded; the pushed reference is printed on stdout."""
    # No key and no --unsigned: refuse before anything leaves this machine.
    key = None if args.unsigned else release_signing_key(args.signing_key)
    tags = [*args.tag, *(tag for path in args.tags_file for tag in read_tags(path))]
    tags = expand_tags(tags, read_status(args.status_file))
    report = push(
        layout, args.push, tags=tags, progress=lambda line: print(f"push: {line}", file=sys.stderr, flush=True)
    )
    print(
        f"pushed: {len(report.uploaded)} blobs uploaded ({report.uploaded_bytes} bytes), "
        f"{len(report.mounted)} mounted, {len(report.streamed)} streamed, {len(report.present)} present",
        file=sys.stderr,
    )
    _push_evidence(layout, args, report.digest, key)
    repository = report.reference.split("@", 1)[0]  # REGISTRY/REPO, as pushed
    for tag in report.tags:
        print(f"tagged: {repository}:{tag}", file=sys.stderr)
    if key is None:
        print(f"UNSIGNED: {report.reference} was pushed without signatures (--unsigned)", file=sys.stderr)
    record_push(report.reference, report.digest)
    print(report.reference)


@refusing_main
def main(argv: list[str] | None = None) -> int:
    redacting_output()  # every secret the run learns stays out of every line it prints
    args = _parser().parse_args(argv)
    base_dir = Path(os.environ.get("BUILD_WORKING_DIRECTORY", "."))
    if args.signing_key is not None:
        args.signing_key = base_dir / args.signing_key
    layout = args.layout.resolve()
    print(summary(layout, args.name))
    print(_engine_line(layout, args.name))
    shallow = (layout / BASE_SIDECAR).is_file()
    if args.archive and shallow and not args.allow_shallow:
        raise OciError(
            "--archive of a shallow image would lack its base layers (they stay in the base's "
            "registry), so docker, podman and `crane validate --tarball` cannot load it; push it "
            "instead, or pass --allow-shallow to write it anyway",
            field="--archive",
        )
    if args.output:
        target = base_dir / args.output
        _write_output(layout, target, force=args.force)
        print(f"layout: {target}")
    else:
        print(f"layout: {layout}")
    if args.sbom:
        print(f"sbom: {args.sbom.resolve()}")
    if args.cyclonedx:
        print(f"cyclonedx: {args.cyclonedx.resolve()}")
    if args.provenance:
        print(f"provenance: {args.provenance.resolve()}")
    if args.archive:
        _write_archive(layout, base_dir / args.archive, force=args.force)
        print(f"archive: {base_dir / args.archive}" + (" (base layers not included: shallow)" if shallow else ""))
    if args.push:
        _push_signed(layout, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
