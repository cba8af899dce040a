"""The offline mirror's record (`omni-mirror.json`): which closures a directory holds, each
manifest's role, and the blobs; what `mirror --from-dir` reads before it trusts any file."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from attest.documents import Document
from attest.pins import OptionalDigest
from omni_oci.format.reference import TAG_RE

RECORD = "omni-mirror.json"
MAX_RECORD_BYTES = 8 << 20
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
# A tag read from a disk nobody vouches for becomes part of a registry URL: the OCI tag grammar
# and nothing else (no '/', no dot segment, no '%').
TAG_PATTERN = TAG_RE.pattern
Tag = Annotated[str, Field(pattern=TAG_PATTERN)]


class RecordedManifest(Document):
    digest: str = Field(pattern=DIGEST_PATTERN)
    media_type: str = Field(min_length=1, max_length=255)
    size: int = Field(ge=0)
    kind: Literal["image", "referrer", "legacy"]
    subject: OptionalDigest = ""
    tag: str = Field(default="", pattern=r"^$|" + TAG_PATTERN)


class RecordedBlob(Document):
    digest: str = Field(pattern=DIGEST_PATTERN)
    size: int = Field(ge=0)


class RecordedClosure(Document):
    role: Literal["image", "model"]
    repository: str = Field(min_length=1, max_length=255)  # REGISTRY/REPO it was read from
    root: str = Field(pattern=DIGEST_PATTERN)
    tags: list[Tag] = Field(default_factory=list, max_length=64)
    manifests: list[RecordedManifest] = Field(min_length=1, max_length=512)
    blobs: list[RecordedBlob] = Field(max_length=8192)


class MirrorRecord(Document):
    schema_version: Literal["1"]
    closures: list[RecordedClosure] = Field(min_length=1, max_length=2)
