"""The README's two commands are the ones CI runs, and the set-up script behaves."""
from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

# Bazel runs tests in the runfiles tree of this repository; pytest from the checkout root works too.
ROOT = Path.cwd()


def _fenced_commands(markdown: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", markdown, flags=re.S)]


def test_readme_has_exactly_the_two_set_up_commands():
    commands = _fenced_commands((ROOT / "README.md").read_text())
    assert commands == ["tools/setup && bazel run //images:qwen_mi300x", "bazel test //..."]


def test_ci_runs_the_readme_set_up_then_exactly_the_readme_test_command():
    lines = [
        line.strip()
        for line in (ROOT / ".ci/run").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    commands = _fenced_commands((ROOT / "README.md").read_text())
    setup = commands[0].split("&&")[0].strip()
    assert lines[-2:] == [setup, commands[1]]
    assert "set -euo pipefail" in lines


def test_setup_help_and_refusal_of_unknown_arguments():
    setup = ROOT / "tools/setup"
    shown = subprocess.run(["bash", str(setup), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "usage: tools/setup" in shown.stdout
    refused = subprocess.run(["bash", str(setup), "--frobnicate"], capture_output=True, text=True)
    assert refused.returncode != 0
    assert "unknown argument: --frobnicate" in refused.stderr


@pytest.mark.parametrize("module, marker", [("boot.settings", "boot-settings"), ("launcher.settings", "launcher-settings"),
                                            ("tools.settings", "tools-settings")])
def test_every_settings_table_in_the_readme_is_generated_from_its_declaration(module: str, marker: str) -> None:
    declared = importlib.import_module(module)
    readme = (ROOT / "README.md").read_text()
    block = re.search(rf"<!-- {marker}:begin[^>]*-->\n(.*?)\n<!-- {marker}:end -->", readme, flags=re.S)
    assert block is not None and block.group(1) == declared.markdown_table()
    assert all(f"`{setting.variable}`" in block.group(1) for setting in declared.SETTINGS)
    assert all(setting.variable in declared.help_table() for setting in declared.SETTINGS)


def test_launcher_help_lists_every_setting() -> None:
    from launcher.settings import SETTINGS

    shown = subprocess.run([sys.executable, "-m", "launcher", "--help"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60)
    assert shown.returncode == 0
    assert all(setting.variable in shown.stdout for setting in SETTINGS)
