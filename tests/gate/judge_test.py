"""tools.gate parity and benchmark judgement on answers built here (no servers): each
honesty rule, each comparison, and every benchmark threshold on both sides."""

from __future__ import annotations

import pytest

from tools.gate.benchmark import Sample, judge_level
from tools.gate.parity import Answer, compare, honesty_problem


def _answer(
    text: str = "abc",
    tokens: int | None = 3,
    ids: list[int] | None = None,
    top1: list[str] | None = None,
    finish: str | None = "length",
) -> Answer:
    return Answer(text, finish, tokens, ids if ids is not None else list(range(tokens or 0)), top1)


@pytest.mark.parametrize(
    "answer, problem",
    [
        (_answer(tokens=None, ids=[]), "usage.completion_tokens is missing"),
        (_answer(tokens=129), "usage.completion_tokens 129 exceeds max_tokens 128"),
        (_answer(text="", tokens=1), "usage claims 1 completion tokens for an empty answer"),
        (_answer(tokens=3, ids=[1, 2]), "token_ids has 2 tokens but usage.completion_tokens is 3"),
        (_answer(tokens=3, top1=["a"]), "logprobs has 1 tokens but usage.completion_tokens is 3"),
        (_answer(tokens=128), None),
        (_answer(text="", tokens=0), None),
        (Answer("abc", "stop", 3, None, None), None),
    ],
)
def test_honesty(answer: Answer, problem) -> None:
    assert honesty_problem(answer, 128) == problem


@pytest.mark.parametrize(
    "spec, why",
    [
        (_answer(ids=[0, 1, 7]), "token ids differ at token 2 (AR 3 tokens, speculative 3)"),
        (_answer(ids=[0, 1]), "token ids differ at token 2 (AR 3 tokens, speculative 2)"),
        (_answer(top1=["a", "x", "c"]), "top-1 tokens differ at token 1: AR ['b'] vs speculative ['x']"),
        (_answer(text="abd"), "text differs at character 2 (AR 3 chars, speculative 3): AR 'c' vs speculative 'd'"),
        (_answer(finish="stop"), "finish_reason differs: AR 'length' vs speculative 'stop'"),
        (Answer("abc", "length", 4, None, ["a", "b", "c"]), "usage.completion_tokens differs: AR 3 vs speculative 4"),
        (_answer(top1=["a", "b", "c"]), None),
    ],
)
def test_compare(spec: Answer, why) -> None:
    ar = _answer(top1=["a", "b", "c"])
    assert compare(ar, spec) == why


def test_compare_skips_what_one_side_does_not_report() -> None:
    assert compare(Answer("abc", "stop", 3, None, None), _answer(finish="stop", top1=["z", "z", "z"])) is None


def _samples(count: int, latency: float, **answer) -> list[Sample]:
    return [Sample(index, latency_ms=latency + index, answer=_answer(**answer)) for index in range(count)]


def test_judge_level_statistics_and_one_reason_per_kind() -> None:
    ar = _samples(4, 100.0)
    spec = _samples(4, 50.0)
    spec[1] = Sample(1, latency_ms=51.0, answer=_answer(text="abd"))
    spec[2] = Sample(2, latency_ms=52.0, answer=_answer(text="abe"))
    spec[3] = Sample(3, error="spec server: POST ... answered HTTP 500")
    stats, parity, reasons = judge_level(2, ar, spec)
    assert stats["concurrency"] == 2 and stats["samples"] == 3
    assert stats["ar_p50_ms"] == 101.0 and stats["dflash2_p95_ms"] == pytest.approx(51.9)
    assert stats["ar_tpot_p50_ms"] == 33.667  # rounded to the microsecond
    assert parity == [
        "benchmark sample c2-1: speculative output differs from AR: text differs at character 2 "
        "(AR 3 chars, speculative 3): AR 'c' vs speculative 'd'",
        "concurrency 2: 2 of 4 benchmark samples differ from AR",
    ]
    assert reasons == ["benchmark sample c2-3: speculative request failed: spec server: POST ... answered HTTP 500"]


def test_judge_level_counts_failures_past_three_and_flags_dishonest_answers() -> None:
    ar = [Sample(index, error="down") for index in range(5)]
    spec = _samples(5, 10.0, tokens=200)
    stats, parity, reasons = judge_level(1, ar, spec)
    assert stats == {"concurrency": 1, "samples": 0}
    assert len(reasons) == 4 and reasons[3] == "concurrency 1: 5 requests failed"
    assert reasons[:3] == [f"benchmark sample c1-{index}: AR request failed: down" for index in range(3)]
    assert (
        parity[0]
        == (
            "benchmark sample c1-0: speculative answer is inconsistent: usage.completion_tokens 200 "
            "exceeds max_tokens 128"
        )
        and len(parity) == 5
    )


@pytest.mark.parametrize("failed, counted", [(3, False), (4, True)])
def test_failures_are_listed_up_to_three_and_counted_past_them(failed: int, counted: bool) -> None:
    ar = [Sample(index, error="down") for index in range(failed)]
    _, _, reasons = judge_level(2, ar, _samples(failed, 10.0))
    assert reasons[:3] == [f"benchmark sample c2-{index}: AR request failed: down" for index in range(3)]
    assert reasons[3:] == ([f"concurrency 2: {failed} requests failed"] if counted else [])


def test_one_differing_sample_is_named_without_a_count() -> None:
    spec = _samples(3, 5.0)
    spec[1] = Sample(1, latency_ms=6.0, answer=_answer(text="abd"))
    _, parity, reasons = judge_level(1, _samples(3, 10.0), spec)
    assert (
        parity
        == [
            "benchmark sample c1-1: speculative output differs from AR: text differs at character 2 "
            "(AR 3 chars, speculative 3): AR 'c' vs speculative 'd'"
        ]
        and reasons == []
    )


def test_a_sample_without_tokens_has_no_time_per_token() -> None:
    assert Sample(0, latency_ms=10.0, answer=_answer(tokens=0, text="")).tpot_ms is None
    assert Sample(0, latency_ms=None, answer=_answer()).tpot_ms is None
    assert Sample(0, latency_ms=9.0, answer=_answer()).tpot_ms == 3.0


@pytest.mark.parametrize("q, value", [(0, 1.0), (100, 100.0), (50, 50.5), (95, 95.05), (99, 99.01)])
def test_percentiles_at_and_inside_the_bounds(q: float, value: float) -> None:
    from tools.gate.stats import percentile

    assert percentile([float(n) for n in range(100, 0, -1)], q) == pytest.approx(value)


@pytest.mark.parametrize("q", [-0.01, 100.01, -1, 101])
def test_percentiles_outside_0_to_100_are_refused(q: float) -> None:
    from tools.gate.stats import percentile

    with pytest.raises(ValueError, match=f"percentile {q} is outside 0..100"):
        percentile([1.0, 2.0], q)


def test_summary_names_each_percentile_and_the_mean() -> None:
    from tools.gate.stats import summary

    assert summary([float(n) for n in range(1, 101)]) == pytest.approx(
        {"p50": 50.5, "p90": 90.1, "p95": 95.05, "p99": 99.01, "mean": 50.5}
    )
