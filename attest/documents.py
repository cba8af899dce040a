"""The typed documents (schema_version "1"): the base model and the checkpoint attestation.
The DFlash2 speculator attestation and gate live in attest.speculation, loaded only where a
canary is judged (a plain start pays for no model it does not read).

Models are strict: unknown fields, wrong types and malformed digests are refused. They
describe shape only; which values are acceptable (exact model ids, bindings, thresholds)
is the caller's policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attest.errors import AttestError
from attest.primitives import MAX_JSON_BYTES, Revision, Sha256
from attest.reader import loads_object, read_file

SCHEMA_VERSION = "1"
CHECKPOINT_ATTESTATION_FILE = ".omni-checkpoint.json"
DEFAULT_WEIGHT_INDEX = "model.safetensors.index.json"


class Document(BaseModel):
    # defer_build: a schema is built on first use, so start-up pays only for the documents it reads.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


class ShardDigest(Document):
    """One weight shard's exact size and content digest."""

    path: str = Field(min_length=1)
    size: int = Field(gt=0)
    sha256: Sha256


class CheckpointAttestation(Document):
    """`.omni-checkpoint.json`: what a local target checkpoint must be, without its weights.

    `shards` is optional: when present, every indexed shard's size and sha256 are verified.
    """

    schema_version: Literal["1"]
    model_id: str
    revision: Revision
    config_sha256: Sha256
    weight_index_path: str = DEFAULT_WEIGHT_INDEX
    weight_index_sha256: Sha256
    expected_shard_count: int = Field(gt=0)
    shards: list[ShardDigest] | None = None


DocumentT = TypeVar("DocumentT", bound=Document)


def _validation_refusal(exc: ValidationError, label: str) -> AttestError:
    """Turn pydantic's first error into one refusal naming the exact field."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    field = f"{label}.{where}" if where else label
    detail = first["msg"]
    if first["type"] == "extra_forbidden":
        detail = "unknown field (not in schema_version 1)"
    elif first["type"] == "missing":
        detail = "required field is missing"
    return AttestError(f"{field}: {detail}", field=field)


def parse_document(model: type[DocumentT], value: dict[str, Any], *, label: str) -> DocumentT:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise _validation_refusal(exc, label) from None


def read_document(
    model: type[DocumentT],
    path: Path,
    *,
    label: str,
    max_bytes: int = MAX_JSON_BYTES,
    pinned_sha256: str = "",
    pin_field: str = "",
) -> tuple[DocumentT, str]:
    """Read `path` once; when `pinned_sha256` is given, those exact bytes must have it before
    they are parsed. Returns the document and the sha256 of the bytes it came from."""
    read = read_file(path, label=label, max_bytes=max_bytes)
    if pinned_sha256 and read.sha256 != pinned_sha256:
        raise AttestError(
            f"{label} SHA-256 does not match its pin {pin_field} (pinned {pinned_sha256}, found {read.sha256})",
            field=pin_field or label,
        )
    return parse_document(model, loads_object(read.data, label=label, max_bytes=max_bytes), label=label), read.sha256


def load_document(model: type[DocumentT], path: Path, *, label: str, max_bytes: int = MAX_JSON_BYTES) -> DocumentT:
    return read_document(model, path, label=label, max_bytes=max_bytes)[0]
