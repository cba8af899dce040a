"""An offline mirror: a release's closures as an OCI image layout on disk (`mirror --to-dir`),
and that directory read back for a push on the far side of an air gap (`mirror --from-dir`).

The directory is an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/`) that skopeo,
oras and umoci read, with every referrer and legacy tag listed in `index.json`, plus
`omni-mirror.json` (tools.release.record), written last: a directory without it is unfinished,
and a second `--to-dir` into it keeps each blob that hashes right and fetches the rest.

Threat model: the directory crossed an air gap on a disk nobody vouches for. Its record is
read once, bounded and strictly; every manifest is read bounded and checked against its digest
before it is parsed; what each manifest names is derived from its bytes, never from the
record's list (a blob the record lists and no manifest names, or the reverse, is refused); a
referrer must name its recorded subject, a legacy tag must be that subject's; a blob is hashed
as it is uploaded (tools.oci.remote.copy); no path is followed through a link.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attest.documents import parse_document
from attest.errors import AttestError
from attest.files import RUN_LOCK, exclusive_run, write_atomic
from attest.reader import loads_object, read_file
from tools.oci.format.errors import OciError
from tools.oci.format.layout import OCI_INDEX, canonical
from tools.oci.remote.copy import FileBlob, HashedSource
from tools.oci.remote.parallel import blob_progress, in_parallel
from tools.oci.remote.registry import MAX_MANIFEST_BYTES
from tools.oci.signing.legacy import tag_for
from tools.release.closure import IMAGE, LEGACY, LEGACY_SUFFIXES, REFERRER, Blob, Closure, Manifest, parts, subject_of
from tools.release.record import MAX_RECORD_BYTES, RECORD, MirrorRecord, RecordedClosure

LAYOUT_MARKER = "oci-layout"
PARTIAL = ".omni-mirror.partial"  # an unfinished --to-dir: the sha256 of the record it writes
REF_NAME = "org.opencontainers.image.ref.name"
ROLE_ANNOTATION = "dev.omni.mirror.role"
WRITE_JOBS = 4


def blob_file(directory: Path, digest: str) -> Path:
    return directory / "blobs" / "sha256" / digest.split(":", 1)[1]


@dataclass
class Rooted:
    """A closure and what it is: the release's image or its model artifact, and its tags."""

    role: str
    closure: Closure
    tags: list[str]


# --- writing ---------------------------------------------------------------------------------


def _prepare(directory: Path, record: bytes) -> bool:
    """The directory made ready: empty (just created), or an unfinished `--to-dir` of the same
    release (resumed: its PARTIAL marker names this record). Anything else there is the user's
    and is refused, never written over. Whether the mirror is complete already."""
    done = directory / RECORD
    if done.is_file():
        if done.read_bytes() != record:
            raise OciError(
                f"--to-dir {directory} holds another release's mirror ({RECORD} differs); name another directory",
                field="--to-dir",
            )
        return True
    marker, digest = directory / PARTIAL, hashlib.sha256(record).hexdigest()
    others = {path.name for path in directory.iterdir()} - {RUN_LOCK}
    if others and not (marker.is_file() and marker.read_text().strip() == digest):
        what = "an unfinished mirror of another release" if marker.is_file() else "files that are not a mirror of ours"
        raise OciError(f"--to-dir {directory} holds {what}; name an empty or new directory", field="--to-dir")
    write_atomic(marker, digest.encode() + b"\n")
    for folder in (directory / "blobs", directory / "blobs" / "sha256"):
        folder.mkdir(exist_ok=True)
        if folder.is_symlink() or not folder.is_dir():
            raise OciError(f"--to-dir: {folder} is not a directory of ours (a link or a file)", field="--to-dir")
    write_atomic(directory / LAYOUT_MARKER, b'{"imageLayoutVersion":"1.0.0"}\n')
    return False


def _kept(path: Path, blob: Blob) -> bool:
    """An earlier run's file that is this blob exactly; a wrong one is removed."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISREG(info.st_mode) and info.st_size == blob.size:
        try:
            for _ in FileBlob(path, blob.digest, blob.size).pieces():
                pass
            return True
        except OciError:
            pass
    path.unlink()
    return False


def _fetch(source: HashedSource, path: Path, blob: Blob) -> int:
    """The blob into its file: written beside it, synced, renamed (never a partial file under
    a digest's name). The bytes moved."""
    if _kept(path, blob):
        return 0
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "wb") as handle:
            for piece in source.from_offset(0):
                handle.write(piece)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return blob.size


def record_of(rooted: list[Rooted]) -> bytes:
    closures = []
    for item in rooted:
        closure = item.closure
        closures.append(
            {
                "role": item.role,
                "repository": closure.repository,
                "root": closure.root,
                "tags": item.tags,
                "manifests": [
                    {
                        "digest": m.digest,
                        "media_type": m.media_type,
                        "size": len(m.data),
                        "kind": m.kind,
                        "subject": m.subject,
                        "tag": m.tag,
                    }
                    for m in closure.manifests
                ],
                "blobs": [{"digest": b.digest, "size": b.size} for b in closure.blobs.values()],
            }
        )
    return json.dumps({"schema_version": "1", "closures": closures}, indent=2, sort_keys=True).encode() + b"\n"


def _index(rooted: list[Rooted]) -> bytes:
    """The layout's index: every manifest of every closure, roots named by their tags."""
    entries = []
    for item in rooted:
        for m in item.closure.manifests:
            annotations = {ROLE_ANNOTATION: item.role if m.digest == item.closure.root else m.kind}
            if m.tag:
                annotations[REF_NAME] = m.tag
            elif m.digest == item.closure.root and item.tags:
                annotations[REF_NAME] = item.tags[0]
            entries.append(
                {"mediaType": m.media_type, "digest": m.digest, "size": len(m.data), "annotations": annotations}
            )
    return canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})


def to_dir(
    rooted: list[Rooted],
    sources: list[Callable[[Blob], HashedSource]],
    directory: Path,
    *,
    jobs: int = WRITE_JOBS,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Write the closures into `directory` (the module's layout); `sources[i]` streams a blob of
    `rooted[i]`. Returns a summary."""
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise OciError(f"--to-dir {directory} is not a directory", field="--to-dir")
    with exclusive_run(directory, what=f"--to-dir {directory}", field="--to-dir"):
        return _write(rooted, sources, directory, jobs, progress)


def _write(rooted: list[Rooted], sources, directory: Path, jobs: int, progress) -> dict:
    record = record_of(rooted)
    if _prepare(directory, record):
        return {"directory": str(directory), "complete_already": True, "bytes_written": 0}
    work: dict[str, tuple[Blob, Callable[[Blob], HashedSource]]] = {}
    for item, source in zip(rooted, sources):
        for blob in item.closure.blobs.values():
            work.setdefault(blob.digest, (blob, source))
    shown = blob_progress(sum(blob.size for blob, _ in work.values()), len(work), progress)

    def one(entry: tuple[Blob, Callable[[Blob], HashedSource]]) -> tuple[int, int, str]:
        blob, source = entry
        moved = _fetch(source(blob), blob_file(directory, blob.digest), blob)
        return moved, blob.size, f"{'written' if moved else 'kept'} {blob.digest[:19]}…"

    written = sum(in_parallel(list(work.values()), one, jobs=jobs, progress=shown))
    for item in rooted:
        for m in item.closure.manifests:
            write_atomic(blob_file(directory, m.digest), m.data)
    write_atomic(directory / "index.json", _index(rooted))
    write_atomic(directory / RECORD, record)  # the directory is complete
    (directory / PARTIAL).unlink()
    return {"directory": str(directory), "complete_already": False, "bytes_written": written}


# --- reading ---------------------------------------------------------------------------------


@dataclass
class DirectorySource:
    """A closure's blobs from an offline mirror's directory, each hashed as it is read."""

    directory: Path

    def blob_stream(self, blob: Blob) -> HashedSource:
        return FileBlob(blob_file(self.directory, blob.digest), blob.digest, blob.size)

    def mount_from(self, registry: str) -> str | None:
        return None


def _manifest_bytes(directory: Path, digest: str, size: int) -> bytes:
    path = blob_file(directory, digest)
    try:
        read = read_file(path, label=f"manifest {digest}", max_bytes=MAX_MANIFEST_BYTES, follow_symlinks=False)
    except AttestError as exc:
        raise OciError(str(exc), field=digest) from None
    if "sha256:" + read.sha256 != digest or len(read.data) != size:
        raise OciError(f"{path}: its bytes are not manifest {digest} ({size} bytes)", field=digest)
    return read.data


def _reached(recorded: RecordedClosure, named: dict[str, list[str]]) -> set[str]:
    """The recorded images the root reaches through its indexes' children."""
    reached, pending = set(), [recorded.root]
    while pending:
        digest = pending.pop()
        if digest not in reached:
            reached.add(digest)
            pending += named.get(digest, [])
    return reached


def _check_entry(closure: Closure, entry, document: dict, reached: set[str]) -> None:
    what = f"{RECORD}: manifest {entry.digest}"
    if entry.kind == IMAGE and entry.digest not in reached:
        raise OciError(f"{what} is recorded as the release's but its root does not reach it", field=entry.digest)
    if entry.kind in (REFERRER, LEGACY) and not closure.has(entry.subject):
        raise OciError(f"{what}: its subject {entry.subject or 'none'} comes nowhere before it", field=entry.digest)
    if entry.kind == REFERRER and subject_of(document) != entry.subject:
        raise OciError(
            f"{what} is recorded as a referrer of {entry.subject} but names {subject_of(document) or 'no subject'}",
            field=entry.digest,
        )
    if entry.kind == LEGACY and entry.tag not in {tag_for(entry.subject, suffix) for suffix in LEGACY_SUFFIXES}:
        raise OciError(f"{what}: tag {entry.tag!r} is not a legacy tag of {entry.subject}", field=entry.digest)


def _closure(directory: Path, recorded: RecordedClosure) -> Closure:
    """The recorded closure rebuilt from the manifests' own bytes (the module's threat model)."""
    read = {}
    for entry in recorded.manifests:
        data = _manifest_bytes(directory, entry.digest, entry.size)
        read[entry.digest] = (data, *parts(data, entry.digest, entry.media_type))
    children = {
        entry.digest: [child for child, _, _ in read[entry.digest][2]]
        for entry in recorded.manifests
        if entry.kind == IMAGE and read[entry.digest][3]
    }
    reached = _reached(recorded, children)
    closure = Closure(recorded.repository, recorded.root)
    for entry in recorded.manifests:
        data, document, named, is_index = read[entry.digest]
        _check_entry(closure, entry, document, reached)
        if is_index:
            missing = [child for child, _, _ in named if not closure.has(child)]
            if missing:
                raise OciError(
                    f"{RECORD}: index {entry.digest}: its child {missing[0]} is not recorded before it",
                    field=entry.digest,
                )
            named = []
        closure.add(
            Manifest(entry.digest, entry.media_type, data, entry.kind, entry.subject, entry.tag),
            [Blob(digest, size) for digest, size, _ in named],
        )
    if not closure.has(recorded.root):
        raise OciError(f"{RECORD}: the root {recorded.root} is not among its manifests", field=recorded.root)
    listed = {(blob.digest, blob.size) for blob in recorded.blobs}
    derived = {(blob.digest, blob.size) for blob in closure.blobs.values()}
    if listed != derived:
        odd = sorted(listed ^ derived)[0]
        raise OciError(
            f"{RECORD}: blob {odd[0]} ({odd[1]} bytes) is {'listed' if odd in listed else 'named'} but "
            f"{'named by no manifest' if odd in listed else 'not listed'}",
            field=odd[0],
        )
    return closure


def from_dir(directory: Path) -> list[Rooted]:
    """The closures an offline mirror holds, checked (the module's threat model)."""
    for folder in (directory / "blobs", directory / "blobs" / "sha256"):
        if folder.is_symlink():
            raise OciError(f"--from-dir: {folder} is a link; a mirror's folders are its own", field="--from-dir")
    if not (directory / RECORD).exists():
        raise OciError(
            f"--from-dir {directory} holds no {RECORD}: not an offline mirror, or one whose --to-dir did not finish",
            field="--from-dir",
        )
    try:
        read = read_file(directory / RECORD, label=RECORD, max_bytes=MAX_RECORD_BYTES, follow_symlinks=False)
        record = parse_document(MirrorRecord, loads_object(read.data, label=RECORD), label=RECORD)
    except AttestError as exc:
        raise OciError(str(exc), field=exc.field or RECORD) from None
    return [Rooted(item.role, _closure(directory, item), list(item.tags)) for item in record.closures]
