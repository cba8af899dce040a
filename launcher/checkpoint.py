"""The local target checkpoint: its exact architecture, its attestation, its shards.

Nothing here loads weight data except optional shard hashing, which the attestation asks
for by listing per-shard digests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attest.documents import (
    CHECKPOINT_ATTESTATION_FILE,
    DEFAULT_WEIGHT_INDEX,
    CheckpointAttestation,
    ShardDigest,
    parse_document,
)
from attest.hashing import hash_files_parallel
from attest.primitives import child_file, local_root, require_revision, require_sha256
from attest.reader import MAX_JSON_BYTES, loads_object, read_file, read_json_file, refuse_nul
from launcher.errors import LauncherError
from launcher.target import DEFAULT_PROFILE, load_target_profile

if TYPE_CHECKING:
    from attest.profile import TargetProfile

ATTESTATION = "checkpoint attestation"


@dataclass(frozen=True)
class CheckpointInspection:
    root: Path
    model_id: str
    revision: str
    config_sha256: str
    weight_index_sha256: str
    shard_count: int
    tensor_count: int
    native_mtp_head: bool
    mtp_reason: str
    max_model_len: int
    shards_hashed: int
    profile: "TargetProfile" = field(compare=False, repr=False)

    def public_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile.name,
            "root": str(self.root),
            "model_id": self.model_id,
            "revision": self.revision,
            "config_sha256": self.config_sha256,
            "weight_index_sha256": self.weight_index_sha256,
            "shard_count": self.shard_count,
            "tensor_count": self.tensor_count,
            "native_mtp_head": self.native_mtp_head,
            "mtp_reason": self.mtp_reason,
            "max_model_len": self.max_model_len,
            "shards_hashed": self.shards_hashed,
        }


def _require_target_model_id(model_id: str, profile: "TargetProfile") -> None:
    if model_id != profile.model_id:
        raise LauncherError(f"MODEL_ID must be exactly {profile.model_id!r}", field="MODEL_ID")


def _exact_text_config(config: dict[str, Any], profile: "TargetProfile") -> tuple[dict[str, Any], str]:
    """The text config (nested or top level, as the profile says) and its field prefix."""
    if config.get("architectures") != [profile.architecture] or config.get("model_type") != profile.model_type:
        raise LauncherError(
            f"checkpoint is not the exact {profile.display_name} architecture "
            f"(config.json architectures must be [{profile.architecture!r}], model_type {profile.model_type!r})",
            field="config.json",
        )
    text_config, prefix = profile.text_fields(config)
    if text_config is None:
        raise LauncherError(
            f"target config has no {profile.text_config} object", field=f"config.json:{profile.text_config}"
        )
    for key, expected in profile.text_shape.items():
        value = text_config.get(key)
        # Exact JSON types: true is not 1, 1.0 is not 1.
        if type(value) is not type(expected) or value != expected:
            raise LauncherError(
                f"target {prefix}{key} is not the {profile.display_name} value {expected!r}",
                field=f"config.json:{prefix}{key}",
            )
    return text_config, prefix


def _read_json(path: Path, label: str) -> tuple[dict[str, Any], str]:
    """One read: the parsed object and the sha256 of exactly those bytes."""
    value, read = read_json_file(path, label=label)
    return value, read.sha256


def _indexed_shards(root: Path, index_path: Path, index: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Path]]:
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise LauncherError("target weight index has no weight_map", field=f"{index_path.name}:weight_map")
    if not all(isinstance(value, str) for value in weight_map.values()):
        raise LauncherError(
            "target weight index maps a tensor to something other than a file name",
            field=f"{index_path.name}:weight_map",
        )
    names = sorted(set(weight_map.values()))
    return weight_map, {name: child_file(root, name, label="target weight shard") for name in names}


def build_checkpoint_attestation(
    model_path: Path,
    *,
    model_id: str,
    revision: str,
    hash_shards: bool = False,
    workers: int = 0,
    path_setting: str = "MODEL_PATH",
    revision_setting: str = "MODEL_REVISION",
    profile: "TargetProfile | None" = None,
) -> CheckpointAttestation:
    """Describe a local checkpoint without loading weights (unless `hash_shards`).

    An operator convenience, not a download provenance oracle: the caller must already
    have obtained and verified the immutable revision.
    """
    profile = profile or load_target_profile(DEFAULT_PROFILE)
    root = local_root(model_path, label=path_setting)
    _require_target_model_id(model_id, profile)
    revision = require_revision(revision, revision_setting)
    config_path = child_file(root, "config.json", label="target config")
    config, config_sha = _read_json(config_path, "target config")
    _exact_text_config(config, profile)
    index_path = child_file(root, DEFAULT_WEIGHT_INDEX, label="target weight index")
    index, index_sha = _read_json(index_path, "target weight index")
    _, shards = _indexed_shards(root, index_path, index)
    shard_digests = None
    if hash_shards:
        digests = hash_files_parallel(shards.values(), label="hashing shards", workers=workers)
        shard_digests = [
            ShardDigest(path=name, size=path.stat().st_size, sha256=digests[path]) for name, path in shards.items()
        ]
    return CheckpointAttestation(
        schema_version="1",
        model_id=model_id,
        revision=revision,
        config_sha256=config_sha,
        weight_index_path=DEFAULT_WEIGHT_INDEX,
        weight_index_sha256=index_sha,
        expected_shard_count=len(shards),
        shards=shard_digests,
    )


def _verify_shard_digests(attested: list[ShardDigest], shards: dict[str, Path], workers: int) -> int:
    listed = {item.path: item for item in attested}
    if len(listed) != len(attested) or set(listed) != set(shards):
        missing = sorted(set(shards) - set(listed))
        extra = sorted(set(listed) - set(shards))
        raise LauncherError(
            f"{ATTESTATION} shards must list each indexed shard once (unlisted: {missing[:3]}, not indexed: {extra[:3]})",
            field=f"{ATTESTATION}.shards",
        )
    for name, path in shards.items():
        actual = path.stat().st_size
        if actual != listed[name].size:
            raise LauncherError(
                f"target weight shard {name} has {actual} bytes, its attestation says {listed[name].size}", field=name
            )
    digests = hash_files_parallel(shards.values(), label="verifying shards", workers=workers)
    for name, path in shards.items():
        if digests[path] != listed[name].sha256:
            raise LauncherError(
                f"target weight shard {name} SHA-256 does not match its attestation "
                f"(expected {listed[name].sha256}, found {digests[path]})",
                field=name,
            )
    return len(shards)


def _native_mtp(
    text_config: dict[str, Any], prefix: str, tensor_names: set[str], profile: "TargetProfile"
) -> tuple[bool, str]:
    layout = profile.mtp
    if layout is None:
        return False, f"the target profile {profile.name} has no native MTP layout"
    declared = text_config.get(layout.layers_field, 0)
    # Only a JSON integer proves the layer count: true, 1.0 or "1" are not evidence.
    mtp_layers = declared if type(declared) is int else 0
    groups = [any(name.startswith(group) for name in tensor_names) for group in layout.weight_groups]
    if mtp_layers != layout.layers:
        return False, f"{prefix}{layout.layers_field} is not exactly {layout.layers}"
    if not all(groups):
        return False, f"weight index does not contain the complete {layout.groups_label} groups"
    return True, "one native MTP layer and its indexed weight groups are present"


def _max_position_embeddings(text_config: dict, prefix: str) -> int:
    value = text_config.get("max_position_embeddings")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise LauncherError(
            "target max_position_embeddings is invalid", field=f"config.json:{prefix}max_position_embeddings"
        )
    return value


def _attestation(manifest_path: Path, expected_manifest_sha256: str | None) -> CheckpointAttestation:
    """The checkpoint attestation, read once: its pin is checked on exactly the bytes parsed."""
    if not os.path.lexists(refuse_nul(manifest_path, "QWEN_CHECKPOINT_MANIFEST_PATH")):
        raise LauncherError(
            f"exact checkpoint attestation is missing; expected {CHECKPOINT_ATTESTATION_FILE} at {manifest_path}",
            field="QWEN_CHECKPOINT_MANIFEST_PATH",
        )
    expected = (
        require_sha256(expected_manifest_sha256, "QWEN_CHECKPOINT_MANIFEST_SHA256") if expected_manifest_sha256 else ""
    )
    read = read_file(manifest_path, label=ATTESTATION, max_bytes=MAX_JSON_BYTES)
    if expected and read.sha256 != expected:
        raise LauncherError(
            f"checkpoint attestation SHA-256 does not match its external pin (pinned {expected}, found {read.sha256})",
            field="QWEN_CHECKPOINT_MANIFEST_SHA256",
        )
    return parse_document(CheckpointAttestation, loads_object(read.data, label=ATTESTATION), label=ATTESTATION)


def inspect_target_checkpoint(
    model_path: Path,
    *,
    model_id: str,
    revision: str,
    manifest_path: Path | None = None,
    expected_manifest_sha256: str | None = None,
    hash_workers: int = 0,
    profile: "TargetProfile | None" = None,
) -> CheckpointInspection:
    """Validate the exact local target (the profile's; default: the seed's) without loading
    model weights."""
    profile = profile or load_target_profile(DEFAULT_PROFILE)
    root = local_root(model_path, label="MODEL_PATH")
    _require_target_model_id(model_id, profile)
    revision = require_revision(revision, "MODEL_REVISION")
    config_path = child_file(root, "config.json", label="target config")
    config, config_sha = _read_json(config_path, "target config")
    text_config, prefix = _exact_text_config(config, profile)
    max_model_len = _max_position_embeddings(text_config, prefix)
    manifest = _attestation(manifest_path or root / CHECKPOINT_ATTESTATION_FILE, expected_manifest_sha256)
    if manifest.model_id != model_id:
        raise LauncherError("checkpoint attestation model_id does not match MODEL_ID", field=f"{ATTESTATION}.model_id")
    if manifest.revision != revision:
        raise LauncherError(
            "checkpoint attestation revision does not match MODEL_REVISION", field=f"{ATTESTATION}.revision"
        )
    if config_sha != manifest.config_sha256:
        raise LauncherError(
            "checkpoint config.json SHA-256 does not match its attestation", field=f"{ATTESTATION}.config_sha256"
        )
    index_path = child_file(root, manifest.weight_index_path, label="target weight index")
    index, index_sha = _read_json(index_path, "target weight index")
    if index_sha != manifest.weight_index_sha256:
        raise LauncherError(
            "checkpoint weight index SHA-256 does not match its attestation", field=f"{ATTESTATION}.weight_index_sha256"
        )
    weight_map, shards = _indexed_shards(root, index_path, index)
    if len(shards) != manifest.expected_shard_count:
        raise LauncherError(
            f"checkpoint shard count does not match its attestation "
            f"(index names {len(shards)}, attestation expects {manifest.expected_shard_count})",
            field=f"{ATTESTATION}.expected_shard_count",
        )
    hashed = 0 if manifest.shards is None else _verify_shard_digests(manifest.shards, shards, hash_workers)
    native_mtp, mtp_reason = _native_mtp(text_config, prefix, {str(name) for name in weight_map}, profile)
    return CheckpointInspection(
        root=root,
        model_id=model_id,
        revision=revision,
        config_sha256=config_sha,
        weight_index_sha256=index_sha,
        shard_count=len(shards),
        tensor_count=len(weight_map),
        native_mtp_head=native_mtp,
        mtp_reason=mtp_reason,
        max_model_len=max_model_len,
        shards_hashed=hashed,
        profile=profile,
    )
