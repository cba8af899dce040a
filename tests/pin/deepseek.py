"""The deepseek_spark pins of a test checkout, resolved against a loopback registry (an sglang
base) and hub: what tools/pin's signature tests share (a module, not a test file)."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.hub import LoopbackHub
from tests.fixtures.registry import LoopbackRegistry
from tests.fixtures.vendor_base import installed_engine, layer, push_vendor_base
from tools.pin.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_ID = "deepseek-ai/DeepSeek-V4.1-Flash"
MODEL_COMMIT, ENGINE_COMMIT = "1" * 40, "4" * 40
SITE = "/usr/local/lib/python3.12/dist-packages"


def workspace(tmp_path: Path, registry: LoopbackRegistry, hub: LoopbackHub, monkeypatch) -> Path:
    """A checkout whose deepseek_spark pins resolve against `registry` and `hub`."""
    images = tmp_path / "ws" / "images"
    images.mkdir(parents=True)
    (images / "deepseek_spark.pins.json").write_bytes((REPO_ROOT / "images/deepseek_spark.pins.json").read_bytes())
    monkeypatch.setenv("OMNI_BASE_MIRROR", registry.host)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    sglang = installed_engine(SITE, "sglang", "0.5.23", package="sglang", direct_url_commit=ENGINE_COMMIT)
    base = {"linux/arm64": [layer(sorted((name.lstrip("/"), data) for name, data in sglang.items()))]}
    push_vendor_base(registry.host, "lmsysorg/sglang", "v0.5.23", base)
    return tmp_path / "ws"


def pin(workspace: Path, *args: str) -> int:
    return main(["--workspace", str(workspace), "deepseek_spark", "--base-tag", "v0.5.23", *args])
