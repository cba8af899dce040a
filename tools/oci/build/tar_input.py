"""Layer inputs that are tar files other rules made: `.tar`, `.tar.gz`/`.tgz`, `.tar.zst`.

Each member becomes a layer entry under a prefix, normalised like every other entry (owner
0:0, fixed time and modes): a regular file, a directory, a symlink, or a hard link (written
as a copy of its target, so the layer never depends on member order). Anything else (a
device, a FIFO), a name that is absolute or climbs out with `..`, or a link to a member the
tar does not hold is refused, naming the tar and the member.

A compressed tar is first decompressed to a plain one beside the output: the layer is
written in sorted order, and seeking backwards in a compressed stream restarts it. The tar is
read by omni_oci.format.tar_reader, as the container runtimes read it.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Iterator

from omni_oci.format.compression import GZIP_MAGIC, ZSTD_MAGIC
from omni_oci.format.errors import OciError
from omni_oci.format.tar_members import member_path
from omni_oci.format.tar_reader import TarMember, TarStream, read_members

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


def _members(source: Path, plain: Path) -> list[tuple[TarMember, int]]:
    """Every member of the plain tar, with where its data starts; read as the runtimes read it."""
    members = []
    try:
        with plain.open("rb") as handle:
            stream = TarStream.of_file(handle)
            for member, _ in read_members(stream, f"layer tar {source}", field=str(source)):
                members.append((member, stream.position))
    except OSError as exc:
        raise OciError(f"layer tar {source} is unreadable: {exc.strerror}", field=str(source)) from None
    return members


def tar_entries(source: Path, prefix: str, scratch: Path) -> Iterator[dict[str, Any]]:
    """Layer entries (see tools.oci.build.layer) for every member of `source`, placed under `prefix`."""
    plain = _plain_copy(source, scratch)
    members = _members(source, plain)
    base = PurePosixPath("/" + prefix.strip("/"))
    by_name = {str(_member_path(source, member.name)): (member, at) for member, at in members}
    for member, at in members:
        relative = _member_path(source, member.name)
        if str(relative) == ".":
            continue
        dest = str(base / relative)
        if member.kind == "dir":
            yield {"dest": dest, "type": "dir"}
        elif member.kind == "symlink":
            yield {"dest": dest, "type": "symlink", "target": member.linkname}
        elif member.kind in ("file", "hardlink"):
            target, target_at = member, at
            if member.kind == "hardlink":
                target, target_at = by_name.get(str(_member_path(source, member.linkname)), (None, 0))
                if target is None or target.kind != "file":
                    raise OciError(
                        f"layer tar {source}: hard link {member.name!r} points to {member.linkname!r}, "
                        "which is not a regular file in the tar",
                        field=f"{source}:{member.name}",
                    )
            mode = 0o755 if target.mode & 0o111 else 0o644
            yield {
                "dest": dest,
                "type": "file",
                "tar": (str(plain), target_at, target.size),
                "size": target.size,
                "mode": mode,
            }
        else:
            raise OciError(
                f"layer tar {source}: member {member.name!r} is a device, FIFO or other special file; "
                "a layer holds files, directories and links only",
                field=f"{source}:{member.name}",
            )


class _Slice:
    """`size` bytes of an open file from `offset`, as a file tarfile copies from."""

    def __init__(self, handle: BinaryIO, offset: int, size: int) -> None:
        handle.seek(offset)
        self._handle, self._left = handle, size

    def read(self, count: int = -1) -> bytes:
        count = self._left if count is None or count < 0 else min(count, self._left)
        data = self._handle.read(count)
        self._left -= len(data)
        return data

    def __enter__(self) -> "_Slice":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class TarReader:
    """Opens each input tar once and reads members' data from it while the layer is written."""

    def __init__(self) -> None:
        self._open: dict[str, BinaryIO] = {}

    def read(self, location: tuple[str, int, int]) -> _Slice:
        path, offset, size = location
        handle = self._open.get(path)
        if handle is None:
            handle = self._open[path] = open(path, "rb")
        return _Slice(handle, offset, size)

    def close(self) -> None:
        for handle in self._open.values():
            handle.close()
        self._open.clear()
