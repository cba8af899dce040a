"""The gate generator against scripted AR and speculative servers on loopback, and the
launcher's verdict on what it writes."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import pytest

from tests.fixtures.openai_server import GoodModel, ScriptedOpenAI, completion
from tests.fixtures.qwen import SPECULATOR_REVISION, TARGET_REVISION, VLLM_COMMIT, LauncherWorld
from tools.gate import generate
from tools.gate.corpus import CORPUS, CORPUS_SHA256, corpus_sha256
from tools.gate.stats import percentile, summary

KEY = "sk-gate-key"


class Deterministic(GoodModel):
    """Same request, same answer: what two lossless engines of one target return."""

    def __init__(self, diverge: str = "") -> None:
        self.diverge = diverge

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(request.get("messages"))
        if request.get("stop"):
            if self.diverge == "stop":
                return completion("red\ngreen\nblue\nyellow\nEND", finish_reason="length")
            return completion("red\ngreen\nblue\nyellow")
        if request.get("stream") and self.diverge == "cancel":
            return completion("")
        if request.get("seed") == 7 and self.diverge == "sampling":
            return completion("A different poem entirely.")
        if "hash table" in text and request.get("temperature") == 0 and self.diverge == "greedy":
            return completion("Collisions are handled by magic.")
        if request.get("tools") and self.diverge == "tool_json":
            return completion(None, tool_calls=[{"id": "c1", "type": "function", "function": {
                "name": "lookup_fixture", "arguments": '{"key": "beta"}'}}])
        if request.get("tools") or "response_format" in request or "19 + 23" in text:
            return super().__call__(request)
        digest = hashlib.sha256((text + str(request.get("seed"))).encode()).hexdigest()[:12]
        return completion(f"Answer {digest} in plain words for the prompt given here.")


def _latency(ms: float) -> Callable[[dict], float]:
    return lambda request: ms / 1000 if not request.get("stream") else 0


def _run_gate(tmp_path: Path, spec_model: Deterministic, *, ar_ms: float = 16, spec_ms: float = 4,
              extra: list[str] = ()) -> tuple[int, dict, str]:
    output = tmp_path / "gate.json"
    with ScriptedOpenAI(Deterministic(), api_key=KEY, latency_s=_latency(ar_ms)) as ar, \
            ScriptedOpenAI(spec_model, api_key=KEY, latency_s=_latency(spec_ms)) as spec, \
            mock.patch.dict(os.environ, {"OMNI_GATE_API_KEY": KEY}):
        code = generate.main([
            "--ar-url", ar.url, "--spec-url", spec.url, "--model", "qwen3.8-27b",
            "--target-revision", TARGET_REVISION, "--speculator-revision", SPECULATOR_REVISION,
            "--engine-commit", VLLM_COMMIT, "--output", str(output), *extra])
        assert ar.unauthorized == spec.unauthorized == 0
    document = json.loads(output.read_text())
    return code, document, hashlib.sha256(output.read_bytes()).hexdigest()


def _launch_with(tmp_path: Path, gate_path: Path, digest: str) -> dict:
    world = LauncherWorld(tmp_path / "world")
    world.env.update(INFERENCE_MODE="dflash2_canary", QWEN_DFLASH2_GATE_PATH=str(gate_path),
                     QWEN_DFLASH2_GATE_SHA256=digest)
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    return result.report["decision"]


def test_identical_and_faster_speculation_passes_and_the_launcher_selects_the_canary(tmp_path: Path, capsys) -> None:
    code, gate, digest = _run_gate(tmp_path, Deterministic())
    assert code == 0
    assert gate["parity"]["passed"] and gate["benchmark"]["passed"], gate
    assert gate["parity"]["covers"] == ["greedy", "sampling", "tool_json", "stop_and_cancel"]
    assert gate["parity"]["corpus_sha256"] == CORPUS_SHA256
    bench = gate["benchmark"]
    assert bench["samples_per_mode"] == 100 and bench["concurrency"] == [1, 2]
    assert bench["dflash2_p95_ms"] < bench["ar_p95_ms"]
    assert [level["concurrency"] for level in bench["per_concurrency"]] == [1, 2]
    out = capsys.readouterr()
    assert out.out.strip() == digest and f"QWEN_DFLASH2_GATE_SHA256={digest}" in out.err
    assert "gate: benchmark speculative concurrency 2: 100/100" in out.err
    results = json.loads((tmp_path / "gate.json.results.json").read_text())
    assert gate["parity"]["result_sha256"] == hashlib.sha256((json.dumps(
        results, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()).hexdigest()
    decision = _launch_with(tmp_path, tmp_path / "gate.json", digest)
    assert decision["mode"] == "dflash2_canary"


@pytest.mark.parametrize("diverge,case_id", [
    ("greedy", "greedy-prose"), ("sampling", "sampling-seed-7"), ("tool_json", "tool-call"),
    ("stop", "stop-sequence"), ("cancel", "client-cancel"),
])
def test_each_parity_divergence_fails_the_gate_and_the_launcher_falls_back(tmp_path: Path, diverge: str,
                                                                            case_id: str) -> None:
    # Parity is judged before the benchmark, so a short benchmark keeps this test quick.
    code, gate, digest = _run_gate(tmp_path, Deterministic(diverge), extra=["--samples", "10"])
    assert code == 1 and gate["parity"]["passed"] is False
    assert any(case_id in reason for reason in gate["parity"]["reasons"]), gate["parity"]["reasons"]
    decision = _launch_with(tmp_path, tmp_path / "gate.json", digest)
    assert decision["mode"] == "native_mtp"
    assert "DFlash2 canary disabled: DFlash2 AR parity gate has not passed" in decision["reasons"]


@pytest.mark.parametrize("kwargs,extra,reason", [
    ({"ar_ms": 3, "spec_ms": 15}, ["--samples", "100"], "does not beat AR p95"),
    ({}, ["--samples", "20"], "only 20 samples per mode"),
    ({}, ["--concurrency", "1"], "concurrency levels [2] were not measured"),
    ({"ar_ms": 20, "spec_ms": 14}, ["--samples", "100", "--min-improvement", "50"], "is below 50.0%"),
])
def test_benchmark_shortfalls_fail_the_gate(tmp_path: Path, kwargs: dict, extra: list, reason: str) -> None:
    code, gate, digest = _run_gate(tmp_path, Deterministic(), extra=extra, **kwargs)
    assert code == 1 and gate["parity"]["passed"] is True and gate["benchmark"]["passed"] is False
    assert any(reason in item for item in gate["benchmark"]["reasons"]), gate["benchmark"]["reasons"]
    decision = _launch_with(tmp_path, tmp_path / "gate.json", digest)
    assert decision["mode"] == "native_mtp"
    assert "DFlash2 canary disabled: DFlash2 target-hardware benchmark gate has not passed" in decision["reasons"]


@pytest.mark.parametrize("flag,value,message", [
    ("--ar-url", "http://10.0.0.7:8000", "must be an http(s) URL on loopback"),
    ("--target-revision", "main", "--target-revision must be an immutable 40-character commit SHA"),
    ("--engine-commit", "v0.18.1", "--engine-commit must be an immutable"),
])
def test_generator_refuses_bad_arguments(tmp_path: Path, capsys, flag: str, value: str, message: str) -> None:
    argv = {"--ar-url": "http://127.0.0.1:9", "--spec-url": "http://127.0.0.1:9", "--model": "m",
            "--target-revision": TARGET_REVISION, "--speculator-revision": SPECULATOR_REVISION,
            "--engine-commit": VLLM_COMMIT, "--output": str(tmp_path / "gate.json")}
    argv[flag] = value
    assert generate.main([item for pair in argv.items() for item in pair]) == 2
    refusal = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert message in refusal["error"] and refusal["field"] == flag
    assert not (tmp_path / "gate.json").exists()


def test_sglang_gates_carry_their_engine_and_the_vllm_launcher_refuses_them(tmp_path: Path) -> None:
    code, gate, digest = _run_gate(tmp_path, Deterministic(), extra=["--engine", "sglang", "--samples", "100"])
    assert code == 0 and gate["engine"] == "sglang"
    decision = _launch_with(tmp_path, tmp_path / "gate.json", digest)
    assert decision["mode"] == "native_mtp"
    assert any("DFlash2 gate engine is not bound" in reason for reason in decision["reasons"])


def test_percentiles_match_known_values() -> None:
    samples = list(range(1, 101))
    assert percentile(samples, 95) == pytest.approx(95.05)
    assert percentile(samples, 50) == pytest.approx(50.5)
    assert percentile([7.0], 95) == 7.0
    assert percentile([10, 20, 30, 40], 75) == pytest.approx(32.5)
    assert summary([1, 2, 3, 4, 5])["p90"] == pytest.approx(4.6)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_corpus_is_fixed() -> None:
    assert corpus_sha256() == CORPUS_SHA256
    # Recorded when the corpus was written: changing the corpus must be a deliberate act.
    assert CORPUS_SHA256 == RECORDED_CORPUS_SHA256
    assert {item["case"] for item in CORPUS} == {"greedy", "sampling", "tool_json", "stop_and_cancel"}


RECORDED_CORPUS_SHA256 = "ed031a572c9a10f83141cefdc4dc286df21852a69a37019b4c8edf074902267d"
