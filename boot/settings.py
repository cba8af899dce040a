"""Boot settings: every environment variable boot reads, declared once and typed.

`SETTINGS` is the one declaration: variable, attribute, default, parser and help. Parsing
refuses a bad value at start, naming the variable and the value seen; `--help` and the
docs/boot.md's table are generated from the same declarations. The pinned repository and
revision live here too.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from attest.baked import BAKED_LOCK_PATH
from attest.edge.settings import (
    Setting,
    ascii_integer,
    flag,
    integer,
    optional_path,
    path,
    read_settings,
    real,
    refuse,
    text,
    token,
)
from attest.edge.status import STATUS_SETTING
from boot.errors import BootError

REPO = "deepseek-ai/DeepSeek-V4.1-Flash"
REVISION = "fb2764a5cf321eaa5070ca8f9e892818f477c16d"
CONTEXT_RANGE = (4096, 1048576)
OFFLOAD_MODES = ("nvme", "ram")
NO_KEY = ("", "none", "off", "dummy", "0")
DEFAULT_LOCK_PATH = BAKED_LOCK_PATH


def seconds(raw: str, variable: str) -> float:
    return real(raw, variable, "a positive number of seconds", lambda value: 0 < value < 10**7)


def fraction(raw: str, variable: str) -> str:
    real(raw, variable, "a number in (0, 1]", lambda value: 0 < value <= 1)
    return raw.strip()  # passed to SGLang as the operator wrote it


def _exactly_one(raw: str, variable: str) -> bool:
    return raw.strip() == "1"


def _not_off(raw: str, variable: str) -> bool:
    return raw.strip() not in ("0", "off", "false")


def _word_counts(raw: str, variable: str) -> tuple[int, ...]:
    values = tuple(ascii_integer(x) for x in raw.split(","))
    if any(value is None for value in values):
        raise BootError(f"{variable} must be comma-separated integers in ASCII digits, got {raw!r}", field=variable)
    if not values or len(values) > 16 or any(not 1 <= v <= 100_000 for v in values):
        raise refuse(variable, raw, "1 to 16 comma-separated integers in 1..100000")
    return values


def api_key(raw: str, variable: str) -> str:
    value = text(raw, variable)
    return "" if value.lower() in NO_KEY else value


def _sha256_or_empty(raw: str, variable: str) -> str:
    value = raw.strip().lower()
    if value and not re.fullmatch(r"[0-9a-f]{64}", value):
        raise refuse(variable, raw, "empty or a 64-character SHA-256 digest")
    return value


def _revision_or_empty(raw: str, variable: str) -> str:
    return text(raw, variable)


def url_or_empty(raw: str, variable: str) -> str:
    value = text(raw, variable)
    if value and (not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value)):
        raise refuse(variable, raw, "an http(s) URL such as https://huggingface.co")
    return value.rstrip("/")


def spec_algo(raw: str, variable: str) -> str:
    value = raw.strip()
    return "" if value.lower() in ("", "off", "none", "0") else token(value, variable)


def extra_args(raw: str, variable: str) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(text(raw, variable)))
    except ValueError as exc:
        raise refuse(variable, raw, f"shell-quoted arguments ({exc})") from None


# How the checkpoint arrives (MODEL_SOURCE): downloaded from the hub into MODEL_PATH, mounted as
# an image volume of the model artifact, or pulled from a registry by every rank; tools/deploy
# writes the same names (boot/checkpoint/sources.py is the one switch over them).
HUB = "hub"
IMAGE = "image"
REGISTRY = "registry"
MODEL_SOURCES = (HUB, IMAGE, REGISTRY)


def model_source(raw: str, variable: str) -> str:
    if raw.strip() not in MODEL_SOURCES:
        raise BootError(f"{variable} must be {', '.join(MODEL_SOURCES)}, got {raw!r}", field=variable)
    return raw.strip()


def offload_mode(raw: str, variable: str) -> str:
    if raw.strip() not in OFFLOAD_MODES:
        raise BootError(f"{variable} must be {' or '.join(OFFLOAD_MODES)}, got {raw!r}", field=variable)
    return raw.strip()


def _tp_default(env: Mapping[str, str]) -> str:
    return env.get("TP", "3")


SETTINGS: tuple[Setting, ...] = (
    Setting("MODEL_PATH", "model", "/models/DeepSeek-V4.1-Flash", path, "the checkpoint directory"),
    Setting(
        "MODEL_SOURCE",
        "model_source",
        "hub",
        model_source,
        "hub: rank 0 downloads into MODEL_PATH (shared by the ranks) and publishes its verdict; image: "
        "MODEL_PATH is a read-only image volume of the model artifact (docs/models.md), every rank "
        "verifies its own copy, nothing is downloaded or written there; registry: every rank pulls the "
        "pinned model artifact (MODEL_ARTIFACT) into its own MODEL_PATH, each byte hashed once against the lock, "
        "a receipt in STATE_PATH re-used by the next start (docs/models.md)",
    ),
    Setting(
        "MODEL_ARTIFACT",
        "model_artifact",
        "",
        text,
        "MODEL_SOURCE=registry: REGISTRY/REPO@sha256:... of the model artifact, a mirror's repository allowed "
        "(default: the image's pin model.artifact, whose digest it must have); credentials as for any registry "
        "(REGISTRY_AUTH_FILE)",
    ),
    Setting("STATE_PATH", "state", "/state", path, "receipts, smoke results, the API key file (writable)"),
    Setting("SERVER_PORT", "port", "8888", integer(1, 65535, expected="an integer in 1..65535"), "API port"),
    Setting("HOST", "host", "0.0.0.0", token, "bind address of the API"),
    Setting("API_KEY", "api_key", "", api_key, "API key clients must send; empty, none, off, dummy or 0: none"),
    Setting(
        "CONTAINER_INTERNAL_ONLY",
        "internal_only",
        "0",
        flag,
        "1: the network is internal-only, so a wildcard bind without a key is allowed",
    ),
    Setting("NNODES", "nnodes", "1", integer(1, 64), "number of nodes"),
    Setting("NODE_RANK", "node_rank", "0", integer(0, 63), "this node's rank (0 downloads and verifies)"),
    Setting("TP_SIZE", "tp_size", _tp_default, integer(1, 512), "tensor parallel size (default: TP, else 3)"),
    Setting(
        "EP_SIZE",
        "ep_size",
        lambda env: env.get("TP_SIZE", _tp_default(env)),
        integer(1, 512),
        "expert parallel size (default: TP_SIZE)",
    ),
    Setting("DIST_INIT_ADDR", "dist_init_addr", "", text, "host:port of rank 0, required when NNODES>1"),
    Setting("SERVED_MODEL_NAME", "served_model_name", "deepseek-v4.1-flash", token, "model name the API serves"),
    Setting(
        "MODEL_REVISION",
        "model_revision",
        "",
        _revision_or_empty,
        "optional: the revision the operator expects; checked against the image pin",
    ),
    Setting("CHECKPOINT_LOCK", "checkpoint_lock", DEFAULT_LOCK_PATH, path, "the checkpoint lock file"),
    Setting(
        "CHECKPOINT_LOCK_SHA256",
        "checkpoint_lock_sha256",
        "",
        _sha256_or_empty,
        "the lock's sha256 when no image pin gives it",
    ),
    Setting("HF_ENDPOINT", "hf_endpoint", "", url_or_empty, "hub or mirror to download from (huggingface_hub)"),
    Setting("DOWNLOAD_STALL_S", "download_stall_s", "120", seconds, "give up on a file after this long with no bytes"),
    Setting("DOWNLOAD_DEADLINE_S", "download_deadline_s", "21600", seconds, "deadline of the whole download"),
    Setting("DOWNLOAD_ATTEMPTS", "download_attempts", "3", integer(1, 20), "attempts per file before refusing"),
    Setting("DOWNLOAD_WORKERS", "download_workers", "4", integer(1, 32), "files downloaded in parallel"),
    Setting("VERIFY_WORKERS", "verify_workers", "0", integer(0, 256), "hashing threads (0: one per core)"),
    Setting(
        "RANK_WAIT_TIMEOUT_S",
        "rank_wait_s",
        "3600",
        integer(0, 10**7),
        "ranks > 0: how long to wait for rank 0's verified checkpoint",
    ),
    Setting(
        "RANK_KEY_FILE",
        "rank_key_file",
        "",
        optional_path,
        "multi-node: the group's shared key (a mounted Secret, never in MODEL_PATH) that authenticates "
        "rank 0's verdict; empty: ranks > 0 hash every file themselves",
    ),
    Setting(
        "RANK_START_SPREAD_S",
        "rank_start_spread_s",
        "900",
        integer(0, 10**7),
        "multi-node: a verdict whose rank 0 started longer than this before this rank is an earlier run's",
    ),
    Setting(
        "RANK_GROUP",
        "rank_group",
        "",
        text,
        "multi-node: a value every rank of this group shares (the LeaderWorkerSet group key); binds the verdict",
    ),
    Setting("READY_TIMEOUT_S", "ready_timeout_s", "3600", integer(1, 10**7), "how long SGLang may take to be healthy"),
    Setting(
        "HEALTH_LOSS_TIMEOUT_S",
        "health_loss_timeout_s",
        "60",
        integer(1, 86400),
        "rank 0, after acceptance: stop the group once /health has failed this long (a rank is gone)",
    ),
    STATUS_SETTING,
    Setting("SKIP_PREPARE", "skip_prepare", "0", _exactly_one, "1: use the checkpoint as it is (no download, no lock)"),
    Setting("SKIP_VERIFY", "skip_verify", "0", _exactly_one, "1: do not re-hash files already on disk"),
    Setting("SKIP_SMOKE", "skip_smoke", "0", _exactly_one, "1: no smoke and warm-up after start"),
    Setting("SMOKE_QUICK", "smoke_quick", "0", _exactly_one, "1: only the arithmetic smoke check"),
    Setting("WARMUP", "warmup", "1", _not_off, "0, off or false: no warm-up"),
    Setting("WARMUP_PROMPT_WORDS", "warmup_prompt_words", "12,200,900,3600", _word_counts, "warm-up prompt sizes"),
    Setting(
        "SGLANG_PYTHON",
        "engine_python",
        "",
        lambda raw, var: text(raw, var) or sys.executable,
        "the interpreter that has SGLang (default: this one)",
    ),
    Setting("OFFLOAD_MODE", "offload_mode", "nvme", offload_mode, "where the Engram tables live"),
    Setting("ALLOW_RAM_OFFLOAD", "allow_ram_offload", "0", _exactly_one, "1: allow OFFLOAD_MODE=ram"),
    Setting(
        "CONTEXT_LENGTH",
        "context_length",
        "409600",
        integer(-(10**12), 10**12, expected="an integer"),
        "context length (4096..1048576)",
    ),
    Setting("MEM_FRACTION_STATIC", "mem_fraction_static", "0.95", fraction, "SGLang --mem-fraction-static"),
    Setting(
        "CHUNKED_PREFILL_SIZE",
        "chunked_prefill_size",
        "2048",
        integer(0, 10**9, expected="a non-negative integer"),
        "SGLang --chunked-prefill-size",
    ),
    Setting(
        "MAX_RUNNING_REQUESTS",
        "max_running_requests",
        "4",
        integer(1, 100_000, expected="a non-negative integer of at least 1"),
        "SGLang --max-running-requests",
    ),
    Setting(
        "CUDA_GRAPH_MAX_BS_DECODE",
        "cuda_graph_max_bs_decode",
        lambda env: env.get("MAX_RUNNING_REQUESTS", "4"),
        integer(0, 100_000, expected="a non-negative integer"),
        "default: MAX_RUNNING_REQUESTS",
    ),
    Setting("ATTENTION_BACKEND", "attention_backend", "dsv4", token, "SGLang --attention-backend"),
    Setting("MOE_RUNNER_BACKEND", "moe_runner_backend", "flashinfer_mxfp4", token, "SGLang --moe-runner-backend"),
    Setting("TOOL_CALL_PARSER", "tool_call_parser", "deepseekv41", token, "SGLang --tool-call-parser"),
    Setting("REASONING_PARSER", "reasoning_parser", "deepseek-v41", token, "SGLang --reasoning-parser"),
    Setting("SPEC_ALGO", "spec_algo", "DSPARK", spec_algo, "speculative algorithm; off, none or 0: none"),
    Setting("DSPARK_BLOCK_SIZE", "dspark_block_size", "5", integer(1, 64), "DSpark block size"),
    Setting("DSPARK_SPS_TABLE", "dspark_sps_table", "", optional_path, "profiled SPS cost table (file)"),
    Setting("DSPARK_STS_TABLE", "dspark_sts_table", "", optional_path, "confidence STS table (file)"),
    Setting(
        "MAX_TOTAL_TOKENS",
        "max_total_tokens",
        "0",
        integer(0, 10**12, expected="a non-negative integer"),
        "pin the KV pool size (0: SGLang sizes it)",
    ),
    Setting("EXTRA_SGLANG_ARGS", "extra_sglang_args", "", extra_args, "further SGLang arguments (shell-quoted)"),
)


@dataclass(frozen=True)
class BootSettings:
    # No defaults here: SETTINGS holds them (one source), from_env applies them.
    model: Path
    model_source: str
    model_artifact: str
    state: Path
    port: int
    host: str
    api_key: str
    internal_only: bool
    nnodes: int
    node_rank: int
    tp_size: int
    ep_size: int
    dist_init_addr: str
    served_model_name: str
    model_revision: str
    checkpoint_lock: Path
    checkpoint_lock_sha256: str
    hf_endpoint: str
    download_stall_s: float
    download_deadline_s: float
    download_attempts: int
    download_workers: int
    verify_workers: int
    rank_wait_s: int
    rank_key_file: Path | None
    rank_start_spread_s: int
    rank_group: str
    ready_timeout_s: int
    health_loss_timeout_s: int
    status_file: Path | None
    skip_prepare: bool
    skip_verify: bool
    skip_smoke: bool
    smoke_quick: bool
    warmup: bool
    warmup_prompt_words: tuple[int, ...]
    engine_python: str
    offload_mode: str
    allow_ram_offload: bool
    context_length: int
    mem_fraction_static: str
    chunked_prefill_size: int
    max_running_requests: int
    cuda_graph_max_bs_decode: int
    attention_backend: str
    moe_runner_backend: str
    tool_call_parser: str
    reasoning_parser: str
    spec_algo: str
    dspark_block_size: int
    dspark_sps_table: Path | None
    dspark_sts_table: Path | None
    max_total_tokens: int
    extra_sglang_args: tuple[str, ...]
    defaults_used: frozenset[str] = frozenset()
    # The environment the engine process inherits; no option is read from it.
    passthrough_env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, environment: Mapping[str, str] | None = None) -> "BootSettings":
        env = dict(os.environ if environment is None else environment)
        values, defaulted = read_settings(SETTINGS, env, BootError)
        settings = cls(**values, defaults_used=defaulted, passthrough_env=env)
        if not settings.node_rank < settings.nnodes:
            raise BootError(
                f"NODE_RANK must be in 0..NNODES-1 (NNODES={settings.nnodes}, NODE_RANK={settings.node_rank})",
                field="NODE_RANK",
            )
        return settings

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
