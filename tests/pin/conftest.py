"""The loopback registry and hub, and a workspace holding copies of the shipped pins, for every
test of tools/pin."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures.hub import HubRepo, LoopbackHub
from tests.fixtures.registry import LoopbackRegistry

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_COMMIT = "1" * 40
SPEC_COMMIT = "3" * 40


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    images = tmp_path / "ws" / "images"
    images.mkdir(parents=True)
    for name in ("qwen_mi300x", "deepseek_spark"):
        shutil.copy(REPO_ROOT / "images" / f"{name}.pins.json", images)
    return tmp_path / "ws"


@pytest.fixture
def hub() -> LoopbackHub:
    model = HubRepo(
        "Qwen/Qwen3.8-27B",
        MODEL_COMMIT,
        {"config.json": b"{}", "model.safetensors": b"w" * 300},
        lfs={"model.safetensors"},
        refs={"main": MODEL_COMMIT, "v1": MODEL_COMMIT},
    )
    speculator = HubRepo("incoai/Qwen3.8-27B-DFlash2", SPEC_COMMIT, {"config.json": b"{}"}, refs={"main": SPEC_COMMIT})
    deepseek = HubRepo(
        "deepseek-ai/DeepSeek-V4.1-Flash",
        MODEL_COMMIT,
        {"config.json": b"{}", "model-00001.safetensors": b"d" * 500, "README.md": b"# d\n"},
        lfs={"model-00001.safetensors"},
        refs={"main": MODEL_COMMIT},
    )
    with LoopbackHub(model, speculator, deepseek) as server:
        yield server


@pytest.fixture
def registry() -> LoopbackRegistry:
    with LoopbackRegistry() as server:
        yield server
