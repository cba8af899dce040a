"""Resolve Omni's Debian runtime base into images/debian.lock.json.

    bazel run //tools/debian:lock            # or: python -m tools.debian.lock --output FILE
    bazel run //tools/debian:lock -- --roots dash util-linux --no-data-only \
        --over images/debian.lock.json --output images/engine_cpu.debian.lock.json

The second form locks an add-on layer: only what the roots need beyond the packages of the
lock given with --over (they are in the base below it).

From the Packages index of a pinned release and suite, for amd64 and arm64, checked against
the SHA256 list of the suite's Release, itself verified with gpgv against Debian's archive
keyring (tools/debian/archive.py; --keyring names another, --archive a mirror), it resolves
the closure of the roots (python3 and its shared libraries) plus data-only packages (CA certificates, tzdata) whose
maintainer-script dependencies are not needed: the base runs no maintainer scripts.
Each package gets its exact version, sha256 and download URLs (Debian's archive, the
snapshot archive as fallback).
"""

from __future__ import annotations

import argparse
import email.utils
import hashlib
import json
import lzma
import math
import os
import sys
import time
from pathlib import Path

import httpx

from tools.debian.archive import KEYRING, ArchiveError, SignedRelease, archive_client, get_bounded, signed_release
from tools.debian.control import alternatives, stanzas

ARCHIVE = "http://deb.debian.org/debian"
SNAPSHOT = "https://snapshot.debian.org/archive/debian"
RELEASE = "bookworm"
COMPONENT = "main"
ARCHITECTURES = ("amd64", "arm64")
ROOTS = ("python3-minimal", "libpython3.11-stdlib")
DATA_ONLY = ("ca-certificates", "tzdata")
DEADLINE_S = 900.0  # the whole read of the archive: a Release and two Packages indexes
# Essential packages a real system has but a runtime base that runs no shell scripts
# does not need; dependencies on them are not followed.
SKIPPED = {
    "debconf",
    "debconf-2.0",
    "perl-base",
    "dpkg",
    "install-info",
    "base-files",
    "libc-bin",
    "readline-common",
    "media-types",
    "mime-support",
    "netbase",
}


def _packages_index(
    client: httpx.Client, archive: str, release: SignedRelease, arch: str, deadline: float
) -> dict[str, dict[str, str]]:
    """The suite's Packages index for `arch`, accepted only as the signed Release lists it."""
    path = f"{COMPONENT}/binary-{arch}/Packages.xz"
    url = f"{archive}/dists/{RELEASE}/{path}"
    # Never read past the size the signed Release gives it.
    data = get_bounded(client, url, release.listed(path)[1], deadline)
    if data is None:
        raise ArchiveError(f"{url} answered HTTP 404")
    release.check(path, data, hashlib.sha256(data).hexdigest())
    index: dict[str, dict[str, str]] = {}
    provides: dict[str, str] = {}
    for stanza in stanzas(lzma.decompress(data).decode()):
        index.setdefault(stanza["Package"], stanza)
        for names in alternatives(stanza.get("Provides", "")):
            provides.setdefault(names[0], stanza["Package"])
    for virtual, real in provides.items():
        index.setdefault(virtual, index[real])
    return index


def resolve(
    index: dict[str, dict[str, str]],
    arch: str,
    roots: tuple[str, ...] = ROOTS,
    data_only: tuple[str, ...] = DATA_ONLY,
    present: frozenset[str] = frozenset(),
) -> list[dict[str, str]]:
    chosen: dict[str, dict[str, str]] = {}
    order: list[str] = []

    def visit(name: str, follow: bool) -> None:
        if name not in index:
            sys.exit(f"lock: {name} ({arch}) is not in the index of {RELEASE}/{COMPONENT}")
        stanza = index[name]
        real = stanza["Package"]
        if real in chosen or real in SKIPPED or real in present:
            return
        chosen[real] = stanza
        if follow:
            for field in ("Pre-Depends", "Depends"):
                for group in alternatives(stanza.get(field, "")):
                    pick = next((n for n in group if n in index and index[n]["Package"] in chosen), None) or next(
                        (n for n in group if n in index and index[n]["Package"] not in SKIPPED), None
                    )
                    if pick is None:
                        if all(n in SKIPPED or (n in index and index[n]["Package"] in SKIPPED) for n in group):
                            continue
                        sys.exit(f"lock: {real} ({arch}) needs one of {group}; none is in the index")
                    visit(pick, True)
        order.append(real)

    for root in roots:
        visit(root, True)
    for name in data_only:
        visit(name, False)
    return [chosen[name] for name in order]


def _lock_entry(stanza: dict[str, str], archive: str, snapshot: str) -> dict[str, object]:
    return {
        "name": stanza["Package"],
        "version": stanza["Version"],
        "architecture": stanza["Architecture"],
        "sha256": stanza["SHA256"],
        "size": int(stanza["Size"]),
        "urls": [f"{archive}/{stanza['Filename']}", f"{SNAPSHOT}/{snapshot}/{stanza['Filename']}"],
    }


def _resolve_all(lock: dict, args: argparse.Namespace, data_only: tuple[str, ...], over: dict | None) -> None:
    """Every architecture's packages into `lock`, from the Release signed by the keyring."""
    deadline = time.monotonic() + args.deadline
    with archive_client() as client:
        release = signed_release(client, f"{args.archive}/dists", RELEASE, args.keyring, deadline=deadline)
        print(
            f"lock_debian: {release.source} of {RELEASE} ({release.date}) verified: signed by "
            f"{', '.join(release.signed_by)}",
            file=sys.stderr,
        )
        snapshot = email.utils.parsedate_to_datetime(release.date).strftime("%Y%m%dT%H%M%SZ")
        lock.update(
            release_date=release.date,
            release_valid_until=release.valid_until,
            release_signed_by=list(release.signed_by),
        )
        for arch in ARCHITECTURES:
            index = _packages_index(client, args.archive, release, arch, deadline)
            present = frozenset(p["name"] for p in over["packages"][arch]) if over else frozenset()
            chosen = resolve(index, arch, tuple(args.roots), data_only, present)
            entries = [_lock_entry(stanza, args.archive, snapshot) for stanza in chosen]
            lock["packages"][arch] = entries
            print(
                f"lock_debian: {arch}: {len(entries)} packages, {sum(e['size'] for e in entries) / 1e6:.1f} MB",
                file=sys.stderr,
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lock_debian", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", ".")) / "images" / "debian.lock.json"
    parser.add_argument("--output", type=Path, default=default)
    parser.add_argument("--roots", nargs="+", default=list(ROOTS), help="packages whose closure is locked")
    parser.add_argument(
        "--no-data-only", action="store_true", help=f"leave out the data-only packages ({', '.join(DATA_ONLY)})"
    )
    parser.add_argument("--over", type=Path, help="a base lock: its packages are not locked again")
    parser.add_argument("--archive", default=ARCHIVE, help="the Debian archive (a mirror) to resolve from")
    parser.add_argument(
        "--keyring", type=Path, default=KEYRING, help="the OpenPGP keyring the archive's Release must be signed by"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEADLINE_S,
        help=f"seconds the whole archive read may take (default {DEADLINE_S:g})",
    )
    args = parser.parse_args(argv)
    if not 0 < args.deadline < math.inf:
        parser.error(f"--deadline must be a positive number of seconds, got {args.deadline}")
    base_dir = Path(os.environ.get("BUILD_WORKSPACE_DIRECTORY", "."))
    output = base_dir / args.output
    data_only = () if args.no_data_only else DATA_ONLY
    over = json.loads((base_dir / args.over).read_text()) if args.over else None
    lock: dict[str, object] = {
        "release": RELEASE,
        "component": COMPONENT,
        "roots": list(args.roots),
        "data_only": list(data_only),
        "packages": {},
    }
    if args.over:
        lock["over"] = args.over.name
    args.archive, args.keyring = args.archive.rstrip("/"), base_dir / args.keyring
    try:
        _resolve_all(lock, args, data_only, over)
    except ArchiveError as exc:
        sys.exit(f"lock_debian: refused: {exc}; nothing written")
    except httpx.HTTPError as exc:
        sys.exit(f"lock_debian: {args.archive} cannot be read ({type(exc).__name__}: {exc}); nothing written")
    tmp = output.with_suffix(".tmp")
    tmp.write_text(json.dumps(lock, indent=2) + "\n")
    tmp.replace(output)
    print(f"lock_debian: wrote {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
