"""Acceptance against live servers on a GPU host (tag `gpu`; `bazel test --config=gpu //...`).

The servers listen on loopback of the GPU host:
  OMNI_ACCEPTANCE_BASE_URL      the served endpoint (e.g. http://127.0.0.1:8888)
  OMNI_ACCEPTANCE_API_KEY       its API key
  OMNI_ACCEPTANCE_MODEL         its served model name
For the short gate run, also:
  OMNI_ACCEPTANCE_SPEC_URL      a speculative server of the same target
  OMNI_ACCEPTANCE_TARGET_REVISION, OMNI_ACCEPTANCE_SPECULATOR_REVISION, OMNI_ACCEPTANCE_ENGINE_COMMIT
Without them every test FAILS, naming what to set: a GPU run that tests nothing must not
look green.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path
from unittest import mock
from urllib.parse import urlsplit

import pytest

SERVER = ("OMNI_ACCEPTANCE_BASE_URL", "OMNI_ACCEPTANCE_API_KEY", "OMNI_ACCEPTANCE_MODEL")
GATE = (
    "OMNI_ACCEPTANCE_SPEC_URL",
    "OMNI_ACCEPTANCE_TARGET_REVISION",
    "OMNI_ACCEPTANCE_SPECULATOR_REVISION",
    "OMNI_ACCEPTANCE_ENGINE_COMMIT",
)


def _require(names: tuple[str, ...]) -> dict[str, str]:
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        pytest.fail(
            "no live endpoint configured: set "
            + ", ".join(missing)
            + " (servers on this host's loopback), then run bazel test --config=gpu //..."
        )
    return {name: os.environ[name] for name in names}


def _loopback_port(url: str) -> int:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host != "localhost" and not ipaddress.ip_address(host).is_loopback:
        pytest.fail(f"{url} is not a loopback address: run the acceptance tests on the GPU host itself")
    return parts.port or 80


@pytest.fixture
def boot_settings(tmp_path: Path):
    from boot.settings import BootSettings

    values = _require(SERVER)
    env = {
        "SERVER_PORT": str(_loopback_port(values["OMNI_ACCEPTANCE_BASE_URL"])),
        "API_KEY": values["OMNI_ACCEPTANCE_API_KEY"],
        "SERVED_MODEL_NAME": values["OMNI_ACCEPTANCE_MODEL"],
        "STATE_PATH": str(tmp_path / "state"),
        "MODEL_PATH": str(tmp_path / "model"),
        "MAX_RUNNING_REQUESTS": os.environ.get("MAX_RUNNING_REQUESTS", "4"),
    }
    with mock.patch.dict(os.environ, env):
        return BootSettings.from_env()


def test_boot_smoke_on_the_live_server(boot_settings) -> None:
    from boot.serving.api import Api, smoke

    smoke(Api(boot_settings), boot_settings)
    assert (
        json.loads((boot_settings.state / "smoke.json").read_text())["choices"][0]["message"]["content"].strip() == "42"
    )


def test_warm_up_batch_returns_latin_prose(boot_settings) -> None:
    from boot.serving.api import Api, warmup

    garbled = warmup(Api(boot_settings), boot_settings)
    assert garbled == [], f"garbled batch output: {garbled}"


def test_short_gate_run_shows_parity(tmp_path: Path) -> None:
    from tools.gate import cli

    server = _require(SERVER)
    gate = _require(GATE)
    for url in (server["OMNI_ACCEPTANCE_BASE_URL"], gate["OMNI_ACCEPTANCE_SPEC_URL"]):
        _loopback_port(url)
    output = tmp_path / "gate.json"
    with mock.patch.dict(os.environ, {"OMNI_GATE_API_KEY": server["OMNI_ACCEPTANCE_API_KEY"]}):
        cli.main(
            [
                "--ar-url",
                server["OMNI_ACCEPTANCE_BASE_URL"],
                "--spec-url",
                gate["OMNI_ACCEPTANCE_SPEC_URL"],
                "--model",
                server["OMNI_ACCEPTANCE_MODEL"],
                "--target-revision",
                gate["OMNI_ACCEPTANCE_TARGET_REVISION"],
                "--speculator-revision",
                gate["OMNI_ACCEPTANCE_SPECULATOR_REVISION"],
                "--engine-commit",
                gate["OMNI_ACCEPTANCE_ENGINE_COMMIT"],
                "--samples",
                "10",
                "--output",
                str(output),
            ]
        )
    document = json.loads(output.read_text())
    assert document["parity"]["passed"], document["parity"]["reasons"]
    assert document["benchmark"]["samples_per_mode"] == 10
