"""Acceptance against a live OpenAI-compatible server (tag `gpu`).

Run with `bazel test --config=gpu //...` on the GPU host, the server on loopback:
OMNI_ACCEPTANCE_BASE_URL (e.g. http://127.0.0.1:8103), OMNI_ACCEPTANCE_API_KEY,
OMNI_ACCEPTANCE_MODEL. Without an endpoint every test FAILS: a GPU run that tests
nothing must not look green.
"""
from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

import httpx
import pytest

SETTINGS = ("OMNI_ACCEPTANCE_BASE_URL", "OMNI_ACCEPTANCE_API_KEY", "OMNI_ACCEPTANCE_MODEL")


@pytest.fixture(scope="module")
def endpoint() -> tuple[httpx.Client, str]:
    missing = [name for name in SETTINGS if not os.environ.get(name)]
    if missing:
        pytest.fail(
            "no live endpoint configured: set " + ", ".join(missing)
            + " (the server must listen on loopback), then run bazel test --config=gpu //..."
        )
    base = os.environ["OMNI_ACCEPTANCE_BASE_URL"].rstrip("/")
    host = urlsplit(base).hostname or ""
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        pytest.fail(f"OMNI_ACCEPTANCE_BASE_URL must be a loopback address, got host {host!r}")
    headers = {"Authorization": f"Bearer {os.environ['OMNI_ACCEPTANCE_API_KEY']}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        yield client, os.environ["OMNI_ACCEPTANCE_MODEL"]


def test_served_model_is_listed(endpoint):
    client, model = endpoint
    response = client.get("/v1/models")
    response.raise_for_status()
    assert model in [item["id"] for item in response.json()["data"]]


def test_greedy_arithmetic_answers_exactly_42(endpoint):
    client, model = endpoint
    response = client.post("/v1/chat/completions", json={
        "model": model,
        "messages": [{"role": "user", "content": "What is 6 times 7? Reply with the number only."}],
        "temperature": 0,
        "max_tokens": 16,
    })
    response.raise_for_status()
    choice = response.json()["choices"][0]
    assert choice["message"]["content"].strip() == "42"
    assert choice["finish_reason"] == "stop"
