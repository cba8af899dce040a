"""Parity: the fixed corpus (greedy, seeded sampling, tool JSON, stop, cancel) and the
token-for-token comparison that every benchmark sample also goes through.

Seeded sampling is not compared across the servers: a lossless speculator keeps the target's
distribution, not its draws. The engine lane (tests/system/engine_e2e_test.py) saw it on the real vLLM:
with ngram speculation its seeded answers differ from plain decoding's, and even from its own
answer to the same request a moment earlier. Exact equality, or a speculator's own
reproducibility, would fail every real speculator. What a lossless one does keep is checked:
where AR's answer changes with the seed, the speculative server's answers are not all one (a
speculator that stopped sampling fails), and a sampled answer is never empty where AR's is not.
Whether the distribution is the target's is what greedy parity proves, token for token, on the
corpus and on every benchmark sample.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from attest.errors import AttestError
from attest.reader import loads
from tools.gate.corpus import CORPUS
from tools.gate.openai_client import ChatCompletion, Endpoint, PeerError

Progress = Callable[[str], None]


def _arguments(text: str | None, where: str) -> Any:
    try:
        return loads(text or "{}", label=where)
    except AttestError as exc:
        raise PeerError(str(exc)) from None


def observe(endpoint: Endpoint, client: httpx.Client, item: dict[str, Any]) -> Any:
    """What the comparison of corpus `item` looks at, from one endpoint."""
    if item["compare"] == "sampled":
        request = item["request"]
        return {
            "seed": endpoint.chat(client, request).choice.message.content,
            "same_seed": endpoint.chat(client, request).choice.message.content,
            "next_seed": endpoint.chat(client, {**request, "seed": request["seed"] + 1}).choice.message.content,
        }
    if item["compare"] == "cancel":
        chunks = endpoint.stream_first_chunk(client, item["request"])
        follow_up = endpoint.chat(client, CORPUS[0]["request"])
        return {"cancelled_after_chunks": chunks, "follow_up": follow_up.choice.message.content}
    answer = endpoint.chat(client, item["request"])
    message = answer.choice.message
    if item["compare"] == "tool_calls":
        return [
            {
                "name": call.function.name,
                "arguments": _arguments(call.function.arguments, f"{endpoint.name} server tool call arguments"),
            }
            for call in message.tool_calls or []
        ]
    if item["compare"] == "json":
        return _arguments(message.content or "null", f"{endpoint.name} server JSON answer")
    if item["compare"] == "stop":
        return {"content": message.content, "finish_reason": answer.choice.finish_reason}
    return message.content


def run_corpus(
    ar: Endpoint, spec: Endpoint, ar_client: httpx.Client, spec_client: httpx.Client, progress: Progress
) -> tuple[list[str], dict[str, Any]]:
    """Reasons (empty when every case agrees) and the raw observations."""
    results: dict[str, Any] = {"ar": {}, "speculative": {}}
    reasons: list[str] = []
    for number, item in enumerate(CORPUS, 1):
        progress(f"parity {number}/{len(CORPUS)}: {item['id']}")
        seen = {}
        for endpoint, client, side in ((ar, ar_client, "ar"), (spec, spec_client, "speculative")):
            try:
                seen[side] = {"ok": observe(endpoint, client, item)}
            except PeerError as exc:
                seen[side] = {"error": str(exc)}
            results[side][item["id"]] = seen[side]
        got_ar, got_spec = seen["ar"], seen["speculative"]
        if "error" in got_ar or "error" in got_spec:
            reasons.append(
                f"parity {item['id']} ({item['case']}): request failed "
                f"(AR: {got_ar.get('error', 'ok')}; speculative: {got_spec.get('error', 'ok')})"
            )
        elif item["compare"] == "sampled":
            reasons += sampling_reasons(item, got_ar["ok"], got_spec["ok"])
        elif got_ar != got_spec:
            reasons.append(
                f"parity divergence in {item['id']} ({item['case']}): AR {json.dumps(got_ar['ok'])[:160]}"
                f" vs speculative {json.dumps(got_spec['ok'])[:160]}"
            )
        elif item["compare"] == "stop" and (
            got_ar["ok"]["finish_reason"] != "stop"
            or any(s in (got_ar["ok"]["content"] or "") for s in item["request"]["stop"])
        ):
            reasons.append(f"parity {item['id']}: the stop sequence did not end the answer on either endpoint")
        elif item["compare"] == "cancel" and not got_ar["ok"]["cancelled_after_chunks"]:
            reasons.append(f"parity {item['id']}: no streamed chunk arrived before the cancel")
    return reasons, results


def sampling_reasons(item: dict[str, Any], ar: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    """What a lossless speculator's seeded sampling cannot do (see the module's docstring)."""
    seed, where = item["request"]["seed"], f"parity {item['id']} ({item['case']})"
    reasons = []
    if ar["seed"] != ar["next_seed"] and spec["seed"] == spec["same_seed"] == spec["next_seed"]:
        reasons.append(
            f"{where}: the speculative server gave one answer for seeds {seed} and {seed + 1} where AR "
            f"gave two: it does not sample as AR does"
        )
    empty = [name for name in ("seed", "same_seed", "next_seed") if ar[name] and not spec[name]]
    if empty:
        reasons.append(f"{where}: the speculative server's sampled answer is empty where AR's is not ({empty[0]})")
    return reasons


@dataclass(frozen=True)
class Answer:
    """One benchmark answer, reduced to what parity compares and what timing needs."""

    text: str
    finish_reason: str | None
    completion_tokens: int | None
    token_ids: list[int] | None
    top1_tokens: list[str] | None

    @classmethod
    def of(cls, completion: ChatCompletion) -> "Answer":
        usage = completion.usage
        return cls(
            completion.text,
            completion.choice.finish_reason,
            usage.completion_tokens if usage else None,
            completion.choice.token_ids,
            completion.top1_tokens,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
            "token_ids": self.token_ids,
            "top1_tokens": self.top1_tokens,
        }


def honesty_problem(answer: Answer, max_tokens: int) -> str | None:
    """What makes one answer's own accounting impossible, if anything."""
    if answer.completion_tokens is None:
        return "usage.completion_tokens is missing"
    if answer.completion_tokens > max_tokens:
        return f"usage.completion_tokens {answer.completion_tokens} exceeds max_tokens {max_tokens}"
    if not answer.text and answer.completion_tokens > 0:
        return f"usage claims {answer.completion_tokens} completion tokens for an empty answer"
    for name, tokens in (("token_ids", answer.token_ids), ("logprobs", answer.top1_tokens)):
        if tokens is not None and len(tokens) != answer.completion_tokens:
            return f"{name} has {len(tokens)} tokens but usage.completion_tokens is {answer.completion_tokens}"
    return None


def _first_difference(left: list[Any] | str, right: list[Any] | str) -> int:
    for position, (a, b) in enumerate(zip(left, right)):
        if a != b:
            return position
    return min(len(left), len(right))


def compare(ar: Answer, spec: Answer) -> str | None:
    """Why the speculative answer is not the autoregressive one, token for token; None if it is."""
    if ar.token_ids is not None and spec.token_ids is not None and ar.token_ids != spec.token_ids:
        at = _first_difference(ar.token_ids, spec.token_ids)
        return f"token ids differ at token {at} (AR {len(ar.token_ids)} tokens, speculative {len(spec.token_ids)})"
    if ar.top1_tokens is not None and spec.top1_tokens is not None and ar.top1_tokens != spec.top1_tokens:
        at = _first_difference(ar.top1_tokens, spec.top1_tokens)
        return (
            f"top-1 tokens differ at token {at}: AR {ar.top1_tokens[at : at + 1]} vs speculative "
            f"{spec.top1_tokens[at : at + 1]}"
        )
    if ar.text != spec.text:
        at = _first_difference(ar.text, spec.text)
        return (
            f"text differs at character {at} (AR {len(ar.text)} chars, speculative {len(spec.text)}): "
            f"AR {ar.text[at : at + 40]!r} vs speculative {spec.text[at : at + 40]!r}"
        )
    if ar.finish_reason != spec.finish_reason:
        return f"finish_reason differs: AR {ar.finish_reason!r} vs speculative {spec.finish_reason!r}"
    if ar.completion_tokens != spec.completion_tokens:
        return f"usage.completion_tokens differs: AR {ar.completion_tokens} vs speculative {spec.completion_tokens}"
    return None
