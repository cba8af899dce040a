"""The README's no-GPU quick start, step by step: build and copy the layout, unpack it,
make the demo inputs, run the image's launcher with --explain in a chroot, push signed to a
loopback registry made from the demo's configuration, verify."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import httpx
import pytest

from tests.fixtures.oci import UMOCI, blobs_of, run
from tests.fixtures.registry import REGISTRY_BIN, free_port
from tools.dev.demo import cli as demo
from tools.oci import verify

README = Path("README.md")
STEPS = (
    "bazel run //images:qwen_mi300x -- --output /tmp/omni/qwen.layout",
    "umoci unpack --rootless --image /tmp/omni/qwen.layout:latest /tmp/omni/bundle",
    "bazel run //tools/dev/demo -- /tmp/omni/demo --rootfs /tmp/omni/bundle/rootfs",
    "env -i $(cat /tmp/omni/demo/launcher.env) chroot /tmp/omni/bundle/rootfs",
    "/usr/bin/python3 -I -S /opt/omni/bin/omni-run launcher --explain",
    "docker-registry serve /tmp/omni/demo/registry.yml &",
    "OMNI_SIGNING_KEY_FILE=/tmp/omni/demo/signing.key bazel run //images:qwen_mi300x -- --push 127.0.0.1:5000/omni/qwen",
    "bazel run //tools/oci:verify -- 127.0.0.1:5000/omni/qwen@sha256:",
)


def test_the_readme_lists_the_steps_this_test_runs() -> None:
    block = re.search(
        r"<!-- quickstart:begin[^>]*-->\n```bash\n(.*?)```\n<!-- quickstart:end -->", README.read_text(), flags=re.S
    )
    assert block is not None
    for step in STEPS:
        assert step in block.group(1), step


def _call(main, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _explain_in_the_unpacked_image(tmp_path: Path) -> None:
    """The README's --explain step: the launcher in the chroot with the demo's settings."""
    settings = dict(line.split("=", 1) for line in (tmp_path / "demo" / "launcher.env").read_text().splitlines())
    explained = subprocess.run(
        [
            "/usr/sbin/chroot",
            str(tmp_path / "bundle" / "rootfs"),
            "/usr/bin/python3",
            "-I",
            "-S",
            "/opt/omni/bin/omni-run",
            "launcher",
            "--explain",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=settings,
    )
    assert explained.returncode == 0, explained.stderr
    report = json.loads(explained.stdout)
    assert report["decision"]["mode"] == "native_mtp" and report["will_start_model"] is False
    assert "warnings" not in report  # the demo pins the attestation and sets its own key
    assert settings["QWEN_API_KEY"] not in explained.stdout + explained.stderr
    assert "not pinned in this development image" in " ".join(report["image_pins"])
    assert "native_mtp       yes       *" in explained.stderr


def _wait_for_registry(port: int, registry: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120  # the registry's start on a loaded machine: an event wait
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            assert time.monotonic() < deadline and registry.poll() is None, "docker-registry did not start"
            time.sleep(0.1)


def test_the_quick_start_runs_end_to_end(tmp_path: Path, monkeypatch) -> None:
    if os.geteuid() != 0:
        pytest.skip(f"the quick start chroots into the unpacked image: needs root (uid {os.geteuid()})")
    monkeypatch.setenv("BUILD_WORKING_DIRECTORY", str(tmp_path))
    runner = Path("images/qwen_mi300x.run.sh").resolve()
    built = subprocess.run(
        [str(runner), "--output", "qwen.layout"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "BUILD_WORKING_DIRECTORY": str(tmp_path)},
    )
    assert built.returncode == 0, built.stderr
    assert "engine: none (local Debian base" in built.stdout
    digest = blobs_of(tmp_path / "qwen.layout")["digest"]

    unpacked = run(
        [UMOCI, "unpack", "--rootless", "--image", f"{tmp_path / 'qwen.layout'}:latest", str(tmp_path / "bundle")]
    )
    assert unpacked.returncode == 0, unpacked.stderr
    port = free_port()
    code, _, err = _call(demo.main, ["demo", "--rootfs", "bundle/rootfs", "--registry-port", str(port)])
    assert code == 0, err
    # Running it again without --force changes nothing; a foreign non-empty directory is refused.
    assert _call(demo.main, ["demo"])[0] == 2
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    code, _, err = _call(demo.main, ["notes", "--force"])
    assert code == 2 and "nothing was changed" in err and (tmp_path / "notes" / "mine.txt").read_text() == "keep me"

    _explain_in_the_unpacked_image(tmp_path)

    registry = subprocess.Popen(
        [REGISTRY_BIN, "serve", str(tmp_path / "demo" / "registry.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for_registry(port, registry)
        pushed = subprocess.run(
            [str(runner), "--push", f"127.0.0.1:{port}/omni/qwen"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "BUILD_WORKING_DIRECTORY": str(tmp_path), "OMNI_SIGNING_KEY_FILE": "demo/signing.key"},
        )
        assert pushed.returncode == 0, pushed.stderr
        reference = pushed.stdout.splitlines()[-1]
        assert reference == f"127.0.0.1:{port}/omni/qwen@{digest}"
        code, out, err = _call(verify.main, [reference, "--key", "demo/signing.pub"])
        assert code == 0, err
        summary = json.loads(out)
        assert summary["ok"] is True and summary["pinned"] is False
        assert "engine.commit or engine.record_sha256" in summary["unpinned"]
    finally:
        registry.terminate()
        registry.wait(timeout=120)
