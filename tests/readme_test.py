"""The README's two commands are the ones CI runs, and the set-up script behaves."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

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


def test_the_readme_table_of_boot_settings_is_generated_from_their_declaration():
    from boot.settings import SETTINGS, help_table, markdown_table

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- boot-settings:begin[^>]*-->\n(.*?)\n<!-- boot-settings:end -->", readme, flags=re.S)
    assert block is not None and block.group(1) == markdown_table()
    assert all(setting.variable in help_table() for setting in SETTINGS)
