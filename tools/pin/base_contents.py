"""What a vendor base installs, read from its layers as they stream (the same read as the
engine's identity: whiteouts honoured, nothing unpacked), into the document of
attest.base_contents that `tools/pin --write` commits as images/IMAGE.base-contents.json.

Read, each file bounded by the layer reader's cap:
- dpkg's database: var/lib/dpkg/status, and var/lib/dpkg/status.d/NAME (distroless's, and
  Omni's own base's); an entry counts when its files are on disk (every state but
  not-installed and config-files; status.d entries have none). Each package's
  /usr/share/doc/NAME/copyright gives its license facts (tools.debian.copyright).
- every *.dist-info's METADATA, RECORD (its sha256) and license files, and every *.egg-info's
  PKG-INFO, wherever it is (tools.private.wheel_facts reads the metadata as it reads a wheel's).
- /etc/os-release (or /usr/lib/os-release): the distribution, for the purls.
An rpm or apk database is refused by name: its packages would be missing from the SBOM, which
must not look complete when it is not. A name or version outside its grammar is refused too,
naming the file and the entry (attest.base_contents holds the grammars).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from attest.base_contents import (
    DEB_ARCHITECTURE_RE,
    DEB_NAME_RE,
    DEB_VERSION_RE,
    OS_ID_RE,
    PYTHON_NAME_RE,
    PYTHON_VERSION_RE,
    BaseContents,
)
from attest.documents import parse_document
from omni_oci.format.errors import OciError
from omni_oci.remote.layers.files import LayerFile
from tools.debian.control import stanzas
from tools.debian.copyright import copyright_facts
from tools.private.wheel_facts import LICENSE_FILE_RE, core_metadata, metadata_facts

DPKG_STATUS = "var/lib/dpkg/status"
DPKG_STATUS_DIR = "var/lib/dpkg/status.d/"
OS_RELEASE = ("etc/os-release", "usr/lib/os-release")
# Package databases Omni does not read, by path; a base holding one is refused.
UNREAD_DATABASES = {
    "var/lib/rpm/Packages": "rpm",
    "var/lib/rpm/Packages.db": "rpm",
    "var/lib/rpm/rpmdb.sqlite": "rpm",
    "usr/lib/sysimage/rpm/Packages": "rpm",
    "usr/lib/sysimage/rpm/Packages.db": "rpm",
    "usr/lib/sysimage/rpm/rpmdb.sqlite": "rpm",
    "lib/apk/db/installed": "apk",
}
# dpkg states whose package has no files on disk.
NOT_ON_DISK = frozenset({"not-installed", "config-files"})
MAX_ENTRIES = 100_000


def _metadata_dir(path: str) -> tuple[str, str] | None:
    """(the *.dist-info or *.egg-info directory, the path below it) for a member under one."""
    parts = path.split("/")
    for index in range(len(parts) - 2, -1, -1):
        if parts[index].endswith((".dist-info", ".egg-info")):
            return "/".join(parts[: index + 1]), "/".join(parts[index + 1 :])
    return None


def _license_file(directory: str, below: str) -> bool:
    return directory.endswith(".dist-info") and bool(LICENSE_FILE_RE.match(f"x.dist-info/{below}"))


def wanted_contents(path: str) -> bool:
    """Which layer members (clean relative paths) the base's contents are read from."""
    if path == DPKG_STATUS or path in OS_RELEASE:
        return True
    if path.startswith(DPKG_STATUS_DIR):
        name = path[len(DPKG_STATUS_DIR) :]
        return "/" not in name and not name.endswith(".md5sums")
    if path.startswith("usr/share/doc/") and path.endswith("/copyright"):
        return path.count("/") == 4
    if path.endswith(".egg-info"):
        return True  # distutils' single-file PKG-INFO
    found = _metadata_dir(path)
    if found is None:
        return False
    directory, below = found
    if directory.endswith(".egg-info"):
        return below == "PKG-INFO"
    return below in ("METADATA", "RECORD") or _license_file(directory, below)


def noted(path: str) -> bool:
    """The databases whose presence alone matters (kept by name, never read)."""
    return path in UNREAD_DATABASES


def _text(found: LayerFile | None) -> str:
    return found.data.decode("utf-8", "replace") if found is not None and found.data is not None else ""


def _refuse(label: str, path: str, what: str) -> OciError:
    return OciError(f"{label}: /{path}: {what}", field=f"/{path}")


def _os_release(files: dict[str, LayerFile], label: str) -> dict[str, str]:
    path = next((p for p in OS_RELEASE if files.get(p) is not None and files[p].data is not None), "")
    values: dict[str, str] = {}
    for line in _text(files.get(path)).splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("ID", "VERSION_ID", "NAME"):
            values[key.strip()] = value.strip().strip("\"'")[:128]
    found = {"id": values.get("ID", ""), "version_id": values.get("VERSION_ID", ""), "name": values.get("NAME", "")}
    for key in ("id", "version_id"):
        if not OS_ID_RE.fullmatch(found[key]):
            raise _refuse(label, path, f"{key.upper()}={found[key]!r}; expected lower-case letters, digits, . _ -")
    return found


def _dpkg_entries(files: dict[str, LayerFile], label: str) -> list[tuple[str, dict[str, str]]]:
    """(database file, entry) of every package whose files are installed."""
    databases = [DPKG_STATUS] + sorted(p for p in files if p.startswith(DPKG_STATUS_DIR))
    entries: list[tuple[str, dict[str, str]]] = []
    for database in databases:
        found = files.get(database)
        if found is None:
            continue
        if found.data is None:
            raise _refuse(label, database, f"is a {found.kind}; expected dpkg's database as a regular file")
        for number, entry in enumerate(stanzas(_text(found)), 1):
            status = entry.get("Status", "install ok installed" if database != DPKG_STATUS else "").split()
            if not status:
                raise _refuse(label, database, f"entry {number} ({entry.get('Package', 'no Package')}) has no Status")
            if status[-1] not in NOT_ON_DISK:
                entries.append((database, entry))
            if len(entries) > MAX_ENTRIES:
                raise _refuse(label, database, f"lists more than {MAX_ENTRIES} installed packages")
    return entries


def _deb(files: dict[str, LayerFile], database: str, entry: dict[str, str], label: str) -> dict[str, Any]:
    values = {
        "name": entry.get("Package", ""),
        "version": entry.get("Version", ""),
        "arch": entry.get("Architecture", ""),
    }
    for key, grammar, field in (
        ("name", DEB_NAME_RE, "Package"),
        ("version", DEB_VERSION_RE, "Version"),
        ("arch", DEB_ARCHITECTURE_RE, "Architecture"),
    ):
        if not grammar.fullmatch(values[key]):
            raise _refuse(
                label,
                database,
                f"the entry of {values['name'] or 'a package'!r} has {field} {values[key][:80]!r}; "
                f"expected {field} as Debian Policy spells it ({grammar.pattern})",
            )
    documented = files.get(f"usr/share/doc/{values['name']}/copyright")  # a link or none: no facts
    return {
        "name": values["name"],
        "version": values["version"],
        "architecture": values["arch"],
        "database": database,
        **copyright_facts(documented.data if documented is not None and documented.data is not None else b""),
    }


def _distribution(files: dict[str, LayerFile], directory: str, below: list[str], label: str) -> dict[str, Any]:
    """One distribution from its metadata directory; `below`: the kept paths under it, sorted."""
    metadata_path = directory if directory.endswith(".egg-info") and directory in files else ""
    metadata_path = metadata_path or f"{directory}/{'PKG-INFO' if directory.endswith('.egg-info') else 'METADATA'}"
    found = files.get(metadata_path)
    if found is None or found.data is None:
        what = "is missing" if found is None else f"is a {found.kind}"
        raise _refuse(label, metadata_path, f"{what}; an installed distribution's core metadata is a regular file")
    inside = [path[len(directory) + 1 :] for path in below]
    # licenses/ first (PEP 639's place), then the older LICENSE*, COPYING*, NOTICE*, AUTHORS*.
    named = [p for p in inside if p.startswith("licenses/")] + [
        p for p in inside if not p.startswith("licenses/") and _license_file(directory, p)
    ]
    licenses = (_text(files[f"{directory}/{p}"]) for p in named)
    parsed = core_metadata(_text(found))
    facts = metadata_facts(parsed, licenses)
    header = {key: " ".join(str(parsed[key]).split()) for key in ("Name", "Version") if parsed[key] is not None}
    for key, grammar in (("Name", PYTHON_NAME_RE), ("Version", PYTHON_VERSION_RE)):
        if not grammar.fullmatch(header.get(key, "")):
            said = f"{key} {header[key][:80]!r}" if key in header else f"no {key} field"
            raise _refuse(
                label, metadata_path, f"has {said}; core metadata names the distribution's {key} ({grammar.pattern})"
            )
    record = files.get(f"{directory}/RECORD")
    return {
        "name": header["Name"],
        "version": header["Version"],
        "path": f"/{directory}",
        "record_sha256": hashlib.sha256(record.data).hexdigest() if record is not None and record.data else "",
        "facts": facts,
    }


def base_contents(files: dict[str, LayerFile], base: dict[str, str], image: str, label: str) -> BaseContents:
    """The contents document of the base whose kept files are `files`; `base` gives its image,
    digest and platform."""
    for path, kind in sorted(UNREAD_DATABASES.items()):
        if path in files:
            raise OciError(
                f"{label} holds an {kind} package database (/{path}): Omni reads dpkg's database and Python's "
                "metadata only, and an SBOM without that base's packages would look complete when it is not; "
                "use a Debian- or Ubuntu-based vendor image",
                field="base.contents",
            )
    debs = [_deb(files, database, entry, label) for database, entry in _dpkg_entries(files, label)]
    os_release = _os_release(files, label)
    if debs and not os_release["id"]:
        raise OciError(
            f"{label} holds dpkg packages but no /etc/os-release naming its distribution (ID): their purls "
            "would have to guess it",
            field="/etc/os-release",
        )
    below: dict[str, list[str]] = {}  # each metadata directory's kept paths, gathered in one pass
    for path in sorted(files):
        found = _metadata_dir(path)
        if found is not None:
            below.setdefault(found[0], []).append(path)
    for path in files:
        if path.endswith(".egg-info") and files[path].data is not None:
            below.setdefault(path, [])
    python = [_distribution(files, directory, paths, label) for directory, paths in sorted(below.items())]
    document = {
        "schema_version": "1",
        "image": image,
        "base": base,
        "os": os_release,
        "dpkg": sorted(debs, key=lambda d: (d["name"], d["architecture"], d["version"], d["database"])),
        "python": sorted(python, key=lambda d: d["path"]),
    }
    return parse_document(BaseContents, document, label=f"the contents of {label}")


def contents_bytes(contents: BaseContents) -> bytes:
    """The document as the repository keeps it: two-space indent, sorted keys, one newline."""
    return (json.dumps(contents.model_dump(mode="json"), indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
