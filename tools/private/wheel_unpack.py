"""Install wheels into an image's site-packages with fixed behaviour, per the wheel spec.

pip is not used for image layers: the pip of the build host writes console scripts whose
shebang is that host's interpreter, records their hashes in RECORD, and its behaviour
changes with its version, so the same lock gave different layers on different hosts.
What this writes depends only on the wheel bytes:

- every archive member is checked against the wheel's own RECORD (hash and size) and must
  be a plain relative path inside the site;
- `*.data/purelib` and `*.data/platlib` go to the site root; `*.data/scripts`, `headers` and
  `data` are left out, and so are entry-point console scripts: the image runs `python3 -m`;
- RECORD is rewritten to list exactly the files written (sorted), INSTALLER says `omni`;
- file modes are 0755 when the archive marks the member executable, 0644 otherwise.

Standard library only: this runs at fetch time, before any locked package exists.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import stat
import sys
import zipfile
from pathlib import Path, PurePosixPath

INSTALLER = b"omni\n"
LEFT_OUT_DATA = {"scripts", "headers", "data"}
INSTALLED_DATA = {"purelib", "platlib"}


class WheelError(Exception):
    """A wheel that cannot be installed as its RECORD says."""


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _verify_hash(wheel: str, name: str, data: bytes, hash_field: str, size_field: str) -> None:
    algorithm, _, expected = hash_field.partition("=")
    if algorithm not in {"sha256", "sha384", "sha512"} or not expected:
        raise WheelError(f"{wheel}: RECORD row {name!r} has hash {hash_field!r}; expected sha256=…")
    actual = base64.urlsafe_b64encode(hashlib.new(algorithm, data).digest()).rstrip(b"=").decode()
    if actual != expected:
        raise WheelError(f"{wheel}: {name} has {algorithm} {actual}, its RECORD says {expected}")
    if size_field and size_field != str(len(data)):
        raise WheelError(f"{wheel}: {name} is {len(data)} bytes, its RECORD says {size_field}")


def _safe_member(wheel: str, name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\x00" in name
        or any(part in {"", ".", ".."} for part in path.parts)
    ):
        raise WheelError(f"{wheel}: archive member {name!r} is not a plain relative path")
    return path


def _write_installed(site: Path, label: str, dist_info: str, written: dict[str, bytes], modes: dict[str, int]) -> None:
    """The wheel's files into `site`, none over another wheel's, and a RECORD of what was written."""
    for relative, data in written.items():
        target = site / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            raise WheelError(f"{label}: {relative} is already installed by another wheel")
        target.write_bytes(data)
        os.chmod(target, modes[relative])
    rows = [(path, _record_digest(data), str(len(data))) for path, data in sorted(written.items())]
    rows.append((f"{dist_info}/RECORD", "", ""))
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(sorted(rows))
    (site / dist_info / "RECORD").write_text(out.getvalue(), encoding="utf-8")
    os.chmod(site / dist_info / "RECORD", 0o644)


def unpack(wheel: Path, site: Path) -> list[str]:
    """Install one wheel into `site`; returns the site-relative paths written."""
    label = wheel.name
    with zipfile.ZipFile(wheel) as archive:
        members = [info for info in archive.infolist() if not info.is_dir()]
        dist_infos = {
            PurePosixPath(info.filename).parts[0]
            for info in members
            if PurePosixPath(info.filename).parts[0].endswith(".dist-info")
        }
        if len(dist_infos) != 1:
            raise WheelError(f"{label}: expected one *.dist-info directory, found {sorted(dist_infos)}")
        dist_info = dist_infos.pop()
        data_dir = dist_info[: -len(".dist-info")] + ".data"
        record_name = f"{dist_info}/RECORD"
        try:
            record_text = archive.read(record_name).decode("utf-8")
        except KeyError:
            raise WheelError(f"{label}: {record_name} is missing") from None
        recorded = {row[0]: row for row in csv.reader(io.StringIO(record_text)) if row}
        written: dict[str, bytes] = {}
        modes: dict[str, int] = {}
        for info in members:
            source = _safe_member(label, info.filename)
            if info.filename == record_name or source.name in {"RECORD.jws", "RECORD.p7s"}:
                continue
            row = recorded.get(info.filename)
            if row is None or len(row) != 3:
                raise WheelError(f"{label}: {info.filename} is not listed in {record_name}")
            data = archive.read(info)
            _verify_hash(label, info.filename, data, row[1], row[2])
            parts = source.parts
            if parts[0] == data_dir:
                if len(parts) < 3 or parts[1] not in INSTALLED_DATA | LEFT_OUT_DATA:
                    raise WheelError(f"{label}: {info.filename} is in an unknown .data category")
                if parts[1] in LEFT_OUT_DATA:
                    continue
                target = PurePosixPath(*parts[2:])
            else:
                target = source
            if str(target) in written:
                raise WheelError(f"{label}: two members install to {target}")
            written[str(target)] = data
            modes[str(target)] = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
        missing = sorted(set(recorded) - {i.filename for i in members})
        if missing:
            raise WheelError(f"{label}: {record_name} lists files the archive lacks: {missing[:3]}")
    # Entry-point scripts and installer bookkeeping are ours to write, not the wheel's.
    for name in ("INSTALLER", "REQUESTED", "direct_url.json"):
        written.pop(f"{dist_info}/{name}", None)
    written[f"{dist_info}/INSTALLER"] = INSTALLER
    modes[f"{dist_info}/INSTALLER"] = 0o644
    _write_installed(site, label, dist_info, written, modes)
    return sorted([*written, f"{dist_info}/RECORD"])


def unpack_all(wheels: Path, site: Path) -> None:
    site.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(wheels.glob("*.whl")):
        unpack(wheel, site)
    # Directories get one mode too: the layer tool fixes them, but the site is also read in place.
    for directory in [site, *sorted(p for p in site.rglob("*") if p.is_dir())]:
        os.chmod(directory, stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: wheel_unpack.py WHEELS_DIR SITE_DIR")
    try:
        unpack_all(Path(sys.argv[1]), Path(sys.argv[2]))
    except WheelError as error:
        sys.exit(f"wheel_unpack: {error}")
