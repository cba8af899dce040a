"""Every environment variable a command reads is declared in its settings (and so in its
--help and the README), and every declared variable is read somewhere."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from boot.settings import SETTINGS as BOOT
from launcher.settings import SETTINGS as LAUNCHER
from tools.settings import SETTINGS as TOOLS

# Read but not settings of ours, each for a reason.
NOT_SETTINGS = {
    "BUILD_WORKING_DIRECTORY": "set by `bazel run`: where the user typed relative paths",
    "BUILD_WORKSPACE_DIRECTORY": "set by `bazel run`: where generated files go",
    "TP": "boot: the seed's older name, only the default of TP_SIZE",
    "ROCR_VISIBLE_DEVICES": "launcher: passed through to rocminfo unchanged",
    "API_KEY": "launcher: only to warn that boot's variable is ignored there",
    "PYDANTIC_DISABLE_PLUGINS": "launcher: set (not read) before pydantic loads",
    "OMNI_IMAGE_JSON": "attest.baked: where the image's baked pins are (tests point it elsewhere)",
    "XML_OUTPUT_FILE": "set by `bazel test` for the pytest runner",
    "TESTBRIDGE_TEST_ONLY": "set by `bazel test --test_filter` for the pytest runner",
    "PYPI_INTERPRETER_RECORD": "a test's own input, set in its BUILD target",
    "HOME": "omni_oci/remote/auth/credentials.py: where ~/.docker is when DOCKER_CONFIG is unset",
    "PATH": "omni_oci/remote/auth/credentials.py: where docker-credential-* helpers are found",
}
PACKAGES = {"launcher": LAUNCHER, "boot": BOOT, "tools": TOOLS}
NAME = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")


def _environment_reads(root: Path) -> dict[str, str]:
    """Upper-case string literals used as environ/env keys in Python files under `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        if "bench" in path.parts or "demo" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            key = None
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                target = ast.unparse(node.func.value)
                if "environ" in target or target in ("env", "environment"):
                    key = node.args[0].value
            elif (
                isinstance(node, ast.Subscript)
                and "environ" in ast.unparse(node.value)
                and isinstance(node.slice, ast.Constant)
            ):
                key = node.slice.value
            if isinstance(key, str) and NAME.match(key):
                found.setdefault(key, str(path))
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_variable_read_is_declared(package: str) -> None:
    declared = {s.variable for s in PACKAGES[package]}
    reads = _environment_reads(Path(package))
    undeclared = {k: v for k, v in reads.items() if k not in declared and k not in NOT_SETTINGS}
    assert not undeclared, f"read but not declared in {package}'s SETTINGS: {undeclared}"


def test_every_declared_tool_variable_is_read_somewhere() -> None:
    sources = "\n".join(
        p.read_text(encoding="utf-8")
        # the registry keychain (omni_oci/remote/auth/credentials.py) reads the registry variables
        for p in [*Path("tools").rglob("*.py"), *Path("omni_oci").rglob("*.py"), *Path("tools").rglob("*.bzl")]
        if p.name != "settings.py"
    )
    constants = {
        name
        for name, value in vars(__import__("tools.settings", fromlist=["x"])).items()
        if isinstance(value, str) and NAME.match(value)
    }
    for setting in TOOLS:
        named = [c for c in constants if getattr(__import__("tools.settings", fromlist=["x"]), c) == setting.variable]
        assert setting.variable in sources or any(c in sources for c in named), setting.variable


def test_the_scanner_sees_reads() -> None:
    """The scanner itself: it must find the reads this repository is known to have."""
    reads = _environment_reads(Path("launcher"))
    assert "QWEN_PORT" not in reads  # read through the declarations, not by name
    assert "API_KEY" in reads and "ROCR_VISIBLE_DEVICES" in reads
    assert "SOURCE_DATE_EPOCH" in _environment_reads(Path("tools"))
