"""Both sides of every numeric and enumerated limit of the launcher's and boot's settings."""
from __future__ import annotations

from pathlib import Path

import pytest

from attest.errors import AttestError
from boot.settings import BootSettings
from launcher.settings import BUILT_IN_API_KEY, LauncherSettings

def _cases(bounds: dict[str, tuple[list[str], list[str]]]) -> list[tuple[str, str, bool]]:
    return [(variable, value, accepted) for variable, (good, bad) in bounds.items()
            for accepted, values in ((True, good), (False, bad)) for value in values]


# variable: (accepted values, refused values)
LAUNCHER_BOUNDS = {
    "QWEN_PORT": (["1", "65535", "8103"], ["0", "65536", "-1", "80.5", "", "0x50"]),
    "QWEN_MAX_MODEL_LEN": (["1024", "262144"], ["1023", "262145", "1e4"]),
    "QWEN_GPU_MEMORY_UTILIZATION": (["0.20", "0.90", "0.2", "0.9"], ["0.19", "0.91", "nan", "inf", "-0.5"]),
    "QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT": (["100", "0.001", "5"], ["0", "-1", "100.01", "nan"]),
    "OMNI_HASH_WORKERS": (["0", "1", "1024"], ["-1", "1025", "two"]),
    "NATIVE_MTP_TOKENS": (["1", " 1 "], ["0", "2", "1.0", "one", ""]),
    "INFERENCE_MODE": (["auto", "AUTO", "autoregressive", "ar", "native_mtp", "mtp", "dflash2_canary", "dflash2"],
                       ["", "turbo", "speculative"]),
    "QWEN_DTYPE": (["float16", "fp16", "half", "FP16"], ["bfloat16", "float32", ""]),
    "QWEN_BIND_HOST": (["127.0.0.1", "::1", "localhost"], ["10.0.0.5", "", "0.0.0.0"]),
}


@pytest.mark.parametrize("variable, value, accepted", _cases(LAUNCHER_BOUNDS))
def test_launcher_setting_bounds(variable: str, value: str, accepted: bool) -> None:
    environment = {variable: value}
    if accepted:
        LauncherSettings.from_env(environment)
    else:
        with pytest.raises(AttestError) as caught:
            LauncherSettings.from_env(environment)
        assert caught.value.field == variable, str(caught.value)
        assert repr(value) in str(caught.value), "the refusal shows the value seen"


def test_the_wildcard_bind_needs_the_internal_only_declaration() -> None:
    assert LauncherSettings.from_env({"QWEN_BIND_HOST": "0.0.0.0", "QWEN_CONTAINER_INTERNAL_ONLY": "1"}).bind_host \
        == "0.0.0.0"
    for internal in ("0", "", "no"):
        with pytest.raises(AttestError, match="requires QWEN_CONTAINER_INTERNAL_ONLY=1"):
            LauncherSettings.from_env({"QWEN_BIND_HOST": "0.0.0.0", "QWEN_CONTAINER_INTERNAL_ONLY": internal})


def test_launcher_defaults_and_which_were_used() -> None:
    settings = LauncherSettings.from_env({"QWEN_API_KEY": "k", "MODEL_PATH": "/m"})
    assert (settings.port, settings.max_model_len, settings.gpu_memory_utilization, settings.mtp_tokens) == \
        (8103, 65536, 0.60, 1)
    assert settings.checkpoint_manifest == Path("/m/.omni-checkpoint.json")
    assert "MODEL_PATH" not in settings.defaults_used and "QWEN_PORT" in settings.defaults_used
    assert settings.warnings() == [w for w in settings.warnings() if w.startswith("QWEN_CHECKPOINT_MANIFEST_SHA256")]
    assert LauncherSettings.from_env({}).api_key == BUILT_IN_API_KEY
    assert len(LauncherSettings.from_env({}).warnings()) == 2


BOOT_BOUNDS = {
    "SERVER_PORT": (["1", "65535"], ["0", "65536", "x"]),
    "NNODES": (["1", "64"], ["0", "65"]),
    "TP_SIZE": (["1", "512"], ["0", "513"]),
    "DOWNLOAD_ATTEMPTS": (["1", "20"], ["0", "21"]),
    "DOWNLOAD_WORKERS": (["1", "32"], ["0", "33"]),
    "VERIFY_WORKERS": (["0", "256"], ["-1", "257"]),
    "DOWNLOAD_STALL_S": (["0.5", "9999999"], ["0", "-1", "10000000", "nan", "inf"]),
    "MEM_FRACTION_STATIC": (["1", "0.01"], ["0", "1.01", "nan"]),
    "DSPARK_BLOCK_SIZE": (["1", "64"], ["0", "65"]),
    "WARMUP_PROMPT_WORDS": (["1", "100000", ",".join(["5"] * 16)], ["0", "100001", ",".join(["5"] * 17), "a,b"]),
    "OFFLOAD_MODE": (["nvme", "ram"], ["disk", ""]),
    "CHECKPOINT_LOCK_SHA256": (["", "ab" * 32, "AB" * 32], ["ab" * 31, "zz" * 32]),
    "HF_ENDPOINT": (["", "https://huggingface.co", "http://127.0.0.1:8080/mirror"], ["ftp://x", "huggingface.co"]),
}


@pytest.mark.parametrize("variable, value, accepted", _cases(BOOT_BOUNDS))
def test_boot_setting_bounds(tmp_path: Path, variable: str, value: str, accepted: bool) -> None:
    environment = {"STATE_PATH": str(tmp_path), variable: value}
    if variable == "NNODES":
        environment["NODE_RANK"] = "0"
    if accepted:
        BootSettings.from_env(environment)
    else:
        with pytest.raises(AttestError) as caught:
            BootSettings.from_env(environment)
        assert caught.value.field == variable, str(caught.value)


def test_node_rank_must_be_below_nnodes() -> None:
    assert BootSettings.from_env({"NNODES": "3", "NODE_RANK": "2"}).node_rank == 2
    with pytest.raises(AttestError, match="NODE_RANK must be in 0..NNODES-1"):
        BootSettings.from_env({"NNODES": "3", "NODE_RANK": "3"})
