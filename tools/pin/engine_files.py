"""The engine's identity read from a base image's layers in memory, exactly as the launcher
and boot compute it at start from the installed files (attest.engine): commit, its kind, and
the canonical RECORD digest.

Only the engine's own metadata is kept while the layers stream (omni_oci.remote.layers.files): the
METADATA, RECORD and direct_url.json of every `*.dist-info` directory named like the engine,
and `<package>/_version.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from attest.engine import (
    ENGINE_DISTRIBUTIONS,
    InstalledDistribution,
    distribution_dirs,
    normalized_name,
    read_distribution,
)
from attest.errors import AttestError
from omni_oci.format.errors import OciError
from omni_oci.remote.layers.files import LayerFile

DIST_INFO_FILES = frozenset({"METADATA", "RECORD", "direct_url.json"})
VERSION_FILE = "_version.py"


def wanted_files(engine: str) -> Callable[[str], bool]:
    """Which layer members (clean relative paths) to keep for `engine`'s identity."""
    names = {normalized_name(name) for name in ENGINE_DISTRIBUTIONS[engine]}

    def wanted(path: str) -> bool:
        parts = path.rsplit("/", 2)
        if len(parts) < 2:
            return False
        directory, name = parts[-2], parts[-1]
        if name == VERSION_FILE:
            return directory == engine
        if name not in DIST_INFO_FILES or not directory.endswith(".dist-info"):
            return False
        return normalized_name(directory[: -len(".dist-info")].rsplit("-", 1)[0]) in names

    return wanted


@dataclass(frozen=True)
class LayerSite:
    """A site directory of the image (attest.engine.SiteFiles) over the kept layer files."""

    root: Path
    files: dict[str, LayerFile]
    label: str

    def _key(self, relative: str) -> str:
        return str(PurePosixPath(str(self.root).lstrip("/")) / relative)

    def children(self) -> list[str]:
        prefix = str(self.root).lstrip("/") + "/"
        return sorted({path[len(prefix) :].split("/")[0] for path in self.files if path.startswith(prefix)})

    def exists(self, relative: str) -> bool:
        return self._key(relative) in self.files

    def read(self, relative: str, *, max_bytes: int) -> bytes:
        found = self.files.get(self._key(relative))
        where = f"{self.label}: /{self._key(relative)}"
        if found is None:
            raise AttestError(f"{where} is missing", field=str(self.root / relative))
        if found.data is None:
            raise AttestError(
                f"{where} is a {found.kind} in layer {found.layer}; expected a regular file",
                field=str(self.root / relative),
            )
        if len(found.data) > max_bytes:
            raise AttestError(f"{where} is larger than {max_bytes} bytes", field=str(self.root / relative))
        return found.data


def engine_identity(files: dict[str, LayerFile], engine: str, label: str) -> InstalledDistribution:
    """The one installed distribution of `engine` in the image; refuses none or several."""
    sites = sorted({PurePosixPath(path).parent.parent for path in files if PurePosixPath(path).name == "METADATA"})
    found: list[InstalledDistribution] = []
    for site_path in sites:
        site = LayerSite(Path("/") / site_path, files, label)
        for dist_info in distribution_dirs(site, ENGINE_DISTRIBUTIONS[engine]):
            installed = read_distribution(site, dist_info, ENGINE_DISTRIBUTIONS[engine], engine)
            if installed is not None:
                found.append(installed)
    if not found:
        raise OciError(
            f"{label} holds no installed {engine} (looked for the *.dist-info of "
            f"{', '.join(ENGINE_DISTRIBUTIONS[engine])} in every layer, whiteouts applied)",
            field="engine",
        )
    if len(found) > 1:
        raise OciError(
            f"{label} holds {len(found)} installed {engine} distributions: "
            f"{', '.join(str(item.dist_info) for item in found)}; expected exactly one",
            field="engine",
        )
    return found[0]
