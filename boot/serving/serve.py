"""serve: the SGLang command line, the guards before it, and the server process.

The API key goes to SGLang on its command line (`--api-key`): SGLang takes it nowhere
else, so it is visible to local processes through /proc on the serving host. It is
stored 0600 in STATE_PATH and redacted from every log line we print.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import httpx

from attest.edge import redact
from attest.edge.status import write_status
from attest.errors import AttestError
from attest.primitives import LOOPBACK_HOSTS, read_json_object
from boot.errors import BootError
from boot.serving.api import answered, engine_client
from boot.serving.state import save, store_api_key
from boot.settings import CONTEXT_RANGE, REVISION, BootSettings

RAM_HEADROOM = 24 * 2**30
# One /health of rank 0's watch: above SGLang's own health-generation timeout (20 s,
# SGLANG_HEALTH_CHECK_TIMEOUT), so a slow but working group is not taken for a lost one.
HEALTH_REQUEST_TIMEOUT_S = 25
ENGRAM_LAYERS = (1, 14)


def gpu_lines() -> list[str]:
    try:
        output = subprocess.check_output(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"], text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BootError(f"nvidia-smi could not list the GPUs: {exc}", field="nvidia-smi") from None
    lines = output.strip().splitlines()
    if not lines:
        raise BootError("nvidia-smi lists no GPU", field="nvidia-smi")
    return lines


def check_ram_offload(settings: BootSettings, meminfo: Path = Path("/proc/meminfo")) -> None:
    """RAM mode pins the Engram tables into host RAM, which on Spark is GPU memory."""
    if not settings.allow_ram_offload:
        raise BootError(
            "RAM Engram offload pins ~189 GiB into host RAM, which on DGX Spark is the same pool as the GPU. "
            "Use OFFLOAD_MODE=nvme (default). Set ALLOW_RAM_OFFLOAD=1 to override.",
            field="ALLOW_RAM_OFFLOAD",
        )
    index_path = settings.model / "model.safetensors.index.json"
    try:
        index = read_json_object(index_path, label=str(index_path))["weight_map"]
        shards = {index[f"layers.{layer}.engram.embed.weight"] for layer in ENGRAM_LAYERS}
        needed = sum((settings.model / name).stat().st_size for name in shards) + RAM_HEADROOM
    except (AttestError, OSError, ValueError, KeyError, TypeError) as exc:
        raise BootError(f"cannot size the Engram tables from {index_path}: {exc}", field="OFFLOAD_MODE") from None
    fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines() if ":" in line)
    available = int(fields["MemAvailable"].split()[0]) * 1024
    if available < needed:
        raise BootError(
            f"RAM offload needs at least {needed / 2**30:.1f} GiB available; found {available / 2**30:.1f}. "
            "Use nvme mode.",
            field="OFFLOAD_MODE",
        )


def check_bind(settings: BootSettings) -> None:
    if settings.host not in LOOPBACK_HOSTS and not settings.api_key and not settings.internal_only:
        raise BootError(
            f"serving on {settings.host} with no API key: set API_KEY, bind HOST=127.0.0.1, or declare the network "
            "internal-only with CONTAINER_INTERNAL_ONLY=1",
            field="API_KEY",
        )


@dataclass(frozen=True)
class LaunchPlan:
    args: list[str]
    offload_mode: str
    notes: tuple[str, ...] = ()


def _table(value: Path | None, variable: str, notes: list[str]) -> str | None:
    """A DSpark table file if it exists; a note (never a crash) when it does not."""
    if value is None:
        return None
    try:
        if value.is_file():
            return str(value)
    except OSError:
        pass
    notes.append(
        f"{variable}={value} not found; "
        + ("staying on the verify-all schedule" if variable == "DSPARK_SPS_TABLE" else "not passing a confidence table")
    )
    return None


def sglang_args(settings: BootSettings) -> LaunchPlan:
    context = settings.context_length
    if not CONTEXT_RANGE[0] <= context <= CONTEXT_RANGE[1]:
        raise BootError("Context must be 4096 through the model limit 1048576", field="CONTEXT_LENGTH")
    args = [
        "--model-path",
        str(settings.model),
        "--served-model-name",
        settings.served_model_name,
        "--trust-remote-code",
        "--load-format",
        "safetensors",
        "--tp-size",
        str(settings.tp_size),
        "--ep-size",
        str(settings.ep_size),
        "--attention-backend",
        settings.attention_backend,
        "--moe-runner-backend",
        settings.moe_runner_backend,
        "--mem-fraction-static",
        settings.mem_fraction_static,
        "--chunked-prefill-size",
        str(settings.chunked_prefill_size),
        "--context-length",
        str(context),
        "--max-running-requests",
        str(settings.max_running_requests),
        "--cuda-graph-max-bs-decode",
        str(settings.cuda_graph_max_bs_decode),
        "--random-seed",
        "0",
        "--enable-decoder-swa-bounded-replay",
        "--enable-cache-report",
        # Prometheus metrics on the API port's /metrics (served without the API key).
        "--enable-metrics",
        "--tool-call-parser",
        settings.tool_call_parser,
        "--reasoning-parser",
        settings.reasoning_parser,
        "--host",
        settings.host,
        "--port",
        str(settings.port),
    ]
    notes: list[str] = []
    args += _speculative_args(settings, notes)
    if settings.nnodes > 1:
        if not settings.dist_init_addr:
            raise BootError("DIST_INIT_ADDR is required when NNODES>1", field="DIST_INIT_ADDR")
        args += ["--nnodes", str(settings.nnodes), "--node-rank", str(settings.node_rank)]
        args += ["--dist-init-addr", settings.dist_init_addr]
    # Pin the KV pool: sized from free memory at load it varies ~2x between boots, and on
    # unified memory a bigger pool comes out of host RAM and stalls the head on reclaim.
    if settings.max_total_tokens:
        args += ["--max-total-tokens", str(settings.max_total_tokens)]
    args += settings.extra_sglang_args
    return LaunchPlan(args=args, offload_mode=settings.offload_mode, notes=tuple(notes))


def _speculative_args(settings: BootSettings, notes: list[str]) -> list[str]:
    """DSpark's flags when SPEC_ALGO asks for it, with its profiled tables where they exist."""
    if not settings.spec_algo:
        return []
    args = [
        "--speculative-algorithm",
        settings.spec_algo,
        "--speculative-dspark-block-size",
        str(settings.dspark_block_size),
    ]
    # Ragged verify needs a profiled SPS cost table (python -m sglang.benchmark.dspark_sps_profiler);
    # without one the planner verifies everything and DSpark buys nothing.
    if table := _table(settings.dspark_sps_table, "DSPARK_SPS_TABLE", notes):
        args += ["--speculative-dspark-sps-table-path", table, "--speculative-dspark-align-verify-tokens-to-graph-tier"]
    if sts := _table(settings.dspark_sts_table, "DSPARK_STS_TABLE", notes):
        args += ["--speculative-dspark-confidence-sts-path", sts]
    return args


def redactor(secret: str) -> Callable[[str], str]:
    """Hides the key in every escaped form it can take in an engine's log line."""
    return redact.redactor([secret])


class Server:
    """The SGLang process in its own process group; signals go to the whole group."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], secret: str) -> None:
        self.redact = redactor(secret)
        self.process = subprocess.Popen(
            list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        self._logs = threading.Thread(target=self._pump, daemon=True)
        self._logs.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            print(self.redact(line), end="", flush=True)

    def stop(self, *_: object) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        code = self.process.wait()
        self._logs.join(timeout=5)
        return code


def wait_healthy(settings: BootSettings, server: Server, client: httpx.Client, *, poll_s: float = 5.0) -> None:
    deadline = time.monotonic() + settings.ready_timeout_s
    while server.process.poll() is None and time.monotonic() < deadline:
        try:
            answered(client, "GET", "/health", timeout=3, body=False)[0].raise_for_status()
            return
        except httpx.HTTPError:
            time.sleep(poll_s)
    if server.process.poll() is not None:
        raise BootError(
            f"SGLang exited with code {server.process.returncode} before it became healthy; inspect the container logs",
            field="server",
        )
    raise BootError(
        f"Server failed to become healthy within READY_TIMEOUT_S={settings.ready_timeout_s}s; inspect container logs",
        field="READY_TIMEOUT_S",
    )


SGLANG_MODULE = "sglang.launch_server"


def server_command(settings: BootSettings, plan: LaunchPlan) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in settings.passthrough_env.items() if k not in ("PYTHONPATH", "PYTHONHOME", "API_KEY")}
    env["DSV41_SOURCE"] = str(settings.model)
    # Compact ragged verify only pays off with a profiled cost table.
    if "--speculative-dspark-sps-table-path" in plan.args:
        env.setdefault("SGLANG_RAGGED_VERIFY_MODE", "compact")
    # `sglang serve` (0.5.23's recommended form) has no module entry point (sglang.cli.main
    # has no __main__ guard) and its console script's location depends on the install;
    # `-m sglang.launch_server` runs the same prepare_server_args and is still supported.
    argv = [settings.engine_python, "-m", SGLANG_MODULE, *plan.args]
    if settings.api_key:
        argv += ["--api-key", settings.api_key]
    return argv, env


def _status(
    settings: BootSettings, stage: str, server: Server | None, *, port: int | None = None, reason: str = ""
) -> None:
    pids = [os.getpid()] + ([server.process.pid] if server is not None else [])
    write_status(settings.status_file, program="boot", stage=stage, pids=pids, port=port, reason=reason)


def watch_group(settings: BootSettings, server: Server, client: httpx.Client, *, poll_s: float = 5.0) -> int:
    """Rank 0 after acceptance: SGLang's /health runs a one-token generation through every
    rank, so a rank that died or hangs fails it. Once it has failed for HEALTH_LOSS_TIMEOUT_S
    without a break, the group is lost: reported, and SGLang stopped (the caller's `finally`),
    so the pod restarts and LeaderWorkerSet recreates the whole group."""
    failing_since = None
    while server.process.poll() is None:
        try:
            answered(client, "GET", "/health", timeout=HEALTH_REQUEST_TIMEOUT_S, body=False)[0].raise_for_status()
            failing_since = None
        except httpx.HTTPError as exc:
            now = time.monotonic()
            failing_since = failing_since if failing_since is not None else now
            if now - failing_since >= settings.health_loss_timeout_s:
                reason = (
                    f"/health has failed for {now - failing_since:.0f} s after acceptance "
                    f"({type(exc).__name__}): the engine or a rank is gone or hangs; stopping the group"
                )
                _status(settings, "lost", server, reason=reason)
                raise BootError(reason, field="HEALTH_LOSS_TIMEOUT_S") from None
        try:
            server.process.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass
    return server.wait()


def serve(
    settings: BootSettings,
    *,
    after_healthy: Callable[[], None] | None = None,
    meminfo: Path = Path("/proc/meminfo"),
    poll_s: float = 5.0,
) -> int:
    """Start SGLang, forward SIGTERM/SIGINT to its group, wait healthy, run `after_healthy`
    (smoke and warm-up) on rank 0, report the verdict (attest.edge.status), then wait for the
    server to end; rank 0 watches the group meanwhile (watch_group)."""
    plan = sglang_args(settings)
    check_bind(settings)
    gpus = gpu_lines()
    if plan.offload_mode == "ram":
        check_ram_offload(settings, meminfo)
    for note in plan.notes:
        print(note, flush=True)
    save(
        settings.state,
        "launch.json",
        {
            "revision": REVISION,
            "offload_mode": plan.offload_mode,
            "args": plan.args,
            "gpus": gpus,
            "nnodes": settings.nnodes,
            "node_rank": settings.node_rank,
            "tp": settings.tp_size,
            "ep": settings.ep_size,
        },
    )
    if settings.api_key:
        store_api_key(settings.state, settings.api_key)
    argv, env = server_command(settings, plan)
    server = Server(argv, env, settings.api_key)
    previous = {sig: signal.signal(sig, server.stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if settings.node_rank != 0:
            # This rank's acceptance is rank 0's authenticated verdict (prepare): its engine runs.
            _status(settings, "accepted", server)
            return server.wait()
        _status(settings, "starting", server)
        with engine_client(settings) as client:
            wait_healthy(settings, server, client, poll_s=poll_s)
            if after_healthy:
                after_healthy()
            _status(settings, "accepted", server, port=settings.port)
            where = f"Key is in {settings.state}/api-key." if settings.api_key else "no API key."
            print(f"Ready: API on port {settings.port} (rank 0). {where}", flush=True)
            return watch_group(settings, server, client, poll_s=poll_s)
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
