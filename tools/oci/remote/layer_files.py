"""A few files of a remote image, read from its layers as they stream: nothing is unpacked.

Each layer is fetched once through RegistryClient.stream_blob, which never reads past the
descriptor's size and checks the digest at the end; a layer whose bytes do not match its
descriptor fails the whole read, so nothing read from it is ever used. Layers apply in order
as a container runtime applies them: a later layer's file wins, a whiteout (`.wh.NAME`)
removes NAME and everything under it from the layers below, an opaque marker
(`.wh..wh..opq`) empties its directory of the layers below, and a file or link that replaces
a directory removes what was under it.

Only the members a caller asks for (`wanted`) are kept in memory, each capped; everything
else is skipped as the tar streams past, without being copied (tools.oci.remote.layer_stream, which
also tells gzip, zstd and plain tar apart by their first bytes).

Up to PARALLEL_LAYERS layers stream at once: a remote registry's round trips and per-connection
bandwidth then overlap (hashing, inflating and the socket reads release the GIL). What each
layer keeps and removes is applied in layer order afterwards, so the result is the serial one.
The first failure stops the other layers' reads at their next piece.
"""

from __future__ import annotations

import math
import os
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Callable, Iterator

from tools.oci.errors import OciError
from tools.oci.remote.layer_stream import ForwardFile, decompressed
from tools.oci.remote.registry import RegistryClient
from tools.oci.tar_members import member_path

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
END_OF_ARCHIVE = bytes(tarfile.BLOCKSIZE)
# What tarfile may read at once beyond a member's data: a pax or long-name header record.
MAX_HEADER_RECORD_BYTES = 1 << 20
MAX_LAYER_BYTES = 1 << 40
# Layers read at once (see the module's docstring), at most 4.
PARALLEL_LAYERS = max(2, min(4, os.cpu_count() or 2))


@dataclass(frozen=True)
class LayerFile:
    """A kept member: its bytes when it is a regular file, else None and what it is."""

    path: str
    layer: str
    data: bytes | None
    kind: str = "file"


def _checked_chunks(chunks: Iterator[bytes], deadline: float, passed: str, stopped: threading.Event) -> Iterator[bytes]:
    """A blob's chunks (RegistryClient.stream_blob: bounded by the descriptor's size while read,
    hashed against its digest at the end), stopping at the whole read's deadline or when
    another layer failed."""
    try:
        for chunk in chunks:
            if time.monotonic() > deadline:
                raise OciError(passed, field="deadline")
            if stopped.is_set():
                raise _Stopped()
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # a generator's own finally (the HTTP response) runs now, not at collection


class _Stopped(Exception):
    """Another layer failed: this one stops reading (its own result is never used)."""


@dataclass
class _LayerChanges:
    """What one layer does to the layers below it."""

    kept: dict[str, LayerFile] = field(default_factory=dict)
    removed: list[tuple[str, bool]] = field(default_factory=list)  # (path, the path itself too)
    members: int = 0


class _Overlay:
    """The kept files of the layers applied so far."""

    def __init__(self) -> None:
        self.files: dict[str, LayerFile] = {}

    def remove_under(self, directory: str, *, itself: bool) -> None:
        prefix = directory + "/" if directory else ""
        for path in [path for path in self.files if path.startswith(prefix) or (itself and path == directory)]:
            del self.files[path]


def _layer_changes(
    archive: tarfile.TarFile, layer: str, where: str, wanted: Callable[[PurePosixPath], bool], max_file_bytes: int
) -> _LayerChanges:
    """One layer's kept members and removals, in the order its tar lists them."""
    changes = _LayerChanges()
    kept, removed = changes.kept, changes.removed
    for member in archive:
        # tarfile keeps every member it has read; a base holds hundreds of thousands.
        archive.members.clear()
        changes.members += 1
        relative = member_path(where, member.name, kind="base layer")
        path = str(relative)
        if path == ".":
            continue
        name = relative.name
        if name == OPAQUE_MARKER:
            parent = str(relative.parent)
            removed.append(("" if parent == "." else parent, False))
            continue
        if name.startswith(WHITEOUT_PREFIX):
            hidden = name[len(WHITEOUT_PREFIX) :]
            if not hidden:
                raise OciError(f"{where}: whiteout {member.name!r} names nothing", field=member.name)
            removed.append((str(relative.parent / hidden), True))
            continue
        if not member.isdir():
            removed.append((path, False))  # a file or link replacing a directory hides what was under it
        if not wanted(relative):
            kept.pop(path, None)
            continue
        if member.isfile():
            if member.size > max_file_bytes:
                raise OciError(
                    f"{where}: {path} is {member.size} bytes; at most {max_file_bytes} are read for it", field=path
                )
            handle = archive.extractfile(member)
            data = handle.read(max_file_bytes + 1) if handle else b""
            kept[path] = LayerFile(path, layer, data)
        elif member.islnk():
            target = kept.get(str(member_path(where, member.linkname, kind="base layer")))
            kept[path] = LayerFile(
                path,
                layer,
                target.data if target else None,
                "file" if target and target.data is not None else "hard link",
            )
        else:
            kind = "symbolic link" if member.issym() else "directory" if member.isdir() else "special file"
            kept[path] = LayerFile(path, layer, None, kind)
    return changes


def _read_layer(
    client: RegistryClient,
    repository: str,
    digest: str,
    size: int,
    where: str,
    wanted: Callable[[PurePosixPath], bool],
    max_file_bytes: int,
    deadline: float,
    stopped: threading.Event,
    progress: bool,
) -> _LayerChanges:
    """One layer streamed once: bounded, decompressed, walked, and its digest checked."""
    started = time.monotonic()
    chunks = _checked_chunks(
        client.stream_blob(repository, digest, size),
        deadline,
        f"{where}: reading the layers passed their deadline",
        stopped,
    )
    try:
        pieces = decompressed(chunks)
        tar = ForwardFile(pieces, max_read=max_file_bytes + MAX_HEADER_RECORD_BYTES)
        with tarfile.open(fileobj=tar, mode="r:") as archive:
            changes = _layer_changes(archive, digest, where, wanted, max_file_bytes)
            # tarfile ends its walk quietly at a header it cannot parse; a runtime refuses the layer.
            if tar.last_read and tar.last_read != END_OF_ARCHIVE:
                raise OciError(
                    f"{where}: the tar stream has an invalid header at byte {archive.offset} "
                    "(expected a member header or the end-of-archive blocks)",
                    field=digest,
                )
        # The rest (end-of-archive padding, the last gzip trailer) is read and checked too, as a
        # runtime does, then the blob to its end: a digest that does not match is the answer
        # even when the bytes also fail to decompress.
        try:
            for _ in pieces:
                pass
        finally:
            for _ in chunks:
                pass
    except (tarfile.TarError, EOFError, OSError) as exc:
        for _ in chunks:  # the blob to its end (bounded by its size and the deadline): a digest
            pass  # that does not match is the answer, not what its bytes fail to decompress to
        raise OciError(f"{where} is not a readable tar layer: {exc}", field=digest) from None
    except Exception as exc:
        zstandard = sys.modules.get("zstandard")
        if zstandard is not None and isinstance(exc, zstandard.ZstdError):
            raise OciError(f"{where} is not a valid zstd stream: {exc}", field=digest) from None
        raise
    finally:
        chunks.close()
    if progress:
        seconds = max(time.monotonic() - started, 1e-6)
        print(
            f"pin: {where}: {size / 1e6:.1f} MB, {changes.members} members, {size / 1e6 / seconds:.1f} MB/s",
            file=sys.stderr,
            flush=True,
        )
    return changes


def read_layer_files(
    client: RegistryClient,
    repository: str,
    layers: list[dict[str, Any]],
    *,
    wanted: Callable[[PurePosixPath], bool],
    max_file_bytes: int,
    label: str,
    progress: bool = True,
    deadline: float = math.inf,
) -> dict[str, LayerFile]:
    """The wanted files of the image whose layer descriptors are `layers`, as the last layer
    leaves them. `client` is the RegistryClient of the registry holding `repository`.
    `deadline` (time.monotonic()) bounds the whole read: it is checked before every piece,
    and each piece waits at most the client's read timeout."""
    reads = []
    for number, descriptor in enumerate(layers, 1):
        digest, size = descriptor.get("digest"), descriptor.get("size")
        if (
            not isinstance(digest, str)
            or not isinstance(size, int)
            or isinstance(size, bool)
            or not 0 <= size <= MAX_LAYER_BYTES
        ):
            raise OciError(f"{label}: layer {number} has no valid digest and size", field=f"layers[{number - 1}]")
        reads.append((digest, size, f"{label} layer {number}/{len(layers)} ({digest})"))
    stopped = threading.Event()
    changes: dict[int, _LayerChanges] = {}
    with ThreadPoolExecutor(max_workers=PARALLEL_LAYERS, thread_name_prefix="layer") as pool:
        futures = {
            pool.submit(
                _read_layer,
                client,
                repository,
                digest,
                size,
                where,
                wanted,
                max_file_bytes,
                deadline,
                stopped,
                progress,
            ): index
            for index, (digest, size, where) in enumerate(reads)
        }
        try:
            for future in as_completed(futures):
                changes[futures[future]] = future.result()
        except BaseException:
            stopped.set()  # the first failure is the answer: the other reads stop at their next piece
            for future in futures:
                future.cancel()
            raise
    overlay = _Overlay()
    for index in range(len(reads)):  # in layer order: a later layer's changes apply over earlier ones
        for path, itself in changes[index].removed:
            overlay.remove_under(path, itself=itself)
        overlay.files.update(changes[index].kept)
    return overlay.files
