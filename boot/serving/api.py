"""The OpenAI-compatible API as the smoke and warm-up see it (httpx), and the checks.

smoke: exact arithmetic, strict JSON-schema output, a tool-call round trip and native-
resolution vision; each failure raises BootError naming the check and what came back.
warm-up: prompt-size tiers and one concurrent batch whose output must read as Latin
prose; it warns, never fails.
"""

from __future__ import annotations

import base64
import io
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import httpx

from attest.edge.bodies import read_bounded
from attest.edge.transport import DeadlineTransport, answer_deadline
from attest.requests import ANSWER_FORMAT, LOOKUP_TOOL
from boot.errors import BootError
from boot.serving.state import save
from boot.settings import BootSettings

SMOKE_TIMEOUT_S = 300
WARMUP_TIMEOUT_S = 600
MAX_ANSWER_BYTES = 16 << 20  # a chat answer or /health: far above any real one
FILLER = (
    "The quick brown fox jumps over the lazy dog near the riverbank "
    "while the sun sets slowly behind the distant hills. "
)
BATCH_PROMPTS = (
    "Explain how a hash table handles collisions in two sentences.",
    "List the steps of the TCP three-way handshake.",
    "Describe a quiet morning in a small harbour town in two sentences.",
    "Explain in plain words why the sky is blue.",
)
VISION_SIZE = (3024, 588)
VISION_IMAGE_TOKENS = 1024


def engine_client(settings: BootSettings) -> httpx.Client:
    """A client of the local server (the engine is a peer like any other: untrusted) whose
    answers' heads arrive within each request's timeout in all (DeadlineTransport), however
    slowly the server trickles them."""
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = "Bearer " + settings.api_key
    return httpx.Client(base_url=settings.base_url, headers=headers, transport=DeadlineTransport())


def answered(client: httpx.Client, method: str, path: str, *, timeout: float, body: bool = True, **kwargs: Any):
    """(the answer, its body): the head and the whole body within `timeout` in all, the body at most
    MAX_ANSWER_BYTES (a refusal naming the request otherwise); `body=False` reads none of it."""
    deadline = time.monotonic() + timeout
    with answer_deadline(timeout, ends=deadline):
        response = client.send(client.build_request(method, path, timeout=timeout, **kwargs), stream=True)
    try:
        data = b""
        if body:
            what = f"the server's answer to {method} {path}"
            data = read_bounded(response, MAX_ANSWER_BYTES, what, deadline=deadline, error=BootError, field="response")
    finally:
        response.close()
    return response, data


class Api:
    """A small client of the local server; the key stays in memory, never re-written."""

    def __init__(self, settings: BootSettings, *, client: httpx.Client | None = None) -> None:
        self.client = client or engine_client(settings)
        self.model = settings.served_model_name

    def get(self, path: str, *, timeout: float = 10) -> dict[str, Any]:
        response, data = answered(self.client, "GET", path, timeout=timeout)
        response.raise_for_status()
        return json.loads(data) if data else {"status": response.status_code}

    def chat(self, payload: dict[str, Any], *, timeout: float = SMOKE_TIMEOUT_S) -> dict[str, Any]:
        body = {"model": self.model, "temperature": 0, "chat_template_kwargs": {"thinking": False}, **payload}
        response, data = answered(self.client, "POST", "/v1/chat/completions", timeout=timeout, json=body)
        response.raise_for_status()
        return json.loads(data)


def _content(result: dict[str, Any]) -> str:
    try:
        return result["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise BootError(f"response has no choices[0].message.content: {str(result)[:300]}", field="response") from None


def _fail(check: str, expected: str, result: Any) -> BootError:
    return BootError(f"smoke {check} failed: expected {expected}; got {json.dumps(result)[:400]}", field=check)


def vision_png() -> bytes:
    """A 3024x588 image: a red circle on the left, a blue square on the right."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", VISION_SIZE, "white")
    draw = ImageDraw.Draw(image)
    draw.ellipse((200, 100, 588, 488), fill="red")
    draw.rectangle((2400, 100, 2788, 488), fill="blue")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


SMOKE_COMMON = {"max_tokens": 256}


def _smoke_structured(api: Api, settings: BootSettings) -> None:
    common = SMOKE_COMMON
    structured = api.chat(
        {
            **common,
            "messages": [{"role": "user", "content": "Return an object whose answer is the integer 42."}],
            "response_format": ANSWER_FORMAT,
        }
    )
    try:
        parsed = json.loads(_content(structured))
    except ValueError:
        parsed = None
    if parsed != {"answer": 42}:
        raise _fail("structured_output", 'the JSON object {"answer": 42}', structured)
    save(settings.state, "smoke-structured.json", structured)


def _smoke_tools(api: Api, settings: BootSettings) -> None:
    common = SMOKE_COMMON
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Use lookup_fixture to retrieve the value for key alpha. Do not guess."}
    ]
    called = api.chat({**common, "messages": messages, "tools": [LOOKUP_TOOL]})
    assistant = called["choices"][0]["message"]
    calls = assistant.get("tool_calls") or []
    if len(calls) != 1 or calls[0].get("function", {}).get("name") != "lookup_fixture":
        raise _fail("tool_call", "exactly one call of lookup_fixture", called)
    try:
        arguments = json.loads(calls[0]["function"].get("arguments") or "")
    except ValueError:
        arguments = None
    if arguments != {"key": "alpha"}:
        raise _fail("tool_arguments", 'arguments {"key": "alpha"}', called)
    messages += [assistant, {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"value":42}'}]
    continued = api.chat({**common, "messages": messages, "tools": [LOOKUP_TOOL]})
    if "42" not in _content(continued):
        raise _fail("tool_continuation", "an answer containing 42 after the tool result", continued)
    save(settings.state, "smoke-tools.json", {"call": called, "continuation": continued})


def _smoke_vision(api: Api, settings: BootSettings) -> None:
    common = SMOKE_COMMON
    image = base64.b64encode(vision_png()).decode()
    visual = api.chat(
        {
            **common,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": "Describe the two colored shapes and their left-to-right order. Be concise.",
                        },
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}},
                    ],
                }
            ],
        }
    )
    text = _content(visual).lower()
    missing = [word for word in ("red", "circle", "blue", "square") if word not in text]
    if missing:
        raise _fail("vision", f"a description naming red, circle, blue and square (missing {missing})", visual)
    details = (visual.get("usage") or {}).get("prompt_tokens_details") or {}
    if "image_tokens" in details and details["image_tokens"] != VISION_IMAGE_TOKENS:
        raise _fail("vision_image_tokens", f"image_tokens == {VISION_IMAGE_TOKENS} at native resolution", visual)
    save(settings.state, "smoke-vision.json", visual)


def smoke(api: Api, settings: BootSettings) -> None:
    result = api.chat(
        {"max_tokens": 32, "messages": [{"role": "user", "content": "What is 19 + 23? Reply only with the number."}]}
    )
    choice = (result.get("choices") or [{}])[0]
    if _content(result).strip() != "42" or choice.get("finish_reason") != "stop":
        raise _fail("arithmetic", 'exactly "42" with finish_reason "stop"', result)
    save(settings.state, "smoke.json", result)
    print("Fresh inference passed: 19 + 23 = 42", flush=True)
    if settings.smoke_quick:
        return
    _smoke_structured(api, settings)
    _smoke_tools(api, settings)
    _smoke_vision(api, settings)
    print("Structured output, tool round trip and full-budget native vision passed.", flush=True)


def looks_like_latin_prose(text: str | None) -> bool:
    """No CJK or Hangul, and at least 70% of the non-space characters are ASCII letters,
    digits or common punctuation. The garbage seen at batch >= 3 was symbol runs and CJK."""
    body = [ch for ch in (text or "") if not ch.isspace()]
    if not body:
        return False
    if any("\u3000" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" for ch in body):
        return False
    latin = sum(1 for ch in body if ch.isascii() and (ch.isalnum() or ch in ".,;:'\"!?-()"))
    return latin / len(body) >= 0.7


def _attempt(call: Callable[[], dict[str, Any]]) -> tuple[str | None, str]:
    try:
        return None, _content(call())
    except Exception as exc:  # warm-up never takes the engine down
        return str(exc), ""


def warmup(api: Api, settings: BootSettings) -> list[tuple[str, str]]:
    """Exercise kernels a fresh engine has not seen (prefill tiers, decode, one batch of
    MAX_RUNNING_REQUESTS) and flag a batch that returns garbage. Returns the garbled pairs."""
    if not settings.warmup:
        return []
    started = time.monotonic()
    for words in settings.warmup_prompt_words:
        prompt = FILLER * (words // 20 + 1) + "Summarise the text above in one sentence."
        error, _ = _attempt(
            lambda: api.chat(
                {"max_tokens": 24, "messages": [{"role": "user", "content": prompt}]}, timeout=WARMUP_TIMEOUT_S
            )
        )
        if error:
            print(f"warm-up prompt (~{words} words) failed: {error}", flush=True)
    batch = settings.max_running_requests
    prompts = (list(BATCH_PROMPTS) * ((batch + 3) // 4))[:batch]
    with ThreadPoolExecutor(batch) as pool:
        outcomes = list(
            pool.map(
                lambda p: _attempt(
                    lambda: api.chat(
                        {"max_tokens": 48, "messages": [{"role": "user", "content": p}]}, timeout=WARMUP_TIMEOUT_S
                    )
                ),
                prompts,
            )
        )
    garbled = []
    for prompt, (error, text) in zip(prompts, outcomes):
        if error:
            print(f"warm-up batch request failed: {error}", flush=True)
        elif not looks_like_latin_prose(text):
            garbled.append((prompt, text))
    if garbled:
        print(
            f"WARNING: BATCH OUTPUT SANITY CHECK FAILED: {len(garbled)}/{batch} requests of a batch of {batch} "
            "(MAX_RUNNING_REQUESTS) did not return Latin prose. Concurrent requests at this batch size are "
            "returning garbage (NaN target logits at batch >= 3 were seen before).",
            flush=True,
        )
        for prompt, text in garbled:
            print(f"  batch of {batch}: {prompt[:40]!r} -> {text[:80]!r}", flush=True)
    else:
        print(f"Batch output sanity check passed: batch of {batch} returned Latin prose.", flush=True)
    print(
        f"Warm-up done in {time.monotonic() - started:.0f}s "
        f"({len(settings.warmup_prompt_words)} prompt sizes + one batch of {batch})",
        flush=True,
    )
    return garbled
