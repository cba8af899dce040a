"""Every refusal of the launcher, one row each.

FATAL rows must exit 2 with {"ok": false, "error", "field"} on stderr and never exec.
CANARY rows are the DFlash2 checks: a failure there never refuses the launch, it falls
back (here to native MTP) with the reason recorded. A final test proves the table covers
every `raise LauncherError(...)` site in the launcher's source.
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.fixtures.pins import qwen_pins, write_baked
from tests.fixtures.qwen import LauncherWorld, make_fake_vllm, use_tiny_target

Row = tuple[str, Callable[[LauncherWorld], Any], str, str]


def _set(**values: str) -> Callable[[LauncherWorld], None]:
    return lambda world: world.env.update(values)


def _unset(name: str) -> Callable[[LauncherWorld], None]:
    return lambda world: world.env.pop(name, None)


def _config(change: Callable[[dict], None]) -> Callable[[LauncherWorld], None]:
    return lambda world: world.edit_config(change)


def _text(key: str, value: Any) -> Callable[[LauncherWorld], None]:
    return _config(lambda c: c["text_config"].__setitem__(key, value))


def _attest(**overrides: Any) -> Callable[[LauncherWorld], None]:
    return lambda world: world.edit_attestation(**overrides)


def _fresh_engine(**kwargs: Any) -> Callable[[LauncherWorld], None]:
    def apply(world: LauncherWorld) -> None:
        world.site = world.base / "engine-site-2"
        make_fake_vllm(world.site, **kwargs)

    return apply


def _remove(relative: str) -> Callable[[LauncherWorld], None]:
    return lambda world: (world.model / relative).unlink()


def _write(relative: str, data: bytes) -> Callable[[LauncherWorld], None]:
    return lambda world: (world.model / relative).write_bytes(data)


def _symlink_index_outside(world: LauncherWorld) -> None:
    outside = world.base / "outside.json"
    outside.write_text((world.model / "model.safetensors.index.json").read_text())
    (world.model / "escape.json").symlink_to(outside)
    world.edit_attestation(weight_index_path="escape.json")


def _baked_with(target_profile: Any = "qwen3.8-27b-mi300x", **env: str) -> Callable[[LauncherWorld], None]:
    """Run inside an image whose pins are the fixture's, with `target_profile` (None: unset)."""

    def breaker(world: LauncherWorld) -> None:
        pins = {key: value for key, value in qwen_pins().items() if key != "target_profile"}
        if target_profile is not None:
            pins["target_profile"] = target_profile
        world.env["OMNI_IMAGE_JSON"] = str(write_baked(world.base / "image.json", pins))
        world.env.update(env)

    return breaker


def _model_path_is_file(world: LauncherWorld) -> None:
    path = world.base / "a-file"
    path.write_text("x")
    world.env["MODEL_PATH"] = str(path)


def _swap_shard(world: LauncherWorld) -> None:
    world.reattest(hash_shards=True)
    first = sorted(world.model.glob("model-*.safetensors"))[0]
    first.write_bytes(b"\xee" * first.stat().st_size)


def _grow_shard(world: LauncherWorld) -> None:
    world.reattest(hash_shards=True)
    first = sorted(world.model.glob("model-*.safetensors"))[0]
    first.write_bytes(first.read_bytes() + b"!")


def _shard_list_short(world: LauncherWorld) -> None:
    world.reattest(hash_shards=True)
    doc = json.loads((world.model / ".omni-checkpoint.json").read_text())
    world.reattest(shards=doc["shards"][:1])


def _shard_list_duplicate(world: LauncherWorld) -> None:
    world.reattest(hash_shards=True)
    doc = json.loads((world.model / ".omni-checkpoint.json").read_text())
    world.reattest(shards=[*doc["shards"], doc["shards"][0]])


def _shard_list_extra(world: LauncherWorld) -> None:
    world.reattest(hash_shards=True)
    doc = json.loads((world.model / ".omni-checkpoint.json").read_text())
    world.reattest(shards=[*doc["shards"], {**doc["shards"][0], "path": "model-extra.safetensors"}])


def _weight_map_a_list(world: LauncherWorld) -> None:
    """A truthy weight_map that is not a mapping, attested as it is."""
    index = world.model / "model.safetensors.index.json"
    world.edit_json(index, lambda i: i.__setitem__("weight_map", ["model-00001-of-00002.safetensors"]))
    attestation = world.model / ".omni-checkpoint.json"
    document = {
        **json.loads(attestation.read_text()),
        "weight_index_sha256": hashlib.sha256(index.read_bytes()).hexdigest(),
    }
    attestation.write_text(json.dumps(document))
    world.env["QWEN_CHECKPOINT_MANIFEST_SHA256"] = hashlib.sha256(attestation.read_bytes()).hexdigest()


SHA_A = "a" * 64
REV_B = "b" * 40

FATAL: list[Row] = [
    # settings
    (
        "mode unknown",
        _set(INFERENCE_MODE="turbo"),
        "INFERENCE_MODE",
        "INFERENCE_MODE must be auto, autoregressive, native_mtp, or dflash2_canary, got 'turbo'",
    ),
    ("port not a number", _set(QWEN_PORT="eighty"), "QWEN_PORT", "numeric Qwen launcher settings are invalid"),
    ("gpu util not a number", _set(QWEN_GPU_MEMORY_UTILIZATION="most"), "QWEN_GPU_MEMORY_UTILIZATION", "numeric"),
    # What int()/float() take and a person reads otherwise (issue #30): ASCII digits only.
    ("port in fullwidth digits", _set(QWEN_PORT="\uff18\uff11\uff10\uff13"), "QWEN_PORT", "written in ASCII digits"),
    ("port in Arabic-Indic digits", _set(QWEN_PORT="\u0668\u0661\u0660\u0663"), "QWEN_PORT", "in ASCII digits"),
    ("port with an underscore", _set(QWEN_PORT="8_103"), "QWEN_PORT", "written in ASCII digits"),
    ("port with spaces", _set(QWEN_PORT=" 8103 "), "QWEN_PORT", "written in ASCII digits"),
    ("gpu util nan", _set(QWEN_GPU_MEMORY_UTILIZATION="nan"), "QWEN_GPU_MEMORY_UTILIZATION", "in ASCII digits"),
    ("gpu util underscore", _set(QWEN_GPU_MEMORY_UTILIZATION="0.5_0"), "QWEN_GPU_MEMORY_UTILIZATION", "ASCII"),
    ("port zero", _set(QWEN_PORT="0"), "QWEN_PORT", "QWEN_PORT is outside 1..65535, got '0'"),
    ("port too high", _set(QWEN_PORT="65536"), "QWEN_PORT", "QWEN_PORT is outside 1..65535"),
    (
        "mtp tokens 2",
        _set(NATIVE_MTP_TOKENS="2"),
        "NATIVE_MTP_TOKENS",
        "native MTP is deliberately fixed to exactly one speculative token (NATIVE_MTP_TOKENS=1), got '2'",
    ),
    ("max len low", _set(QWEN_MAX_MODEL_LEN="1023"), "QWEN_MAX_MODEL_LEN", "outside 1024..262144"),
    ("max len high", _set(QWEN_MAX_MODEL_LEN="262145"), "QWEN_MAX_MODEL_LEN", "outside 1024..262144"),
    ("gpu util low", _set(QWEN_GPU_MEMORY_UTILIZATION="0.19"), "QWEN_GPU_MEMORY_UTILIZATION", "outside 0.20..0.90"),
    ("gpu util high", _set(QWEN_GPU_MEMORY_UTILIZATION="0.91"), "QWEN_GPU_MEMORY_UTILIZATION", "outside 0.20..0.90"),
    (
        "improvement zero",
        _set(QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT="0"),
        "QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT",
        "must be in (0, 100]",
    ),
    (
        "improvement above 100",
        _set(QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT="101"),
        "QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT",
        "must be in (0, 100]",
    ),
    ("hash workers negative", _set(OMNI_HASH_WORKERS="-1"), "OMNI_HASH_WORKERS", "OMNI_HASH_WORKERS must be"),
    (
        "dtype bf16",
        _set(QWEN_DTYPE="bfloat16"),
        "QWEN_DTYPE",
        "QWEN_DTYPE is fixed to float16 for the Qwen3.8-27B profile (qwen3.8-27b-mi300x), got 'bfloat16'",
    ),
    ("dtype unknown", _set(QWEN_DTYPE="int8"), "QWEN_DTYPE", "QWEN_DTYPE must be one of float16, bfloat16, float32"),
    (
        "profile name a path",
        _set(OMNI_TARGET_PROFILE="../etc/passwd"),
        "OMNI_TARGET_PROFILE",
        "OMNI_TARGET_PROFILE must name a target profile (",
    ),
    (
        "profile unknown",
        _set(OMNI_TARGET_PROFILE="qwen9-mi300x"),
        "OMNI_TARGET_PROFILE",
        "OMNI_TARGET_PROFILE: no target profile named 'qwen9-mi300x' (shipped: qwen3.5-tiny-cpu, qwen3.8-27b-mi300x)",
    ),
    (
        "profile other than the image pin",
        _baked_with(OMNI_TARGET_PROFILE="qwen3.5-tiny-cpu"),
        "OMNI_TARGET_PROFILE",
        "OMNI_TARGET_PROFILE='qwen3.5-tiny-cpu' differs from the image pin target_profile 'qwen3.8-27b-mi300x'",
    ),
    (
        "image pins name no profile",
        _baked_with(target_profile=None),
        "target_profile",
        "this image's pins name no target_profile",
    ),
    (
        "tmpdir too long for sockets",
        _set(TMPDIR="/tmp/" + "t" * 80),
        "TMPDIR",
        "TMPDIR is 85 bytes long: the engine's local sockets live there",
    ),
    ("wildcard bind", _set(QWEN_BIND_HOST="0.0.0.0"), "QWEN_BIND_HOST", "requires QWEN_CONTAINER_INTERNAL_ONLY=1"),
    ("public bind", _set(QWEN_BIND_HOST="10.0.0.5"), "QWEN_BIND_HOST", "may bind only to loopback"),
    # model path
    ("model path URL", _set(MODEL_PATH="hf://Qwen/Qwen3.8-27B"), "MODEL_PATH", "not a URL"),
    ("model path relative", _set(MODEL_PATH="models/qwen"), "MODEL_PATH", "must be an absolute local path"),
    ("model path missing", _set(MODEL_PATH="/nonexistent/qwen"), "MODEL_PATH", "does not exist"),
    ("model path a file", _model_path_is_file, "MODEL_PATH", "is not a directory"),
    ("model id", _set(MODEL_ID="Qwen/Qwen3-32B"), "MODEL_ID", "MODEL_ID must be exactly"),
    ("model revision branch", _set(MODEL_REVISION="main"), "MODEL_REVISION", "immutable 40-character commit SHA"),
    # target config
    ("config missing", _remove("config.json"), "target config", "target config is missing"),
    ("config empty", _write("config.json", b""), "target config", "not a non-empty local file"),
    ("config not JSON", _write("config.json", b"{nope"), "target config", "target config is not valid JSON"),
    ("config not UTF-8", _write("config.json", b"\xff\xfe{}"), "target config", "target config is not valid UTF-8"),
    ("config an array", _write("config.json", b"[1]"), "target config", "must contain a JSON object"),
    (
        "config oversized",
        _write("config.json", b" " * (16 * 1024 * 1024 + 1)),
        "target config",
        "is 16777217 bytes; at most 16777216 allowed",
    ),
    (
        "architecture",
        _config(lambda c: c.__setitem__("architectures", ["LlamaForCausalLM"])),
        "config.json",
        "not the exact Qwen3.8-27B architecture (config.json architectures must be [",
    ),
    (
        "model type",
        _config(lambda c: c.__setitem__("model_type", "qwen3")),
        "config.json",
        "exact Qwen3.8-27B architecture",
    ),
    (
        "no text_config",
        _config(lambda c: c.pop("text_config")),
        "config.json:text_config",
        "target config has no text_config object",
    ),
    (
        "text model_type",
        _text("model_type", "qwen3_text"),
        "config.json:text_config.model_type",
        "text_config.model_type is not the Qwen3.8-27B value",
    ),
    (
        "hidden size",
        _text("hidden_size", 4096),
        "config.json:text_config.hidden_size",
        "hidden_size is not the Qwen3.8-27B value 5120",
    ),
    (
        "layers",
        _text("num_hidden_layers", 48),
        "config.json:text_config.num_hidden_layers",
        "num_hidden_layers is not the Qwen3.8-27B value 64",
    ),
    (
        "vocab",
        _text("vocab_size", 151936),
        "config.json:text_config.vocab_size",
        "vocab_size is not the Qwen3.8-27B value 248320",
    ),
    # Equal in Python but not the same JSON type: 5120.0 is not 5120.
    (
        "hidden size a float",
        _text("hidden_size", 5120.0),
        "config.json:text_config.hidden_size",
        "hidden_size is not the Qwen3.8-27B value 5120",
    ),
    (
        "vocab a float",
        _text("vocab_size", 248320.0),
        "config.json:text_config.vocab_size",
        "vocab_size is not the Qwen3.8-27B value 248320",
    ),
    (
        "max positions missing",
        _config(lambda c: c["text_config"].pop("max_position_embeddings")),
        "config.json:text_config.max_position_embeddings",
        "max_position_embeddings is invalid",
    ),
    (
        "max positions zero",
        _text("max_position_embeddings", 0),
        "config.json:text_config.max_position_embeddings",
        "max_position_embeddings is invalid",
    ),
    (
        "max positions negative",
        _text("max_position_embeddings", -1),
        "config.json:text_config.max_position_embeddings",
        "max_position_embeddings is invalid",
    ),
    (
        "max positions true",
        _text("max_position_embeddings", True),
        "config.json:text_config.max_position_embeddings",
        "max_position_embeddings is invalid",
    ),
    (
        "max positions text",
        _text("max_position_embeddings", "65536"),
        "config.json:text_config.max_position_embeddings",
        "max_position_embeddings is invalid",
    ),
    # attestation
    (
        "attestation missing",
        _remove(".omni-checkpoint.json"),
        "QWEN_CHECKPOINT_MANIFEST_PATH",
        "expected .omni-checkpoint.json",
    ),
    (
        "attestation elsewhere missing",
        _set(QWEN_CHECKPOINT_MANIFEST_PATH="/nonexistent/a.json"),
        "QWEN_CHECKPOINT_MANIFEST_PATH",
        "attestation is missing",
    ),
    (
        "attestation pin malformed",
        _set(QWEN_CHECKPOINT_MANIFEST_SHA256="abc"),
        "QWEN_CHECKPOINT_MANIFEST_SHA256",
        "64-character SHA-256",
    ),
    (
        "attestation pin differs",
        _set(QWEN_CHECKPOINT_MANIFEST_SHA256=SHA_A),
        "QWEN_CHECKPOINT_MANIFEST_SHA256",
        "does not match its external pin",
    ),
    (
        "attestation not JSON",
        lambda w: (_write(".omni-checkpoint.json", b"nope")(w), w.env.pop("QWEN_CHECKPOINT_MANIFEST_SHA256")),
        "checkpoint attestation",
        "checkpoint attestation is not valid JSON",
    ),
    ("schema version", _attest(schema_version="2"), "checkpoint attestation.schema_version", "Input should be '1'"),
    ("unknown field", _attest(signed_by="me"), "checkpoint attestation.signed_by", "unknown field"),
    ("field missing", lambda w: w.reattest(config_sha256=None), "checkpoint attestation.config_sha256", "string"),
    ("wrong type", _attest(expected_shard_count="2"), "checkpoint attestation.expected_shard_count", "integer"),
    ("attested model id", _attest(model_id="Qwen/Other"), "checkpoint attestation.model_id", "does not match MODEL_ID"),
    (
        "attested revision malformed",
        _attest(revision="main"),
        "checkpoint attestation.revision",
        "40-character commit SHA",
    ),
    (
        "attested revision differs",
        _attest(revision=REV_B),
        "checkpoint attestation.revision",
        "does not match MODEL_REVISION",
    ),
    (
        "config sha malformed",
        _attest(config_sha256="xyz"),
        "checkpoint attestation.config_sha256",
        "64-character SHA-256",
    ),
    (
        "config sha differs",
        _attest(config_sha256=SHA_A),
        "checkpoint attestation.config_sha256",
        "config.json SHA-256 does not match",
    ),
    ("index path absolute", _attest(weight_index_path="/etc/passwd"), "target weight index", "safe path relative"),
    (
        "index path dotdot",
        _attest(weight_index_path="../qwen/model.safetensors.index.json"),
        "target weight index",
        "safe path relative",
    ),
    ("index symlink escapes", _symlink_index_outside, "target weight index", "escapes the checkpoint root"),
    (
        "index missing",
        _attest(weight_index_path="missing.json"),
        "target weight index",
        "target weight index is missing",
    ),
    (
        "index sha malformed",
        _attest(weight_index_sha256="0"),
        "checkpoint attestation.weight_index_sha256",
        "64-character",
    ),
    (
        "index sha differs",
        _attest(weight_index_sha256=SHA_A),
        "checkpoint attestation.weight_index_sha256",
        "weight index SHA-256 does not match",
    ),
    (
        "no weight_map",
        lambda w: w.edit_index(lambda i: i.pop("weight_map")),
        "model.safetensors.index.json:weight_map",
        "has no weight_map",
    ),
    (
        "empty weight_map",
        lambda w: w.edit_index(lambda i: i.__setitem__("weight_map", {})),
        "model.safetensors.index.json:weight_map",
        "has no weight_map",
    ),
    ("weight_map a list", _weight_map_a_list, "model.safetensors.index.json:weight_map", "has no weight_map"),
    (
        "weight_map value not a name",
        lambda w: w.edit_index(lambda i: i["weight_map"].__setitem__("x", 42)),
        "model.safetensors.index.json:weight_map",
        "maps a tensor to something other than a file name",
    ),
    (
        "shard missing",
        _remove("model-00002-of-00002.safetensors"),
        "target weight shard",
        "target weight shard is missing",
    ),
    (
        "shard empty",
        _write("model-00001-of-00002.safetensors", b""),
        "target weight shard",
        "not a non-empty local file",
    ),
    (
        "shard escapes",
        lambda w: w.edit_index(lambda i: i["weight_map"].__setitem__("x", "../../etc/passwd")),
        "target weight shard",
        "safe path relative",
    ),
    (
        "shard count zero",
        _attest(expected_shard_count=0),
        "checkpoint attestation.expected_shard_count",
        "greater than 0",
    ),
    (
        "shard count differs",
        _attest(expected_shard_count=3),
        "checkpoint attestation.expected_shard_count",
        "shard count does not match",
    ),
    ("shard digest differs", _swap_shard, "model-00001-of-00002.safetensors", "SHA-256 does not match its attestation"),
    ("shard size differs", _grow_shard, "model-00001-of-00002.safetensors", "bytes, its attestation says"),
    ("shard list incomplete", _shard_list_short, "checkpoint attestation.shards", "must list each indexed shard once"),
    ("shard listed twice", _shard_list_duplicate, "checkpoint attestation.shards", "must list each indexed shard once"),
    (
        "shard not indexed",
        _shard_list_extra,
        "checkpoint attestation.shards",
        "not indexed: ['model-extra.safetensors']",
    ),
    # installed vLLM and hardware
    (
        "vllm absent",
        lambda w: setattr(w, "site", w.base / "empty-site"),
        "vllm",
        "installed vLLM cannot serve the exact Qwen3.8 target",
    ),
    ("vllm without qwen3_5", _fresh_engine(ar=False), "vllm", "cannot serve the exact Qwen3.8 target"),
    ("gpu arch required", _set(QWEN_REQUIRE_GPU_ARCH="gfx950"), "QWEN_REQUIRE_GPU_ARCH", "was not found locally"),
    # server argv
    (
        "max len above checkpoint",
        lambda w: w.edit_config(
            lambda c: c["text_config"].__setitem__("max_position_embeddings", 32768), reattest=True
        ),
        "QWEN_MAX_MODEL_LEN",
        "exceeds the checkpoint's declared limit",
    ),
    (
        "checkpoint limit of one token",
        lambda w: w.edit_config(lambda c: c["text_config"].__setitem__("max_position_embeddings", 1), reattest=True),
        "QWEN_MAX_MODEL_LEN",
        "exceeds the checkpoint's declared limit",
    ),
    (
        "served name empty",
        _set(QWEN_SERVED_MODEL_NAME=" "),
        "QWEN_SERVED_MODEL_NAME",
        "QWEN_SERVED_MODEL_NAME is invalid",
    ),
    ("served name long", _set(QWEN_SERVED_MODEL_NAME="x" * 129), "QWEN_SERVED_MODEL_NAME", "is invalid"),
    ("api key empty", _set(QWEN_API_KEY=""), "QWEN_API_KEY", "non-empty local API key"),
    ("api key long", _set(QWEN_API_KEY="k" * 513), "QWEN_API_KEY", "non-empty local API key"),
]


def _spec_config(change: Callable[[dict], None]) -> Callable[[LauncherWorld], None]:
    return lambda world: world.edit_speculator_config(change)


def _spec(**overrides: Any) -> Callable[[LauncherWorld], None]:
    return lambda world: world.edit_speculator_attestation(**overrides)


def _gate(**overrides: Any) -> Callable[[LauncherWorld], None]:
    return lambda world: world.edit_gate(**overrides)


def _gate_part(part: str, **overrides: Any) -> Callable[[LauncherWorld], None]:
    from tests.fixtures.qwen import gate_document

    return lambda world: world.edit_gate(**{part: {**gate_document()[part], **overrides}})


def _weight(**overrides: Any) -> Callable[[LauncherWorld], None]:
    def apply(world: LauncherWorld) -> None:
        doc = json.loads((world.speculator / ".omni-speculator.json").read_text())
        world.edit_speculator_attestation(weight_files=[{**doc["weight_files"][0], **overrides}])

    return apply


def _no_rocm(world: LauncherWorld) -> None:
    (world.bin / "rocminfo").unlink()


CANARY: list[Row] = [
    ("canary not enabled", _unset("QWEN_DFLASH2_CANARY"), "QWEN_DFLASH2_CANARY", "not explicitly enabled"),
    ("other hardware profile", _set(OMNI_HARDWARE_PROFILE="mi250x_single"), "OMNI_HARDWARE_PROFILE", "MI300X/gfx942"),
    (
        "profile without a drafter",
        use_tiny_target,
        "INFERENCE_MODE",
        "the target profile qwen3.5-tiny-cpu allows no DFlash2 canary",
    ),
    (
        "no gfx942 present",
        _no_rocm,
        "OMNI_HARDWARE_PROFILE",
        "DFlash2 canary gate was not measured on the active MI300X/gfx942",
    ),
    ("vllm lacks dflash2", _fresh_engine(dflash2=False), "vllm", "does not prove DFlash2"),
    (
        "vllm commit pin malformed",
        _set(DFLASH2_VLLM_COMMIT="v0.18.1"),
        "DFLASH2_VLLM_COMMIT",
        "40-character commit SHA",
    ),
    (
        "vllm commit differs",
        _set(DFLASH2_VLLM_COMMIT=REV_B),
        "DFLASH2_VLLM_COMMIT",
        "does not equal the DFlash2 commit pin",
    ),
    ("vllm commit unknown", _fresh_engine(commit=None), "DFLASH2_VLLM_COMMIT", "installed unknown"),
    (
        "speculator path unset",
        _unset("DFLASH2_SPECULATOR_PATH"),
        "DFLASH2_SPECULATOR_PATH",
        "DFLASH2_SPECULATOR_PATH is required",
    ),
    (
        "speculator path missing",
        _set(DFLASH2_SPECULATOR_PATH="/nonexistent/d"),
        "DFLASH2_SPECULATOR_PATH",
        "does not exist",
    ),
    ("speculator revision", _set(DFLASH2_SPECULATOR_REVISION="main"), "DFLASH2_SPECULATOR_REVISION", "40-character"),
    (
        "speculator config missing",
        lambda w: (w.speculator / "config.json").unlink(),
        "DFlash2 config",
        "DFlash2 config is missing",
    ),
    (
        "speculator architecture",
        _spec_config(lambda c: c.__setitem__("architectures", ["X"])),
        "DFlash2 config.architectures",
        "DFlash2 config does not declare DFlash2DraftModel",
    ),
    (
        "speculator model_type missing",
        _spec_config(lambda c: c.pop("model_type")),
        "DFlash2 config.model_type",
        "DFlash2 config has no model_type (found None)",
    ),
    (
        "speculator model_type empty",
        _spec_config(lambda c: c.__setitem__("model_type", " ")),
        "DFlash2 config.model_type",
        "vLLM cannot load it",
    ),
    (
        "speculator hidden size",
        _spec_config(lambda c: c.__setitem__("hidden_size", 4096)),
        "DFlash2 config.hidden_size",
        "not shaped for the exact Qwen3.8-27B target",
    ),
    (
        "speculator target layers",
        _spec_config(lambda c: c.__setitem__("num_target_layers", 48)),
        "DFlash2 config.num_target_layers",
        "not shaped",
    ),
    (
        "speculator layers",
        _spec_config(lambda c: c.__setitem__("num_hidden_layers", 4)),
        "DFlash2 config.num_hidden_layers",
        "not shaped",
    ),
    (
        "speculator vocab",
        _spec_config(lambda c: c.__setitem__("vocab_size", 1)),
        "DFlash2 config.vocab_size",
        "not shaped",
    ),
    (
        "drafter shape",
        _spec_config(lambda c: c["dflash_config"].__setitem__("block_size", 16)),
        "DFlash2 config.dflash_config",
        "published drafter shape",
    ),
    (
        "drafter config missing",
        _spec_config(lambda c: c.pop("dflash_config")),
        "DFlash2 config.dflash_config",
        "published drafter shape",
    ),
    ("speculator pin malformed", _set(DFLASH2_MANIFEST_SHA256="nope"), "DFLASH2_MANIFEST_SHA256", "64-character"),
    (
        "speculator pin differs",
        _set(DFLASH2_MANIFEST_SHA256=SHA_A),
        "DFLASH2_MANIFEST_SHA256",
        "does not match the pinned value",
    ),
    (
        "speculator attestation missing",
        lambda w: (w.speculator / ".omni-speculator.json").unlink(),
        ".omni-speculator.json",
        "DFlash2 attestation is missing",
    ),
    ("speculator schema", _spec(schema_version="0"), "DFlash2 attestation.schema_version", "Input should be '1'"),
    ("speculator unknown field", _spec(note="x"), "DFlash2 attestation.note", "unknown field"),
    (
        "speculator model id",
        _spec(model_id="someone/else"),
        "DFlash2 attestation.model_id",
        "wrong schema or exact model_id",
    ),
    ("speculator attested revision", _spec(revision=REV_B), "DFlash2 attestation.revision", "does not match its pin"),
    (
        "speculator target",
        _spec(target={"model_id": "Qwen/Qwen3.8-27B", "revision": REV_B}),
        "DFlash2 attestation.target",
        "not bound to the exact target checkpoint",
    ),
    (
        "speculator config sha",
        _spec(config_sha256=SHA_A),
        "DFlash2 attestation.config_sha256",
        "config SHA-256 does not match",
    ),
    ("speculator weight list", _spec(weight_files=[]), "DFlash2 attestation.weight_files", "its one exact weight file"),
    (
        "speculator weight path",
        _weight(path="other.safetensors"),
        "DFlash2 attestation.weight_files.0.path",
        "DFlash2 weight file must be exactly model.safetensors",
    ),
    (
        "speculator weight missing",
        lambda w: (w.speculator / "model.safetensors").unlink(),
        "DFlash2 weight file",
        "is missing",
    ),
    ("speculator weight size", _weight(size=1), "DFlash2 attestation.weight_files.0.size", "size does not match"),
    (
        "speculator weight sha",
        _weight(sha256=SHA_A),
        "DFlash2 attestation.weight_files.0.sha256",
        "weight SHA-256 does not match",
    ),
    (
        "gate path unset",
        _unset("QWEN_DFLASH2_GATE_PATH"),
        "QWEN_DFLASH2_GATE_PATH",
        "QWEN_DFLASH2_GATE_PATH is required",
    ),
    ("gate file missing", lambda w: w.gate.unlink(), "QWEN_DFLASH2_GATE_PATH", "DFlash2 gate is missing"),
    ("gate pin malformed", _set(QWEN_DFLASH2_GATE_SHA256="1234"), "QWEN_DFLASH2_GATE_SHA256", "64-character"),
    ("gate pin differs", _set(QWEN_DFLASH2_GATE_SHA256=SHA_A), "QWEN_DFLASH2_GATE_SHA256", "does not match its pin"),
    ("gate schema", _gate(schema_version="2"), "DFlash2 gate.schema_version", "Input should be '1'"),
    ("gate unknown field", _gate(comment="trust me"), "DFlash2 gate.comment", "unknown field"),
    ("gate for another engine", _gate(engine="sglang"), "DFlash2 gate.engine", "not bound to the active runtime"),
    (
        "gate target model",
        _gate(target_model_id="Qwen/Other"),
        "DFlash2 gate.target_model_id",
        "not bound to the active runtime",
    ),
    ("gate target revision", _gate(target_revision=REV_B), "DFlash2 gate.target_revision", "not bound"),
    ("gate speculator model", _gate(speculator_model_id="x/y"), "DFlash2 gate.speculator_model_id", "not bound"),
    ("gate speculator revision", _gate(speculator_revision=REV_B), "DFlash2 gate.speculator_revision", "not bound"),
    ("gate vllm commit", _gate(vllm_commit=REV_B), "DFlash2 gate.vllm_commit", "not bound"),
    ("gate hardware profile", _gate(hardware_profile="h100"), "DFlash2 gate.hardware_profile", "not bound"),
    ("gate gpu arch", _gate(gpu_arch="gfx90a"), "DFlash2 gate.gpu_arch", "not bound"),
    ("parity failed", _gate_part("parity", passed=False), "DFlash2 gate.parity.passed", "parity gate has not passed"),
    (
        "parity partial",
        _gate_part("parity", covers=["greedy"]),
        "DFlash2 gate.parity.covers",
        "does not cover all required",
    ),
    ("parity corpus sha", _gate_part("parity", corpus_sha256="x"), "DFlash2 gate.parity.corpus_sha256", "64-character"),
    ("parity result sha", _gate_part("parity", result_sha256=""), "DFlash2 gate.parity.result_sha256", "64-character"),
    (
        "benchmark failed",
        _gate_part("benchmark", passed=False),
        "DFlash2 gate.benchmark.passed",
        "benchmark gate has not passed",
    ),
    (
        "concurrency 2 missing",
        _gate_part("benchmark", concurrency=[1]),
        "DFlash2 gate.benchmark.concurrency",
        "concurrency 1 and 2",
    ),
    (
        "too few samples",
        _gate_part("benchmark", samples_per_mode=99),
        "DFlash2 gate.benchmark.samples_per_mode",
        "at least 100 samples",
    ),
    ("p95 not a number", _gate_part("benchmark", ar_p95_ms="fast"), "DFlash2 gate.benchmark.ar_p95_ms", "valid number"),
    ("p95 zero", _gate_part("benchmark", ar_p95_ms=0), "DFlash2 gate.benchmark.dflash2_p95_ms", "did not beat AR p95"),
    (
        "p95 slower",
        _gate_part("benchmark", dflash2_p95_ms=120.0),
        "DFlash2 gate.benchmark.dflash2_p95_ms",
        "did not beat AR p95",
    ),
    (
        "p95 equal",
        _gate_part("benchmark", dflash2_p95_ms=100.0),
        "DFlash2 gate.benchmark.dflash2_p95_ms",
        "did not beat AR p95",
    ),
    (
        "draft p95 zero",
        _gate_part("benchmark", dflash2_p95_ms=0),
        "DFlash2 gate.benchmark.dflash2_p95_ms",
        "did not beat AR p95",
    ),
    (
        "draft p95 negative",
        _gate_part("benchmark", dflash2_p95_ms=-5.0),
        "DFlash2 gate.benchmark.dflash2_p95_ms",
        "did not beat AR p95",
    ),
    (
        "concurrency 1 missing",
        _gate_part("benchmark", concurrency=[2]),
        "DFlash2 gate.benchmark.concurrency",
        "concurrency 1 and 2",
    ),
    (
        "p95 below threshold",
        _gate_part("benchmark", dflash2_p95_ms=97.0),
        "QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT",
        "below the configured canary threshold",
    ),
]


@pytest.fixture
def world(tmp_path: Path) -> LauncherWorld:
    return LauncherWorld(tmp_path)


@pytest.mark.parametrize("name,breaker,field,message", FATAL, ids=[row[0] for row in FATAL])
def test_fatal_refusal(world: LauncherWorld, name: str, breaker, field: str, message: str) -> None:
    world.env["INFERENCE_MODE"] = "auto"
    breaker(world)
    result = world.run()
    assert result.code == 2, (name, result.stdout, result.stderr)
    refusal = result.refusal
    assert refusal["ok"] is False
    assert message in refusal["error"], refusal
    assert refusal["field"] == field, refusal
    assert result.exec_calls == []
    assert result.stdout == ""
    key = world.env.get("QWEN_API_KEY")
    if key:
        assert key not in result.stderr  # a refusal never leaks the key


@pytest.mark.parametrize("name,breaker,field,message", CANARY, ids=[row[0] for row in CANARY])
def test_canary_refusal_falls_back_with_reason(
    world: LauncherWorld, name: str, breaker, field: str, message: str
) -> None:
    world.env["INFERENCE_MODE"] = "dflash2_canary"
    breaker(world)
    result = world.run("--explain")
    assert result.code == 0, result.stderr
    report = result.report
    decision = report["decision"]
    assert decision["mode"] == "native_mtp", decision
    canary_reasons = [reason for reason in decision["reasons"] if reason.startswith("DFlash2 canary disabled: ")]
    assert len(canary_reasons) == 1 and message in canary_reasons[0], decision
    verdict = {item["mode"]: item for item in report["explain"]}["dflash2_canary"]
    assert verdict["accepted"] is False and message in verdict["reasons"][0]
    assert verdict["field"] == field, verdict
    assert result.exec_calls == []


def _raise_sites() -> list[str]:
    """The longest literal part of every `raise LauncherError(...)` message in launcher/."""
    starts = []
    for path in sorted(Path("launcher").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Raise)
                and isinstance(node.exc, ast.Call)
                and getattr(node.exc.func, "id", "") == "LauncherError"
                and node.exc.args
            ):
                first = node.exc.args[0]
                while isinstance(first, ast.BinOp):
                    first = first.left
                if isinstance(first, ast.JoinedStr):
                    chunks = [str(v.value) for v in first.values if isinstance(v, ast.Constant)]
                    starts.append(max(chunks, key=len))
                elif isinstance(first, ast.Constant):
                    starts.append(str(first.value))
    return starts


def test_every_raise_site_has_a_row(capsys) -> None:
    messages = [row[3] for row in FATAL + CANARY]
    uncovered = []
    for literal in _raise_sites():
        if not any(message in literal or literal.strip() in message for message in messages):
            uncovered.append(literal)
    with capsys.disabled():
        print(
            f"\nrefusal rows: {len(FATAL)} fatal + {len(CANARY)} canary = {len(FATAL) + len(CANARY)}; "
            f"LauncherError raise sites covered: {len(_raise_sites())}"
        )
    assert not uncovered, f"raise sites with no refusal row: {uncovered}"


@pytest.mark.parametrize(
    "name,breaker",
    [
        ("samples exactly 100", _gate_part("benchmark", samples_per_mode=100)),
        ("improvement exactly at the threshold", _gate_part("benchmark", dflash2_p95_ms=95.0)),
        ("more concurrency levels", _gate_part("benchmark", concurrency=[1, 2, 4])),
        ("sub-millisecond latencies", _gate_part("benchmark", ar_p95_ms=1.0, dflash2_p95_ms=0.5)),
        ("threshold raised to exactly the improvement", _set(QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT="20")),
    ],
)
def test_gates_on_the_accepting_side_of_each_boundary_enable_the_canary(
    world: LauncherWorld, name: str, breaker
) -> None:
    world.env["INFERENCE_MODE"] = "dflash2_canary"
    breaker(world)
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    assert result.report["decision"]["mode"] == "dflash2_canary", (name, result.report["decision"])


@pytest.mark.parametrize(
    "name,breaker,field,message",
    CANARY[::3]
    + [
        ("no breaker", lambda w: None, "", ""),
        (
            "no mtp head",
            lambda w: w.edit_config(lambda c: c["text_config"].__setitem__("mtp_num_hidden_layers", 0), reattest=True),
            "",
            "",
        ),
    ],
    ids=[row[0] for row in CANARY[::3]] + ["no breaker", "no mtp head"],
)
def test_explain_selects_what_a_real_launch_execs(
    world: LauncherWorld, name: str, breaker, field: str, message: str
) -> None:
    world.env["INFERENCE_MODE"] = "dflash2_canary" if field else "auto"
    breaker(world)
    explained = world.run("--explain")
    launched = world.run()
    assert explained.code == 0 and launched.code == 127 and launched.exec_calls, (explained.stderr, launched.stderr)
    selected = [item["mode"] for item in explained.report["explain"] if item["selected"]]
    assert selected == [launched.report["decision"]["mode"]] == [explained.report["decision"]["mode"]]
    argv = list(launched.exec_calls[0][1])
    speculative = launched.report["decision"]["speculative_config"]
    if speculative is None:
        assert "--speculative-config" not in argv
    else:
        assert json.loads(argv[argv.index("--speculative-config") + 1]) == speculative


def _positions(limit: int) -> Callable[[LauncherWorld], None]:
    return lambda world: world.edit_config(
        lambda c: c["text_config"].__setitem__("max_position_embeddings", limit), reattest=True
    )


# Both sides of each limit the server command enforces: the last accepted value, then one past it.
LIMITS = [
    ("served name 128", _set(QWEN_SERVED_MODEL_NAME="n" * 128), None, None),
    ("served name 129", _set(QWEN_SERVED_MODEL_NAME="n" * 129), "QWEN_SERVED_MODEL_NAME", "1..128 characters"),
    ("api key 512", _set(QWEN_API_KEY="k" * 512), None, None),
    ("api key 513", _set(QWEN_API_KEY="k" * 513), "QWEN_API_KEY", "at most 512 characters"),
    (
        "max len at the checkpoint's limit",
        lambda w: (_positions(65536)(w), _set(QWEN_MAX_MODEL_LEN="65536")(w)),
        None,
        None,
    ),
    (
        "max len one past it",
        lambda w: (_positions(65536)(w), _set(QWEN_MAX_MODEL_LEN="65537")(w)),
        "QWEN_MAX_MODEL_LEN",
        "(65537 > max_position_embeddings 65536)",
    ),
]


@pytest.mark.parametrize("name,change,field,message", LIMITS, ids=[row[0] for row in LIMITS])
def test_server_limits_on_both_sides(world: LauncherWorld, name: str, change, field, message) -> None:
    change(world)
    result = world.run("--inspect-only")
    if field is None:
        assert result.code == 0, result.stderr
        return
    assert result.code == 2 and result.refusal["field"] == field and message in result.refusal["error"]


@pytest.mark.parametrize(
    "argv,printed",
    [
        (["vllm", "--api-key", "s3cret"], ["vllm", "--api-key", "[REDACTED]"]),
        (["vllm", "--api-key", "s3cret", "--port", "1"], ["vllm", "--api-key", "[REDACTED]", "--port", "1"]),
        (["vllm", "--api-key=s3cret"], ["vllm", "[REDACTED]"]),
        (["vllm", "--api-key"], ["vllm", "--api-key"]),
        (["--api-key", "a", "--api-key", "b"], ["--api-key", "[REDACTED]", "--api-key", "[REDACTED]"]),
    ],
)
def test_the_printed_server_command_never_shows_the_key(argv: list[str], printed: list[str]) -> None:
    from launcher.server import redact_argv

    assert redact_argv(argv) == printed
