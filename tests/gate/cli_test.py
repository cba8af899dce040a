"""The gate generator against scripted AR and speculative servers on loopback, and the
launcher's verdict on what it writes."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import pytest

from tests.fixtures.bounds import ended_by_deadline, ended_long_before
from tests.fixtures.openai_server import GoodModel, Raw, ScriptedOpenAI, completion
from tests.fixtures.qwen import SPECULATOR_REVISION, TARGET_REVISION, VLLM_COMMIT, LauncherWorld
from tools.gate import cli
from tools.gate.corpus import BENCHMARK_MAX_TOKENS, CORPUS, CORPUS_SHA256, corpus_sha256
from tools.gate.stats import percentile, summary

KEY = "sk-gate-key"
MODEL = "qwen3.8-27b"


def long_answer(request: dict[str, Any]) -> dict[str, Any]:
    """A greedy benchmark answer: `max_tokens` one-token words, a pure function of the prompt,
    with usage and token ids that account for exactly what was returned."""
    seed = hashlib.sha256(json.dumps(request.get("messages")).encode()).hexdigest()[:6]
    count = request["max_tokens"]
    answer = completion(
        " ".join(f"{seed}{i}" for i in range(count)),
        finish_reason="length",
        usage={"prompt_tokens": 9, "completion_tokens": count, "total_tokens": 9 + count},
    )
    answer["choices"][0]["token_ids"] = [int(seed, 16) + i for i in range(count)]
    return answer


class Deterministic(GoodModel):
    """Same request, same answer: what two lossless engines of one target return."""

    def __init__(self, diverge: str = "") -> None:
        self.diverge = diverge

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        text = json.dumps(request.get("messages"))
        if request.get("ignore_eos"):
            return long_answer(request)
        if request.get("stop"):
            if self.diverge == "stop":
                return completion("red\ngreen\nblue\nyellow\nEND", finish_reason="length")
            return completion("red\ngreen\nblue\nyellow")
        if request.get("stream") and self.diverge == "cancel":
            return completion("")
        if request.get("temperature", 0) > 0 and self.diverge == "sampling":  # stopped sampling: one answer
            return completion("The same poem whatever the seed.")
        if request.get("temperature", 0) > 0 and self.diverge == "sampling-unseeded":
            self.draws = getattr(self, "draws", 0) + 1
            return completion(f"Poem number {self.draws}.")
        if request.get("temperature", 0) > 0 and self.diverge == "sampling-empty":
            return completion("", finish_reason="stop")
        if request.get("temperature", 0) > 0 and self.diverge == "other-draws":  # lossless, other draws
            return completion(
                f"Another draw {hashlib.sha256((text + str(request.get('seed'))).encode()).hexdigest()[:8]}"
            )
        if "hash table" in text and request.get("temperature") == 0 and self.diverge == "greedy":
            return completion("Collisions are handled by magic.")
        if request.get("tools") and self.diverge == "tool_json":
            return completion(
                None,
                tool_calls=[
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "lookup_fixture", "arguments": '{"key": "beta"}'},
                    }
                ],
            )
        if request.get("tools") or "response_format" in request or "19 + 23" in text:
            return super().__call__(request)
        digest = hashlib.sha256((text + str(request.get("seed"))).encode()).hexdigest()[:12]
        return completion(f"Answer {digest} in plain words for the prompt given here.")


class Benchmarked(Deterministic):
    """Correct on the parity corpus; on benchmark samples, `alter(index, answer)` changes the answer."""

    def __init__(self, alter: Callable[[int, dict[str, Any]], Any]) -> None:
        super().__init__()
        self.alter = alter
        self.count = 0

    def __call__(self, request: dict[str, Any]) -> Any:
        answer = super().__call__(request)
        if request.get("ignore_eos"):
            self.count += 1
            return self.alter(self.count, answer)
        return answer


def _latency(ms: float) -> Callable[[dict], float]:
    return lambda request: ms / 1000 if not request.get("stream") else 0


def spec_metrics() -> Callable[[], str]:
    """vLLM's spec-decode counters, advancing on every scrape as a busy server's would."""
    scrapes = []

    def render() -> str:
        scrapes.append(1)
        n = len(scrapes) * 1000
        return (
            "# TYPE vllm:spec_decode_num_drafts counter\n"
            f'vllm:spec_decode_num_drafts_total{{model_name="{MODEL}"}} {n}\n'
            f'vllm:spec_decode_num_draft_tokens_total{{model_name="{MODEL}"}} {n * 3}\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{MODEL}"}} {n * 2}\n'
        )

    return render


def _run_gate(
    tmp_path: Path,
    spec_model: Any,
    *,
    ar_ms: float = 16,
    spec_ms: float = 4,
    extra: list[str] = (),
    env: dict[str, str] | None = None,
    log: list | None = None,
) -> tuple[int, dict, str]:
    output = tmp_path / "gate.json"
    with (
        ScriptedOpenAI(
            Deterministic(), api_key=KEY, latency_s=_latency(ar_ms), served_model=MODEL, log=log, name="ar"
        ) as ar,
        ScriptedOpenAI(
            spec_model,
            api_key=KEY,
            latency_s=_latency(spec_ms),
            served_model=MODEL,
            metrics=spec_metrics(),
            log=log,
            name="spec",
        ) as spec,
        mock.patch.dict(os.environ, env if env is not None else {"OMNI_GATE_API_KEY": KEY}),
    ):
        code = cli.main(
            [
                "--ar-url",
                ar.url,
                "--spec-url",
                spec.url,
                "--model",
                MODEL,
                "--target-revision",
                TARGET_REVISION,
                "--speculator-revision",
                SPECULATOR_REVISION,
                "--engine-commit",
                VLLM_COMMIT,
                "--output",
                str(output),
                *extra,
            ]
        )
        if env is None:
            assert ar.unauthorized == spec.unauthorized == 0
    document = json.loads(output.read_text())
    return code, document, hashlib.sha256(output.read_bytes()).hexdigest()


def _launch_with(tmp_path: Path, gate_path: Path, digest: str) -> dict:
    world = LauncherWorld(tmp_path / "world")
    world.env.update(
        INFERENCE_MODE="dflash2_canary", QWEN_DFLASH2_GATE_PATH=str(gate_path), QWEN_DFLASH2_GATE_SHA256=digest
    )
    result = world.run("--inspect-only")
    assert result.code == 0, result.stderr
    return result.report["decision"]


def test_identical_and_faster_speculation_passes_and_the_launcher_selects_the_canary(tmp_path: Path, capsys) -> None:
    code, gate, digest = _run_gate(tmp_path, Deterministic())
    assert code == 0
    assert gate["parity"]["passed"] and gate["benchmark"]["passed"], gate
    assert gate["parity"]["covers"] == ["greedy", "sampling", "tool_json", "stop_and_cancel"]
    assert gate["parity"]["corpus_sha256"] == CORPUS_SHA256
    assert gate["parity"]["benchmark_samples_compared"] == 200
    bench = gate["benchmark"]
    assert bench["samples_per_mode"] == 100 and bench["concurrency"] == [1, 2]
    assert bench["dflash2_p95_ms"] < bench["ar_p95_ms"]
    assert bench["median_completion_tokens"] == BENCHMARK_MAX_TOKENS
    # Acceptance from the counter deltas of /metrics: 2 accepted of 3 drafted per draft.
    assert bench["acceptance_rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert bench["mean_accepted_length"] == pytest.approx(3.0)
    for level in bench["per_concurrency"]:
        assert level["ar_p50_ms"] <= level["ar_p95_ms"] <= level["ar_p99_ms"]
        assert level["dflash2_tpot_p95_ms"] == pytest.approx(level["dflash2_p95_ms"] / BENCHMARK_MAX_TOKENS, rel=0.3)
    assert [level["concurrency"] for level in bench["per_concurrency"]] == [1, 2]
    out = capsys.readouterr()
    assert out.out.strip() == digest and f"QWEN_DFLASH2_GATE_SHA256={digest}" in out.err
    assert "gate: benchmark concurrency 2: 100/100 per server" in out.err
    assert "| speculative | 2 |" in out.err and "66.7%, mean length 3" in out.err
    results = json.loads((tmp_path / "gate.json.results.json").read_text())
    assert (
        gate["parity"]["result_sha256"]
        == hashlib.sha256(
            (json.dumps(results, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
        ).hexdigest()
    )
    assert results["servers"]["speculative"]["models"] == [MODEL]
    assert len(results["benchmark"]["concurrency_1"]["speculative"]) == 100
    decision = _launch_with(tmp_path, tmp_path / "gate.json", digest)
    assert decision["mode"] == "dflash2_canary"


def test_benchmark_requests_are_greedy_long_and_interleaved(tmp_path: Path) -> None:
    log: list = []
    code, gate, _ = _run_gate(tmp_path, Deterministic(), log=log, extra=["--samples", "100"])
    assert code == 0, gate
    bench = [(name, request) for name, request in log if request.get("ignore_eos")]
    assert all(r["temperature"] == 0 and r["max_tokens"] == BENCHMARK_MAX_TOKENS and "seed" in r for _, r in bench)
    # Warm-up (2 each), then rounds at concurrency 1 that alternate which server goes first.
    order = [name for name, _ in bench[4:8]]
    assert order == ["ar", "spec", "spec", "ar"]


def _empty_instantly(index: int, answer: dict) -> dict:
    return completion("", finish_reason="stop", usage={"prompt_tokens": 9, "completion_tokens": 0, "total_tokens": 9})


def _one_token_off(index: int, answer: dict) -> dict:
    # Warm-up takes the first two benchmark requests; sample 37 of concurrency 1 is the 40th.
    if index == 40:
        words = answer["choices"][0]["message"]["content"].split(" ")
        words[17] = "DIFFERENT"
        answer["choices"][0]["message"]["content"] = " ".join(words)
        answer["choices"][0]["token_ids"][17] += 1
    return answer


def _truncated_but_counted(index: int, answer: dict) -> dict:
    words = answer["choices"][0]["message"]["content"].split(" ")
    answer["choices"][0]["message"]["content"] = " ".join(words[:32])
    answer["choices"][0]["token_ids"] = answer["choices"][0]["token_ids"][:32]
    return answer


def _usage_inflated(index: int, answer: dict) -> dict:
    answer["usage"]["completion_tokens"] += 5
    return answer


@pytest.mark.parametrize(
    "alter,spec_ms,sample,why",
    [
        (_empty_instantly, 0.1, "benchmark sample c1-0", "speculative output differs from AR"),
        (_one_token_off, 4, "benchmark sample c1-37", "token ids differ at token 17"),
        (
            _truncated_but_counted,
            1,
            "benchmark sample c1-0",
            "token_ids has 32 tokens but usage.completion_tokens is 128",
        ),
        (_usage_inflated, 4, "benchmark sample c1-0", "usage.completion_tokens 133 exceeds max_tokens 128"),
    ],
)
def test_a_speculator_that_answers_less_or_lies_never_passes(
    tmp_path: Path, capsys, alter, spec_ms: float, sample: str, why: str
) -> None:
    code, gate, digest = _run_gate(tmp_path, Benchmarked(alter), spec_ms=spec_ms)
    assert code == 1
    assert gate["parity"]["passed"] is False and gate["benchmark"]["passed"] is False
    first = [reason for reason in gate["parity"]["reasons"] if reason.startswith("benchmark sample")][0]
    assert first.startswith(sample) and why in first, gate["parity"]["reasons"]
    err = capsys.readouterr().err
    assert "pin it" not in err and "QWEN_DFLASH2_GATE_SHA256" not in err
    assert err.splitlines()[-1].startswith("gate: FAILED; wrote")
    decision = _launch_with(tmp_path, tmp_path / "gate.json", digest)
    assert decision["mode"] == "native_mtp"


def test_short_answers_cannot_stand_in_for_decoding_work(tmp_path: Path) -> None:
    class Short(Deterministic):
        def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
            if request.get("ignore_eos"):
                return long_answer({**request, "max_tokens": 10})
            return super().__call__(request)

    # Both servers answer alike (the AR one is Short too), so only the floor can catch it.
    output = tmp_path / "gate.json"
    with (
        ScriptedOpenAI(Short(), api_key=KEY, served_model=MODEL, latency_s=_latency(8)) as ar,
        ScriptedOpenAI(Short(), api_key=KEY, served_model=MODEL, latency_s=_latency(2)) as spec,
        mock.patch.dict(os.environ, {"OMNI_GATE_API_KEY": KEY}),
    ):
        code = cli.main(
            [
                "--ar-url",
                ar.url,
                "--spec-url",
                spec.url,
                "--model",
                MODEL,
                "--target-revision",
                TARGET_REVISION,
                "--speculator-revision",
                SPECULATOR_REVISION,
                "--engine-commit",
                VLLM_COMMIT,
                "--output",
                str(output),
            ]
        )
    gate = json.loads(output.read_text())
    assert code == 1 and gate["parity"]["passed"] is True and gate["benchmark"]["passed"] is False
    assert any("median benchmark completion is 10 tokens; at least 64" in r for r in gate["benchmark"]["reasons"])


def _broken(kind: str) -> Callable[[int, dict], Any]:
    def alter(index: int, answer: dict) -> Any:
        return {
            "non-json": Raw(200, b"<html>gateway</html>"),
            "choices-strings": Raw(200, json.dumps({"choices": ["x"]}).encode()),
            "deep": Raw(200, b"[" * 5000 + b"]" * 5000),
            "nan": Raw(200, b'{"choices": [{"message": {"content": "a"}}], "usage": {"completion_tokens": NaN}}'),
            "server-error": Raw(500, b'{"error": "boom"}'),
        }[kind]

    return alter


@pytest.mark.parametrize(
    "kind,reason",
    [
        ("non-json", "speculative server chat completion is not valid JSON"),
        ("choices-strings", "speculative server chat completion has the wrong shape at choices.0"),
        ("deep", "speculative server chat completion nests deeper than 64 levels"),
        ("nan", "NaN is not a JSON number"),
        ("server-error", "answered HTTP 500"),
    ],
)
def test_every_peer_failure_fails_the_gate_with_its_reason_and_writes_it(
    tmp_path: Path, kind: str, reason: str
) -> None:
    code, gate, _ = _run_gate(tmp_path, Benchmarked(_broken(kind)), extra=["--samples", "4"])
    assert code == 1 and gate["parity"]["passed"] is False
    assert reason in gate["parity"]["reasons"][0], gate["parity"]["reasons"]


def test_a_server_that_never_answers_is_bounded_by_timeout_and_deadline(tmp_path: Path) -> None:
    started = time.monotonic()
    code, gate, _ = _run_gate(
        tmp_path,
        Deterministic(),
        spec_ms=600_000,  # a server that never answers in the test's lifetime
        extra=["--request-timeout", "0.3", "--deadline", "600", "--samples", "4"],
    )
    assert code == 1 and "did not answer within 0.3 s" in gate["parity"]["reasons"][0]
    ended_long_before(time.monotonic() - started, 600, what="the request timeout")  # not the deadline
    started = time.monotonic()
    code, gate, _ = _run_gate(tmp_path, Deterministic(), spec_ms=5000, extra=["--deadline", "2"])
    assert code == 1
    # The overall deadline, not the default 300 s request timeout nor the slow server's many requests.
    ended_by_deadline(time.monotonic() - started, 2, 300, started_with_it=False)
    assert any("overall deadline of 2 s passed" in r for r in gate["parity"]["reasons"] + gate["benchmark"]["reasons"])


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, "the API key from OMNI_GATE_API_KEY is not set"),
        ({"OMNI_GATE_API_KEY": "wrong"}, "the API key from OMNI_GATE_API_KEY is not accepted"),
    ],
)
def test_without_a_working_key_the_gate_stops_within_seconds_naming_the_variable(
    tmp_path: Path, capsys, env: dict, expected: str
) -> None:
    log: list = []
    code, gate, _ = _run_gate(tmp_path, Deterministic(), env=env, log=log)
    assert code == 1
    assert log == []  # no chat request was sent: the preflight stopped the run
    err = capsys.readouterr().err
    gate_lines = [line for line in err.splitlines() if line.startswith("gate:")]
    assert expected in gate_lines[0] and "HTTP 401" in err and "/v1/models" in err
    assert "pin it" not in err
    assert gate["parity"]["passed"] is False and expected in gate["parity"]["reasons"][0]


def test_a_server_serving_another_model_is_refused_before_the_run(tmp_path: Path) -> None:
    output = tmp_path / "gate.json"
    with (
        ScriptedOpenAI(Deterministic(), api_key=KEY, served_model=MODEL) as ar,
        ScriptedOpenAI(Deterministic(), api_key=KEY, served_model="other") as spec,
        mock.patch.dict(os.environ, {"OMNI_GATE_API_KEY": KEY}),
    ):
        code = cli.main(
            [
                "--ar-url",
                ar.url,
                "--spec-url",
                spec.url,
                "--model",
                MODEL,
                "--target-revision",
                TARGET_REVISION,
                "--speculator-revision",
                SPECULATOR_REVISION,
                "--engine-commit",
                VLLM_COMMIT,
                "--output",
                str(output),
            ]
        )
        assert spec.requests == []
    gate = json.loads(output.read_text())
    assert code == 1 and "serves ['other'], not the model 'qwen3.8-27b' (--spec-model)" in gate["parity"]["reasons"][0]


@pytest.mark.parametrize(
    "diverge,case_id",
    [
        ("greedy", "greedy-prose"),
        ("sampling", "sampling-seed-7"),
        ("sampling-empty", "sampling-seed-1234"),
        ("tool_json", "tool-call"),
        ("stop", "stop-sequence"),
        ("cancel", "client-cancel"),
    ],
)
def test_each_parity_divergence_fails_the_gate_and_the_launcher_falls_back(
    tmp_path: Path, diverge: str, case_id: str
) -> None:
    # Parity is judged before the benchmark, so a short benchmark keeps this test quick.
    code, gate, digest = _run_gate(tmp_path, Deterministic(diverge), extra=["--samples", "10"])
    assert code == 1 and gate["parity"]["passed"] is False
    assert any(case_id in reason for reason in gate["parity"]["reasons"]), gate["parity"]["reasons"]
    decision = _launch_with(tmp_path, tmp_path / "gate.json", digest)
    assert decision["mode"] == "native_mtp"
    assert "DFlash2 canary disabled: DFlash2 AR parity gate has not passed" in decision["reasons"]


@pytest.mark.parametrize("draws", ["other-draws", "sampling-unseeded"])
def test_a_lossless_speculator_whose_seeded_draws_differ_from_ar_passes(tmp_path: Path, draws: str) -> None:
    """Other draws of the same distribution are no divergence, and neither is a speculator whose
    seeded draws do not repeat (vLLM's ngram speculation on the CPU, seen in the engine lane)."""
    code, gate, _ = _run_gate(tmp_path, Deterministic(draws))
    assert gate["parity"]["passed"] is True, gate["parity"]["reasons"]
    assert code == 0
    results = json.loads((tmp_path / "gate.json.results.json").read_text())["parity"]
    ar, spec = results["ar"]["sampling-seed-7"]["ok"], results["speculative"]["sampling-seed-7"]["ok"]
    assert ar["seed"] == ar["same_seed"] != ar["next_seed"] and spec["seed"] != ar["seed"]
    assert (spec["seed"] == spec["same_seed"]) is (draws == "other-draws") and spec["seed"] != spec["next_seed"]


@pytest.mark.parametrize(
    "kwargs,extra,reason",
    [
        ({"ar_ms": 3, "spec_ms": 15}, ["--samples", "100"], "does not beat AR p95"),
        ({}, ["--samples", "20"], "only 20 samples per mode"),
        ({}, ["--concurrency", "1"], "concurrency levels [2] were not measured"),
        ({"ar_ms": 20, "spec_ms": 14}, ["--samples", "100", "--min-improvement", "50"], "is below 50.0%"),
    ],
)
def test_benchmark_shortfalls_fail_the_gate(tmp_path: Path, kwargs: dict, extra: list, reason: str) -> None:
    code, gate, digest = _run_gate(tmp_path, Deterministic(), extra=extra, **kwargs)
    assert code == 1 and gate["parity"]["passed"] is True and gate["benchmark"]["passed"] is False
    assert any(reason in item for item in gate["benchmark"]["reasons"]), gate["benchmark"]["reasons"]
    decision = _launch_with(tmp_path, tmp_path / "gate.json", digest)
    assert decision["mode"] == "native_mtp"
    assert "DFlash2 canary disabled: DFlash2 target-hardware benchmark gate has not passed" in decision["reasons"]


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--ar-url", "http://10.0.0.7:8000", "must be an http(s) URL on loopback"),
        ("--ar-url", "ftp://127.0.0.1:8000", "must be an http(s) URL on loopback"),
        ("--ar-url", "http://localhost.example:8000", "must be an http(s) URL on loopback"),
        ("--ar-url", "http://:8000", "must be an http(s) URL on loopback"),
        (
            "--spec-url",
            "https://192.168.1.2",
            "--spec-url must be an http(s) URL on loopback (the servers run on this host), got 'https://192.168.1.2'",
        ),
        ("--spec-url", "127.0.0.1:8000", "must be an http(s) URL on loopback"),
        ("--target-revision", "main", "--target-revision must be an immutable 40-character commit SHA"),
        ("--speculator-revision", "a" * 39, "--speculator-revision must be an immutable"),
        ("--engine-commit", "v0.18.1", "--engine-commit must be an immutable"),
        ("--samples", "0", "--samples must be positive"),
        ("--samples", "-1", "--samples must be positive"),
        ("--request-timeout", "0", "--request-timeout and --deadline must be positive seconds"),
        ("--request-timeout", "-0.5", "--request-timeout and --deadline must be positive seconds"),
        ("--deadline", "0", "--request-timeout and --deadline must be positive seconds"),
    ],
)
def test_generator_refuses_bad_arguments(tmp_path: Path, capsys, flag: str, value: str, message: str) -> None:
    argv = {
        "--ar-url": "http://127.0.0.1:9",
        "--spec-url": "http://127.0.0.1:9",
        "--model": "m",
        "--target-revision": TARGET_REVISION,
        "--speculator-revision": SPECULATOR_REVISION,
        "--engine-commit": VLLM_COMMIT,
        "--output": str(tmp_path / "gate.json"),
    }
    argv[flag] = value
    assert cli.main([item for pair in argv.items() for item in pair]) == 2, value
    refusal = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert message in refusal["error"] and refusal["field"] == flag
    assert not (tmp_path / "gate.json").exists()


@pytest.mark.parametrize("flag, value", [("--samples", "1"), ("--request-timeout", "0.5"), ("--deadline", "0.5")])
def test_the_smallest_accepted_values_run_the_gate(tmp_path: Path, flag: str, value: str) -> None:
    """Accepted, so the run starts: nothing listens on port 9, the preflight fails, the gate is
    written with passed: false (exit 1), not refused as an argument (exit 2)."""
    argv = {
        "--ar-url": "http://127.0.0.1:9",
        "--spec-url": "http://127.0.0.1:9",
        "--model": "m",
        "--target-revision": TARGET_REVISION,
        "--speculator-revision": SPECULATOR_REVISION,
        "--engine-commit": VLLM_COMMIT,
        "--output": str(tmp_path / "gate.json"),
        "--request-timeout": "2",
    }
    argv[flag] = value
    assert cli.main([item for pair in argv.items() for item in pair]) == 1
    gate = json.loads((tmp_path / "gate.json").read_text())
    assert gate["parity"]["passed"] is False and gate["parity"]["reasons"][0].startswith("preflight: ")


@pytest.mark.parametrize("url", ["http://127.0.0.1:9", "https://localhost", "http://[::1]:8000", "http://127.8.9.10"])
def test_loopback_urls_are_accepted(url: str) -> None:
    assert cli.require_loopback(url, "--ar-url") == url


def test_a_relative_output_is_where_bazel_run_was_started(tmp_path: Path, monkeypatch) -> None:
    argv = [
        "--ar-url",
        "http://127.0.0.1:9",
        "--spec-url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--target-revision",
        TARGET_REVISION,
        "--speculator-revision",
        SPECULATOR_REVISION,
        "--engine-commit",
        VLLM_COMMIT,
    ]
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(tmp_path))
    assert cli.parse_args([*argv, "--output", "gate.json"]).output == tmp_path / "gate.json"
    assert cli.parse_args([*argv, "--output", "/abs/gate.json"]).output == Path("/abs/gate.json")


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


RECORDED_CORPUS_SHA256 = "e591d809850418065154c3152b55d71bd8c1d8f6f16a7ae088d86da6e3d1969e"


def test_preflight_failure_compares_no_benchmark_sample_and_a_spec_model_is_asked_for_by_its_name(
    tmp_path: Path,
) -> None:
    output = tmp_path / "gate.json"
    base = [
        "--model",
        MODEL,
        "--target-revision",
        TARGET_REVISION,
        "--speculator-revision",
        SPECULATOR_REVISION,
        "--engine-commit",
        VLLM_COMMIT,
        "--output",
        str(output),
        "--samples",
        "1",
    ]
    with (
        ScriptedOpenAI(Deterministic(), api_key=KEY, served_model=MODEL) as ar,
        ScriptedOpenAI(Deterministic(), api_key=KEY, served_model="spec-name") as spec,
        mock.patch.dict(os.environ, {"OMNI_GATE_API_KEY": KEY}),
    ):
        assert cli.main(["--ar-url", ar.url, "--spec-url", spec.url, *base]) == 1
        gate = json.loads(output.read_text())
        assert gate["parity"]["benchmark_samples_compared"] == 0 and gate["benchmark"]["samples_per_mode"] == 0
        # With --spec-model the speculative server is asked for its own name: the preflight passes.
        cli.main(["--ar-url", ar.url, "--spec-url", spec.url, "--spec-model", "spec-name", *base])
        gate = json.loads(output.read_text())
        assert not any(reason.startswith("preflight") for reason in gate["parity"]["reasons"]), gate["parity"]
        assert any(request.get("model") == "spec-name" for request in spec.requests if isinstance(request, dict))


@pytest.mark.parametrize("models", [[], {"data": {"id": MODEL}}, {"data": "x"}, "models"])
def test_a_model_list_of_another_shape_is_refused_naming_the_server(models: Any) -> None:
    from tools.gate.openai_client import PeerError

    class Listing:
        name, model, url = "ar", MODEL, "http://127.0.0.1:9"

        def get_json(self, client: Any, path: str) -> Any:
            return models if path == "/v1/models" else {}

    with pytest.raises(PeerError, match="ar server: /v1/models is not an OpenAI model list"):
        cli.describe(Listing(), None)


def test_the_deadline_is_named_when_only_it_is_wrong(tmp_path: Path, capsys) -> None:
    code = cli.main(
        [
            "--ar-url",
            "http://127.0.0.1:9",
            "--spec-url",
            "http://127.0.0.1:9",
            "--model",
            MODEL,
            "--target-revision",
            TARGET_REVISION,
            "--speculator-revision",
            SPECULATOR_REVISION,
            "--engine-commit",
            VLLM_COMMIT,
            "--output",
            str(tmp_path / "g.json"),
            "--request-timeout",
            "0.5",
            "--deadline",
            "0",
        ]
    )
    assert code == 2 and json.loads(capsys.readouterr().err.strip().splitlines()[-1])["field"] == "--deadline"


def test_the_results_table_puts_acceptance_on_the_speculative_rows(tmp_path: Path) -> None:
    _, gate, _ = _run_gate(tmp_path, Deterministic(), extra=["--samples", "100"])
    from attest.documents import parse_document
    from attest.speculation import DFlash2Gate

    table = cli.results_table(parse_document(DFlash2Gate, gate, label="gate")).splitlines()
    ar_rows = [row for row in table if row.startswith("| AR |")]
    spec_rows = [row for row in table if row.startswith("| speculative |")]
    assert ar_rows and spec_rows and all(row.endswith("| - |") for row in ar_rows)
    assert all("%" in row.rsplit("|", 2)[1] for row in spec_rows)


def test_a_parity_failure_fails_the_gate_even_when_the_benchmark_passes(tmp_path: Path, capsys) -> None:
    code, gate, _ = _run_gate(tmp_path, Deterministic("tool_json"), extra=["--samples", "100"])
    assert gate["benchmark"]["passed"] is True and gate["parity"]["passed"] is False
    assert code == 1 and "gate: FAILED; wrote" in capsys.readouterr().err


def test_the_module_exits_with_the_generators_code() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.gate.cli",
            "--ar-url",
            "http://127.0.0.1:9",
            "--spec-url",
            "http://127.0.0.1:9",
            "--model",
            MODEL,
            "--target-revision",
            TARGET_REVISION,
            "--speculator-revision",
            SPECULATOR_REVISION,
            "--engine-commit",
            VLLM_COMMIT,
            "--output",
            "/tmp/unused-gate.json",
            "--samples",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 2 and "--samples must be positive" in done.stderr
