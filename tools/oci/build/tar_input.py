"""Layer inputs that are tar files other rules made: `.tar`, `.tar.gz`/`.tgz`, `.tar.zst`.

Each member becomes a layer entry under a prefix, normalised like every other entry (owner
0:0, fixed time and modes): a regular file, a directory, a symlink, or a hard link (written
as a copy of its target, so the layer never depends on member order). Anything else (a
device, a FIFO), a name that is absolute or climbs out with `..`, or a link to a member the
tar does not hold is refused, naming the tar and the member.

A compressed tar is first decompressed to a plain one beside the output: the layer is
written in sorted order, and seeking backwards in a compressed stream restarts it.
"""

from __future__ import annotations

import gzip
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from tools.oci.errors import OciError
from tools.oci.tar_members import member_path

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
COPY_CHUNK = 1 << 20


def _plain_copy(source: Path, scratch: Path) -> Path:
    """`source` itself when it is a plain tar, else a decompressed copy in `scratch`."""
    try:
        with source.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise OciError(f"layer tar {source} is unreadable: {exc.strerror}", field=str(source)) from None
    if magic[:2] != GZIP_MAGIC and magic != ZSTD_MAGIC:
        return source
    scratch.mkdir(parents=True, exist_ok=True)
    plain = scratch / (source.name + ".plain.tar")
    if magic == ZSTD_MAGIC:
        import zstandard  # the locked zstd binding: Python 3.11's standard library has none

        try:
            with source.open("rb") as compressed, plain.open("wb") as out:
                zstandard.ZstdDecompressor().copy_stream(compressed, out)
        except zstandard.ZstdError as exc:
            raise OciError(f"layer tar {source} is not a valid zstd stream: {exc}", field=str(source)) from None
        return plain
    try:
        with gzip.open(source, "rb") as compressed, plain.open("wb") as out:
            shutil.copyfileobj(compressed, out, COPY_CHUNK)
    except (OSError, EOFError) as exc:
        raise OciError(f"layer tar {source} is not a valid gzip stream: {exc}", field=str(source)) from None
    return plain


def _member_path(source: Path, name: str) -> PurePosixPath:
    return member_path(source, name, kind="layer tar")


def tar_entries(source: Path, prefix: str, scratch: Path) -> Iterator[dict[str, Any]]:
    """Layer entries (see tools.oci.build.layer) for every member of `source`, placed under `prefix`."""
    plain = _plain_copy(source, scratch)
    try:
        archive = tarfile.open(plain, mode="r:")
        members = archive.getmembers()
    except (tarfile.TarError, OSError) as exc:
        raise OciError(f"layer tar {source} is not a tar archive: {exc}", field=str(source)) from None
    base = PurePosixPath("/" + prefix.strip("/"))
    by_name = {str(_member_path(source, m.name)): m for m in members}
    for member in members:
        relative = _member_path(source, member.name)
        if str(relative) == ".":
            continue
        dest = str(base / relative)
        if member.isdir():
            yield {"dest": dest, "type": "dir"}
        elif member.issym():
            yield {"dest": dest, "type": "symlink", "target": member.linkname}
        elif member.isfile() or member.islnk():
            target = member
            if member.islnk():
                target = by_name.get(str(_member_path(source, member.linkname)))
                if target is None or not target.isfile():
                    raise OciError(
                        f"layer tar {source}: hard link {member.name!r} points to {member.linkname!r}, "
                        "which is not a regular file in the tar",
                        field=f"{source}:{member.name}",
                    )
            mode = 0o755 if target.mode & 0o111 else 0o644
            yield {"dest": dest, "type": "file", "tar": (str(plain), target.name), "size": target.size, "mode": mode}
        else:
            raise OciError(
                f"layer tar {source}: member {member.name!r} is a device, FIFO or other special file; "
                "a layer holds files, directories and links only",
                field=f"{source}:{member.name}",
            )


class TarReader:
    """Opens each input tar once and reads members from it while the layer is written."""

    def __init__(self) -> None:
        self._open: dict[str, tarfile.TarFile] = {}

    def read(self, location: tuple[str, str]):
        path, name = location
        archive = self._open.get(path)
        if archive is None:
            archive = self._open[path] = tarfile.open(path, mode="r:")
        handle = archive.extractfile(name)
        if handle is None:
            raise OciError(f"layer tar {path}: member {name!r} has no content", field=f"{path}:{name}")
        return handle

    def close(self) -> None:
        for archive in self._open.values():
            archive.close()
        self._open.clear()
