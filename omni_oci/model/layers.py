"""One checkpoint file as one uncompressed tar layer: the exact bytes, their digest, and the
ModelPack media type of the file's role.

A layer is a ustar header, the file's bytes, zero padding to the next 512-byte block and the two
end-of-archive blocks; nothing else. The header is fixed but for the name and size (mode 0644,
owner 0:0, mtime 0, no user or group names), so the same file gives the same layer digest on any
host. The header is written here rather than by `tarfile` because tarfile's bytes for the same
member have changed between Python releases (pax records, device fields), and a digest must not
depend on which Python packed it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

from attest.errors import AttestError
from attest.hashing import new_digest
from attest.lock import LockedFile
from attest.tree import open_regular
from omni_oci.format.layout import TITLE
from omni_oci.model.errors import ModelError

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
# Per read: large enough that hashing, not system calls, is the cost, and small enough that a
# push's memory stays flat (4 jobs, 2 GB in 8 files, push --model --lock: 8 MB reads 188 MB
# peak RSS, 2 MB 90 MB, 1 MB 74 MB; the time and CPU the same within 2%).
READ_BYTES = 2 << 20
FILE_MODE = 0o644

WEIGHT = "application/vnd.cncf.model.weight.v1.tar"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.tar"
DOC = "application/vnd.cncf.model.doc.v1.tar"
CODE = "application/vnd.cncf.model.code.v1.tar"
IMAGE_LAYER = "application/vnd.oci.image.layer.v1.tar"

# Layer annotations: the ModelPack keys (model-spec docs/annotations.md), the OCI title, and the
# file's own digest from the lock (so `verify` checks it without pulling the layer).
FILEPATH = "org.cncf.model.filepath"
FILE_METADATA = "org.cncf.model.file.metadata+json"
FILE_DIGEST = "omni.model.file.digest"

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".msgpack", ".h5", ".ckpt")
CODE_SUFFIXES = (".py", ".so", ".pyc")
DOC_SUFFIXES = (".md", ".rst", ".pdf", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp")
DOC_STEMS = ("README", "LICENSE", "LICENCE", "NOTICE", "COPYING", "USE_POLICY", "CITATION")


def media_type(path: str) -> str:
    """The ModelPack layer type of a checkpoint file, by its name."""
    name = PurePosixPath(path).name
    lower = name.lower()
    if lower.endswith(WEIGHT_SUFFIXES):
        return WEIGHT
    if lower.endswith(CODE_SUFFIXES):
        return CODE
    if lower.endswith(DOC_SUFFIXES) or name.split(".", 1)[0].upper() in DOC_STEMS:
        return DOC
    return WEIGHT_CONFIG


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _split_name(path: str) -> tuple[bytes, bytes]:
    """(name, prefix) fields of ustar: a name over 100 bytes is split at a slash into a prefix
    of at most 155 bytes and a name of at most 100."""
    raw = path.encode("utf-8", "surrogateescape")
    if len(raw) <= 100:
        return raw, b""
    for cut in range(len(raw) - 1, 0, -1):
        if raw[cut : cut + 1] == b"/" and cut <= 155 and len(raw) - cut - 1 <= 100:
            return raw[cut + 1 :], raw[:cut]
    raise ModelError(
        f"{path}: a path that ustar cannot hold (over 100 bytes with no slash leaving at most 155 before "
        "it and 100 after); rename the file in the checkpoint",
        field=path,
    )


def tar_header(path: str, size: int) -> bytes:
    """The member header of `path` holding `size` bytes (ustar, fixed metadata)."""
    name, prefix = _split_name(path)
    header = bytearray(BLOCK)
    header[0:100] = name.ljust(100, b"\0")
    header[100:108] = _octal(FILE_MODE, 8)
    header[108:116] = _octal(0, 8)
    header[116:124] = _octal(0, 8)
    header[124:136] = _octal(size, 12)
    header[136:148] = _octal(0, 12)
    header[148:156] = b" " * 8
    header[156:157] = b"0"
    header[257:265] = b"ustar\x0000"
    header[329:337] = _octal(0, 8)
    header[337:345] = _octal(0, 8)
    header[345:500] = prefix.ljust(155, b"\0")
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def padding(size: int) -> bytes:
    return bytes(-size % BLOCK)


def layer_size(size: int) -> int:
    """The bytes of the layer of a file of `size` bytes."""
    return BLOCK + size + (-size % BLOCK) + len(END_OF_ARCHIVE)


def file_metadata(path: str, size: int) -> str:
    """The ModelPack file metadata annotation: what the layer's header says of the file."""
    return json.dumps(
        {
            "name": path,
            "mode": FILE_MODE,
            "uid": 0,
            "gid": 0,
            "size": size,
            "mtime": "1970-01-01T00:00:00Z",
            "typeflag": ord("0"),
        },
        separators=(",", ":"),
        sort_keys=True,
    )


@dataclass(frozen=True)
class FileLayer:
    """A locked file's layer: its digest and size, where the bytes come from."""

    item: LockedFile
    digest: str
    size: int

    @property
    def media_type(self) -> str:
        return media_type(self.item.path)

    def descriptor(self, image: bool) -> dict:
        """The layer's descriptor in the plain image manifest (`image`) or the ModelPack one."""
        return {
            "mediaType": IMAGE_LAYER if image else self.media_type,
            "digest": self.digest,
            "size": self.size,
            "annotations": {
                FILE_DIGEST: f"{self.item.algorithm}:{self.item.digest}",
                FILEPATH: self.item.path,
                FILE_METADATA: file_metadata(self.item.path, self.item.size),
                TITLE: self.item.path,
            },
        }


def stream_file_layer(root: Path, item: LockedFile, on_bytes: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """The layer's bytes, read from the file at `root`/`item.path` (no symlink followed); the
    file is checked against the lock as it is read (size, content digest, unchanged while read)
    and the stream raises, naming the file, before its last bytes when it differs."""
    yield tar_header(item.path, item.size)
    content = new_digest(item.algorithm, item.size)
    try:
        with open_regular(root, item.path) as fd:
            before = os.fstat(fd)
            if before.st_size != item.size:
                raise ModelError(
                    f"{item.path}: {before.st_size} bytes in {root}, the checkpoint lock says {item.size}",
                    field=item.path,
                )
            offset = 0
            while offset < item.size:
                block = os.pread(fd, min(READ_BYTES, item.size - offset), offset)
                if not block:
                    break
                offset += len(block)
                content.update(block)
                if on_bytes is not None:
                    on_bytes(len(block))
                if offset < item.size:
                    yield block
                else:
                    last = block
            after = os.fstat(fd)
    except AttestError as exc:
        if isinstance(exc, ModelError):
            raise
        raise ModelError(str(exc), field=exc.field or item.path) from None
    except OSError as exc:
        raise ModelError(f"{item.path} cannot be read: {exc.strerror or exc}", field=item.path) from None
    if offset != item.size or (before.st_mtime_ns, before.st_ctime_ns) != (after.st_mtime_ns, after.st_ctime_ns):
        raise ModelError(f"{item.path} changed while it was read", field=item.path)
    if content.hexdigest() != item.digest:
        raise ModelError(
            f"{item.path}: {item.algorithm} {content.hexdigest()}, the checkpoint lock says {item.digest}",
            field=item.path,
        )
    if item.size:
        yield last
    yield padding(item.size) + END_OF_ARCHIVE


@dataclass(frozen=True)
class FileLayerStream:
    """A packed file's layer bytes from any offset (omni_oci.remote.registry's OffsetStream), so a
    chunked upload streams each chunk from the file and resumes where the registry stopped.

    Nothing is hashed here: `pack` computed the layer's digest from the file checked against the
    lock, and the registry takes the blob only under that digest, so a file changed since is
    refused there, naming the digest (hashing it again here cost a second pass over every byte:
    0.6 s of CPU per GB on these cores). What is checked here needs no pass: the file's size is
    the lock's, and it does not change while it is read."""

    root: Path
    item: LockedFile

    def from_offset(self, offset: int) -> Iterator[bytes]:
        header, size = tar_header(self.item.path, self.item.size), self.item.size
        if offset < BLOCK:
            yield header[offset:]
        start = max(offset - BLOCK, 0)
        try:
            with open_regular(self.root, self.item.path) as fd:
                before = os.fstat(fd)
                if before.st_size != size:
                    raise ModelError(
                        f"{self.item.path}: {before.st_size} bytes in {self.root}, the checkpoint lock says {size}",
                        field=self.item.path,
                    )
                yield from _pread_all(fd, start, size, self.item.path)
                if _times(os.fstat(fd)) != _times(before):
                    raise ModelError(f"{self.item.path} changed while it was read", field=self.item.path)
        except AttestError as exc:
            if isinstance(exc, ModelError):
                raise
            raise ModelError(str(exc), field=exc.field or self.item.path) from None
        tail = padding(size) + END_OF_ARCHIVE
        yield tail[max(offset - BLOCK - size, 0) :]


def _times(found: os.stat_result) -> tuple[int, int, int]:
    return found.st_size, found.st_mtime_ns, found.st_ctime_ns


def _pread_all(fd: int, start: int, size: int, path: str) -> Iterator[bytes]:
    while start < size:
        block = os.pread(fd, min(READ_BYTES, size - start), start)
        if not block:
            raise ModelError(f"{path} is shorter than the lock says", field=path)
        start += len(block)
        yield block


def hash_file_layer(root: Path, item: LockedFile, on_bytes: Callable[[int], None] | None = None) -> FileLayer:
    """The file's layer digest, the file checked against the lock on the way."""
    digest, size = hashlib.sha256(), 0
    for piece in stream_file_layer(root, item, on_bytes):
        digest.update(piece)
        size += len(piece)
    return FileLayer(item, "sha256:" + digest.hexdigest(), size)
