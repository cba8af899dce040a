"""The build actions' programs run with //omni_oci/format, //tools/oci/build, tools/debian and
attest only: no registry stack, signing, command or network library is among their files. Bazel
keys each image action on its tool's files, so a registry or signing edit leaves every image
action cached (tests/oci/floors.bzl lists the files as Bazel hands them to the actions)."""

from __future__ import annotations

import os
from pathlib import Path

FILES = Path(os.environ["BUILD_TOOLS_FILES"])
NEVER = (
    "omni_oci/remote/",
    "omni_oci/signing/",
    "tools/oci/push.py",
    "tools/oci/verify.py",
    "tools/oci/run_image.py",
    "omni_oci/model/",
    "tools/model/",
    "tools/pin/",
    "attest/edge/transport.py",
)
NEVER_PACKAGES = ("httpx", "httpcore", "cryptography", "isal", "publicsuffixlist")


def listed() -> list[str]:
    return [line for line in FILES.read_text().splitlines() if line]


def test_the_build_tools_run_with_no_registry_signing_or_command_code() -> None:
    files = listed()
    assert "omni_oci/format/layout.py" in files and "tools/oci/build/layer.py" in files, files[:20]
    assert [path for path in files if path.startswith(NEVER)] == []


def test_the_build_tools_run_with_no_network_or_crypto_package() -> None:
    files = listed()
    site = [path for path in files if "/site-packages/" in path or "/site/" in path]
    assert any("/zstandard/" in path for path in site), "no locked package listed: the test would prove nothing"
    offending = sorted({path for path in site for name in NEVER_PACKAGES if f"/{name}/" in path})
    assert offending == []
