"""An offline mirror: a release's closures as an OCI image layout on disk (`mirror --to-dir`),
and that directory read back for a push on the far side of an air gap (`mirror --from-dir`).

The directory is an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/`) that skopeo,
oras and umoci read, with every referrer and legacy tag listed in `index.json`, plus
`omni-mirror.json` (tools.release.record), written last: a directory without it is unfinished,
and a second `--to-dir` into it keeps each blob that hashes right and fetches the rest. A
directory with it is checked the same way: a record proves nothing on its own.

Threat model: the directory crossed an air gap on a disk nobody vouches for. Its record is
read once, bounded and strictly; every manifest is read bounded and checked against its digest
before it is parsed; what each manifest names is derived from its bytes, never from the
record's list (a blob the record lists and no manifest names, or the reverse, is refused); a
referrer must name its recorded subject, a legacy tag must be that subject's; a release tag is a
tag (the grammar) and never a name computed from a digest; a blob is hashed as it is uploaded
(omni_oci.remote.copy), read from a regular file only; no path is followed through a link. When
writing, the directory must be the user's own (attest.files.refuse_shared_directory) and every
file in it is created exclusively (attest.files.create_new).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from attest.documents import parse_document
from attest.errors import AttestError
from attest.files import RUN_LOCK, create_new, exclusive_run, refuse_shared_directory, write_atomic
from attest.reader import loads_object, read_file
from omni_oci.format.errors import OciError
from omni_oci.format.layout import OCI_INDEX, canonical
from omni_oci.format.reference import COMPUTED_TAG_RE
from omni_oci.remote.copy import FileBlob, HashedSource
from omni_oci.remote.parallel import blob_progress, in_parallel
from omni_oci.remote.session import MAX_MANIFEST_BYTES
from omni_oci.signing.legacy import tag_for
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


def _small(path: Path, label: str, max_bytes: int) -> bytes | None:
    """A record or marker of the directory, read once and bounded, never through a link; None
    where there is none."""
    if not os.path.lexists(path):
        return None
    try:
        return read_file(path, label=label, max_bytes=max_bytes, follow_symlinks=False, allow_empty=True).data
    except AttestError as exc:
        raise OciError(str(exc), field="--to-dir") from None


def _prepare(directory: Path, record: bytes) -> bool:
    """The directory made ready: empty (just created), a finished `--to-dir` of the same release
    (its record is this one), or an unfinished one (its PARTIAL marker names this record).
    Anything else there is the user's and is refused, never written over. A finished directory
    is proof of nothing (it may have been copied or planted): it is marked unfinished again, and
    every blob is checked as for a resume. Whether it held this release's record."""
    marker, digest = directory / PARTIAL, hashlib.sha256(record).hexdigest()
    done = _small(directory / RECORD, RECORD, MAX_RECORD_BYTES)
    if done is not None and done != record:
        raise OciError(
            f"--to-dir {directory} holds another release's mirror ({RECORD} differs); name another directory",
            field="--to-dir",
        )
    others = {path.name for path in directory.iterdir()} - {RUN_LOCK}
    marked = _small(marker, PARTIAL, 256)
    if done is None and others and (marked or b"").strip() != digest.encode():
        what = (
            "an unfinished mirror of another release" if marked is not None else "files that are not a mirror of ours"
        )
        raise OciError(f"--to-dir {directory} holds {what}; name an empty or new directory", field="--to-dir")
    write_atomic(marker, digest.encode() + b"\n")
    if done is not None:
        (directory / RECORD).unlink()  # unfinished again until every blob is checked
    for folder in (directory / "blobs", directory / "blobs" / "sha256"):
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
        if folder.is_symlink() or not folder.is_dir():
            raise OciError(f"--to-dir: {folder} is not a directory of ours (a link or a file)", field="--to-dir")
    write_atomic(directory / LAYOUT_MARKER, b'{"imageLayoutVersion":"1.0.0"}\n')
    return done is not None


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
        with create_new(partial) as handle:
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
    try:
        refuse_shared_directory(directory, field="--to-dir")
    except AttestError as exc:
        raise OciError(str(exc), field="--to-dir") from None
    with exclusive_run(directory, what=f"--to-dir {directory}", field="--to-dir"):
        return _write(rooted, sources, directory, jobs, progress)


def _write(rooted: list[Rooted], sources, directory: Path, jobs: int, progress) -> dict:
    record = record_of(rooted)
    finished = _prepare(directory, record)
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
    # Complete already: the record was this release's and every blob it names hashed right.
    return {"directory": str(directory), "complete_already": finished and not written, "bytes_written": written}


# --- reading ---------------------------------------------------------------------------------


@dataclass
class DirectorySource:
    """A closure's blobs from an offline mirror's directory, each hashed as it is read, none
    read past `deadline` (time.monotonic(); the mirror's --deadline)."""

    directory: Path
    deadline: float = math.inf

    def blob_stream(self, blob: Blob) -> HashedSource:
        return FileBlob(blob_file(self.directory, blob.digest), blob.digest, blob.size, deadline=self.deadline)

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


def _own_tags(recorded: RecordedClosure) -> list[str]:
    """The release tags a recorded closure may write: a model artifact's (its pin's tag, already
    held to the tag grammar by the record's schema), never one of the names a registry's listing
    or a signature lives under (those are computed from digests, never read); an image's none
    (its tag is the command line's)."""
    for tag in recorded.tags:
        if recorded.role == "image":
            raise OciError(f"{RECORD}: the image's closure lists tag {tag!r}; its tag is the target's", field=tag)
        if COMPUTED_TAG_RE.fullmatch(tag):
            raise OciError(
                f"{RECORD}: tag {tag!r} is a name computed from a digest (a referrers listing or a signature), "
                "never a release's own tag",
                field=tag,
            )
    return list(recorded.tags)


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
    return [Rooted(item.role, _closure(directory, item), _own_tags(item)) for item in record.closures]
