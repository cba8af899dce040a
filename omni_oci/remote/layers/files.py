"""A few files of a remote image, read from its layers as they stream: nothing is unpacked.

Each layer is fetched once through RegistryClient.stream_blob, which never reads past the
descriptor's size and checks the digest at the end; a layer whose bytes do not match its
descriptor fails the whole read, so nothing read from it is ever used. Its tar is read by
omni_oci.format.tar_reader (members exactly as the runtimes' Go reader takes them) and applied as a
runtime applies layers (omni_oci.remote.layers.overlay): whiteouts, opaque markers, replaced
directories, and no member written through a symbolic link.

Only the members a caller asks for (`wanted`) are kept in memory, each capped and all together
capped (MAX_KEPT_BYTES unless the caller says); members whose presence alone matters (`noted`:
a package database Omni does not read, say) are kept by name, without their bytes; everything
else is skipped as the tar streams past, without being copied (omni_oci.remote.layers.stream also
tells gzip, zstd and plain tar apart).

Up to PARALLEL_LAYERS layers stream at once, so a remote registry's round trips and
per-connection bandwidth overlap (hashing, inflating and the socket reads release the GIL).
Each layer's reader hands its members, in batches through a bounded queue, to the one thread
that applies them in layer order: what a member means depends on every member before it
(a link it is written through, a directory it replaces), and the queue bounds memory however
many members a layer holds. The first failure stops every read at its next piece.
"""

from __future__ import annotations

import math
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from omni_oci.format.errors import OciError
from omni_oci.format.tar_members import PATH_MAX, clean_name
from omni_oci.format.tar_reader import TarMember, TarStream, read_members
from omni_oci.remote.layers.overlay import LayerFile, Overlay
from omni_oci.remote.layers.stream import decompressed
from omni_oci.remote.registry import RegistryClient

__all__ = ["LayerFile", "read_layer_files"]

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
MAX_LAYER_BYTES = 1 << 40
# Bytes of wanted members read from all layers together: an engine's metadata is a few MB.
MAX_KEPT_BYTES = 64 << 20
# Layers read at once (see the module's docstring), at most 4.
PARALLEL_LAYERS = max(2, min(4, os.cpu_count() or 2))
BATCH_MEMBERS = 2048
QUEUED_BATCHES = 8
_POLL_S = 0.05


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


@dataclass(frozen=True)
class _Read:
    """What every layer's reader shares."""

    client: RegistryClient
    repository: str
    wanted: Callable[[str], bool]
    noted: Callable[[str], bool]
    max_file_bytes: int
    max_kept_bytes: int
    deadline: float
    stopped: threading.Event
    progress: bool
    kept: list[int]  # bytes kept so far, all layers together (one cell, under `lock`)
    lock: threading.Lock


# An applied member: (what, path, payload, wanted) with what one of
# dir, file, symlink, hardlink, whiteout, opaque.
_Event = tuple[str, str, Any, bool]


def _kept_data(read: _Read, member: TarMember, data: Any, path: str, where: str) -> bytes:
    if member.size > read.max_file_bytes:
        raise OciError(
            f"{where}: {path} is {member.size} bytes; at most {read.max_file_bytes} are read for it", field=path
        )
    with read.lock:
        read.kept[0] += member.size
        if read.kept[0] > read.max_kept_bytes:
            raise OciError(f"{where}: the wanted members exceed {read.max_kept_bytes} bytes in all", field=path)
    kept = data.read(member.size)
    if len(kept) < member.size:
        raise OciError(f"{where}: {path} is cut short by the end of the stream", field=path)
    return kept


def _event(read: _Read, member: TarMember, data: Any, layer: str, where: str) -> _Event | None:
    """What `member` does to the tree, its wanted bytes read."""
    path = clean_name(where, member.name, kind="base layer")
    if path == ".":
        return None
    parent, _, name = path.rpartition("/")
    if name == OPAQUE_MARKER:
        return ("opaque", path, None, False)
    if name.startswith(WHITEOUT_PREFIX):
        if not name[len(WHITEOUT_PREFIX) :]:
            raise OciError(f"{where}: whiteout {member.name!r} names nothing", field=member.name)
        hidden = name[len(WHITEOUT_PREFIX) :]
        return ("whiteout", path, f"{parent}/{hidden}" if parent else hidden, False)
    if member.kind != "dir" and read.noted(path):
        return ("file", path, LayerFile(path, layer, None, "noted " + member.kind), True)
    wanted = read.wanted(path)
    if member.kind == "dir":
        return ("dir", path, None, wanted)
    if member.kind == "symlink":
        if len(member.linkname.encode("utf-8", "surrogateescape")) >= PATH_MAX:
            raise OciError(f"{where}: symbolic link {path} has a target longer than Linux allows", field=path)
        return ("symlink", path, member.linkname, wanted)
    if member.kind == "hardlink":
        return ("hardlink", path, clean_name(where, member.linkname, kind="base layer"), wanted)
    if not wanted:
        return ("file", path, None, False)
    if member.kind != "file":
        return ("file", path, LayerFile(path, layer, None, "special file"), True)
    return ("file", path, LayerFile(path, layer, _kept_data(read, member, data, path, where)), True)


def _put(read: _Read, out: queue.Queue, item: Any) -> None:
    while True:
        if read.stopped.is_set():
            raise _Stopped()
        try:
            out.put(item, timeout=_POLL_S)
            return
        except queue.Full:
            continue


def _walk(read: _Read, pieces: Iterator[bytes], digest: str, where: str, out: queue.Queue) -> int:
    """Every member of the layer's tar as events, in batches; how many members it holds."""
    batch: list[_Event] = []
    members = 0
    for member, data in read_members(TarStream(pieces), where):
        members += 1
        event = _event(read, member, data, digest, where)
        if event is not None:
            batch.append(event)
        if len(batch) >= BATCH_MEMBERS:
            _put(read, out, batch)
            batch = []
    _put(read, out, batch)
    return members


def _read_layer(read: _Read, digest: str, size: int, where: str, out: queue.Queue) -> None:
    """One layer streamed once: bounded, decompressed, walked, its digest checked; its events
    go to `out`, then None."""
    started = time.monotonic()
    passed = f"{where}: reading the layers passed their deadline"
    chunks = _checked_chunks(
        read.client.stream_blob(read.repository, digest, size), read.deadline, passed, read.stopped
    )
    try:
        refusal: OciError | None = None
        try:
            pieces = decompressed(chunks)
            members = _walk(read, pieces, digest, where, out)
            for _ in pieces:  # the rest (the last gzip trailer) is read and checked too, as a runtime does
                pass
        except OciError as exc:
            refusal = exc
        except (EOFError, OSError) as exc:
            refusal = OciError(f"{where} is not a readable tar layer: {exc}", field=digest)
        # The blob to its end (bounded by its size and the deadline), read or refused alike: a
        # digest that does not match is the answer, not what its bytes fail to decompress to.
        for _ in chunks:
            pass
        if refusal is not None:
            raise refusal
    except Exception as exc:
        zstandard = sys.modules.get("zstandard")
        if zstandard is not None and isinstance(exc, zstandard.ZstdError):
            raise OciError(f"{where} is not a valid zstd stream: {exc}", field=digest) from None
        raise
    finally:
        chunks.close()
    _put(read, out, None)
    if read.progress:
        seconds = max(time.monotonic() - started, 1e-6)
        print(
            f"pin: {where}: {size / 1e6:.1f} MB, {members} members, {size / 1e6 / seconds:.1f} MB/s",
            file=sys.stderr,
            flush=True,
        )


def _apply(overlay: Overlay, event: _Event) -> None:
    """One member applied; each of the overlay's operations first refuses a path through a link."""
    what, path, payload, wanted = event
    if what == "dir":
        overlay.directory(path)
    elif what == "file":
        overlay.non_directory(path, payload)
    elif what == "symlink":
        kept = LayerFile(path, overlay.digest, None, "symbolic link") if wanted else None
        overlay.non_directory(path, kept, payload)
    elif what == "hardlink":
        overlay.hard_link(path, payload, overlay.digest, wanted)
    elif what == "whiteout":  # the hidden path has the marker's parents
        overlay.whiteout(payload)
    else:  # the marker's parents include the directory it empties
        overlay.check_parents(path)
        overlay.opaque(path.rpartition("/")[0])


def _next_batch(read: _Read, source: queue.Queue, failures: list[BaseException]) -> list[_Event] | None:
    while True:
        if failures:
            raise failures[0]
        if time.monotonic() > read.deadline:
            raise OciError("reading the layers passed their deadline", field="deadline")
        try:
            return source.get(timeout=_POLL_S)
        except queue.Empty:
            continue


def _layer_reads(layers: list[dict[str, Any]], label: str) -> list[tuple[str, int, str]]:
    """(digest, size, label) of each layer descriptor, refused unless both are valid."""
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
    return reads


def read_layer_files(
    client: RegistryClient,
    repository: str,
    layers: list[dict[str, Any]],
    *,
    wanted: Callable[[str], bool],
    max_file_bytes: int,
    label: str,
    progress: bool = True,
    deadline: float = math.inf,
    noted: Callable[[str], bool] = lambda path: False,
    max_kept_bytes: int = MAX_KEPT_BYTES,
) -> dict[str, LayerFile]:
    """The wanted files of the image whose layer descriptors are `layers`, as the last layer
    leaves them, and the noted ones by name (LayerFile.data None, kind "noted ...").
    `client` is the RegistryClient of the registry holding `repository`.
    `deadline` (time.monotonic()) bounds the whole read: it is checked before every piece,
    and each piece waits at most the client's read timeout."""
    reads = _layer_reads(layers, label)
    read = _Read(
        client,
        repository,
        wanted,
        noted,
        max_file_bytes,
        max_kept_bytes,
        deadline,
        threading.Event(),
        progress,
        [0],
        threading.Lock(),
    )
    queues = [queue.Queue(maxsize=QUEUED_BATCHES) for _ in reads]
    failures: list[BaseException] = []

    def produce(index: int) -> None:
        digest, size, where = reads[index]
        try:
            _read_layer(read, digest, size, where, queues[index])
        except _Stopped:
            pass
        except BaseException as exc:  # the first failure is the answer: every other read stops
            failures.append(exc)
            read.stopped.set()

    overlay = Overlay(label)
    with ThreadPoolExecutor(max_workers=PARALLEL_LAYERS, thread_name_prefix="layer") as pool:
        for index in range(len(reads)):
            pool.submit(produce, index)
        try:
            for index, (digest, _, where) in enumerate(reads):  # applied in layer order
                overlay.begin_layer(index, where, digest)
                while (batch := _next_batch(read, queues[index], failures)) is not None:
                    for event in batch:
                        _apply(overlay, event)
        except BaseException:
            read.stopped.set()
            raise
    return overlay.files()
