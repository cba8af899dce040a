"""tools.gate.openai_client: one untrusted OpenAI-compatible server, answer by answer, against an
in-process transport (httpx.MockTransport): bounds, status codes, shapes, deadlines, metrics."""

from __future__ import annotations

import json
import time
from typing import Callable

import httpx
import pytest

from tools.gate import openai_client
from tools.gate.openai_client import Deadline, DeadlinePassed, Endpoint, PeerError, acceptance, parse_spec_metrics

ANSWER = {
    "choices": [{"message": {"content": "hi"}, "finish_reason": "stop", "token_ids": [1, 2]}],
    "usage": {"completion_tokens": 2},
}


def _endpoint(key: str = "k3y-value", request_timeout: float = 5, deadline: float = 60) -> Endpoint:
    return Endpoint("spec", "http://127.0.0.1:9/", "m", key, request_timeout, Deadline(deadline))


def _client(endpoint: Endpoint, answer: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    client = endpoint.client()
    client._transport = httpx.MockTransport(answer)  # the endpoint's own client, headers included
    return client


def _fixed(status: int, body: bytes | dict, seen: list | None = None) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        return httpx.Response(status, content=data)

    return answer


def test_a_chat_sends_the_model_the_key_and_the_timeout_and_parses_the_answer() -> None:
    seen: list = []
    endpoint = _endpoint()
    with _client(endpoint, _fixed(200, ANSWER, seen)) as client:
        completion = endpoint.chat(client, {"messages": []})
    assert completion.text == "hi" and completion.choice.token_ids == [1, 2] and completion.usage.completion_tokens == 2
    request = seen[0]
    assert json.loads(request.content) == {"model": "m", "messages": []}
    assert request.headers["authorization"] == "Bearer k3y-value"
    assert str(request.url) == "http://127.0.0.1:9/v1/chat/completions"
    assert request.extensions["timeout"]["read"] == 5
    assert completion.top1_tokens is None


def test_without_a_key_no_authorization_header_is_sent() -> None:
    seen: list = []
    endpoint = _endpoint(key="")
    with _client(endpoint, _fixed(200, ANSWER, seen)) as client:
        endpoint.chat(client, {})
    assert "authorization" not in seen[0].headers


@pytest.mark.parametrize(
    "status, key, reason",
    [
        (401, "", "answered HTTP 401: the API key from OMNI_GATE_API_KEY is not set"),
        (403, "", "answered HTTP 403: the API key from OMNI_GATE_API_KEY is not set"),
        (401, "wrong", "answered HTTP 401: the API key from OMNI_GATE_API_KEY is not accepted"),
        (500, "k", "answered HTTP 500: b'" + "e" * 200 + "'"),
        (204, "k", "answered HTTP 204: b'" + "e" * 200 + "'"),
    ],
)
def test_each_status_other_than_200_is_a_reason(status: int, key: str, reason: str) -> None:
    endpoint = _endpoint(key=key)
    with _client(endpoint, _fixed(status, b"e" * 300)) as client, pytest.raises(PeerError) as caught:
        endpoint.chat(client, {})
    assert str(caught.value).startswith("spec server: POST http://127.0.0.1:9/v1/chat/completions ")
    assert str(caught.value).endswith(reason)


@pytest.mark.parametrize("size, refused", [(8 << 20, False), ((8 << 20) + 1, True)])
def test_a_body_is_read_up_to_8_mib(size: int, refused: bool) -> None:
    endpoint = _endpoint()
    with _client(endpoint, _fixed(200, b" " * (size - 2) + b"{}")) as client:
        if refused:
            with pytest.raises(PeerError, match=f"sent more than {8 << 20} bytes"):
                endpoint.get_json(client, "/v1/models")
        else:
            assert endpoint.get_json(client, "/v1/models") == {}


@pytest.mark.parametrize("size, exposed", [(4 << 20, True), ((4 << 20) + 1, False)])
def test_metrics_are_read_up_to_4_mib(size: int, exposed: bool) -> None:
    line = b"vllm:spec_decode_num_drafts_total 5\n"
    endpoint = _endpoint()
    with _client(endpoint, _fixed(200, line + b"#" * (size - len(line)))) as client:
        assert (endpoint.metrics(client) == {"drafts": 5.0}) is exposed


@pytest.mark.parametrize(
    "body, where",
    [
        ({"choices": []}, "choices"),
        ({"choices": [{"message": {"content": 3}}]}, "choices.0.message.content"),
        ({"choices": [{"message": {}}], "usage": {"completion_tokens": -1}}, "usage.completion_tokens"),
        ({"choices": [{"message": {}, "token_ids": ["1"]}]}, "choices.0.token_ids.0"),
    ],
)
def test_a_chat_answer_of_the_wrong_shape_names_where(body: dict, where: str) -> None:
    endpoint = _endpoint()
    with _client(endpoint, _fixed(200, body)) as client, pytest.raises(PeerError) as caught:
        endpoint.chat(client, {})
    assert str(caught.value).startswith(f"spec server chat completion has the wrong shape at {where}: ")


def test_an_answer_that_is_not_json_is_a_reason() -> None:
    endpoint = _endpoint()
    with _client(endpoint, _fixed(200, b"{nope")) as client, pytest.raises(PeerError, match="is not valid JSON"):
        endpoint.chat(client, {})


def test_timeouts_and_transport_failures_are_reasons() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    endpoint = _endpoint(request_timeout=2.5)
    with _client(endpoint, slow) as client, pytest.raises(PeerError, match=r"did not answer within 2.5 s"):
        endpoint.get_json(client, "/v1/models")
    with _client(endpoint, refused) as client, pytest.raises(PeerError, match="failed: ConnectError: refused"):
        endpoint.get_json(client, "/v1/models")
    with _client(endpoint, slow) as client, pytest.raises(PeerError, match="streamed request did not answer within"):
        endpoint.stream_first_chunk(client, {})
    with (
        _client(endpoint, refused) as client,
        pytest.raises(PeerError, match="streamed request failed: ConnectError: refused"),
    ):
        endpoint.stream_first_chunk(client, {})


def test_the_deadline_bounds_every_request() -> None:
    deadline = Deadline(0.2)
    assert deadline.timeout(5) <= 0.2 and deadline.timeout(0.01) == 0.01
    time.sleep(0.25)
    with pytest.raises(DeadlinePassed, match="the overall deadline of 0.2 s passed"):
        deadline.timeout(5)
    seen: list = []
    endpoint = Endpoint("ar", "http://127.0.0.1:9", "m", "", 5, Deadline(0))
    with _client(endpoint, _fixed(200, ANSWER, seen)) as client, pytest.raises(DeadlinePassed):
        endpoint.chat(client, {})
    assert seen == []  # nothing is sent once the deadline passed


@pytest.mark.parametrize(
    "lines, chunks", [([b": keep-alive", b'data: {"x": 1}', b"data: [DONE]"], 1), ([b"data: [DONE]"], 0), ([b""], 0)]
)
def test_a_stream_is_hung_up_after_its_first_data_chunk(lines: list[bytes], chunks: int) -> None:
    endpoint = _endpoint()
    with _client(endpoint, _fixed(200, b"\n".join(lines) + b"\n")) as client:
        assert endpoint.stream_first_chunk(client, {"stream": True}) == chunks
    with _client(endpoint, _fixed(500, b"")) as client, pytest.raises(PeerError, match="answered HTTP 500"):
        endpoint.stream_first_chunk(client, {})


@pytest.mark.parametrize(
    "pieces, chunks",
    [
        ([b": keep\n", b"da", b'ta: {"x"', b": 1}\n"], 1),  # a data line cut by the chunks
        ([b"data: [DO", b"NE]\n", b": bye\n"], 0),
        ([b"\r", b"\ndata: {}", b"\r\n"], 1),
        ([b"data: ", b"x" * 10000, b"x" * 10000, b"\n"], 1),  # a long first chunk, in pieces
        ([b": a\n", b"data: {}"], 1),  # the last line, ended by the end of the stream
        ([b"data: [DONE]"], 0),
        ([b"ddata: {}\n", b" data: {}\n"], 0),  # not at a line's start
        ([b"x\rdata: {}\n"], 1),  # a bare CR ends a line
    ],
)
def test_a_data_line_is_found_however_the_stream_is_cut(pieces: list[bytes], chunks: int) -> None:
    endpoint = _endpoint()
    with _client(endpoint, lambda request: httpx.Response(200, content=iter(pieces))) as client:
        assert endpoint.stream_first_chunk(client, {"stream": True}) == chunks


def test_a_stream_without_a_data_chunk_is_bounded() -> None:
    endpoint = _endpoint()
    body = (b": " + b"x" * 1000 + b"\n") * ((8 << 20) // 1000 + 2)
    with (
        _client(endpoint, _fixed(200, body)) as client,
        pytest.raises(PeerError, match=f"stream sent more than {8 << 20} bytes without a data chunk"),
    ):
        endpoint.stream_first_chunk(client, {})


@pytest.mark.parametrize("line", [b"\n", b":\n", b"\r\n"], ids=["blank lines", "keep-alive comments", "CRLF"])
def test_a_stream_of_blank_lines_or_comments_counts_toward_the_cap(line: bytes) -> None:
    endpoint = _endpoint()
    body = line * ((8 << 20) + 8)  # at least one counted byte per line
    with (
        _client(endpoint, _fixed(200, body)) as client,
        pytest.raises(PeerError, match=f"stream sent more than {8 << 20} bytes without a data chunk"),
    ):
        endpoint.stream_first_chunk(client, {})


def test_spec_metrics_sum_counters_over_label_sets_and_keep_gauges() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:spec_decode_num_drafts counter",
            'vllm:spec_decode_num_drafts_total{model_name="a"} 10',
            'vllm:spec_decode_num_drafts_total{model_name="b"} 5 1700000000',
            "vllm:spec_decode_num_draft_tokens_total 30",
            "vllm:spec_decode_num_accepted_tokens_total NaN",
            "vllm:spec_decode_num_accepted_tokens_total 12",
            "vllm:spec_decode_num_accepted_tokens_total +Inf",
            "sglang:spec_accept_rate 0.5",
            "sglang:spec_accept_rate 0.75",
            "other_metric 99",
            "garbage line",
        ]
    )
    assert parse_spec_metrics(text) == {
        "drafts": 15.0,
        "draft_tokens": 30.0,
        "accepted_tokens": 12.0,
        "sglang_accept_rate": 0.75,
    }
    assert parse_spec_metrics("other 1\n") is None


def test_acceptance_over_the_window() -> None:
    before = {"drafts": 10.0, "draft_tokens": 30.0, "accepted_tokens": 10.0}
    after = {"drafts": 20.0, "draft_tokens": 60.0, "accepted_tokens": 25.0}
    assert acceptance(before, after) == {
        "exposed": True,
        "drafts": 10.0,
        "draft_tokens": 30.0,
        "accepted_tokens": 15.0,
        "acceptance_rate": 0.5,
        "mean_accepted_length": 2.5,
    }
    assert acceptance(None, None) == {"exposed": False} and acceptance(before, {}) == {"exposed": False}
    assert acceptance(None, {"drafts": 0.0, "draft_tokens": 4.0, "accepted_tokens": 1.0}) == {
        "exposed": True,
        "drafts": 0.0,
        "draft_tokens": 4.0,
        "accepted_tokens": 1.0,
        "acceptance_rate": 0.25,
    }
    assert acceptance(after, after) == {"exposed": True}  # no drafts in the window
    assert acceptance(None, {"sglang_accept_rate": 0.123456, "sglang_accept_length": 2.345678}) == {
        "exposed": True,
        "acceptance_rate": 0.1235,
        "mean_accepted_length": 2.3457,
    }


def test_the_limits() -> None:
    assert (openai_client.MAX_BODY_BYTES, openai_client.MAX_METRICS_BYTES) == (8 << 20, 4 << 20)


def test_acceptance_rounds_to_four_places_and_reads_missing_counters_as_zero() -> None:
    assert acceptance(None, {"drafts": 3.0, "draft_tokens": 7.0, "accepted_tokens": 2.0}) == {
        "exposed": True,
        "drafts": 3.0,
        "draft_tokens": 7.0,
        "accepted_tokens": 2.0,
        "acceptance_rate": 0.2857,
        "mean_accepted_length": 1.6667,
    }
    # No drafts counter: zero drafts, so no mean length (not a division by a made-up count).
    assert acceptance(None, {"draft_tokens": 4.0, "accepted_tokens": 1.0}) == {
        "exposed": True,
        "drafts": 0.0,
        "draft_tokens": 4.0,
        "accepted_tokens": 1.0,
        "acceptance_rate": 0.25,
    }
    assert acceptance(None, {"drafts": 1.0, "draft_tokens": 2.0, "accepted_tokens": 1.0})["mean_accepted_length"] == 2.0
    # One draft token in the window is enough to report a rate.
    assert acceptance(None, {"drafts": 1.0, "draft_tokens": 1.0, "accepted_tokens": 1.0})["acceptance_rate"] == 1.0


def test_the_answer_is_the_first_choice_and_absent_parts_read_as_nothing() -> None:
    from tools.gate.openai_client import ChatCompletion

    two = ChatCompletion.model_validate({"choices": [{"message": {"content": "a"}}, {"message": {"content": "b"}}]})
    assert two.text == "a"
    assert ChatCompletion.model_validate({"choices": [{"message": {"content": None}}]}).text == ""
    for logprobs, tokens in (
        (None, None),
        ({"content": None}, None),
        ({"content": []}, []),
        ({"content": [{"token": "x"}]}, ["x"]),
    ):
        answer = ChatCompletion.model_validate({"choices": [{"message": {}, "logprobs": logprobs}]})
        assert answer.top1_tokens == tokens, logprobs


@pytest.mark.parametrize(
    "body, where",
    [
        # Two wrong fields: the first one pydantic reports is named.
        ({"choices": [{"message": {"content": 5}}], "usage": {"completion_tokens": -1}}, "choices.0.message.content"),
        ([1, 2], "body"),
    ],
)
def test_the_first_shape_error_is_named(body, where: str) -> None:
    endpoint = _endpoint()
    with (
        _client(endpoint, _fixed(200, json.dumps(body).encode())) as client,
        pytest.raises(PeerError, match=f"has the wrong shape at {where}:"),
    ):
        endpoint.chat(client, {})


@pytest.mark.parametrize("extra, refused", [(0, False), (1, True)])
def test_a_stream_may_send_exactly_8_mib_without_a_data_chunk(extra: int, refused: bool) -> None:
    endpoint = _endpoint()
    body = b":" + b"x" * ((8 << 20) - 2 + extra) + b"\n"  # the newline counts
    with _client(endpoint, _fixed(200, body)) as client:
        if refused:
            with pytest.raises(PeerError, match="without a data chunk"):
                endpoint.stream_first_chunk(client, {})
        else:
            assert endpoint.stream_first_chunk(client, {}) == 0


def test_a_stream_that_times_out_is_a_reason() -> None:
    endpoint = _endpoint(request_timeout=3)

    def stall(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("stalled", request=request)

    with (
        _client(endpoint, stall) as client,
        pytest.raises(PeerError, match="streamed request did not answer within 3 s"),
    ):
        endpoint.stream_first_chunk(client, {})
