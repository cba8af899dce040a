"""The fixed parity corpus and the benchmark prompts. Changing either changes
CORPUS_SHA256, which every gate records: a gate is only comparable to its corpus."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from attest.requests import ANSWER_FORMAT, LOOKUP_TOOL

PARITY_CASES = ("greedy", "sampling", "tool_json", "stop_and_cancel")


# Each case: the request body (model added at run time) and how outputs are compared.
CORPUS: tuple[dict[str, Any], ...] = (
    {
        "id": "greedy-arithmetic",
        "case": "greedy",
        "compare": "text",
        "request": {
            "temperature": 0,
            "max_tokens": 32,
            "messages": [{"role": "user", "content": "What is 19 + 23? Reply only with the number."}],
        },
    },
    {
        "id": "greedy-prose",
        "case": "greedy",
        "compare": "text",
        "request": {
            "temperature": 0,
            "max_tokens": 96,
            "messages": [
                {"role": "user", "content": "Explain in three sentences how a hash table resolves collisions."}
            ],
        },
    },
    {
        "id": "greedy-code",
        "case": "greedy",
        "compare": "text",
        "request": {
            "temperature": 0,
            "max_tokens": 128,
            "messages": [{"role": "user", "content": "Write a Python function that reverses a linked list."}],
        },
    },
    # Seeded sampling is judged per server, not across them (tools/gate/parity.py: "sampled").
    {
        "id": "sampling-seed-7",
        "case": "sampling",
        "compare": "sampled",
        "request": {
            "temperature": 0.8,
            "top_p": 0.95,
            "seed": 7,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Write a two-line poem about a harbour at dawn."}],
        },
    },
    {
        "id": "sampling-seed-1234",
        "case": "sampling",
        "compare": "sampled",
        "request": {
            "temperature": 1.0,
            "top_p": 0.9,
            "seed": 1234,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Name three uses of a paperclip, briefly."}],
        },
    },
    {
        "id": "tool-call",
        "case": "tool_json",
        "compare": "tool_calls",
        "request": {
            "temperature": 0,
            "max_tokens": 128,
            "tools": [LOOKUP_TOOL],
            "messages": [{"role": "user", "content": "Use lookup_fixture to retrieve the value for key alpha."}],
        },
    },
    {
        "id": "json-schema",
        "case": "tool_json",
        "compare": "json",
        "request": {
            "temperature": 0,
            "max_tokens": 64,
            "response_format": ANSWER_FORMAT,
            "messages": [{"role": "user", "content": "Return an object whose answer is the integer 42."}],
        },
    },
    {
        "id": "stop-sequence",
        "case": "stop_and_cancel",
        "compare": "stop",
        "request": {
            "temperature": 0,
            "max_tokens": 128,
            "stop": ["\n\n", "END"],
            "messages": [{"role": "user", "content": "List four colours, one per line, then write END."}],
        },
    },
    {
        "id": "client-cancel",
        "case": "stop_and_cancel",
        "compare": "cancel",
        "request": {
            "temperature": 0,
            "max_tokens": 512,
            "stream": True,
            "messages": [{"role": "user", "content": "Count slowly from one to two hundred in words."}],
        },
    },
)

BENCHMARK_PROMPTS = (
    "Summarise the causes of the French Revolution in two sentences.",
    "Explain what a TCP three-way handshake is.",
    "Describe a quiet morning in a small harbour town.",
    "Give a short proof that the square root of two is irrational.",
)
BENCHMARK_MAX_TOKENS = 128
BENCHMARK_SEED = 0


def benchmark_request(index: int) -> dict[str, Any]:
    """Sample `index` of the benchmark: greedy, seeded, and decoding all `max_tokens` tokens
    (`ignore_eos`, accepted by vLLM and SGLang) so every sample does the same real work."""
    return {
        "temperature": 0,
        "seed": BENCHMARK_SEED,
        "max_tokens": BENCHMARK_MAX_TOKENS,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": BENCHMARK_PROMPTS[index % len(BENCHMARK_PROMPTS)]}],
    }


def corpus_sha256() -> str:
    document = {"parity": CORPUS, "benchmark": [benchmark_request(index) for index in range(len(BENCHMARK_PROMPTS))]}
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


CORPUS_SHA256 = corpus_sha256()
