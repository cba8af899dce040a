"""tools.gate.parity against scripted endpoints (httpx.MockTransport, no sockets): what each
kind of corpus item looks at, and the reason run_corpus gives for each way two servers can
disagree or fail."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx
import pytest

from tools.gate import parity
from tools.gate.corpus import CORPUS
from tools.gate.openai_client import Deadline, Endpoint, PeerError
from tools.gate.parity import Answer, compare, observe, run_corpus, sampling_reasons

Reply = Callable[[dict[str, Any]], dict[str, Any] | bytes]


def _client(endpoint: Endpoint, reply: Reply, seen: list | None = None) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if seen is not None:
            seen.append(body)
        result = reply(body)
        if isinstance(result, bytes):
            return httpx.Response(200, content=result)
        return httpx.Response(200, json=result)

    client = endpoint.client()
    client._transport = httpx.MockTransport(answer)
    return client


def _endpoint(name: str = "ar") -> Endpoint:
    return Endpoint(name, "http://127.0.0.1:9", "m", "k", 5, Deadline(60))


def _chat(content: str | None = "hello", finish: str = "stop", tool_calls: list | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"choices": [{"message": message, "finish_reason": finish}], "usage": {"completion_tokens": 1}}


def _item(compare_kind: str) -> dict[str, Any]:
    return next(item for item in CORPUS if item["compare"] == compare_kind)


def _observe(item: dict[str, Any], reply: Reply, seen: list | None = None) -> Any:
    endpoint = _endpoint()
    with _client(endpoint, reply, seen) as client:
        return observe(endpoint, client, item)


@pytest.mark.parametrize(
    "tool_calls, seen",
    [
        (
            [{"function": {"name": "lookup_fixture", "arguments": '{"key": "alpha"}'}}],
            [{"name": "lookup_fixture", "arguments": {"key": "alpha"}}],
        ),
        ([{"function": {"name": "lookup_fixture", "arguments": None}}], [{"name": "lookup_fixture", "arguments": {}}]),
        ([{"function": {"name": "lookup_fixture"}}], [{"name": "lookup_fixture", "arguments": {}}]),
        (None, []),
        ([], []),
    ],
)
def test_a_tool_call_item_looks_at_names_and_parsed_arguments(tool_calls, seen) -> None:
    assert _observe(_item("tool_calls"), lambda body: _chat(None, tool_calls=tool_calls)) == seen


def test_tool_arguments_that_are_not_json_are_a_failure_naming_the_side() -> None:
    bad = [{"function": {"name": "lookup_fixture", "arguments": "{key: alpha"}}]
    with pytest.raises(PeerError, match="ar server tool call arguments"):
        _observe(_item("tool_calls"), lambda body: _chat(None, tool_calls=bad))


@pytest.mark.parametrize("content, seen", [('{"answer": 42}', {"answer": 42}), (None, None), ("", None)])
def test_a_json_item_looks_at_the_parsed_answer(content, seen) -> None:
    assert _observe(_item("json"), lambda body: _chat(content)) == seen


def test_a_json_answer_that_is_not_json_is_a_failure() -> None:
    with pytest.raises(PeerError, match="ar server JSON answer"):
        _observe(_item("json"), lambda body: _chat("{'answer': 42}"))


def test_stop_and_text_items() -> None:
    assert _observe(_item("stop"), lambda body: _chat("red", "length")) == {"content": "red", "finish_reason": "length"}
    assert _observe(_item("text"), lambda body: _chat("hello")) == "hello"


def test_a_cancel_item_hangs_up_then_asks_the_first_corpus_request_again() -> None:
    seen: list = []

    def reply(body: dict[str, Any]) -> dict[str, Any] | bytes:
        return b'data: {"x": 1}\n\ndata: [DONE]\n\n' if body.get("stream") else _chat("after")

    assert _observe(_item("cancel"), reply, seen) == {"cancelled_after_chunks": 1, "follow_up": "after"}
    assert seen[0]["stream"] is True
    assert {key: value for key, value in seen[1].items() if key != "model"} == CORPUS[0]["request"]


def _corpus_run(ar_reply: Reply, spec_reply: Reply) -> tuple[list[str], dict[str, Any], list[str]]:
    ar, spec = _endpoint("ar"), _endpoint("speculative")
    progress: list[str] = []
    with _client(ar, ar_reply) as ar_client, _client(spec, spec_reply) as spec_client:
        reasons, results = run_corpus(ar, spec, ar_client, spec_client, progress.append)
    return reasons, results, progress


def _well_behaved(body: dict[str, Any]) -> dict[str, Any] | bytes:
    """Answers every corpus item acceptably, the same way each time."""
    if body.get("stream"):
        return b'data: {"x": 1}\n\n'
    if body.get("tools"):
        return _chat(None, tool_calls=[{"function": {"name": "lookup_fixture", "arguments": '{"key": "alpha"}'}}])
    if body.get("response_format"):
        return _chat('{"answer": 42}')
    return _chat("red\ngreen")


def test_agreeing_servers_give_no_reason_and_progress_counts_from_one() -> None:
    reasons, results, progress = _corpus_run(_well_behaved, _well_behaved)
    assert reasons == []
    assert progress[0] == f"parity 1/{len(CORPUS)}: {CORPUS[0]['id']}"
    assert progress[-1] == f"parity {len(CORPUS)}/{len(CORPUS)}: {CORPUS[-1]['id']}"
    assert set(results["ar"]) == {item["id"] for item in CORPUS}


def _differs_on(item_id: str, text: str) -> Reply:
    prompt = next(item for item in CORPUS if item["id"] == item_id)["request"]["messages"]

    def reply(body: dict[str, Any]) -> dict[str, Any] | bytes:
        return _chat(text) if body.get("messages") == prompt else _well_behaved(body)

    return reply


def test_a_divergence_names_the_item_with_both_answers_cut_to_160_characters() -> None:
    reasons, _, _ = _corpus_run(_differs_on("greedy-prose", "a" * 300), _differs_on("greedy-prose", "b" * 300))
    [reason] = reasons
    assert reason.startswith("parity divergence in greedy-prose (greedy): AR ")
    assert reason.endswith(f'AR "{"a" * 159} vs speculative "{"b" * 159}')


@pytest.mark.parametrize("failing_side", ["ar", "speculative"])
def test_a_request_failing_on_either_side_is_a_reason_naming_both(failing_side: str) -> None:
    def broken(body: dict[str, Any]) -> dict[str, Any] | bytes:
        return b"not json" if body.get("messages") == CORPUS[1]["request"]["messages"] else _well_behaved(body)

    replies = (broken, _well_behaved) if failing_side == "ar" else (_well_behaved, broken)
    reasons, _, _ = _corpus_run(*replies)
    [reason] = reasons
    assert reason.startswith(f"parity {CORPUS[1]['id']} ({CORPUS[1]['case']}): request failed (AR: ")
    assert ("AR: ok;" in reason) is (failing_side == "speculative")
    assert reason.endswith("speculative: ok)") is (failing_side == "ar")


@pytest.mark.parametrize(
    "answer, finish, stopped",
    [
        ("red\ngreen", "stop", True),
        (None, "stop", True),  # stopped at once: no content at all
        ("red\ngreen", "length", False),
        ("red\ngreen\n\nEND", "stop", False),
        ("red END", "stop", False),
    ],
)
def test_the_stop_item_must_end_at_its_stop_sequence_on_both(answer: str, finish: str, stopped: bool) -> None:
    item = _item("stop")

    def reply(body: dict[str, Any]) -> dict[str, Any] | bytes:
        return _chat(answer, finish) if body.get("stop") else _well_behaved(body)

    reasons, _, _ = _corpus_run(reply, reply)
    assert (reasons == []) is stopped, reasons
    if not stopped:
        assert reasons == [f"parity {item['id']}: the stop sequence did not end the answer on either endpoint"]


def test_a_cancel_without_a_streamed_chunk_is_a_reason() -> None:
    def reply(body: dict[str, Any]) -> dict[str, Any] | bytes:
        return b"data: [DONE]\n\n" if body.get("stream") else _well_behaved(body)

    reasons, _, _ = _corpus_run(reply, reply)
    assert reasons == [f"parity {_item('cancel')['id']}: no streamed chunk arrived before the cancel"]


def test_a_text_difference_shows_40_characters_from_where_it_starts() -> None:
    ar = Answer("x" * 10 + "a" * 100, "length", None, None, None)
    spec = Answer("x" * 10 + "b" * 100, "length", None, None, None)
    assert compare(ar, spec) == (
        f"text differs at character 10 (AR 110 chars, speculative 110): AR {'a' * 40!r} vs speculative {'b' * 40!r}"
    )
    assert parity._first_difference("abc", "abd") == 2 and parity._first_difference("ab", "abc") == 2


def _draws(seed: str, same: str, following: str) -> dict[str, str]:
    return {"seed": seed, "same_seed": same, "next_seed": following}


@pytest.mark.parametrize(
    "ar, spec, expected",
    [
        (_draws("a", "a", "b"), _draws("x", "x", "y"), []),  # other draws of the distribution
        (_draws("a", "a", "b"), _draws("x", "z", "y"), []),  # draws that do not repeat (vLLM with speculation)
        (_draws("a", "a", "a"), _draws("x", "x", "x"), []),  # AR itself gives one answer: nothing to tell
        (_draws("a", "a", "b"), _draws("x", "x", "x"), ["gave one answer for seeds 7 and 8 where AR gave two"]),
        (_draws("a", "a", "b"), _draws("x", "x", ""), ["sampled answer is empty where AR's is not (next_seed)"]),
        (_draws("a", "a", "b"), _draws("", "x", "y"), ["sampled answer is empty where AR's is not (seed)"]),
        (_draws("a", "a", "b"), _draws("", "x", ""), ["sampled answer is empty where AR's is not (seed)"]),
        (_draws("", "", ""), _draws("", "", ""), []),
    ],
)
def test_seeded_sampling_is_judged_by_what_a_lossless_speculator_keeps(ar, spec, expected: list[str]) -> None:
    item = next(item for item in CORPUS if item["id"] == "sampling-seed-7")
    reasons = sampling_reasons(item, ar, spec)
    assert len(reasons) == len(expected)
    for reason, words in zip(reasons, expected):
        assert reason.startswith("parity sampling-seed-7 (sampling): the speculative server") and words in reason


def test_a_sampled_item_asks_its_seed_twice_and_the_next_seed_once() -> None:
    seen: list = []
    answers = iter(["first", "again", "next"])
    observed = _observe(_item("sampled"), lambda body: _chat(next(answers)), seen)
    assert observed == {"seed": "first", "same_seed": "again", "next_seed": "next"}
    seed = _item("sampled")["request"]["seed"]
    assert [request["seed"] for request in seen] == [seed, seed, seed + 1]
    assert all(request["temperature"] == _item("sampled")["request"]["temperature"] for request in seen)
