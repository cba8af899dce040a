"""Launcher settings: every environment variable the launcher reads, declared once and typed.

`SETTINGS` is the one declaration (variable, attribute, default, parser, help). Parsing
refuses a bad value naming the variable and the value seen; `--help` and docs/launcher.md's
table are generated from it; defaults that weaken security are reported as warnings.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from attest.documents import CHECKPOINT_ATTESTATION_FILE
from attest.edge.settings import (
    Setting,
    ascii_decimal,
    ascii_integer,
    default_warnings,
    flag,
    optional_path,
    path,
    read_settings,
    shown,
    text,
)
from attest.edge.status import STATUS_SETTING
from attest.primitives import LOOPBACK_HOSTS
from attest.profile import DTYPE_ALIASES, DTYPES, PROFILE_NAME_RE
from launcher.errors import LauncherError
from launcher.target import DEFAULT_PROFILE, PROFILE_SETTING

MODE_ALIASES = {"autoregressive": "ar", "native_mtp": "mtp", "dflash2": "dflash2_canary"}
MODES = ("auto", "ar", "mtp", "dflash2_canary")
BUILT_IN_API_KEY = "omni-local-only"


def number(kind: type, low: float, high: float, rule: str) -> Callable[[str, str], Any]:
    """`rule` is the refusal when the value is out of range (it names the range)."""

    def parse(raw: str, variable: str) -> int | float:
        value = ascii_integer(raw) if kind is int else ascii_decimal(raw)
        if value is None:
            raise LauncherError(
                f"numeric Qwen launcher settings are invalid: {variable}={shown(raw)} is not "
                f"a {kind.__name__} written in ASCII digits",
                field=variable,
            )
        if not low <= value <= high:  # NaN fails too
            raise LauncherError(f"{rule}, got {shown(raw)}", field=variable)
        return value

    return parse


def _inference_mode(raw: str, variable: str) -> str:
    mode = raw.strip().lower()
    mode = MODE_ALIASES.get(mode, mode)
    if mode not in MODES:
        raise LauncherError(
            f"{variable} must be auto, autoregressive, native_mtp, or dflash2_canary, got {shown(raw)}", field=variable
        )
    return mode


def mtp_tokens(raw: str, variable: str) -> int:
    if raw.strip() != "1":
        raise LauncherError(
            "native MTP is deliberately fixed to exactly one speculative token "
            f"(NATIVE_MTP_TOKENS=1), got {shown(raw)}",
            field=variable,
        )
    return 1


def dtype(raw: str, variable: str) -> str:
    """A --dtype vLLM knows (aliases resolved); "" leaves it to the target profile. Which ones
    the target allows is the profile's (launcher.server)."""
    value = raw.strip().lower()
    value = DTYPE_ALIASES.get(value, value)
    if value and value not in DTYPES:
        raise LauncherError(
            f"{variable} must be one of {', '.join(DTYPES)} (or an alias: "
            f"{', '.join(sorted(DTYPE_ALIASES))}), got {shown(raw)}",
            field=variable,
        )
    return value


def _profile_name(raw: str, variable: str) -> str:
    value = raw.strip()
    if not PROFILE_NAME_RE.fullmatch(value):
        raise LauncherError(
            f"{variable} must name a target profile ({PROFILE_NAME_RE.pattern}), got {shown(raw)}", field=variable
        )
    return value


def bind_host(raw: str, variable: str) -> str:
    value = raw.strip()
    if value != "0.0.0.0" and value not in LOOPBACK_HOSTS:
        raise LauncherError(
            f"Qwen may bind only to loopback or an explicitly internal container network "
            f"(0.0.0.0 with QWEN_CONTAINER_INTERNAL_ONLY=1), got {shown(raw)}",
            field=variable,
        )
    return value


def _lower_text(raw: str, variable: str) -> str:
    return text(raw, variable).lower()


def engine_python(raw: str, variable: str) -> str:
    return text(raw, variable) or sys.executable


def _manifest_default(env: Mapping[str, str]) -> str:
    return str(Path(env.get("MODEL_PATH", "/models/qwen")) / CHECKPOINT_ATTESTATION_FILE)


SETTINGS: tuple[Setting, ...] = (
    Setting(
        PROFILE_SETTING,
        "target_profile",
        DEFAULT_PROFILE,
        _profile_name,
        "the target profile (launcher/profiles/); inside an image only its pinned one",
    ),
    Setting("MODEL_PATH", "model_path", "/models/qwen", path, "the local checkpoint directory (absolute)"),
    Setting("MODEL_ID", "model_id", "", text, "must be the exact target model id"),
    Setting("MODEL_REVISION", "model_revision", "", text, "the checkpoint's pinned 40-hex revision"),
    Setting(
        "QWEN_CHECKPOINT_MANIFEST_PATH",
        "checkpoint_manifest",
        _manifest_default,
        path,
        f"the checkpoint attestation (default: MODEL_PATH/{CHECKPOINT_ATTESTATION_FILE})",
    ),
    Setting(
        "QWEN_CHECKPOINT_MANIFEST_SHA256",
        "checkpoint_manifest_sha256",
        "",
        text,
        "sha256 of the attestation (what build_attestation prints); unset: the attestation is not pinned",
        warn_when_default="the checkpoint attestation is not pinned; set it to the sha256 "
        "`python -m launcher.build_attestation` printed",
    ),
    Setting(
        "INFERENCE_MODE",
        "requested_mode",
        "auto",
        _inference_mode,
        "auto, autoregressive, native_mtp or dflash2_canary",
    ),
    Setting("NATIVE_MTP_TOKENS", "mtp_tokens", "1", mtp_tokens, "speculative tokens of native MTP (only 1)"),
    Setting(
        "QWEN_BIND_HOST",
        "bind_host",
        "127.0.0.1",
        bind_host,
        "bind address: loopback, or 0.0.0.0 with QWEN_CONTAINER_INTERNAL_ONLY=1",
    ),
    Setting(
        "QWEN_CONTAINER_INTERNAL_ONLY",
        "internal_only",
        "0",
        flag,
        "1: the container network is internal-only, so a wildcard bind is allowed",
    ),
    Setting("QWEN_PORT", "port", "8103", number(int, 1, 65535, "QWEN_PORT is outside 1..65535"), "API port"),
    Setting("QWEN_SERVED_MODEL_NAME", "served_model_name", "qwen3.8-27b", text, "model name the API serves"),
    Setting(
        "QWEN_API_KEY",
        "api_key",
        BUILT_IN_API_KEY,
        text,
        "API key clients must send (VLLM_API_KEY)",
        warn_when_default=f"the server uses the built-in, publicly known API key {BUILT_IN_API_KEY!r}; "
        "set QWEN_API_KEY",
        secret=True,
    ),
    Setting(
        "QWEN_MAX_MODEL_LEN",
        "max_model_len",
        "65536",
        number(int, 1024, 262144, "QWEN_MAX_MODEL_LEN is outside 1024..262144"),
        "vLLM --max-model-len",
    ),
    Setting(
        "QWEN_GPU_MEMORY_UTILIZATION",
        "gpu_memory_utilization",
        "0.60",
        number(float, 0.20, 0.90, "QWEN_GPU_MEMORY_UTILIZATION is outside 0.20..0.90"),
        "vLLM --gpu-memory-utilization",
    ),
    Setting("QWEN_DTYPE", "dtype", "", dtype, "vLLM --dtype; only the target profile's (default: its first)"),
    Setting(
        "QWEN_REQUIRE_GPU_ARCH",
        "required_gpu_arch",
        "",
        _lower_text,
        "refuse unless rocminfo reports this architecture (e.g. gfx942)",
    ),
    Setting(
        "OMNI_HARDWARE_PROFILE",
        "hardware_profile",
        "",
        text,
        "the hardware the DFlash2 gate was measured on (default: the target profile's)",
    ),
    Setting("QWEN_DFLASH2_CANARY", "dflash2_canary", "0", flag, "1: allow the gated DFlash2 canary"),
    Setting("DFLASH2_SPECULATOR_PATH", "dflash2_path", "", optional_path, "the local DFlash2 speculator directory"),
    Setting("DFLASH2_SPECULATOR_REVISION", "dflash2_revision", "", text, "the speculator's pinned 40-hex revision"),
    Setting("DFLASH2_MANIFEST_SHA256", "dflash2_manifest_sha256", "", text, "sha256 of the speculator's manifest"),
    Setting("DFLASH2_VLLM_COMMIT", "dflash2_vllm_commit", "", text, "the vLLM commit the canary was gated on"),
    Setting("QWEN_DFLASH2_GATE_PATH", "dflash2_gate_path", "", optional_path, "the canary's gate.json"),
    Setting("QWEN_DFLASH2_GATE_SHA256", "dflash2_gate_sha256", "", text, "sha256 of gate.json"),
    Setting(
        "QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT",
        "dflash2_min_p95_improvement_percent",
        "5.0",
        number(float, 1e-9, 100.0, "DFlash2 minimum p95 improvement must be in (0, 100]"),
        "the gate's required p95 improvement",
    ),
    Setting(
        "OMNI_ENGINE_PYTHON",
        "engine_python",
        "",
        engine_python,
        "the interpreter whose site-packages hold vLLM (default: this one)",
    ),
    Setting(
        "OMNI_HASH_WORKERS",
        "hash_workers",
        "0",
        number(int, 0, 1024, "OMNI_HASH_WORKERS must be 0 (one per core) or in 1..1024"),
        "hashing threads (0: one per core)",
    ),
    STATUS_SETTING,
)


@dataclass(frozen=True)
class LauncherSettings:
    # No defaults here: SETTINGS holds them (one source), from_env applies them.
    target_profile: str
    model_path: Path
    model_id: str
    model_revision: str
    checkpoint_manifest: Path
    checkpoint_manifest_sha256: str
    requested_mode: str
    mtp_tokens: int
    bind_host: str
    internal_only: bool
    port: int
    served_model_name: str
    api_key: str
    max_model_len: int
    gpu_memory_utilization: float
    dtype: str
    required_gpu_arch: str
    hardware_profile: str
    dflash2_canary: bool
    dflash2_path: Path | None
    dflash2_revision: str
    dflash2_manifest_sha256: str
    dflash2_vllm_commit: str
    dflash2_gate_path: Path | None
    dflash2_gate_sha256: str
    dflash2_min_p95_improvement_percent: float
    engine_python: str
    hash_workers: int
    status_file: Path | None
    defaults_used: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, environment: Mapping[str, str] | None = None) -> "LauncherSettings":
        env = dict(os.environ if environment is None else environment)
        values, defaulted = read_settings(SETTINGS, env, LauncherError)
        if values["bind_host"] == "0.0.0.0" and not values["internal_only"]:
            raise LauncherError(
                "wildcard Qwen bind requires QWEN_CONTAINER_INTERNAL_ONLY=1 (QWEN_BIND_HOST='0.0.0.0')",
                field="QWEN_BIND_HOST",
            )
        return cls(**values, defaults_used=defaulted)

    def warnings(self) -> list[str]:
        """Defaults in use that weaken security: the report says so."""
        return default_warnings(SETTINGS, self.defaults_used)
