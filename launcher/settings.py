"""Launcher settings from the environment, with every range and rule enforced."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from attest.documents import CHECKPOINT_ATTESTATION_FILE
from attest.primitives import LOOPBACK_HOSTS
from launcher.errors import LauncherError

MODE_ALIASES = {"autoregressive": "ar", "native_mtp": "mtp", "dflash2": "dflash2_canary"}
MODES = ("auto", "ar", "mtp", "dflash2_canary")
DTYPE_ALIASES = {"fp16": "float16", "half": "float16"}


def is_true(value: str | None) -> bool:
    return str(value or "").strip().lower() in {"1", "true", "yes", "on"}


def _number(env: Mapping[str, str], name: str, default: str, kind: type) -> int | float:
    raw = env.get(name, default)
    try:
        return kind(raw)
    except ValueError:
        raise LauncherError(
            f"numeric Qwen launcher settings are invalid: {name}={raw!r} is not a {kind.__name__}",
            field=name,
        ) from None


@dataclass(frozen=True)
class LauncherSettings:
    model_path: Path
    model_id: str
    model_revision: str
    checkpoint_manifest: Path
    checkpoint_manifest_sha256: str = ""
    requested_mode: str = "auto"
    mtp_tokens: int = 1
    bind_host: str = "127.0.0.1"
    port: int = 8103
    served_model_name: str = "qwen3.8-27b"
    api_key: str = "omni-local-only"
    max_model_len: int = 65536
    gpu_memory_utilization: float = 0.60
    dtype: str = "float16"
    required_gpu_arch: str = ""
    hardware_profile: str = "mi300x_single"
    dflash2_canary: bool = False
    dflash2_path: Path | None = None
    dflash2_revision: str = ""
    dflash2_manifest_sha256: str = ""
    dflash2_vllm_commit: str = ""
    dflash2_gate_path: Path | None = None
    dflash2_gate_sha256: str = ""
    dflash2_min_p95_improvement_percent: float = 5.0
    engine_python: str = sys.executable
    hash_workers: int = 0

    @classmethod
    def from_env(cls, environment: Mapping[str, str] | None = None) -> "LauncherSettings":
        env = dict(os.environ if environment is None else environment)
        model_path = Path(env.get("MODEL_PATH", "/models/qwen"))
        manifest = Path(env.get("QWEN_CHECKPOINT_MANIFEST_PATH", str(model_path / CHECKPOINT_ATTESTATION_FILE)))
        mode = env.get("INFERENCE_MODE", "auto").strip().lower()
        mode = MODE_ALIASES.get(mode, mode)
        if mode not in MODES:
            raise LauncherError(
                "INFERENCE_MODE must be auto, autoregressive, native_mtp, or dflash2_canary", field="INFERENCE_MODE"
            )
        port = _number(env, "QWEN_PORT", "8103", int)
        mtp_tokens = _number(env, "NATIVE_MTP_TOKENS", "1", int)
        max_model_len = _number(env, "QWEN_MAX_MODEL_LEN", "65536", int)
        gpu_util = _number(env, "QWEN_GPU_MEMORY_UTILIZATION", "0.60", float)
        min_improvement = _number(env, "QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT", "5.0", float)
        hash_workers = _number(env, "OMNI_HASH_WORKERS", "0", int)
        if not 1 <= port <= 65535:
            raise LauncherError("QWEN_PORT is outside 1..65535", field="QWEN_PORT")
        if mtp_tokens != 1:
            raise LauncherError(
                "native MTP is deliberately fixed to exactly one speculative token (NATIVE_MTP_TOKENS=1)",
                field="NATIVE_MTP_TOKENS",
            )
        if not 1024 <= max_model_len <= 262144:
            raise LauncherError("QWEN_MAX_MODEL_LEN is outside 1024..262144", field="QWEN_MAX_MODEL_LEN")
        if not 0.20 <= gpu_util <= 0.90:
            raise LauncherError(
                "QWEN_GPU_MEMORY_UTILIZATION is outside 0.20..0.90", field="QWEN_GPU_MEMORY_UTILIZATION"
            )
        if not 0.0 < min_improvement <= 100.0:
            raise LauncherError(
                "DFlash2 minimum p95 improvement must be in (0, 100]",
                field="QWEN_DFLASH2_MIN_P95_IMPROVEMENT_PERCENT",
            )
        if hash_workers < 0:
            raise LauncherError("OMNI_HASH_WORKERS must be 0 (one per core) or positive", field="OMNI_HASH_WORKERS")
        dtype = env.get("QWEN_DTYPE", "float16").strip().lower()
        dtype = DTYPE_ALIASES.get(dtype, dtype)
        if dtype != "float16":
            raise LauncherError("QWEN_DTYPE is fixed to float16 for the Nelloz Qwen profile", field="QWEN_DTYPE")
        bind_host = env.get("QWEN_BIND_HOST", "127.0.0.1").strip()
        if bind_host == "0.0.0.0":
            if not is_true(env.get("QWEN_CONTAINER_INTERNAL_ONLY")):
                raise LauncherError(
                    "wildcard Qwen bind requires QWEN_CONTAINER_INTERNAL_ONLY=1", field="QWEN_BIND_HOST"
                )
        elif bind_host not in LOOPBACK_HOSTS:
            raise LauncherError(
                "Qwen may bind only to loopback or an explicitly internal container network", field="QWEN_BIND_HOST"
            )
        dflash_path_raw = env.get("DFLASH2_SPECULATOR_PATH", "").strip()
        gate_path_raw = env.get("QWEN_DFLASH2_GATE_PATH", "").strip()
        return cls(
            model_path=model_path,
            model_id=env.get("MODEL_ID", "").strip(),
            model_revision=env.get("MODEL_REVISION", "").strip(),
            checkpoint_manifest=manifest,
            checkpoint_manifest_sha256=env.get("QWEN_CHECKPOINT_MANIFEST_SHA256", "").strip(),
            requested_mode=mode,
            mtp_tokens=mtp_tokens,
            bind_host=bind_host,
            port=port,
            served_model_name=env.get("QWEN_SERVED_MODEL_NAME", "qwen3.8-27b").strip(),
            api_key=env.get("QWEN_API_KEY", "omni-local-only"),
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_util,
            dtype=dtype,
            required_gpu_arch=env.get("QWEN_REQUIRE_GPU_ARCH", "").strip().lower(),
            hardware_profile=env.get("OMNI_HARDWARE_PROFILE", "mi300x_single").strip(),
            dflash2_canary=is_true(env.get("QWEN_DFLASH2_CANARY")),
            dflash2_path=Path(dflash_path_raw) if dflash_path_raw else None,
            dflash2_revision=env.get("DFLASH2_SPECULATOR_REVISION", "").strip(),
            dflash2_manifest_sha256=env.get("DFLASH2_MANIFEST_SHA256", "").strip(),
            dflash2_vllm_commit=env.get("DFLASH2_VLLM_COMMIT", "").strip(),
            dflash2_gate_path=Path(gate_path_raw) if gate_path_raw else None,
            dflash2_gate_sha256=env.get("QWEN_DFLASH2_GATE_SHA256", "").strip(),
            dflash2_min_p95_improvement_percent=min_improvement,
            engine_python=env.get("OMNI_ENGINE_PYTHON", "").strip() or sys.executable,
            hash_workers=hash_workers,
        )
