"""boot smoke and warm-up against a scripted OpenAI-compatible server on loopback."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from unittest import mock

import httpx
import pytest

from boot.errors import BootError
from boot.serving.api import Api, looks_like_latin_prose, smoke, vision_png, warmup
from boot.settings import BootSettings
from tests.fixtures.bounds import ended_by_deadline
from tests.fixtures.deepseek import boot_env
from tests.fixtures.fault_proxy import ScriptedPeer, Trickler
from tests.fixtures.openai_server import GoodModel, ScriptedOpenAI, completion, has_image

KEY = "sk-boot-secret-999"


def _settings(base: Path, server: ScriptedOpenAI, **extra: str) -> BootSettings:
    env = boot_env(base, SERVER_PORT=str(server.port), API_KEY=KEY, **extra)
    with mock.patch.dict(os.environ, env, clear=True):
        return BootSettings.from_env()


class Wrong(GoodModel):
    """GoodModel with one answer replaced."""

    def __init__(self, case: str) -> None:
        self.case = case

    def __call__(self, request):
        text = json.dumps(request.get("messages"))
        if self.case == "not 42" and "19 + 23" in text:
            return completion("41")
        if self.case == "cut off" and "19 + 23" in text:
            return completion("42", finish_reason="length")
        if self.case == "bad JSON" and "response_format" in request:
            return completion("{answer: 42")
        if self.case == "wrong JSON" and "response_format" in request:
            return completion('{"answer": "42"}')
        if self.case == "no tool call" and request.get("tools") and '"tool"' not in text:
            return completion("I would look it up, but here is a guess: 42.")
        if self.case == "wrong tool args" and request.get("tools") and '"tool"' not in text:
            return completion(
                None,
                tool_calls=[
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "lookup_fixture", "arguments": '{"key": "beta"}'},
                    }
                ],
            )
        if self.case == "continuation ignores tool" and request.get("tools") and '"tool"' in text:
            return completion("I do not know.")
        if self.case == "vision words missing" and has_image(request):
            return completion("Two shapes: something red and something blue.")
        if self.case == "wrong image_tokens" and has_image(request):
            result = super().vision(request)
            result["usage"]["prompt_tokens_details"]["image_tokens"] = 256
            return result
        return super().__call__(request)


def test_smoke_passes_on_correct_answers_and_saves_each_result(tmp_path: Path) -> None:
    with ScriptedOpenAI(api_key=KEY) as server:
        settings = _settings(tmp_path, server)
        smoke(Api(settings), settings)
    assert server.unauthorized == 0 and len(server.requests) == 5
    for name in ("smoke.json", "smoke-structured.json", "smoke-tools.json", "smoke-vision.json"):
        assert json.loads((tmp_path / "state" / name).read_text())
    assert all(r["temperature"] == 0 and r["model"] == "deepseek-v4.1-flash" for r in server.requests)
    tool_round = server.requests[3]["messages"]
    assert tool_round[-1] == {"role": "tool", "tool_call_id": "call_1", "content": '{"value":42}'}


def test_smoke_quick_stops_after_arithmetic(tmp_path: Path) -> None:
    with ScriptedOpenAI(api_key=KEY) as server:
        settings = _settings(tmp_path, server, SMOKE_QUICK="1")
        smoke(Api(settings), settings)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "case,check",
    [
        ("not 42", "arithmetic"),
        ("cut off", "arithmetic"),
        ("bad JSON", "structured_output"),
        ("wrong JSON", "structured_output"),
        ("no tool call", "tool_call"),
        ("wrong tool args", "tool_arguments"),
        ("continuation ignores tool", "tool_continuation"),
        ("vision words missing", "vision"),
        ("wrong image_tokens", "vision_image_tokens"),
    ],
)
def test_smoke_fails_clearly_on_each_wrong_answer(tmp_path: Path, case: str, check: str) -> None:
    with ScriptedOpenAI(Wrong(case), api_key=KEY) as server:
        settings = _settings(tmp_path, server)
        with pytest.raises(BootError) as caught:
            smoke(Api(settings), settings)
    assert caught.value.field == check
    assert str(caught.value).startswith(f"smoke {check} failed: expected ")


def test_vision_image_is_native_resolution_with_both_shapes() -> None:
    from io import BytesIO

    from PIL import Image

    image = Image.open(BytesIO(vision_png())).convert("RGB")
    assert image.size == (3024, 588)
    assert image.getpixel((394, 294)) == (255, 0, 0) and image.getpixel((2594, 294)) == (0, 0, 255)
    assert image.getpixel((1500, 294)) == (255, 255, 255)


def test_warmup_flags_a_garbled_batch_without_failing(tmp_path: Path, capsys) -> None:
    batch_prompts = ("hash table", "TCP three-way", "harbour town", "sky is blue")

    def garbling(request):
        text = json.dumps(request["messages"])
        if any(p in text for p in batch_prompts[:3]):
            return completion("数据 ### @@@ 漢字 ∑∑∑")
        return completion("A plain sentence of Latin prose.")

    with ScriptedOpenAI(garbling, api_key=KEY) as server:
        settings = _settings(tmp_path, server, MAX_RUNNING_REQUESTS="4", WARMUP_PROMPT_WORDS="12,40")
        garbled = warmup(Api(settings), settings)
    assert len(garbled) == 3
    out = capsys.readouterr().out
    assert "WARNING: BATCH OUTPUT SANITY CHECK FAILED: 3/4 requests of a batch of 4" in out
    assert len(server.requests) == 2 + 4


def test_warmup_passes_and_survives_failed_requests(tmp_path: Path, capsys) -> None:
    with ScriptedOpenAI(api_key="another-key") as server:  # every request is refused 401
        settings = _settings(tmp_path, server, MAX_RUNNING_REQUESTS="2", WARMUP_PROMPT_WORDS="12")
        assert warmup(Api(settings), settings) == []
    assert "warm-up prompt (~12 words) failed" in capsys.readouterr().out
    with ScriptedOpenAI(api_key=KEY) as server:
        settings = _settings(tmp_path, server, MAX_RUNNING_REQUESTS="2", WARMUP_PROMPT_WORDS="12")
        assert warmup(Api(settings), settings) == []
    assert "Batch output sanity check passed: batch of 2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text,latin",
    [
        ("The sky is blue because of Rayleigh scattering.", True),
        ("", False),
        ("   ", False),
        ("漢字のテキスト", False),
        ("한국어 텍스트", False),
        ("### @@@ ∑∑∑ ~~~ ^^^", False),
        ("SYN, SYN-ACK, ACK.", True),
    ],
)
def test_latin_prose_check(text: str, latin: bool) -> None:
    assert looks_like_latin_prose(text) is latin


def _dripping(client, head: bytes) -> bool:
    """A server answering 200 with a JSON body that arrives one byte every 0.5 s (60 s in all)."""
    client.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 120\r\n\r\n")
    for byte in b"{" + b" " * 118 + b"}":
        time.sleep(0.5)
        client.sendall(bytes([byte]))
    return False


# Issue #68: the engine is a peer like any other; a trickling answer ends at the request's timeout
# in all, not at its last byte (each byte would reset a per-read timeout).
@pytest.mark.parametrize("where", ["head", "body"])
def test_a_trickling_engine_answer_ends_at_its_timeout(tmp_path: Path, where: str) -> None:
    peer = Trickler(0.5) if where == "head" else ScriptedPeer(_dripping)
    with peer:
        env = boot_env(tmp_path, SERVER_PORT=peer.host.rsplit(":", 1)[1], API_KEY=KEY)
        with mock.patch.dict(os.environ, env, clear=True):
            settings = BootSettings.from_env()
        started = time.monotonic()
        with pytest.raises((BootError, httpx.ReadTimeout)):
            Api(settings).chat({"messages": []}, timeout=2)
        ended_by_deadline(time.monotonic() - started, 2, 60)
