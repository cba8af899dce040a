"""Boot settings from the environment; the pinned repository and revision live here."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from boot.errors import BootError

REPO = "deepseek-ai/DeepSeek-V4.1-Flash"
REVISION = "fb2764a5cf321eaa5070ca8f9e892818f477c16d"
CONTEXT_RANGE = (4096, 1048576)
OFFLOAD_MODES = ("nvme", "ram")
NO_KEY = ("", "none", "off", "dummy", "0")


def _int(env: Mapping[str, str], name: str, default: str) -> int:
    raw = env.get(name, default)
    try:
        return int(raw)
    except ValueError:
        raise BootError(f"{name} must be an integer, got {raw!r}", field=name) from None


def is_on(value: str | None) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class BootSettings:
    model: Path
    state: Path
    port: int = 8888
    nnodes: int = 1
    node_rank: int = 0
    tp_size: int = 3
    ep_size: int = 3
    dist_init_addr: str = ""
    served_model_name: str = "deepseek-v4.1-flash"
    host: str = "0.0.0.0"
    api_key: str = ""
    internal_only: bool = False
    skip_prepare: bool = False
    skip_verify: bool = False
    skip_smoke: bool = False
    smoke_quick: bool = False
    warmup: bool = True
    warmup_prompt_words: tuple[int, ...] = (12, 200, 900, 3600)
    rank_wait_s: int = 3600
    ready_timeout_s: int = 3600
    verify_workers: int = 0
    engine_python: str = sys.executable
    env: Mapping[str, str] = field(default_factory=dict)  # the raw environment, for serve options

    @classmethod
    def from_env(cls, environment: Mapping[str, str] | None = None) -> "BootSettings":
        env = dict(os.environ if environment is None else environment)
        tp = _int(env, "TP_SIZE", env.get("TP", "3"))
        key = env.get("API_KEY", "").strip()
        words = env.get("WARMUP_PROMPT_WORDS", "12,200,900,3600")
        try:
            warmup_words = tuple(int(x) for x in words.split(","))
        except ValueError:
            raise BootError(f"WARMUP_PROMPT_WORDS must be comma-separated integers, got {words!r}",
                            field="WARMUP_PROMPT_WORDS") from None
        settings = cls(
            model=Path(env.get("MODEL_PATH", "/models/DeepSeek-V4.1-Flash")),
            state=Path(env.get("STATE_PATH", "/state")),
            port=_int(env, "SERVER_PORT", "8888"),
            nnodes=_int(env, "NNODES", "1"),
            node_rank=_int(env, "NODE_RANK", "0"),
            tp_size=tp,
            ep_size=_int(env, "EP_SIZE", str(tp)),
            dist_init_addr=env.get("DIST_INIT_ADDR", ""),
            served_model_name=env.get("SERVED_MODEL_NAME", "deepseek-v4.1-flash"),
            host=env.get("HOST", "0.0.0.0").strip(),
            api_key="" if key.lower() in NO_KEY else key,
            internal_only=is_on(env.get("CONTAINER_INTERNAL_ONLY")),
            skip_prepare=env.get("SKIP_PREPARE", "0") == "1",
            skip_verify=env.get("SKIP_VERIFY", "0") == "1",
            skip_smoke=env.get("SKIP_SMOKE", "0") == "1",
            smoke_quick=env.get("SMOKE_QUICK", "0") == "1",
            warmup=env.get("WARMUP", "1") not in ("0", "off", "false"),
            warmup_prompt_words=warmup_words,
            rank_wait_s=_int(env, "RANK_WAIT_TIMEOUT_S", "3600"),
            ready_timeout_s=_int(env, "READY_TIMEOUT_S", "3600"),
            verify_workers=_int(env, "VERIFY_WORKERS", "0"),
            engine_python=env.get("SGLANG_PYTHON", "").strip() or sys.executable,
            env=env,
        )
        if not 1 <= settings.port <= 65535:
            raise BootError("SERVER_PORT is outside 1..65535", field="SERVER_PORT")
        if settings.nnodes < 1 or not 0 <= settings.node_rank < settings.nnodes:
            raise BootError(f"NODE_RANK must be in 0..NNODES-1 (NNODES={settings.nnodes})", field="NODE_RANK")
        return settings

    @property
    def max_running_requests(self) -> int:
        return max(1, _int(self.env, "MAX_RUNNING_REQUESTS", "4"))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
