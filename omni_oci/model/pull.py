"""pull: a model artifact by digest into a directory, every file checked against the lock while
it is written (one pass over the bytes), placed only whole and verified.

The expected lock comes from the caller (`--lock` or `--lock-sha256`), never from the registry.
Files are written under DIR/.omni-partial and renamed into place once the layer is exactly the
one tools/model makes of the locked file; the artifact's model signature (ARTIFACT_SIGNATURE), where
it carries one, follows them, and its lock (ARTIFACT_LOCK) is placed last, so a DIR holding it is
complete, and a DIR without it never passes for a pulled one. A re-run keeps each file
already placed that still matches the lock (hashed locally, unless the caller vouches for it
as it is: boot's receipt identities) and fetches the rest.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from attest.errors import AttestError
from attest.files import create_new, exclusive_run
from attest.hashing import digest_fd, new_digest
from attest.lock import (
    ARTIFACT_LOCK,
    ARTIFACT_SIGNATURE,
    MAX_LOCK_BYTES,
    PARTIAL_DIR,
    WORKING_DIRS,
    WORKING_FILES,
    CheckpointLock,
    LockedFile,
)
from attest.tree import open_regular, place, walk_files
from omni_oci.format.errors import OciError
from omni_oci.format.reference import Reference
from omni_oci.format.tar_reader import TarStream, read_members
from omni_oci.model.artifact import (
    MAX_SIGNATURE_BYTES,
    check_manifest,
    lock_descriptor,
    parse_manifest,
    read_lock_layer,
    read_signature_layer,
    signature_descriptor,
)
from omni_oci.model.errors import ModelError
from omni_oci.model.layers import BLOCK, END_OF_ARCHIVE, padding, tar_header
from omni_oci.model.pack import parse_lock
from omni_oci.remote.parallel import blob_progress, in_parallel
from omni_oci.remote.pieces import Pieces
from omni_oci.remote.registry import RegistryClient, client_for

PULL_JOBS = 4
# The caller's word that a placed file, as it is now (its stat), was checked against the lock
# (boot's receipt identities): it is kept without hashing it again.
Vouched = Callable[[str, os.stat_result], bool]
WRITE_BYTES = 8 << 20


@dataclass(frozen=True)
class ExpectedLock:
    """What the caller trusts: the sha256 of a lock file's bytes."""

    sha256: str


def expected_lock(lock_bytes: bytes | None, lock_sha256: str) -> ExpectedLock:
    if lock_bytes is None and not lock_sha256:
        raise ModelError(
            "say which lock the artifact must carry: --lock FILE or --lock-sha256 HEX (the image pin "
            "model.lock_sha256); the registry's word is never taken for it",
            field="--lock",
        )
    if lock_sha256 and not re.fullmatch(r"[0-9a-fA-F]{64}", lock_sha256):
        raise ModelError(f"--lock-sha256 {lock_sha256!r}: expected 64 hex digits", field="--lock-sha256")
    found = hashlib.sha256(lock_bytes).hexdigest() if lock_bytes is not None else ""
    if found and lock_sha256 and found != lock_sha256.lower():
        raise ModelError(f"--lock hashes to {found}, --lock-sha256 says {lock_sha256}", field="--lock-sha256")
    return ExpectedLock(found or lock_sha256.lower())


def fetch_lock(
    client: RegistryClient, repository: str, manifest: dict[str, Any], expected: ExpectedLock
) -> tuple[CheckpointLock, bytes]:
    """The artifact's lock, which must be exactly the expected one."""
    entry = lock_descriptor(manifest)
    try:
        blob = client.blob(repository, entry.get("digest", ""), size=entry.get("size"), max_bytes=MAX_LOCK_BYTES + 4096)
    except OciError as exc:
        raise ModelError(str(exc), field=ARTIFACT_LOCK) from None
    data = read_lock_layer(blob, f"the artifact's {ARTIFACT_LOCK}")
    found = hashlib.sha256(data).hexdigest()
    if found != expected.sha256:
        raise ModelError(
            f"the artifact carries the checkpoint lock {found}; expected {expected.sha256}", field=ARTIFACT_LOCK
        )
    return parse_lock(data, f"the artifact's {ARTIFACT_LOCK}"), data


def fetch_signature(client: RegistryClient, repository: str, entry: dict[str, Any] | None) -> bytes | None:
    """The model signature of its layer `entry` (signature_descriptor's), or None where there is
    none: read bounded, one file, its digest the one its layer names (a pin's manifest digest
    covers both)."""
    if entry is None:
        return None
    try:
        blob = client.blob(repository, entry["digest"], size=entry.get("size"), max_bytes=MAX_SIGNATURE_BYTES + 4096)
    except OciError as exc:
        raise ModelError(str(exc), field=ARTIFACT_SIGNATURE) from None
    return read_signature_layer(blob, entry, f"the artifact's {ARTIFACT_SIGNATURE}")


def _write_member(stream: TarStream, item: LockedFile, partial: Path, where: str) -> None:
    """The layer's one member, which must be `item`, written to `partial` while hashed."""
    members = read_members(stream, where, field=item.path)
    found = False
    for member, data in members:
        if found or member.kind != "file" or member.name != item.path:
            raise ModelError(
                f"{where}: holds {member.kind} {member.name!r}; expected only the file {item.path}", field=item.path
            )
        if member.size != item.size:
            raise ModelError(
                f"{where}: {item.path} has {member.size} bytes, the lock says {item.size}", field=item.path
            )
        found = True
        digest = new_digest(item.algorithm, item.size)
        with create_new(partial) as handle:
            while block := data.read(WRITE_BYTES):
                digest.update(block)
                handle.write(block)
            handle.flush()
            os.fsync(handle.fileno())
        if digest.hexdigest() != item.digest:
            raise ModelError(
                f"{where}: {item.path} is {item.algorithm} {digest.hexdigest()}, the lock says {item.digest}",
                field=item.path,
            )
    if not found:
        raise ModelError(f"{where}: holds no file; expected {item.path}", field=item.path)


def _receive_layer(blob: Iterator[bytes], item: LockedFile, temporary: Path, where: str) -> None:
    """The layer, which must be exactly the one tools/model makes of `item` (its header, the
    file's bytes matching the lock, zero padding and the end blocks), its file written to
    `temporary` while hashed: one pass over the bytes, so the layer digest is not computed
    again (the bytes accepted are fully determined by the lock). Any other layer is read by
    the strict tar reader, which names what it holds instead."""
    pieces = Pieces(blob)
    header = pieces.take(BLOCK)
    if header != tar_header(item.path, item.size):
        _write_member(TarStream(itertools.chain([header], pieces.rest())), item, temporary, where)
        raise ModelError(
            f"{where}: not the layer tools/model makes of {item.path} (its header differs)", field=item.path
        )
    digest, written = new_digest(item.algorithm, item.size), 0
    with create_new(temporary) as handle:
        for piece in pieces.upto(item.size):
            digest.update(piece)
            handle.write(piece)
            written += len(piece)
        handle.flush()
        os.fsync(handle.fileno())
    if written != item.size:
        raise ModelError(f"{where}: the layer ends after {written} of {item.size} bytes", field=item.path)
    if digest.hexdigest() != item.digest:
        raise ModelError(
            f"{where}: {item.path} is {item.algorithm} {digest.hexdigest()}, the lock says {item.digest}",
            field=item.path,
        )
    if b"".join(pieces.rest()) != padding(item.size) + END_OF_ARCHIVE:
        raise ModelError(f"{where}: bytes after {item.path} are not the tar's zero padding and end", field=item.path)


def _placed_matches(dest: Path, item: LockedFile, vouched: Vouched | None) -> tuple[bool, bool]:
    """Whether a file already in DIR is the locked one and DIR's alone (one with another link, a
    hard link to a file outside which could change under it, is fetched and placed anew), and
    whether that took hashing it: not where the caller vouches for the file as it is now."""
    try:
        with open_regular(dest, item.path) as fd:
            found = os.fstat(fd)
            if found.st_nlink != 1 or found.st_size != item.size:
                return False, False
            if vouched is not None and vouched(item.path, found):
                return True, False
            return digest_fd(fd, item.algorithm, item.size) == item.digest, True
    except AttestError:
        return False, False


def _refuse_foreign_files(dest: Path, lock: CheckpointLock) -> None:
    listed = lock.by_path
    for name, is_link in walk_files(dest, WORKING_FILES, WORKING_DIRS):
        if name == ARTIFACT_SIGNATURE and name not in listed:
            continue  # an earlier pull's, replaced (or removed) before the lock is placed
        if name not in listed or is_link:
            raise ModelError(
                f"{dest} holds {name}, which the checkpoint lock does not list; pull into an empty directory "
                "or one an earlier pull of this lock left",
                field=name,
            )


def pull(
    reference: str,
    dest: Path,
    expected: ExpectedLock,
    *,
    client: RegistryClient | None = None,
    jobs: int = PULL_JOBS,
    progress: Callable[[str], None] | None = None,
    before_files: Callable[[RegistryClient, Reference], None] | None = None,
    vouched: Vouched | None = None,
) -> dict[str, Any]:
    ref = Reference.parse(reference)
    if not ref.digest:
        raise ModelError(f"{reference}: pull by digest (REGISTRY/REPO@sha256:...), not a tag", field="reference")
    with client_for(ref.registry, client) as client:
        if before_files is not None:
            before_files(client, ref)  # the signature, when a key was given
        data, _ = client.manifest(ref.repository, ref.digest)
        manifest, _ = parse_manifest(data, str(ref))
        lock, lock_bytes = fetch_lock(client, ref.repository, manifest, expected)
        layers = check_manifest(manifest, lock, expected.sha256)
        signature = fetch_signature(client, ref.repository, signature_descriptor(manifest, lock))
        return _pull_files(client, ref, dest, lock, (lock_bytes, signature), layers, jobs, progress, vouched)


def _pull_files(client, ref, dest, lock, own, layers, jobs, progress, vouched) -> dict[str, Any]:
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"{dest} cannot be created: {exc.strerror}", field="DIR") from None
    with exclusive_run(dest / PARTIAL_DIR, what=f"DIR {dest}", field=PARTIAL_DIR):
        return _pull_locked(client, ref, dest, lock, own, layers, jobs, progress, vouched)


def _place_own(partial: Path, dest: Path, name: str, data: bytes | None) -> None:
    """One of the artifact's own files placed whole (the old one removed where there is none)."""
    if data is None:
        if os.path.lexists(dest / name):
            os.unlink(dest / name)
        return
    temporary = partial / f"{name}.part"
    with create_new(temporary) as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    place(temporary, dest, name)


def _pull_locked(client, ref, dest, lock, own, layers, jobs, progress, vouched) -> dict[str, Any]:
    """The pull proper, this run alone on DIR (its run lock held in DIR/.omni-partial)."""
    lock_bytes, signature = own
    _refuse_foreign_files(dest, lock)
    if os.path.lexists(dest / ARTIFACT_LOCK):
        os.unlink(dest / ARTIFACT_LOCK)  # from here on DIR is not a complete pull until the end
    partial = dest / PARTIAL_DIR  # made, owned and locked by exclusive_run
    pairs = list(zip(layers, sorted(lock.files, key=lambda item: item.path)))
    placed = {item.path: _placed_matches(dest, item, vouched) for _, item in pairs}
    kept = [path for path, (matches, _) in placed.items() if matches]
    hashed = [item for _, item in pairs if placed[item.path] == (True, True)]
    wanted = [(layer, item) for layer, item in pairs if item.path not in kept]
    total = sum(layer["size"] for layer, _ in wanted)
    shown = blob_progress(total, len(wanted), progress, unit="files")

    def fetch(pair: tuple[dict[str, Any], LockedFile]) -> tuple[None, int, str]:
        layer, item = pair
        temporary = partial / (layer["digest"].split(":", 1)[1] + ".part")
        where = f"{ref.registry}/{ref.repository}@{layer['digest']} ({item.path})"
        try:
            _receive_layer(
                client.stream_blob(ref.repository, layer["digest"], layer["size"], hashed=False), item, temporary, where
            )
        except BaseException as exc:
            # A refused or broken layer's bytes are nobody's: none is resumed (the next pull creates
            # its partial file anew), so none is left in the partial area to take disk or mislead.
            temporary.unlink(missing_ok=True)
            if isinstance(exc, OciError):
                raise ModelError(str(exc), field=item.path) from None
            if isinstance(exc, OSError):  # a full disk, a directory that went away: named
                raise ModelError(
                    f"{item.path} cannot be written under {dest}: {exc.strerror or exc}", field=item.path
                ) from None
            raise
        place(temporary, dest, item.path)
        return None, layer["size"], item.path

    in_parallel(wanted, fetch, jobs=jobs, progress=shown)
    if ARTIFACT_SIGNATURE not in lock.by_path:
        _place_own(partial, dest, ARTIFACT_SIGNATURE, signature)
    _place_own(partial, dest, ARTIFACT_LOCK, lock_bytes)
    shutil.rmtree(partial, ignore_errors=True)
    return {
        "reference": str(ref),
        "directory": str(dest),
        "files": len(pairs),
        "fetched": len(wanted),
        "kept": len(kept),
        "kept_hashed": len(hashed),
        "kept_hashed_bytes": sum(item.size for item in hashed),
        "fetched_bytes": total,
        "lock_sha256": hashlib.sha256(lock_bytes).hexdigest(),
        "repo": lock.repo,
        "revision": lock.revision,
        "model_signature": ARTIFACT_SIGNATURE if signature is not None else None,
    }
