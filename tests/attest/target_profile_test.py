"""Target profiles (attest/profile.py, launcher/profiles/): the seed's values exactly, every
malformed profile refused naming its field, the image pin choosing the profile, and the
test-only tiny CPU profile agreeing with the checkpoint tools/dev/tiny_model writes."""

from __future__ import annotations

import copy
import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from attest.documents import parse_document
from attest.errors import AttestError
from attest.pins import BakedImage
from attest.profile import TargetProfile
from launcher.target import DEFAULT_PROFILE, PROFILES_DIR, load_target_profile, select_target_profile, shipped_profiles
from tests.fixtures.pins import qwen_pins
from tests.fixtures.qwen import TINY_MODEL_ID, TINY_PROFILE, LauncherWorld, use_tiny_target
from tools.dev.tiny_model import tiny_qwen

# The seed launcher's constants (qwen_mi300x_launcher.py), written out here on purpose: the
# profile must not drift from them.
SEED = {
    "model_id": "Qwen/Qwen3.8-27B",
    "architecture": "Qwen3_5ForConditionalGeneration",
    "model_type": "qwen3_5",
    "text_config": "text_config",
    "text_shape": {"model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64, "vocab_size": 248320},
    "mtp": {
        "layers_field": "mtp_num_hidden_layers",
        "layers": 1,
        "weight_groups": ["mtp.layers.0.", "mtp.fc.", "mtp.norm."],
        "groups_label": "mtp.layers/fc/norm",
    },
    "hardware": {"profile": "mi300x_single", "gpu_arch": "gfx942", "description": "MI300X/gfx942"},
    "modes": ["autoregressive", "native_mtp", "dflash2_canary"],
    "dflash2": {
        "model_id": "incoai/Qwen3.8-27B-DFlash2",
        "architecture": "DFlash2DraftModel",
        "shape": {"hidden_size": 5120, "num_target_layers": 64, "num_hidden_layers": 5, "vocab_size": 248320},
        "drafter_config": {
            "block_size": 8,
            "conv_group_size": 16,
            "conv_kernel_size": 2,
            "selector_rank": 256,
            "selector_top_k": 16,
            "target_layer_ids": [5, 19, 33, 47, 61],
        },
        "weight_file": "model.safetensors",
        "speculative_tokens": 7,
    },
    "server": {
        "dtypes": ["float16"],
        "prefix_caching": True,
        "chunked_prefill": True,
        "gpu_memory_utilization": True,
        "enforce_eager": False,
        "tool_call_parser": None,
    },
}


def _document(name: str) -> dict[str, Any]:
    return json.loads((PROFILES_DIR / f"{name}.json").read_text())


def test_every_shipped_profile_loads_and_is_named_by_its_file() -> None:
    assert shipped_profiles() == ["qwen3.5-tiny-cpu", "qwen3.8-27b-mi300x"]
    for name in shipped_profiles():
        assert load_target_profile(name).name == name


def test_the_default_profile_carries_exactly_the_seed_values() -> None:
    profile = load_target_profile(DEFAULT_PROFILE)
    assert DEFAULT_PROFILE == "qwen3.8-27b-mi300x" and profile.test_only is False
    assert {key: profile.model_dump(mode="json")[key] for key in SEED} == SEED


def test_the_tiny_profile_describes_the_checkpoint_tools_tiny_model_writes() -> None:
    profile = load_target_profile(TINY_PROFILE)
    config = tiny_qwen.TEXT_CONFIG
    assert profile.test_only is True and profile.model_id == TINY_MODEL_ID
    assert profile.architecture == "Qwen3_5ForCausalLM" and profile.text_config is None
    assert profile.text_shape == {key: config[key] for key in profile.text_shape}
    assert profile.mtp is not None and config[profile.mtp.layers_field] == profile.mtp.layers
    names = tiny_qwen.tensor_shapes()
    assert all(any(name.startswith(group) for name in names) for group in profile.mtp.weight_groups)
    # What vLLM on the CPU needs (issue #15): bf16, no prefix caching with speculation, eager.
    assert profile.server.dtypes == ["bfloat16"] and not profile.server.prefix_caching and profile.server.enforce_eager
    assert "dflash2_canary" not in profile.modes and profile.hardware.gpu_arch == ""


def _broken(change) -> dict[str, Any]:
    document = copy.deepcopy(_document(DEFAULT_PROFILE))
    change(document)
    return document


BAD_PROFILES = [
    ("unknown field", lambda d: d.__setitem__("extra", 1), "target profile.extra", "unknown field"),
    ("name with a slash", lambda d: d.__setitem__("name", "a/b"), "target profile.name", "must match"),
    ("no schema version", lambda d: d.pop("schema_version"), "target profile.schema_version", "missing"),
    ("no modes", lambda d: d.__setitem__("modes", []), "target profile.modes", "at least 1"),
    ("unknown mode", lambda d: d.__setitem__("modes", ["autoregressive", "eagle"]), "target profile.modes.1", ""),
    (
        "speculation first",
        lambda d: d.__setitem__("modes", ["native_mtp", "autoregressive", "dflash2_canary"]),
        "target profile",
        "must start with autoregressive",
    ),
    (
        "a mode twice",
        lambda d: d.__setitem__("modes", ["autoregressive", "native_mtp", "native_mtp", "dflash2_canary"]),
        "target profile",
        "list each mode once",
    ),
    (
        "mtp mode without layout",
        lambda d: d.__setitem__("mtp", None),
        "target profile",
        "native_mtp is allowed exactly",
    ),
    (
        "mtp layout without mode",
        lambda d: d.__setitem__("modes", ["autoregressive", "dflash2_canary"]),
        "target profile",
        "native_mtp is allowed exactly",
    ),
    ("canary without drafter", lambda d: d.__setitem__("dflash2", None), "target profile", "dflash2_canary is allowed"),
    (
        "canary without gpu arch",
        lambda d: d["hardware"].__setitem__("gpu_arch", ""),
        "target profile",
        "needs hardware.gpu_arch",
    ),
    ("mtp layers zero", lambda d: d["mtp"].__setitem__("layers", 0), "target profile.mtp.layers", "greater than 0"),
    ("no weight groups", lambda d: d["mtp"].__setitem__("weight_groups", []), "target profile.mtp.weight_groups", ""),
    ("dtype unknown", lambda d: d["server"].__setitem__("dtypes", ["int8"]), "target profile.server.dtypes.0", ""),
    ("no dtypes", lambda d: d["server"].__setitem__("dtypes", []), "target profile.server.dtypes", ""),
    (
        "shape value a float",
        lambda d: d["text_shape"].__setitem__("hidden_size", 5120.5),
        "target profile.text_shape.hidden_size",
        "",
    ),
    ("empty shape", lambda d: d.__setitem__("text_shape", {}), "target profile.text_shape", ""),
    (
        "flag as a string",
        lambda d: d["server"].__setitem__("enforce_eager", "false"),
        "target profile.server.enforce_eager",
        "",
    ),
    (
        "tool parser with a space",
        lambda d: d["server"].__setitem__("tool_call_parser", "a b"),
        "target profile.server.tool_call_parser",
        "pattern",
    ),
    (
        "speculative tokens zero",
        lambda d: d["dflash2"].__setitem__("speculative_tokens", 0),
        "target profile.dflash2.speculative_tokens",
        "",
    ),
]


@pytest.mark.parametrize("name, change, field, message", BAD_PROFILES, ids=[row[0] for row in BAD_PROFILES])
def test_a_malformed_profile_is_refused_naming_its_field(name: str, change, field: str, message: str) -> None:
    with pytest.raises(AttestError) as caught:
        parse_document(TargetProfile, _broken(change), label="target profile")
    # A value of a union (the shape's int | str | bool) is named with the member it failed.
    assert caught.value.field == field or caught.value.field.startswith(field + ".int"), str(caught.value)
    assert message in str(caught.value)


def _baked(**pins: Any) -> BakedImage:
    document = qwen_pins()
    document.update(pins)
    return BakedImage.model_validate(
        {
            "schema_version": "1",
            "toolkit_version": "0",
            "image": "qwen_mi300x",
            "pins": {k: v for k, v in document.items() if v is not None},
            "base_digest": "",
            "layers": [],
        }
    )


@pytest.mark.parametrize(
    "requested, by_default, baked, chosen, field",
    [
        (DEFAULT_PROFILE, True, None, DEFAULT_PROFILE, ""),
        (TINY_PROFILE, False, None, TINY_PROFILE, ""),
        ("qwen9", False, None, "", "OMNI_TARGET_PROFILE"),
        # Inside an image the pin chooses; the default setting does not count as a choice.
        (DEFAULT_PROFILE, True, {"target_profile": TINY_PROFILE}, TINY_PROFILE, ""),
        (TINY_PROFILE, False, {"target_profile": TINY_PROFILE}, TINY_PROFILE, ""),
        (DEFAULT_PROFILE, False, {"target_profile": TINY_PROFILE}, "", "OMNI_TARGET_PROFILE"),
        (DEFAULT_PROFILE, True, {"target_profile": None}, "", "target_profile"),
        (DEFAULT_PROFILE, True, {"target_profile": "qwen9"}, "", "target_profile"),
    ],
)
def test_the_image_pin_chooses_the_profile(requested: str, by_default: bool, baked, chosen: str, field: str) -> None:
    image = None if baked is None else _baked(**baked)
    if chosen:
        assert select_target_profile(requested, by_default, image).name == chosen
    else:
        with pytest.raises(AttestError) as caught:
            select_target_profile(requested, by_default, image)
        assert caught.value.field == field, str(caught.value)


def test_a_pin_naming_no_valid_profile_file_is_refused_by_the_pin_schema() -> None:
    with pytest.raises(ValueError, match="must match"):
        _baked(target_profile="../etc/passwd")


def test_the_tiny_checkpoint_is_the_same_bytes_every_time_and_well_formed(tmp_path: Path) -> None:
    first = {path.name: path.read_bytes() for path in tiny_qwen.write(tmp_path / "a")}
    second = {path.name: path.read_bytes() for path in tiny_qwen.write(tmp_path / "b")}
    assert first == second
    assert sorted(first) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    data = first["model.safetensors"]
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    assert length % 8 == 0 and header.pop("__metadata__") == {"format": "pt"}
    end = 0
    for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
        count = 1
        for size in entry["shape"]:
            count *= size
        assert entry["dtype"] == "BF16" and entry["data_offsets"] == [end, end + 2 * count], name
        end += 2 * count
    assert 8 + length + end == len(data)
    index = json.loads(first["model.safetensors.index.json"])
    assert set(index["weight_map"]) == set(header) == set(tiny_qwen.tensor_shapes())
    vocab = json.loads(first["tokenizer.json"])["model"]["vocab"]
    assert len(vocab) == 256 and len(set(vocab.values())) == 256
    assert hashlib.sha256(data).hexdigest() == hashlib.sha256(second["model.safetensors"]).hexdigest()


def test_bf16_rounds_to_nearest_even() -> None:
    assert tiny_qwen._bf16(1.0) == b"\x80\x3f" and tiny_qwen._bf16(-2.0) == b"\x00\xc0"
    # 1 + 2^-8 lies halfway between two bf16 values: ties go to the even one (1.0).
    assert tiny_qwen._bf16(1.0 + 2**-8) == b"\x80\x3f"
    assert tiny_qwen._bf16(1.0 + 3 * 2**-8) == b"\x82\x3f"


def test_the_launcher_serves_the_tiny_profile_with_its_own_server_flags(tmp_path: Path) -> None:
    world = LauncherWorld(tmp_path)
    use_tiny_target(world)
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    report = result.report
    assert report["checkpoint"]["profile"] == TINY_PROFILE and report["checkpoint"]["native_mtp_head"] is True
    assert report["decision"]["mode"] == "native_mtp"
    argv = report["server_argv"]
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv[argv.index("--max-model-len") + 1] == "1024"
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" in argv
    assert "--gpu-memory-utilization" not in argv and "--enable-prefix-caching" not in argv
    assert argv[argv.index("--tool-call-parser") - 1 : argv.index("--tool-call-parser") + 2] == [
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    assert any("is for tests only" in warning for warning in report["warnings"])


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"QWEN_DTYPE": "float16"}, "QWEN_DTYPE", "QWEN_DTYPE is fixed to bfloat16 for the Qwen3.5-tiny profile"),
        ({"MODEL_ID": "Qwen/Qwen3.8-27B"}, "MODEL_ID", "MODEL_ID must be exactly 'omni-test/Qwen3.5-tiny'"),
        ({"OMNI_TARGET_PROFILE": DEFAULT_PROFILE}, "MODEL_ID", "MODEL_ID must be exactly 'Qwen/Qwen3.8-27B'"),
        ({"QWEN_MAX_MODEL_LEN": "4096"}, "QWEN_MAX_MODEL_LEN", "exceeds the checkpoint's declared limit"),
    ],
)
def test_the_tiny_profile_refuses_what_it_does_not_serve(
    tmp_path: Path, change: dict, field: str, message: str
) -> None:
    world = LauncherWorld(tmp_path)
    use_tiny_target(world)
    world.env.update(change)
    result = world.run("--inspect-only")
    assert result.code == 2 and result.refusal["field"] == field and message in result.refusal["error"], result.stderr


def test_a_top_level_text_shape_is_checked_field_by_field(tmp_path: Path) -> None:
    world = LauncherWorld(tmp_path)
    use_tiny_target(world)
    world.edit_config(lambda config: config.__setitem__("hidden_size", 256), reattest=False)
    world.reattest(model_id=TINY_MODEL_ID)
    result = world.run("--inspect-only")
    assert result.code == 2 and result.refusal["field"] == "config.json:hidden_size", result.stderr
    assert "target hidden_size is not the Qwen3.5-tiny value 128" in result.refusal["error"]


def _built_checkpoint(tmp_path: Path) -> tuple[Path, str, str]:
    """Bazel's //tools/dev/tiny_model:checkpoint (named by OMNI_TINY_REVISION_FILE), or, outside
    Bazel, the same two steps its genrule runs: (directory, revision, attestation sha256)."""
    import os

    named = os.environ.get("OMNI_TINY_REVISION_FILE")
    if named:
        revision_file = Path(named).resolve()  # runfiles are links; the launcher refuses links out of a root
        root = revision_file.with_name("qwen3.5-tiny")
        pinned = revision_file.with_name("qwen3.5-tiny.attestation.sha256").read_text().strip()
        return root, revision_file.read_text().strip(), pinned
    from launcher import build_attestation

    root = tmp_path / "qwen3.5-tiny"
    assert tiny_qwen.main([str(root), str(tmp_path / "revision")]) == 0
    revision = (tmp_path / "revision").read_text().strip()
    assert build_attestation.main([str(root), "--profile", TINY_PROFILE, "--revision", revision, "--hash-shards"]) == 0
    return root, revision, hashlib.sha256((root / ".omni-checkpoint.json").read_bytes()).hexdigest()


def test_the_built_tiny_checkpoint_is_attested_for_its_profile(tmp_path: Path) -> None:
    from launcher.checkpoint import inspect_target_checkpoint

    root, revision, pinned = _built_checkpoint(tmp_path)
    expected = {path.name: path.read_bytes() for path in tiny_qwen.write(tmp_path / "fresh")}
    assert {name: (root / name).read_bytes() for name in expected} == expected
    assert revision == tiny_qwen.content_revision([root / name for name in expected])
    assert hashlib.sha256((root / ".omni-checkpoint.json").read_bytes()).hexdigest() == pinned
    inspected = inspect_target_checkpoint(
        root,
        model_id=TINY_MODEL_ID,
        revision=revision,
        expected_manifest_sha256=pinned,
        profile=load_target_profile(TINY_PROFILE),
    )
    assert (inspected.native_mtp_head, inspected.shards_hashed, inspected.max_model_len) == (True, 1, 2048)


# Every bounded field of a profile, on both sides of its bound: the empty (or zero) value is
# refused naming the field, the smallest allowed one is accepted.
BOUNDS = [
    (("display_name",), "", "Q"),
    (("family",), "", "Q"),
    (("model_id",), "", "m"),
    (("architecture",), "", "A"),
    (("model_type",), "", "q"),
    (("text_shape",), {}, {"hidden_size": 5120}),
    (("mtp", "layers_field"), "", "x"),
    (("mtp", "layers"), 0, 1),
    (("mtp", "weight_groups"), [], ["mtp."]),
    (("mtp", "groups_label"), "", "m"),
    (("hardware", "profile"), "", "p"),
    (("hardware", "description"), "", "d"),
    (("dflash2", "model_id"), "", "d"),
    (("dflash2", "architecture"), "", "D"),
    (("dflash2", "shape"), {}, {"a": 1}),
    (("dflash2", "drafter_config"), {}, {"block_size": 8}),
    (("dflash2", "weight_file"), "", "w"),
    (("dflash2", "speculative_tokens"), 0, 1),
    (("server", "dtypes"), [], ["float16"]),
    (("modes",), [], ["autoregressive"]),
]


@pytest.mark.parametrize("path, refused, smallest", BOUNDS, ids=[".".join(b[0]) for b in BOUNDS])
def test_every_bounded_profile_field_on_both_sides_of_its_bound(path: tuple, refused: Any, smallest: Any) -> None:
    def with_value(value: Any) -> dict[str, Any]:
        document = copy.deepcopy(_document(DEFAULT_PROFILE))
        if path == ("modes",) and value:  # one mode: then neither MTP nor the canary may be described
            document["mtp"], document["dflash2"] = None, None
        target = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return document

    with pytest.raises(AttestError) as caught:
        parse_document(TargetProfile, with_value(refused), label="target profile")
    assert caught.value.field == "target profile." + ".".join(path), caught.value
    assert parse_document(TargetProfile, with_value(smallest), label="target profile")


@pytest.mark.parametrize(
    "name",
    [
        "../profiles/qwen3.8-27b-mi300x",
        "qwen3.8-27b-mi300x/../qwen3.8-27b-mi300x",
        "QWEN3.8-27B-MI300X",
        "no-such-profile",
        "",
    ],
)
def test_a_profile_name_is_a_plain_shipped_name_never_a_path(name: str) -> None:
    with pytest.raises(AttestError, match="no target profile named") as refused:
        load_target_profile(name)
    assert refused.value.field == "OMNI_TARGET_PROFILE" and "qwen3.8-27b-mi300x" in str(refused.value)


@pytest.mark.parametrize("requested, served", [("", "float32"), ("bfloat16", "bfloat16")])
def test_a_profile_of_several_dtypes_serves_its_first_unless_one_is_asked_for(
    tmp_path: Path, requested: str, served: str
) -> None:
    import dataclasses

    from launcher.checkpoint import CheckpointInspection
    from launcher.engine_probe import VllmCapabilities
    from launcher.selection import Decision
    from launcher.server import build_server_command
    from launcher.settings import LauncherSettings

    tiny = load_target_profile(TINY_PROFILE)
    profile = tiny.model_copy(update={"server": tiny.server.model_copy(update={"dtypes": ["float32", "bfloat16"]})})
    target = CheckpointInspection(
        root=tmp_path,
        model_id=TINY_MODEL_ID,
        revision="0" * 40,
        config_sha256="1" * 64,
        weight_index_sha256="2" * 64,
        shard_count=1,
        tensor_count=1,
        native_mtp_head=False,
        mtp_reason="",
        max_model_len=1024,
        shards_hashed=0,
        profile=profile,
    )
    settings = dataclasses.replace(
        LauncherSettings.from_env({"QWEN_API_KEY": "sk-test-key-123456"}), dtype=requested, max_model_len=1024
    )
    command = build_server_command(
        settings, target, Decision("autoregressive"), VllmCapabilities(installed=True, serve_entry="cli"), base_env={}
    )
    assert command.argv[command.argv.index("--dtype") + 1] == served
