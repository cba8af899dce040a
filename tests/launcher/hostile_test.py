"""Hostile bytes in every document position the launcher reads: each is refused (exit 2, one
JSON line naming it) or, for the canary's evidence, makes the launcher fall back; never a
traceback, never a hang."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Callable

import pytest

from tests.fixtures.bounds import LOAD_SLACK_S
from tests.fixtures.pins import qwen_pins, write_baked
from tests.fixtures.qwen import LauncherWorld, sha256

# A hostile document ends in a refusal instead of a hang (a FIFO, /dev/zero, a symlink loop) or an
# unbounded parse: a run still going after this is taken for a hang. No speed is asserted.
HANG_S = 6 * LOAD_SLACK_S


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _loop(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(path.name)  # points at itself


def _zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def _bytes(data: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.unlink(missing_ok=True)
        path.write_bytes(data)

    return write


HOSTILE: dict[str, Callable[[Path], None]] = {
    "fifo": _fifo,
    "symlink loop": _loop,
    "/dev/zero": _zero,
    "deep nesting": _bytes(b"[" * 100_000 + b"]" * 100_000),
    "NaN": _bytes(b'{"a": NaN}'),
    "Infinity": _bytes(b'{"a": Infinity}'),
    "5000-digit integer": _bytes(b'{"a": ' + b"9" * 5000 + b"}"),
    "duplicate key": _bytes(b'{"a": 1, "a": 2}'),
    "not UTF-8": _bytes(b'{"a": "\xff"}'),
}

# Where the launcher reads a document, and whether a bad one is fatal or only disables the canary.
POSITIONS: dict[str, tuple[Callable[[LauncherWorld], Path], bool]] = {
    "config.json": (lambda w: w.model / "config.json", True),
    "weight index": (lambda w: w.model / "model.safetensors.index.json", True),
    "attestation (pinned)": (lambda w: w.model / ".omni-checkpoint.json", True),
    "image.json": (lambda w: Path(w.env["OMNI_IMAGE_JSON"]), True),
    "engine direct_url.json": (lambda w: w.site / "vllm-0.18.1.dist-info" / "direct_url.json", True),
    "engine METADATA": (lambda w: w.site / "vllm-0.18.1.dist-info" / "METADATA", True),
    "DFlash2 gate": (lambda w: w.gate, False),
    "speculator config": (lambda w: w.speculator / "config.json", False),
    "speculator attestation": (lambda w: w.speculator / ".omni-speculator.json", False),
}


def _run_bounded(world: LauncherWorld):
    result: list = []
    worker = threading.Thread(target=lambda: result.append(world.run("--inspect-only")), daemon=True)
    worker.start()
    worker.join(HANG_S)
    assert result, f"the launcher did not return within {HANG_S:g} s: it hangs on the document"
    return result[0]


@pytest.mark.parametrize("kind", sorted(HOSTILE))
@pytest.mark.parametrize("position", sorted(POSITIONS))
def test_hostile_documents_are_refused_quickly_without_a_traceback(tmp_path: Path, position: str, kind: str) -> None:
    world = LauncherWorld(tmp_path)
    world.env["OMNI_IMAGE_JSON"] = str(write_baked(tmp_path / "image.json", qwen_pins()))
    world.env["INFERENCE_MODE"] = "dflash2_canary"
    locate, fatal = POSITIONS[position]
    HOSTILE[kind](locate(world))
    result = _run_bounded(world)
    assert "Traceback" not in result.stderr + result.stdout
    assert "sk-test-secret-key-123" not in result.stderr + result.stdout.replace('"api_key_transport"', "")
    if result.code == 2:
        lines = [line for line in result.stderr.splitlines() if line.startswith("{")]
        assert len(lines) == 1, result.stderr
        refusal = json.loads(lines[0])
        assert refusal["ok"] is False and refusal["field"] and refusal["error"]
    else:
        # The canary's evidence is optional: a bad document only keeps the canary off.
        assert not fatal, f"{position}/{kind} was accepted: {result.stdout[:300]}"
        assert result.code == 0 and result.report["decision"]["mode"] != "dflash2_canary"


def test_a_symlink_loop_as_model_path_and_as_a_shard(tmp_path: Path) -> None:
    world = LauncherWorld(tmp_path)
    shard = next(world.model.glob("*.safetensors"))
    _loop(shard)
    result = _run_bounded(world)
    assert result.code == 2 and "Traceback" not in result.stderr
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    world.env["MODEL_PATH"] = str(loop)
    result = _run_bounded(world)
    assert result.code == 2 and json.loads(result.stderr.splitlines()[-1])["field"] == "MODEL_PATH"


def test_a_nul_byte_in_a_weight_map_path_or_the_index_path(tmp_path: Path) -> None:
    world = LauncherWorld(tmp_path)
    world.edit_index(lambda index: index["weight_map"].__setitem__("x", "model\u0000.safetensors"))
    result = _run_bounded(world)
    assert result.code == 2 and "Traceback" not in result.stderr
    world = LauncherWorld(tmp_path / "second")
    world.reattest(weight_index_path="model\u0000.index.json")
    result = _run_bounded(world)
    assert result.code == 2 and "Traceback" not in result.stderr


def test_the_attestation_swapped_between_reads_is_never_accepted(tmp_path: Path) -> None:
    """A writer flips the attestation between the pinned one (which lists every shard's
    digest) and a tampered one that would skip shard hashing, as fast as it can. The launcher
    reads it once, so it sees one or the other whole, and only the pinned bytes pass."""
    world = LauncherWorld(tmp_path)
    world.reattest(hash_shards=True)
    path = world.model / ".omni-checkpoint.json"
    good = path.read_bytes()
    tampered = json.loads(good)
    shard_count = len(tampered.pop("shards"))
    bad = json.dumps(tampered).encode()
    assert sha256(path) == world.env["QWEN_CHECKPOINT_MANIFEST_SHA256"]
    stop = threading.Event()

    def flip() -> None:
        flag = False
        while not stop.is_set():
            temporary = path.with_suffix(".swap")
            temporary.write_bytes(bad if flag else good)
            os.replace(temporary, path)
            flag = not flag

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    outcomes = {"accepted pinned": 0, "refused": 0}
    try:
        for _ in range(200):
            result = world.run("--inspect-only")
            if result.code == 0:
                assert result.report["checkpoint"]["shards_hashed"] == shard_count  # the pinned document
                outcomes["accepted pinned"] += 1
            else:
                assert result.code == 2 and "Traceback" not in result.stderr
                outcomes["refused"] += 1
    finally:
        stop.set()
        flipper.join(5)
    assert sum(outcomes.values()) == 200 and outcomes["refused"] > 0, outcomes
