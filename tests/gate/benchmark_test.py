"""tools.gate.benchmark without servers: the rounds and their order, progress, the deadline
stopping a run, latency in milliseconds, and every threshold of run_benchmark on both sides
(samples, required concurrency levels, median completion length, per-level and overall p95,
the improvement floor), with scripted endpoints and scripted levels."""

from __future__ import annotations

from typing import Any

import pytest

from tools.gate import benchmark
from tools.gate.benchmark import Sample, run_benchmark, run_level
from tools.gate.openai_client import ChatCompletion, DeadlinePassed, PeerError
from tools.gate.parity import Answer

# The gate's documented floors, written out so that a changed constant fails here.
MIN_SAMPLES = 100
MIN_MEDIAN_COMPLETION_TOKENS = 64


def _completion(tokens: int = 3) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "choices": [
                {"message": {"content": "x" * tokens}, "finish_reason": "length", "token_ids": list(range(tokens))}
            ],
            "usage": {"completion_tokens": tokens},
        }
    )


class ScriptedEndpoint:
    """Answers each benchmark request (its index, through the patched benchmark_request) and
    logs the order; `fail` maps an index to the PeerError that request raises."""

    def __init__(self, name: str, log: list[tuple[str, int]], fail: dict[int, PeerError] | None = None) -> None:
        self.name, self.log, self.fail = name, log, fail or {}

    def chat(self, client: Any, request: dict[str, Any]) -> ChatCompletion:
        index = request["index"]
        self.log.append((self.name, index))
        if index in self.fail:
            raise self.fail[index]
        return _completion()


@pytest.fixture(autouse=True)
def _indexed_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(benchmark, "benchmark_request", lambda index: {"index": index})


def _run_level(level: int, samples: int, ar_fail=None, spec_fail=None):
    log: list[tuple[str, int]] = []
    progress: list[str] = []
    ar, spec = ScriptedEndpoint("ar", log, ar_fail), ScriptedEndpoint("spec", log, spec_fail)
    result = run_level(ar, spec, None, None, level=level, samples=samples, progress=progress.append)
    return result, log, progress


def test_rounds_alternate_which_server_goes_first() -> None:
    (ar, spec), log, _ = _run_level(level=2, samples=7)
    assert [s.index for s in ar] == [s.index for s in spec] == list(range(7))
    rounds = [sorted(log[start : start + 4]) for start in (0, 4, 8)] + [log[12:]]
    firsts = [log[0][0], log[4][0], log[8][0], log[12][0]]
    assert firsts == ["ar", "spec", "ar", "spec"]
    assert rounds[0] == [("ar", 0), ("ar", 1), ("spec", 0), ("spec", 1)]
    assert {name for name, _ in log[4:6]} == {"spec"} and {name for name, _ in log[8:10]} == {"ar"}
    assert log[12:] == [("spec", 6), ("ar", 6)]
    assert all(s.error is None and s.latency_ms is not None and s.answer.completion_tokens == 3 for s in ar + spec)


@pytest.mark.parametrize(
    "level, samples, expected",
    [(1, 12, [10, 12]), (2, 25, [10, 20, 25]), (2, 20, [10, 20]), (3, 9, [9]), (3, 31, [12, 21, 30, 31])],
)
def test_progress_every_tenth_sample_and_at_the_end(level: int, samples: int, expected: list[int]) -> None:
    _, _, progress = _run_level(level, samples)
    assert progress == [f"benchmark concurrency {level}: {done}/{samples} per server" for done in expected]


def test_a_failed_request_is_a_sample_with_its_error() -> None:
    (ar, spec), _, _ = _run_level(1, 3, spec_fail={1: PeerError("spec server: HTTP 500")})
    assert spec[1].error == "spec server: HTTP 500" and spec[1].latency_ms is None and spec[1].answer is None
    assert not spec[1].deadline_passed and len(ar) == len(spec) == 3


@pytest.mark.parametrize("side", ["ar", "spec"])
def test_the_deadline_stops_the_level_after_its_round(side: str) -> None:
    fail = {3: DeadlinePassed("the overall deadline of 5 s passed (--deadline)")}
    (ar, spec), log, _ = _run_level(2, 10, **{f"{side}_fail": fail})
    assert len(ar) == len(spec) == 4 and len(log) == 8
    failed = (ar if side == "ar" else spec)[3]
    assert failed.deadline_passed and failed.error.startswith("the overall deadline")


def test_latency_is_the_request_time_in_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([10.0, 10.25, 20.0, 20.5])

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return next(clock)

    monkeypatch.setattr(benchmark, "time", Clock)
    (ar, spec), _, _ = _run_level(1, 1)
    assert ar[0].latency_ms == 250.0 and spec[0].latency_ms == 500.0
    assert ar[0].tpot_ms == pytest.approx(250.0 / 3)


def _level(count: int, ar_ms: float, spec_ms: float, tokens: int = 128, start: int = 0) -> tuple[list, list]:
    def samples(latency: float) -> list[Sample]:
        return [
            Sample(index, latency_ms=latency, answer=Answer("x" * tokens, "length", tokens, list(range(tokens)), None))
            for index in range(start, start + count)
        ]

    return samples(ar_ms), samples(spec_ms)


def _benchmark(
    monkeypatch: pytest.MonkeyPatch,
    levels: dict[int, tuple[list, list]],
    *,
    concurrency=None,
    min_improvement: float = 10.0,
) -> tuple[dict, list, dict, list[int]]:
    ran: list[int] = []

    def scripted(ar, spec, ar_client, spec_client, *, level, samples, progress):
        ran.append(level)
        return levels[level]

    monkeypatch.setattr(benchmark, "run_level", scripted)
    section, parity, raw = run_benchmark(
        None,
        None,
        None,
        None,
        samples=MIN_SAMPLES,
        concurrency=concurrency or sorted(levels),
        min_improvement=min_improvement,
        progress=lambda line: None,
    )
    return section, parity, raw, ran


def test_a_faster_equal_speculator_passes_with_every_statistic(monkeypatch: pytest.MonkeyPatch) -> None:
    section, parity, raw, ran = _benchmark(monkeypatch, {1: _level(100, 100.0, 80.0), 2: _level(100, 200.0, 160.0)})
    assert ran == [1, 2] and parity == []
    assert section["passed"] is True and section["reasons"] == []
    assert section["samples_per_mode"] == 100 and section["median_completion_tokens"] == 128
    assert section["concurrency"] == [1, 2]
    assert section["ar_p95_ms"] == 200.0 and section["dflash2_p95_ms"] == 160.0
    first = section["per_concurrency"][0]
    assert {key for key in first} == {
        "concurrency",
        "samples",
        *(f"{side}_p{q}_ms" for side in ("ar", "dflash2", "ar_tpot", "dflash2_tpot") for q in (50, 95, 99)),
    }
    assert first["ar_p99_ms"] == 100.0 and first["dflash2_tpot_p50_ms"] == 0.625
    assert raw["concurrency_1"]["ar"][0] == {
        "index": 0,
        "latency_ms": 100.0,
        "error": None,
        "text": "x" * 128,
        "finish_reason": "length",
        "completion_tokens": 128,
        "token_ids": list(range(128)),
        "top1_tokens": None,
    }
    assert len(raw["concurrency_2"]["speculative"]) == 100


def test_the_overall_p95_is_the_95th_percentile_of_every_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    ar, spec = _level(100, 0.0, 0.0)
    for index, (a, s) in enumerate(zip(ar, spec)):
        a.latency_ms, s.latency_ms = float(index + 1), float(index + 1) / 2
    section, _, _, _ = _benchmark(monkeypatch, {1: (ar, spec), 2: _level(100, 50.0, 25.0)})
    # 200 samples per side: the 95th percentile lies between the 190th and 191st values.
    assert section["ar_p95_ms"] == 90.05 and section["dflash2_p95_ms"] == 45.025
    assert section["per_concurrency"][0]["ar_p95_ms"] == 95.05


def test_percentiles_are_rounded_to_the_microsecond(monkeypatch: pytest.MonkeyPatch) -> None:
    section, _, _, _ = _benchmark(monkeypatch, {1: _level(100, 100.12345, 80.98765), 2: _level(100, 100.0, 80.0)})
    assert section["per_concurrency"][0]["ar_p50_ms"] == 100.123
    assert section["per_concurrency"][0]["dflash2_p95_ms"] == 80.988
    assert section["ar_p95_ms"] == 100.123 and section["dflash2_p95_ms"] == 80.988


@pytest.mark.parametrize(
    "counts, reason",
    [
        ((MIN_SAMPLES, MIN_SAMPLES), None),
        (
            (MIN_SAMPLES, MIN_SAMPLES - 1),
            f"only {MIN_SAMPLES - 1} samples per mode and concurrency level; at least {MIN_SAMPLES} needed",
        ),
        (
            (MIN_SAMPLES - 1, MIN_SAMPLES + 5),
            f"only {MIN_SAMPLES - 1} samples per mode and concurrency level; at least {MIN_SAMPLES} needed",
        ),
    ],
)
def test_the_sample_floor_on_both_sides(monkeypatch: pytest.MonkeyPatch, counts, reason) -> None:
    section, _, _, _ = _benchmark(monkeypatch, {1: _level(counts[0], 100.0, 80.0), 2: _level(counts[1], 100.0, 80.0)})
    assert section["reasons"] == ([reason] if reason else [])
    assert section["samples_per_mode"] == min(counts) and section["passed"] is (reason is None)


def test_no_usable_sample_at_all_is_zero_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    down = [Sample(index, error="down") for index in range(MIN_SAMPLES)]
    section, _, _, _ = _benchmark(monkeypatch, {1: (down, down), 2: (down, down)})
    assert section["samples_per_mode"] == 0 and section["per_concurrency"] == []
    assert f"only 0 samples per mode and concurrency level; at least {MIN_SAMPLES} needed" in section["reasons"]
    assert "concurrency levels [1, 2] were not measured; 1 and 2 are required" in section["reasons"]
    assert "speculative p95 0.0 ms does not beat AR p95 0.0 ms" in section["reasons"]
    assert section["median_completion_tokens"] == 0 and section["passed"] is False


@pytest.mark.parametrize("concurrency, missing", [([1], [2]), ([2], [1]), ([2, 4], [1]), ([1, 2, 4], None)])
def test_levels_1_and_2_are_required(monkeypatch: pytest.MonkeyPatch, concurrency, missing) -> None:
    levels = {level: _level(100, 100.0, 80.0) for level in concurrency}
    section, _, _, ran = _benchmark(monkeypatch, levels)
    assert ran == concurrency
    expected = [f"concurrency levels {missing} were not measured; 1 and 2 are required"] if missing else []
    assert section["reasons"] == expected


def test_a_level_without_samples_counts_as_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    down = [Sample(index, error="down") for index in range(3)]
    section, _, _, _ = _benchmark(monkeypatch, {1: _level(100, 100.0, 80.0), 2: (down, down)})
    assert "concurrency levels [2] were not measured; 1 and 2 are required" in section["reasons"]
    assert [level["concurrency"] for level in section["per_concurrency"]] == [1]


@pytest.mark.parametrize(
    "tokens, passes", [(MIN_MEDIAN_COMPLETION_TOKENS, True), (MIN_MEDIAN_COMPLETION_TOKENS - 1, False)]
)
def test_the_median_completion_floor_on_both_sides(monkeypatch: pytest.MonkeyPatch, tokens: int, passes: bool) -> None:
    levels = {level: _level(100, 100.0, 80.0, tokens) for level in (1, 2)}
    section, _, _, _ = _benchmark(monkeypatch, levels)
    assert section["median_completion_tokens"] == tokens
    expected = (
        []
        if passes
        else [
            f"the median benchmark completion is {tokens} tokens; at least "
            f"{MIN_MEDIAN_COMPLETION_TOKENS} are needed so each sample does real decoding work"
        ]
    )
    assert section["reasons"] == expected


def test_answers_without_usage_are_a_median_of_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    ar, spec = _level(100, 100.0, 80.0)
    for sample in ar:
        sample.answer = Answer("x", "length", None, None, None)
    section, _, _, _ = _benchmark(monkeypatch, {1: (ar, spec), 2: (ar, spec)})
    assert section["median_completion_tokens"] == 0
    assert (
        "the median benchmark completion is 0 tokens; at least 64 are needed so each sample does real decoding work"
    ) in section["reasons"]


def test_an_answer_without_usage_counts_zero_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    ar, spec = _level(100, 100.0, 80.0)
    for sample in ar[:51]:
        sample.answer = Answer("x", "length", None, None, None)
    section, _, _, _ = _benchmark(monkeypatch, {1: (ar, spec), 2: _level(100, 100.0, 80.0)})
    assert section["median_completion_tokens"] == 128  # 51 zeros and 149 of 128
    ar2, spec2 = _level(100, 100.0, 80.0)
    for sample in ar2[:50]:
        sample.answer = Answer("x", "length", None, None, None)
    for sample in ar[:51]:
        sample.answer, sample.latency_ms, sample.error = None, None, "down"
    section, _, _, _ = _benchmark(monkeypatch, {1: (ar, spec), 2: (ar2, spec2)})
    assert section["median_completion_tokens"] == 128  # failed requests are left out, not zeros


@pytest.mark.parametrize(
    "spec_ms, reason",
    [
        (99.999, None),
        (100.0, "concurrency 1: speculative p95 100.0 ms does not beat AR p95 100.0 ms"),
        (0.0, "concurrency 1: speculative p95 0.0 ms does not beat AR p95 100.0 ms"),
        (0.5, None),
    ],
)
def test_each_level_must_beat_ar(monkeypatch: pytest.MonkeyPatch, spec_ms: float, reason) -> None:
    section, _, _, _ = _benchmark(
        monkeypatch, {1: _level(100, 100.0, spec_ms), 2: _level(100, 1000.0, 10.0)}, min_improvement=0.0
    )
    assert [r for r in section["reasons"] if r.startswith("concurrency 1")] == ([reason] if reason else [])


@pytest.mark.parametrize(
    "spec_ms, min_improvement, reason",
    [
        (90.0, 10.0, None),
        (90.001, 10.0, "speculative p95 improvement 10.0% is below 10.0%"),
        (95.0, 10.0, "speculative p95 improvement 5.0% is below 10.0%"),
        (100.0, 0.0, "speculative p95 100.0 ms does not beat AR p95 100.0 ms"),
        (0.0, 0.0, "speculative p95 0.0 ms does not beat AR p95 100.0 ms"),
        (0.5, 0.0, None),
    ],
)
def test_the_overall_improvement_on_both_sides(
    monkeypatch: pytest.MonkeyPatch, spec_ms: float, min_improvement: float, reason
) -> None:
    levels = {1: _level(100, 100.0, spec_ms), 2: _level(100, 100.0, spec_ms)}
    section, _, _, _ = _benchmark(monkeypatch, levels, min_improvement=min_improvement)
    overall = [r for r in section["reasons"] if not r.startswith("concurrency")]
    assert overall == ([reason] if reason else [])
    assert section["passed"] is (reason is None)


def test_differing_outputs_fail_the_benchmark_and_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    ar, spec = _level(100, 100.0, 80.0)
    spec[5].answer = Answer("y" * 128, "length", 128, list(range(128)), None)
    section, parity, _, _ = _benchmark(monkeypatch, {1: (ar, spec), 2: _level(100, 100.0, 80.0)})
    assert parity and parity[0].startswith("benchmark sample c1-5: speculative output differs from AR")
    assert section["passed"] is False
    assert section["reasons"] == [
        "benchmark outputs differ from AR (see parity reasons): the timing compares unequal work"
    ]


def test_own_reasons_are_kept_beside_parity_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    ar, spec = _level(100, 100.0, 100.0)
    spec[5].answer = Answer("y" * 128, "length", 128, list(range(128)), None)
    section, parity, _, _ = _benchmark(monkeypatch, {1: (ar, spec), 2: _level(100, 100.0, 80.0)})
    assert parity and "concurrency 1: speculative p95 100.0 ms does not beat AR p95 100.0 ms" in section["reasons"]
    assert not any("unequal work" in reason for reason in section["reasons"])


@pytest.mark.parametrize("side", [0, 1])
def test_a_passed_deadline_ends_the_benchmark(monkeypatch: pytest.MonkeyPatch, side: int) -> None:
    first = _level(100, 100.0, 80.0)
    first[side][-1].deadline_passed = True
    section, _, raw, ran = _benchmark(monkeypatch, {1: first, 2: _level(100, 100.0, 80.0)})
    assert ran == [1] and list(raw) == ["concurrency_1"]
    assert "concurrency levels [2] were not measured; 1 and 2 are required" in section["reasons"]
