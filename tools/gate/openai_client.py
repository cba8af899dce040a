"""The gate's view of one OpenAI-compatible server: an untrusted peer.

Every body is read bounded and parsed strictly (attest.reader), every answer is checked
against the shape we rely on. Every request has a total deadline, body included (the
request timeout, never past the run's): a peer sending a byte a second is cut off when it
passes, not kept alive by httpx's per-read timeout. Every line of a stream counts toward its
cap, blank lines and keep-alive comments included. At the run's deadline a watchdog closes
every client, so nothing waits past it, not even a peer trickling its headers. Any failure of
the peer is a PeerError whose message is the reason the gate records.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attest.errors import AttestError
from attest.reader import loads
from tools.settings import GATE_API_KEY

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_METRICS_BYTES = 4 * 1024 * 1024
# What a stream may send before its first data chunk, every line's newline counted.
MAX_STREAM_BYTES_BEFORE_DATA = MAX_BODY_BYTES
# A server-sent event's data line (a line starts after \r, \n or \r\n), whole. Scanned over the
# raw bytes: httpx's line iterator costs about 0.5 us a line, so 8 MB of blank lines took seconds.
DATA_LINE = re.compile(rb"(?:\A|[\r\n])(data:[^\r\n]*)[\r\n]")


def first_data_line(pending: bytes) -> bool:
    """Whether `pending` holds a whole data line other than `data: [DONE]`."""
    return any(found.group(1).strip() != b"data: [DONE]" for found in DATA_LINE.finditer(pending))


KEY_VARIABLE = GATE_API_KEY


class PeerError(Exception):
    """A server failed to give a usable answer; the message is the gate's reason."""


class DeadlinePassed(PeerError):
    """The run's overall deadline passed: no further request is sent."""


class Deadline:
    """The run's overall deadline: each request's total time never exceeds what is left, and
    at the deadline every client watched is closed (its blocked reads fail at once)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends = time.monotonic() + seconds
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def passed(self) -> bool:
        return time.monotonic() >= self.ends

    def refusal(self) -> DeadlinePassed:
        return DeadlinePassed(f"the overall deadline of {self.seconds:g} s passed (--deadline)")

    def timeout(self, per_request: float) -> float:
        left = self.ends - time.monotonic()
        if left <= 0:
            raise self.refusal()
        return min(per_request, left)

    def watch(self, client: httpx.Client) -> httpx.Client:
        with self._lock:
            self._clients.append(client)
            if self._timer is None:
                self._timer = threading.Timer(max(self.ends - time.monotonic(), 0), self._expire)
                self._timer.daemon = True
                self._timer.start()
        return client

    def _expire(self) -> None:
        with self._lock:
            clients = list(self._clients)
        for client in clients:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - a client mid-request may refuse; its read fails anyway
                pass


class _Lenient(BaseModel):
    # Servers add fields freely; only the ones we compare must have the right type.
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class ToolFunction(_Lenient):
    name: str
    arguments: str | None = None


class ToolCall(_Lenient):
    function: ToolFunction


class Message(_Lenient):
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class TopLogprob(_Lenient):
    token: str


class Logprobs(_Lenient):
    content: list[TopLogprob] | None = None


class Choice(_Lenient):
    message: Message
    finish_reason: str | None = None
    logprobs: Logprobs | None = None
    token_ids: list[int] | None = None


class Usage(_Lenient):
    completion_tokens: int = Field(ge=0)


class ChatCompletion(_Lenient):
    choices: list[Choice] = Field(min_length=1)
    usage: Usage | None = None

    @property
    def choice(self) -> Choice:
        return self.choices[0]

    @property
    def text(self) -> str:
        return self.choice.message.content or ""

    @property
    def top1_tokens(self) -> list[str] | None:
        logprobs = self.choice.logprobs
        return [item.token for item in logprobs.content] if logprobs and logprobs.content is not None else None


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    model: str
    api_key: str
    request_timeout: float
    deadline: Deadline

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return self.deadline.watch(
            httpx.Client(base_url=self.url.rstrip("/"), headers=headers, timeout=self.request_timeout)
        )

    def _late(self, where: str, timeout: float) -> PeerError:
        if self.deadline.passed():
            return self.deadline.refusal()
        return PeerError(
            f"{self.name} server: {where} did not answer within {timeout:g} s (--request-timeout, --deadline)"
        )

    def _request(self, client: httpx.Client, method: str, path: str, *, limit: int, json: Any = None) -> bytes:
        timeout = self.deadline.timeout(self.request_timeout)
        ends = time.monotonic() + timeout
        where = f"{method} {self.url.rstrip('/')}{path}"
        try:
            with client.stream(method, path, json=json, timeout=timeout) as response:
                body = bytearray()
                for chunk in response.iter_bytes():
                    if time.monotonic() > ends:
                        raise self._late(where, timeout)
                    body += chunk
                    if len(body) > limit:
                        raise PeerError(f"{self.name} server: {where} sent more than {limit} bytes")
                status = response.status_code
        except httpx.TimeoutException:
            raise self._late(where, timeout) from None
        except (httpx.HTTPError, RuntimeError) as exc:
            # A client closed by the deadline's watchdog fails its read (RuntimeError when closed
            # before the request was sent).
            if self.deadline.passed():
                raise self.deadline.refusal() from None
            raise PeerError(f"{self.name} server: {where} failed: {type(exc).__name__}: {exc}") from None
        if status == 401 or status == 403:
            hint = "is not set" if not self.api_key else "is not accepted"
            raise PeerError(
                f"{self.name} server: {where} answered HTTP {status}: the API key from {KEY_VARIABLE} {hint}"
            )
        if status != 200:
            raise PeerError(f"{self.name} server: {where} answered HTTP {status}: {bytes(body[:200])!r}")
        return bytes(body)

    def get_json(self, client: httpx.Client, path: str) -> Any:
        body = self._request(client, "GET", path, limit=MAX_BODY_BYTES)
        return _parse(body, f"{self.name} server {path}")

    def chat(self, client: httpx.Client, request: dict[str, Any]) -> ChatCompletion:
        body = self._request(
            client, "POST", "/v1/chat/completions", limit=MAX_BODY_BYTES, json={"model": self.model, **request}
        )
        value = _parse(body, f"{self.name} server chat completion")
        try:
            return ChatCompletion.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            raise PeerError(
                f"{self.name} server chat completion has the wrong shape at {where}: {first['msg']}"
            ) from None

    def stream_first_chunk(self, client: httpx.Client, request: dict[str, Any]) -> int:
        """Start a streamed answer and hang up after the first data chunk; chunks seen."""
        timeout = self.deadline.timeout(self.request_timeout)
        ends = time.monotonic() + timeout
        read = 0
        try:
            with client.stream(
                "POST", "/v1/chat/completions", json={"model": self.model, **request}, timeout=timeout
            ) as response:
                if response.status_code != 200:
                    raise PeerError(f"{self.name} server: streamed request answered HTTP {response.status_code}")
                pending = b""
                for chunk in response.iter_bytes():
                    if time.monotonic() > ends:
                        raise self._late("streamed request", timeout)
                    pending += chunk
                    if first_data_line(pending):
                        return 1
                    read += len(chunk)  # blank lines and keep-alive comments count too
                    if read > MAX_STREAM_BYTES_BEFORE_DATA:
                        raise PeerError(
                            f"{self.name} server: stream sent more than {MAX_STREAM_BYTES_BEFORE_DATA} "
                            "bytes without a data chunk"
                        )
                    pending = pending[max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1 :]  # the unended line
                if first_data_line(pending + b"\n"):  # the last line, ended by the end of the stream
                    return 1
        except httpx.TimeoutException:
            raise self._late("streamed request", timeout) from None
        except (httpx.HTTPError, RuntimeError) as exc:
            if self.deadline.passed():
                raise self.deadline.refusal() from None
            raise PeerError(f"{self.name} server: streamed request failed: {type(exc).__name__}: {exc}") from None
        return 0

    def metrics(self, client: httpx.Client) -> dict[str, float] | None:
        """The speculative-decoding counters and gauges of /metrics, or None where not exposed."""
        try:
            body = self._request(client, "GET", "/metrics", limit=MAX_METRICS_BYTES)
        except PeerError:
            return None
        return parse_spec_metrics(body.decode("utf-8", "replace"))


def _parse(body: bytes, label: str) -> Any:
    try:
        return loads(body, label=label, max_bytes=MAX_BODY_BYTES)
    except AttestError as exc:
        raise PeerError(str(exc)) from None


# Prometheus text format: `name{labels} value`. vLLM's counters are summed over label sets.
SPEC_METRICS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "sglang:spec_accept_rate": "sglang_accept_rate",
    "sglang:spec_accept_length": "sglang_accept_length",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+([-+0-9.eEnaNIif]+)(?:\s+\d+)?$")


def parse_spec_metrics(text: str) -> dict[str, float] | None:
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        name = match.group(1).removesuffix("_total")
        key = SPEC_METRICS.get(name)
        if key is None:
            continue
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if value != value or value in (float("inf"), float("-inf")):
            continue
        found[key] = found.get(key, 0.0) + value if key in ("drafts", "draft_tokens", "accepted_tokens") else value
    return found or None


def acceptance(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any]:
    """Acceptance over the benchmark window: counter deltas (vLLM) or the gauges (SGLang)."""
    if not after:
        return {"exposed": False}
    before = before or {}
    result: dict[str, Any] = {"exposed": True}
    drafts = after.get("drafts", 0.0) - before.get("drafts", 0.0)
    draft_tokens = after.get("draft_tokens", 0.0) - before.get("draft_tokens", 0.0)
    accepted = after.get("accepted_tokens", 0.0) - before.get("accepted_tokens", 0.0)
    if draft_tokens > 0:
        result.update(
            drafts=drafts,
            draft_tokens=draft_tokens,
            accepted_tokens=accepted,
            acceptance_rate=round(accepted / draft_tokens, 4),
        )
        if drafts > 0:
            # vLLM's definition: the bonus token plus the accepted drafts, per draft.
            result["mean_accepted_length"] = round(1 + accepted / drafts, 4)
    if "sglang_accept_rate" in after:
        result["acceptance_rate"] = round(after["sglang_accept_rate"], 4)
    if "sglang_accept_length" in after:
        result["mean_accepted_length"] = round(after["sglang_accept_length"], 4)
    return result
