"""Assemble the Debian runtime base layer from locked .deb files, in lock order.

    python -m tools.debian.rootfs --lock images/debian.lock.json --arch amd64 --debs DIR \
        --passwd FILE --group FILE --output LAYER.tar.gz --descriptor LAYER.json --packages PACKAGES.json

Each package's data archive (xz, gzip, or uncompressed) is unpacked in Python and merged
(later packages win, as dpkg would); every .deb is checked against the lock's sha256
first. dpkg status records go to /var/lib/dpkg/status.d/<package> so scanners see the
packages, and /etc/os-release names the release as base-files would (base-files itself is not
installed); the CA bundle is generated as update-ca-certificates would (maintainer
scripts never run). The layer is normalised like every other.

Without --passwd and --group it is an add-on layer over such a base (a lock made with
`--over`): the packages' files and status records only, no CA bundle, users or mount points.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import sys
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from omni_oci.format.errors import OciError
from tools.debian.control import stanzas
from tools.debian.copyright import copyright_facts
from tools.oci.build.layer import source_date_epoch, write_layer

CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
STATUS_DIR = "var/lib/dpkg/status.d"
OS_RELEASE = "usr/lib/os-release"
# Debian's releases by suite name: /etc/os-release (as base-files writes it: scanners identify
# the distribution by it) and the purls of the SBOM (distro=debian-12).
DEBIAN_VERSIONS = {"bookworm": "12", "trixie": "13"}


def _ar_members(data: bytes, where: str) -> dict[str, bytes]:
    """The members of a Unix ar archive (the .deb container); hand-written: the standard
    library has no ar reader and the format is a fixed 60-byte header per member."""
    if not data.startswith(b"!<arch>\n"):
        raise OciError(f"{where} is not a Debian package (no ar header)", field=where)
    members, offset = {}, 8
    while offset + 60 <= len(data):
        header = data[offset : offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[offset + 60 : offset + 60 + size]
        offset += 60 + size + (size % 2)
    return members


def _zstd_decompress(payload: bytes) -> bytes:
    try:
        from compression import zstd  # Python 3.14+  # novermin (guarded: 3.11 takes the except)

        return zstd.decompress(payload)
    except ImportError:
        import zstandard  # a stream reader: Debian's frames need not record their size

        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload)).read()


def _open_tar(members: dict[str, bytes], prefix: str, where: str) -> tarfile.TarFile:
    for name, payload in members.items():
        if name.startswith(prefix):
            if name.endswith(".xz"):
                payload = lzma.decompress(payload)
            elif name.endswith(".gz"):
                import gzip

                payload = gzip.decompress(payload)
            elif name.endswith(".zst"):
                payload = _zstd_decompress(payload)
            return tarfile.open(fileobj=io.BytesIO(payload), mode="r:")
    raise OciError(f"{where} has no {prefix}* member", field=where)


def _clean(name: str) -> str:
    parts = [p for p in PurePosixPath(name).parts if p not in (".", "/")]
    return "/".join(parts)


def os_release(suite: str) -> bytes:
    """/usr/lib/os-release of the Debian release `suite`, as its base-files package writes it."""
    version = DEBIAN_VERSIONS.get(suite)
    if version is None:
        raise OciError(f"the Debian lock's release {suite!r} is none of {sorted(DEBIAN_VERSIONS)}", field="release")
    return (
        f'PRETTY_NAME="Debian GNU/Linux {version} ({suite})"\nNAME="Debian GNU/Linux"\nVERSION_ID="{version}"\n'
        f'VERSION="{version} ({suite})"\nVERSION_CODENAME={suite}\nID=debian\nHOME_URL="https://www.debian.org/"\n'
        'SUPPORT_URL="https://www.debian.org/support"\nBUG_REPORT_URL="https://bugs.debian.org/"\n'
    ).encode()


def unpack(deb: Path, entry: dict[str, Any], tree: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = deb.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise OciError(
            f"{deb.name}: downloaded bytes do not match the lock (sha256 {digest}, lock says {entry['sha256']})",
            field=entry["name"],
        )
    members = _ar_members(data, deb.name)
    with _open_tar(members, "control.tar", deb.name) as control_tar:
        control_files = {
            _clean(m.name): control_tar.extractfile(m).read() for m in control_tar.getmembers() if m.isfile()
        }
    control = next(stanzas(control_files["control"].decode()))
    with _open_tar(members, "data.tar", deb.name) as data_tar:
        for member in data_tar.getmembers():
            name = _clean(member.name)
            if not name:
                continue
            mode = member.mode & 0o1777  # no setuid/setgid bits in our base
            if member.isdir():
                tree[name] = {"dest": name, "type": "dir", "mode": mode}
            elif member.issym():
                tree[name] = {"dest": name, "type": "symlink", "target": member.linkname}
            elif member.islnk():
                target = tree.get(_clean(member.linkname))
                if not target or "data" not in target:
                    raise OciError(f"{deb.name}: hard link {name} to missing {member.linkname}", field=deb.name)
                tree[name] = {"dest": name, "data": target["data"], "mode": mode}
            elif member.isfile():
                tree[name] = {"dest": name, "data": data_tar.extractfile(member).read(), "mode": mode}
    status = control_files["control"].decode().rstrip("\n").split("\n")
    status.insert(1, "Status: install ok installed")
    tree[f"{STATUS_DIR}/{control['Package']}"] = {
        "dest": f"{STATUS_DIR}/{control['Package']}",
        "data": ("\n".join(status) + "\n").encode(),
        "mode": 0o644,
    }
    if "md5sums" in control_files:
        tree[f"{STATUS_DIR}/{control['Package']}.md5sums"] = {
            "dest": f"{STATUS_DIR}/{control['Package']}.md5sums",
            "data": control_files["md5sums"],
            "mode": 0o644,
        }
    if (control["Package"], control["Version"]) != (entry["name"], entry["version"]):
        raise OciError(
            f"{deb.name} is {control['Package']} {control['Version']}, the lock says "
            f"{entry['name']} {entry['version']}",
            field=entry["name"],
        )
    documented = tree.get(f"usr/share/doc/{control['Package']}/copyright") or {}
    return {
        "name": entry["name"],
        "version": entry["version"],
        "architecture": entry["architecture"],
        "sha256": entry["sha256"],
        **copyright_facts(documented.get("data", b"")),  # a link to another package's file: none
    }


def build(
    lock: dict[str, Any], arch: str, debs: Path, passwd: Path | None, group: Path | None, output: Path
) -> tuple[dict, list]:
    entries = lock["packages"].get(arch)
    if not entries:
        raise OciError(f"the Debian lock has no packages for {arch}", field="arch")
    tree: dict[str, dict[str, Any]] = {}
    packages = []
    release = os_release(lock.get("release", ""))  # refused before any package is unpacked
    distro = f"debian-{DEBIAN_VERSIONS[lock['release']]}"
    for entry in entries:
        deb = debs / f"{entry['name']}_{entry['architecture']}.deb"
        if not deb.is_file():
            raise OciError(f"{deb} is missing: the Debian fetch did not provide {entry['name']}", field=entry["name"])
        packages.append({**unpack(deb, entry, tree), "vendor": "debian", "distro": distro})
    if passwd is None or group is None:
        return write_layer(tree.values(), output, mtime=source_date_epoch()), packages
    certificates = sorted(
        name
        for name in tree
        if name.startswith("usr/share/ca-certificates/") and name.endswith(".crt") and "data" in tree[name]
    )
    tree[CA_BUNDLE] = {"dest": CA_BUNDLE, "data": b"".join(tree[name]["data"] for name in certificates), "mode": 0o644}
    tree[OS_RELEASE] = {"dest": OS_RELEASE, "data": release, "mode": 0o644}
    tree["etc/os-release"] = {"dest": "etc/os-release", "type": "symlink", "target": "../" + OS_RELEASE}
    tree["etc/passwd"] = {"dest": "etc/passwd", "data": passwd.read_bytes(), "mode": 0o644}
    tree["etc/group"] = {"dest": "etc/group", "data": group.read_bytes(), "mode": 0o644}
    tree["tmp"] = {"dest": "tmp", "type": "dir", "mode": 0o1777}
    # Mount points of the declared volumes (the images may run with a read-only root).
    tree["state"] = {"dest": "state", "type": "dir", "mode": 0o755, "uid": 1000, "gid": 1000}
    tree["cache"] = {"dest": "cache", "type": "dir", "mode": 0o755, "uid": 1000, "gid": 1000}
    tree["models"] = {"dest": "models", "type": "dir", "mode": 0o755}
    tree["opt/omni"] = {"dest": "opt/omni", "type": "dir", "mode": 0o755}
    descriptor = write_layer(tree.values(), output, mtime=source_date_epoch())
    return descriptor, packages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rootfs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for flag in ("--lock", "--debs", "--output", "--descriptor", "--packages"):
        parser.add_argument(flag, type=Path, required=True)
    for flag in ("--passwd", "--group"):
        parser.add_argument(flag, type=Path, help="the base's users (both, or neither for an add-on layer)")
    parser.add_argument("--arch", required=True)
    args = parser.parse_args(argv)
    if (args.passwd is None) != (args.group is None):
        parser.error("--passwd and --group go together: both for a base, neither for an add-on layer")
    try:
        descriptor, packages = build(
            json.loads(args.lock.read_text()), args.arch, args.debs, args.passwd, args.group, args.output
        )
    except OciError as exc:
        print(f"rootfs: {exc}", file=sys.stderr)
        return 2
    args.descriptor.write_text(json.dumps(descriptor, sort_keys=True, indent=2) + "\n")
    args.packages.write_text(json.dumps(packages, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
