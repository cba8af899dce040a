"""The checkpoint lock: the one local source of truth for a pinned hub checkpoint.

Every file of the pinned revision with its path, size and digest (sha256 for LFS files,
git's blob sha1 otherwise). Generated once from the hub's metadata, reviewed and
committed; its sha256 is pinned in the image's pin document. From then on the hub is
untrusted: its listing is compared with the lock and every byte it serves is hashed
against the lock, never against what the hub says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from attest.documents import Document, parse_document
from attest.errors import AttestError
from attest.hashing import GIT_SHA1, SHA256
from attest.primitives import Revision, Sha256, safe_relative_name
from attest.reader import UntrustedBytes, read_json_file

LOCK_FILE = "checkpoint.lock.json"
REVIEWED = "reviewed"
TRUST_ON_FIRST_USE = "trust-on-first-use"
# tools/pin found the lock's files exactly those a publisher's OpenSSF Model Signing signature
# names, verified with the key the pins record (model.signature): who published these bytes.
PUBLISHER_SIGNED = "publisher-signed"
PINNED_TRUST = frozenset({REVIEWED, PUBLISHER_SIGNED})  # a lock an image pins and carries
MAX_LOCK_BYTES = 32 * 1024 * 1024
GIT_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
# boot's own working names inside the model root (boot/checkpoint/verify.py uses these): partial
# downloads, rank 0's published verdict and lock, an artifact's lock. A lock may not name them, or anything under
# them: a hub could otherwise make boot overwrite, or trust, its own state.
PARTIAL_DIR = ".omni-partial"
VERIFIED_MARKER = ".omni-verified.json"
PUBLISHED_LOCK = ".omni-checkpoint.lock.json"
REFUSED_MARKER = ".omni-refused.json"  # rank 0's refusal, so the other ranks stop waiting
# The lock a model artifact carries (tools/model): in an image volume it lies in the model root.
ARTIFACT_LOCK = ".omni-artifact.lock.json"
# The OpenSSF Model Signing signature a model artifact may carry (tools/model/oms.py), beside
# the files in the model root: not a working name, since a publisher's repository may hold its own.
ARTIFACT_SIGNATURE = "model.sig"
# Working names are files, but for the partial directory: a directory under a file's working name
# is no working file, and whatever lies in it is the checkpoint's to account for (attest.tree.walk_files).
WORKING_FILES = frozenset({VERIFIED_MARKER, PUBLISHED_LOCK, REFUSED_MARKER, ARTIFACT_LOCK})
WORKING_DIRS = frozenset({PARTIAL_DIR})
WORKING_NAMES = WORKING_FILES | WORKING_DIRS


def _name(value: str) -> str:
    try:
        name = safe_relative_name(value, "checkpoint lock.files.path")
    except AttestError as exc:
        raise ValueError(str(exc)) from None
    if name.split("/", 1)[0] in WORKING_NAMES:
        raise ValueError(f"file name {name!r} is one of boot's own working names ({', '.join(sorted(WORKING_NAMES))})")
    return name


def _git_sha1(value: str) -> str:
    if not GIT_SHA1_RE.fullmatch(value):
        raise ValueError("must be a 40-character lower-case git blob sha1")
    return value


class LockedFile(Document):
    path: Annotated[str, AfterValidator(_name)]
    size: int = Field(ge=0, le=1 << 50)
    sha256: Sha256 | None = None
    git_sha1: Annotated[str, AfterValidator(_git_sha1)] | None = None

    @model_validator(mode="after")
    def _one_digest(self) -> "LockedFile":
        if (self.sha256 is None) == (self.git_sha1 is None):
            raise ValueError("exactly one of sha256 (LFS files) and git_sha1 (other files) is required")
        return self

    @property
    def algorithm(self) -> str:
        return SHA256 if self.sha256 else GIT_SHA1

    @property
    def digest(self) -> str:
        return self.sha256 or self.git_sha1 or ""


class CheckpointLock(Document):
    schema_version: Literal["1"]
    repo: str = Field(min_length=1)
    revision: Revision
    trust: Literal["reviewed", "publisher-signed", "trust-on-first-use"]
    files: list[LockedFile] = Field(min_length=1)
    # With trust publisher-signed, and only then: the publisher, as the pins record it
    # (model.signature.signer: key:<hex sha256 of its PEM public key>, or cert:<hex sha256 of
    # the signing certificate>).
    signed_by: str | None = Field(default=None, pattern=r"^(key|cert):[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _signer_with_its_trust(self) -> "CheckpointLock":
        if (self.trust == PUBLISHER_SIGNED) != (self.signed_by is not None):
            raise ValueError(f"signed_by is required with trust {PUBLISHER_SIGNED}, and only with it")
        return self

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, files: list[LockedFile]) -> list[LockedFile]:
        paths = [item.path for item in files]
        if len(set(paths)) != len(paths):
            twice = sorted({path for path in paths if paths.count(path) > 1})
            raise ValueError(f"file {twice[0]!r} is listed twice")
        listed = set(paths)
        for path in paths:
            # A file and a directory of the same name cannot both exist on disk.
            clash = next((str(parent) for parent in Path(path).parents if str(parent) in listed), None)
            if clash:
                raise ValueError(f"file {path!r} lies under another listed file {clash!r}")
        return files

    @property
    def by_path(self) -> dict[str, LockedFile]:
        return {item.path: item for item in self.files}

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.files)

    def document_bytes(self) -> bytes:
        """The lock file's bytes, the one form whose sha256 an image pins as model.lock_sha256."""
        from attest.files import canonical_json

        return canonical_json(self.model_dump(mode="json", exclude_none=True))


def load_lock(path: Path, *, label: str = "checkpoint lock") -> tuple[CheckpointLock, UntrustedBytes]:
    """The lock and exactly the bytes (with their sha256) it was parsed from."""
    value, read = read_json_file(path, label=label, max_bytes=MAX_LOCK_BYTES)
    return parse_document(CheckpointLock, value, label=label), read
