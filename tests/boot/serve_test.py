"""boot serve: the SGLang command line, its guards, the key file, and the server process."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import httpx
import pytest

from attest.edge.status import judge
from boot.errors import BootError
from boot.serving.serve import check_bind, check_ram_offload, server_command, sglang_args
from boot.serving.state import store_api_key
from boot.settings import BootSettings
from tests.fixtures.bounds import ended_by_deadline
from tests.fixtures.deepseek import boot_env
from tests.fixtures.processes import READY_WAIT_S
from tests.fixtures.qwen import make_fake_tool
from tests.fixtures.tools import recorded_timeouts

KEY = "sk-spark-secret-4242"


def _settings(base: Path, **extra: str) -> BootSettings:
    with mock.patch.dict(os.environ, boot_env(base, **extra), clear=True):
        return BootSettings.from_env()


def test_single_node_argv_is_exact(tmp_path: Path) -> None:
    settings = _settings(tmp_path, API_KEY=KEY, SGLANG_PYTHON="/opt/engine/bin/python")
    plan = sglang_args(settings)
    argv, env = server_command(settings, plan)
    assert argv == [
        "/opt/engine/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(tmp_path / "model"),
        "--served-model-name",
        "deepseek-v4.1-flash",
        "--trust-remote-code",
        "--load-format",
        "safetensors",
        "--tp-size",
        "3",
        "--ep-size",
        "3",
        "--attention-backend",
        "dsv4",
        "--moe-runner-backend",
        "flashinfer_mxfp4",
        "--mem-fraction-static",
        "0.95",
        "--chunked-prefill-size",
        "2048",
        "--context-length",
        "409600",
        "--max-running-requests",
        "4",
        "--cuda-graph-max-bs-decode",
        "4",
        "--random-seed",
        "0",
        "--enable-decoder-swa-bounded-replay",
        "--enable-cache-report",
        "--enable-metrics",
        "--tool-call-parser",
        "deepseekv41",
        "--reasoning-parser",
        "deepseek-v41",
        "--host",
        "0.0.0.0",
        "--port",
        "8888",
        "--speculative-algorithm",
        "DSPARK",
        "--speculative-dspark-block-size",
        "5",
        "--api-key",
        KEY,
    ]
    assert env["DSV41_SOURCE"] == str(tmp_path / "model")
    assert "API_KEY" not in env and "SGLANG_RAGGED_VERIFY_MODE" not in env


def test_multi_node_argv_and_tables_only_when_present(tmp_path: Path) -> None:
    sps = tmp_path / "sps.json"
    sps.write_text("{}")
    settings = _settings(
        tmp_path,
        NNODES="3",
        NODE_RANK="1",
        DIST_INIT_ADDR="10.0.0.1:5000",
        TP="3",
        DSPARK_SPS_TABLE=str(sps),
        DSPARK_STS_TABLE=str(tmp_path / "absent.json"),
        MAX_TOTAL_TOKENS="750000",
        EXTRA_SGLANG_ARGS="--log-level debug",
        CUDA_GRAPH_MAX_BS_DECODE="8",
        SPEC_ALGO="DSPARK",
    )
    plan = sglang_args(settings)
    args = plan.args
    assert args[-10:] == [
        "--nnodes",
        "3",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "10.0.0.1:5000",
        "--max-total-tokens",
        "750000",
        "--log-level",
        "debug",
    ]
    assert args[args.index("--speculative-dspark-sps-table-path") + 1] == str(sps)
    assert "--speculative-dspark-align-verify-tokens-to-graph-tier" in args
    assert "--speculative-dspark-confidence-sts-path" not in args
    assert any("DSPARK_STS_TABLE" in note for note in plan.notes)
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == "8"
    _, env = server_command(settings, plan)
    assert env["SGLANG_RAGGED_VERIFY_MODE"] == "compact"
    off = sglang_args(_settings(tmp_path, SPEC_ALGO="off")).args
    assert "--speculative-algorithm" not in off


@pytest.mark.parametrize(
    "extra,field,message",
    [
        ({"CONTEXT_LENGTH": "4095"}, "CONTEXT_LENGTH", "Context must be 4096 through the model limit 1048576"),
        ({"CONTEXT_LENGTH": "1048577"}, "CONTEXT_LENGTH", "Context must be 4096 through"),
        ({"CONTEXT_LENGTH": "lots"}, "CONTEXT_LENGTH", "must be an integer"),
        ({"NNODES": "3", "NODE_RANK": "0"}, "DIST_INIT_ADDR", "DIST_INIT_ADDR is required when NNODES>1"),
        ({"MAX_RUNNING_REQUESTS": "four"}, "MAX_RUNNING_REQUESTS", "non-negative integer"),
    ],
)
def test_argv_refusals(tmp_path: Path, extra: dict, field: str, message: str) -> None:
    with pytest.raises(BootError) as caught:
        sglang_args(_settings(tmp_path, **extra))
    assert caught.value.field == field and message in str(caught.value)


@pytest.mark.parametrize(
    "extra,field,message",
    [
        ({"NNODES": "3", "NODE_RANK": "3"}, "NODE_RANK", "NODE_RANK must be in 0..NNODES-1"),
        ({"SERVER_PORT": "0"}, "SERVER_PORT", "SERVER_PORT must be an integer in 1..65535, got '0'"),
        ({"SERVER_PORT": "http"}, "SERVER_PORT", "must be an integer"),
        ({"SERVER_PORT": "9" * 5000}, "SERVER_PORT", "must be an integer in 1..65535"),
        ({"MEM_FRACTION_STATIC": "1.5"}, "MEM_FRACTION_STATIC", "must be a number in (0, 1], got '1.5'"),
        ({"MEM_FRACTION_STATIC": "nan"}, "MEM_FRACTION_STATIC", "must be a number in (0, 1]"),
        ({"ATTENTION_BACKEND": "dsv4 --evil"}, "ATTENTION_BACKEND", "must be a name of letters"),
        ({"TOOL_CALL_PARSER": ""}, "TOOL_CALL_PARSER", "must be a name of letters"),
        ({"DSPARK_SPS_TABLE": "/x" * 5000}, "DSPARK_SPS_TABLE", "at most 4096 bytes"),
        ({"DSPARK_BLOCK_SIZE": "0"}, "DSPARK_BLOCK_SIZE", "an integer in 1..64"),
        ({"EXTRA_SGLANG_ARGS": '--x "unterminated'}, "EXTRA_SGLANG_ARGS", "shell-quoted arguments"),
        ({"DOWNLOAD_STALL_S": "0"}, "DOWNLOAD_STALL_S", "a positive number of seconds"),
        ({"DOWNLOAD_DEADLINE_S": "inf"}, "DOWNLOAD_DEADLINE_S", "a positive number of seconds"),
        ({"DOWNLOAD_ATTEMPTS": "0"}, "DOWNLOAD_ATTEMPTS", "an integer in 1..20"),
        ({"CHECKPOINT_LOCK_SHA256": "abc"}, "CHECKPOINT_LOCK_SHA256", "64-character SHA-256"),
        ({"HF_ENDPOINT": "ftp://mirror"}, "HF_ENDPOINT", "an http(s) URL"),
        ({"WARMUP_PROMPT_WORDS": "a,b"}, "WARMUP_PROMPT_WORDS", "comma-separated integers"),
        ({"OFFLOAD_MODE": "disk"}, "OFFLOAD_MODE", "OFFLOAD_MODE must be nvme or ram"),
        ({"MAX_TOTAL_TOKENS": "-1"}, "MAX_TOTAL_TOKENS", "non-negative integer"),
    ],
)
def test_settings_refusals(tmp_path: Path, extra: dict, field: str, message: str) -> None:
    with pytest.raises(BootError) as caught:
        _settings(tmp_path, **extra)
    assert caught.value.field == field and message in str(caught.value)


def _ram_model(base: Path) -> None:
    model = base / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "layers.1.engram.embed.weight": "a.safetensors",
                    "layers.14.engram.embed.weight": "b.safetensors",
                }
            }
        )
    )
    (model / "a.safetensors").write_bytes(b"x" * 1024)
    (model / "b.safetensors").write_bytes(b"y" * 1024)


def test_ram_offload_needs_permission_and_memory(tmp_path: Path) -> None:
    _ram_model(tmp_path)
    meminfo = tmp_path / "meminfo"
    with pytest.raises(BootError, match="Set ALLOW_RAM_OFFLOAD=1 to override") as caught:
        check_ram_offload(_settings(tmp_path, OFFLOAD_MODE="ram"), meminfo)
    assert caught.value.field == "ALLOW_RAM_OFFLOAD"
    allowed = _settings(tmp_path, OFFLOAD_MODE="ram", ALLOW_RAM_OFFLOAD="1")
    meminfo.write_text("MemTotal: 130000000 kB\nMemAvailable: 20000000 kB\n")
    with pytest.raises(BootError, match=r"needs at least 24.0 GiB available; found 19.1"):
        check_ram_offload(allowed, meminfo)
    meminfo.write_text("MemTotal: 130000000 kB\nMemAvailable: 30000000 kB\n")
    check_ram_offload(allowed, meminfo)


def test_key_file_is_0600_from_creation(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = store_api_key(tmp_path / "state", KEY)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == KEY


def test_write_atomic_never_exposes_the_key_with_wider_permissions(tmp_path: Path, monkeypatch) -> None:
    from attest import files

    seen = []
    real_fdopen = os.fdopen

    def spy(fd, *args, **kwargs):
        seen.append(stat.S_IMODE(os.fstat(fd).st_mode))
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(files.os, "fdopen", spy)
    store_api_key(tmp_path, KEY)
    assert seen == [0o600]  # the mode was set before the first byte was written


@pytest.mark.parametrize(
    "extra,refused",
    [
        ({"HOST": "0.0.0.0"}, True),
        ({"HOST": "0.0.0.0", "API_KEY": "none"}, True),
        ({"HOST": "0.0.0.0", "CONTAINER_INTERNAL_ONLY": "1"}, False),
        ({"HOST": "0.0.0.0", "API_KEY": KEY}, False),
        ({"HOST": "127.0.0.1"}, False),
    ],
)
def test_wildcard_bind_without_key_is_refused(tmp_path: Path, extra: dict, refused: bool) -> None:
    settings = _settings(tmp_path, **extra)
    if refused:
        with pytest.raises(BootError, match="with no API key") as caught:
            check_bind(settings)
        assert caught.value.field == "API_KEY"
    else:
        check_bind(settings)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(path: Path, timeout: float = READY_WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _fake_engine(tmp_path: Path, pythonpath: str) -> Path:
    """An engine interpreter that ignores `-m sglang.launch_server` and runs the fake SGLang with
    the test's own path; a GB10 nvidia-smi beside it."""
    bin_dir = tmp_path / "bin"
    make_fake_tool(bin_dir, "nvidia-smi", "NVIDIA GB10, 122880")
    engine = bin_dir / "engine-python"
    engine.write_text(
        f'#!/bin/sh\nshift 2\nPYTHONPATH="{pythonpath}" exec "{sys.executable}" -m tests.fixtures.fake_sglang "$@"\n'
    )
    engine.chmod(0o755)
    return engine


def test_run_serves_smokes_and_forwards_sigterm_to_the_process_group(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    pythonpath = os.pathsep.join(p for p in sys.path if p)
    engine = _fake_engine(tmp_path, pythonpath)
    bin_dir = engine.parent
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    env = boot_env(
        tmp_path,
        PATH=f"{bin_dir}:/usr/bin:/bin",
        SKIP_PREPARE="1",
        API_KEY=KEY,
        SERVER_PORT=str(_free_port()),
        SGLANG_PYTHON=str(engine),
        FAKE_SGLANG_MARKERS=str(markers),
        MAX_RUNNING_REQUESTS="2",
        WARMUP_PROMPT_WORDS="12",
        PYTHONPATH=pythonpath,
        OMNI_STATUS_FILE=str(tmp_path / "tmp" / "omni-status.json"),
    )
    boot = subprocess.Popen(
        [sys.executable, "-m", "boot", "run"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    try:
        for line in boot.stdout:
            lines.append(line)
            if line.startswith("Ready: API on port"):
                break
        _wait_for(markers / "child.pid")
        child = int((markers / "child.pid").read_text())
        status = tmp_path / "tmp" / "omni-status.json"
        verdict = json.loads(status.read_text())
        assert (verdict["stage"], verdict["program"], verdict["port"]) == ("accepted", "boot", int(env["SERVER_PORT"]))
        assert [pid for pid, _ in verdict["processes"]][0] == boot.pid and len(verdict["processes"]) == 2
        assert judge(status, "ready") == ""  # accepted after the smoke and warm-up, and /health answers
        boot.send_signal(signal.SIGTERM)
        _wait_for(markers / "engine-got-sigterm")
        lines += boot.stdout.readlines()
        boot.wait(timeout=20)
    finally:
        if boot.poll() is None:
            boot.kill()
    log = "".join(lines)
    assert "Fresh inference passed: 19 + 23 = 42" in log
    assert "Batch output sanity check passed: batch of 2" in log
    assert f"Key is in {tmp_path / 'state'}/api-key." in log
    assert "fake sglang starting with:" in log and "--api-key [REDACTED]" in log
    assert KEY not in log
    # The child in the engine's group got SIGTERM too.
    assert _gone_within(child, 10), "the engine's child survived: SIGTERM did not reach the process group"
    engine_env = (markers / "env.txt").read_text().split()
    assert "API_KEY" not in engine_env and "DSV41_SOURCE" in engine_env
    launch = json.loads((tmp_path / "state" / "launch.json").read_text())
    assert launch["gpus"] == ["NVIDIA GB10, 122880"] and KEY not in json.dumps(launch)
    assert stat.S_IMODE((tmp_path / "state" / "api-key").stat().st_mode) == 0o600
    assert "no longer running" in judge(status, "live")  # boot and SGLang are gone


def test_run_refuses_before_starting_anything(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    env = boot_env(tmp_path, SKIP_PREPARE="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    completed = subprocess.run(
        [sys.executable, "-m", "boot", "run"], env=env, capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 2
    assert json.loads(completed.stderr.splitlines()[-1])["field"] == "API_KEY"
    assert not (tmp_path / "state" / "launch.json").exists()


def test_usage_and_unknown_command(tmp_path: Path) -> None:
    env = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PATH": "/usr/bin:/bin"}
    shown = subprocess.run([sys.executable, "-m", "boot", "--help"], env=env, capture_output=True, text=True)
    assert shown.returncode == 0 and "Commands:" in shown.stdout and "verify" in shown.stdout
    bad = subprocess.run([sys.executable, "-m", "boot", "launch"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command or option: launch" in bad.stderr


@pytest.mark.parametrize(
    "secret", ['sk-"quoted"-key', "sk-back\\slash\\key", "sk-it's-mine", "sk-ünï-cødé", "sk-tab\tkey"]
)
def test_the_key_is_redacted_in_every_escaped_form(secret: str) -> None:
    import shlex
    from urllib.parse import quote

    from boot.serving.serve import redactor

    redact = redactor(secret)
    for printed in (
        secret,
        json.dumps(secret),
        json.dumps({"api_key": secret}, ensure_ascii=True),
        repr(secret),
        shlex.quote(secret),
        f"--api-key={quote(secret, safe='')}",
        str([secret]),
    ):
        line = redact(f"engine log: {printed} end")
        assert secret not in line and json.dumps(secret)[1:-1] not in line and repr(secret)[1:-1] not in line, line
        assert "[REDACTED]" in line


def test_a_refusal_never_prints_a_secret_from_the_environment(tmp_path: Path, capsys) -> None:
    from attest.edge.refusal import report_refusal
    from attest.errors import AttestError

    secret = 'sk-"leaky\\key'
    with mock.patch.dict(os.environ, {"API_KEY": secret}):
        assert report_refusal(AttestError(f"the server said {json.dumps(secret)} and {secret!r}", field="x")) == 2
    err = capsys.readouterr().err
    assert "leaky" not in err and err.count("[REDACTED]") == 2


# --- the guards before SGLang starts, each on both sides -----------------------------------
def test_gpu_lines_come_from_nvidia_smi_within_thirty_seconds(tmp_path: Path, monkeypatch) -> None:
    from boot.serving.serve import gpu_lines

    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with pytest.raises(BootError, match="nvidia-smi could not list the GPUs") as missing:
        gpu_lines()
    assert missing.value.field == "nvidia-smi"
    make_fake_tool(tmp_path / "bin", "nvidia-smi", "")
    with pytest.raises(BootError, match="nvidia-smi lists no GPU"):
        gpu_lines()
    make_fake_tool(tmp_path / "bin", "nvidia-smi", "NVIDIA GB10, 122880\nNVIDIA GB10, 122880")
    seen = recorded_timeouts(monkeypatch, "check_output", run_with=30)
    assert gpu_lines() == ["NVIDIA GB10, 122880", "NVIDIA GB10, 122880"] and seen == [30]


@pytest.mark.parametrize(
    "available_kb, enough", [(25165826, True), (25165825, False)], ids=["tables + 24 GiB exactly", "one KiB short"]
)
def test_ram_offload_needs_the_tables_plus_24_gib_exactly(tmp_path: Path, available_kb: int, enough: bool) -> None:
    _ram_model(tmp_path)  # two 1 KiB Engram shards
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: 130000000 kB\nMemAvailable: {available_kb} kB\n")
    allowed = _settings(tmp_path, OFFLOAD_MODE="ram", ALLOW_RAM_OFFLOAD="1")
    if enough:
        check_ram_offload(allowed, meminfo)
        return
    with pytest.raises(BootError, match="Use nvme mode") as caught:
        check_ram_offload(allowed, meminfo)
    assert caught.value.field == "OFFLOAD_MODE"


def test_ram_offload_refuses_an_index_without_the_engram_tables(tmp_path: Path) -> None:
    _ram_model(tmp_path)
    (tmp_path / "model" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"layers.1.engram.embed.weight": "a.safetensors"}})
    )
    with pytest.raises(BootError, match="cannot size the Engram tables") as caught:
        check_ram_offload(_settings(tmp_path, OFFLOAD_MODE="ram", ALLOW_RAM_OFFLOAD="1"), tmp_path / "meminfo")
    assert caught.value.field == "OFFLOAD_MODE"


@pytest.mark.parametrize("context, accepted", [("4096", True), ("4095", False), ("1048576", True), ("1048577", False)])
def test_context_length_on_both_sides(tmp_path: Path, context: str, accepted: bool) -> None:
    try:
        settings = _settings(tmp_path, CONTEXT_LENGTH=context)
        args = sglang_args(settings).args
    except BootError as exc:
        assert not accepted and exc.field == "CONTEXT_LENGTH", exc
        return
    assert accepted and args[args.index("--context-length") + 1] == context


def test_two_nodes_are_multi_node(tmp_path: Path) -> None:
    args = sglang_args(_settings(tmp_path, NNODES="2", NODE_RANK="1", DIST_INIT_ADDR="127.0.0.1:5000")).args
    assert args[args.index("--nnodes") : args.index("--nnodes") + 6] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--dist-init-addr",
        "127.0.0.1:5000",
    ]
    assert "--nnodes" not in sglang_args(_settings(tmp_path, NNODES="1")).args


def test_a_missing_table_is_a_note_that_says_what_happens_instead(tmp_path: Path) -> None:
    from boot.serving.serve import _table

    notes: list[str] = []
    assert _table(None, "DSPARK_SPS_TABLE", notes) is None and notes == []
    assert _table(tmp_path / "none", "DSPARK_SPS_TABLE", notes) is None
    assert _table(tmp_path / "none", "DSPARK_STS_TABLE", notes) is None
    assert notes == [
        f"DSPARK_SPS_TABLE={tmp_path / 'none'} not found; staying on the verify-all schedule",
        f"DSPARK_STS_TABLE={tmp_path / 'none'} not found; not passing a confidence table",
    ]
    (tmp_path / "table").write_text("x")
    assert _table(tmp_path / "table", "DSPARK_STS_TABLE", notes) == str(tmp_path / "table") and len(notes) == 2


class _Process:
    def __init__(self, code: int | None) -> None:
        self.returncode = code

    def poll(self) -> int | None:
        return self.returncode


class _Server:
    def __init__(self, code: int | None) -> None:
        self.process = _Process(code)


def _client(statuses: list[int], seen: list) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.extensions["timeout"]["read"])
        return httpx.Response(statuses.pop(0) if statuses else 503)

    return httpx.Client(base_url="http://127.0.0.1:1", transport=httpx.MockTransport(answer))


def test_wait_healthy_polls_until_health_answers(tmp_path: Path) -> None:
    from boot.serving.serve import wait_healthy

    seen: list = []
    with _client([503, 500, 200], seen) as client:
        wait_healthy(_settings(tmp_path), _Server(None), client, poll_s=0)
    assert seen == [3, 3, 3]  # each probe waits at most 3 s


def test_wait_healthy_names_a_server_that_exited(tmp_path: Path) -> None:
    from boot.serving.serve import wait_healthy

    with _client([], []) as client, pytest.raises(BootError, match="SGLang exited with code 7") as caught:
        wait_healthy(_settings(tmp_path), _Server(7), client, poll_s=0)
    assert caught.value.field == "server"


def test_wait_healthy_gives_up_after_ready_timeout(tmp_path: Path) -> None:
    from boot.serving.serve import wait_healthy

    seen: list = []
    started = time.monotonic()
    with _client([], seen) as client, pytest.raises(BootError, match="READY_TIMEOUT_S=1s") as caught:
        wait_healthy(_settings(tmp_path, READY_TIMEOUT_S="1"), _Server(None), client, poll_s=0.05)
    assert caught.value.field == "READY_TIMEOUT_S" and len(seen) >= 2  # it kept asking until then
    ended_by_deadline(time.monotonic() - started, 1, math.inf)  # a server never healthy: no other end


class _Ending(_Process):
    """Runs until `polls` checks have seen it, then ends with 0; wait(timeout) just sleeps."""

    def __init__(self, polls: int) -> None:
        super().__init__(None)
        self.pid, self.polls = os.getpid(), polls

    def poll(self) -> int | None:
        self.polls -= 1
        return None if self.polls >= 0 else 0

    def wait(self, timeout: float | None = None) -> int:
        time.sleep(timeout or 0)
        raise subprocess.TimeoutExpired("sglang", timeout or 0)


class _WatchedServer(_Server):
    def __init__(self, polls: int) -> None:
        self.process = _Ending(polls)

    def wait(self) -> int:
        return 0


def test_the_watch_forgives_a_short_health_gap(tmp_path: Path) -> None:
    from boot.serving.serve import watch_group

    seen: list = []
    settings = _settings(tmp_path, HEALTH_LOSS_TIMEOUT_S="2", OMNI_STATUS_FILE=str(tmp_path / "status.json"))
    with _client([200, 503, 503, 200, 503, 200], seen) as client:
        assert watch_group(settings, _WatchedServer(polls=6), client, poll_s=0.2) == 0
    assert len(seen) == 6 and set(seen) == {25}  # each check waits at most HEALTH_REQUEST_TIMEOUT_S
    assert not (tmp_path / "status.json").exists()  # nothing lost, nothing reported


def test_a_group_that_stops_answering_is_lost_within_the_timeout(tmp_path: Path) -> None:
    from boot.serving.serve import watch_group

    status = tmp_path / "status.json"
    settings = _settings(tmp_path, HEALTH_LOSS_TIMEOUT_S="1", OMNI_STATUS_FILE=str(status))
    started = time.monotonic()
    with _client([200], []) as client, pytest.raises(BootError) as caught:
        watch_group(settings, _WatchedServer(polls=10**6), client, poll_s=0.1)
    took = time.monotonic() - started
    assert caught.value.field == "HEALTH_LOSS_TIMEOUT_S" and "stopping the group" in str(caught.value)
    ended_by_deadline(took, 1, math.inf)  # HEALTH_LOSS_TIMEOUT_S: the group would run on forever
    assert judge(status, "live").startswith("boot is lost: /health has failed for 1 s")
