"""The tree's style, enforced: ruff's checks and formatter over every Python file (ruff.toml),
buildifier's formatting and lint over every Bazel file, the function-length limit, and the map of
tools/ in docs/development.md.

The test reads the checkout itself (through its own file's link), not a declared set of inputs:
every file of the tree counts, including ones no target names yet. It is tagged `external` so
Bazel never serves it from the cache.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BAZEL_FILES = ("BUILD.bazel", "MODULE.bazel", "*.bzl")
# Buildifier's lint warnings that are kept: the docstring warnings ask for Args/Returns sections
# in every private helper, which the rule docs (doc= attributes) already cover.
BUILDIFIER_WARNINGS = (
    "-function-docstring,-function-docstring-header,-function-docstring-args,-function-docstring-return"
)


def _tree(patterns: tuple[str, ...]) -> list[str]:
    files: set[Path] = set()
    for pattern in patterns:
        files.update(ROOT.rglob(pattern))
    return sorted(
        str(path.relative_to(ROOT))
        for path in files
        if not any(part.startswith((".", "bazel-")) or part == "__pycache__" for part in path.relative_to(ROOT).parts)
    )


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_tree_is_found() -> None:
    python = _tree(("*.py",))
    assert {"attest/errors.py", "omni_oci/remote/registry.py", "tests/system/style_test.py"} <= set(python)
    assert {"MODULE.bazel", "tests/oci/BUILD.bazel", "tools/defs.bzl"} <= set(_tree(BAZEL_FILES))


def test_ruff_check_passes() -> None:
    done = _run(sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format=concise", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    done = _run(sys.executable, "-m", "ruff", "format", "--no-cache", "--check", ".")
    assert done.returncode == 0, "run `ruff format` (ruff.toml):\n" + done.stdout + done.stderr


def test_ruff_sees_a_violation(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import os\nx=1\n")
    config = str(ROOT / "ruff.toml")
    check = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", config, "bad.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 1 and "F401" in check.stdout
    form = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--no-cache", "--config", config, "--check", "bad.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert form.returncode == 1


def _buildifier() -> str:
    found = shutil.which("buildifier", path="/usr/local/bin:/usr/bin:/bin")
    if found is None:
        pytest.fail("buildifier is not installed: run tools/setup")
    return found


def test_buildifier_formats_and_lints_every_bazel_file() -> None:
    files = _tree(BAZEL_FILES)
    done = _run(_buildifier(), "--mode=check", "--lint=warn", f"--warnings={BUILDIFIER_WARNINGS}", *files)
    assert done.returncode == 0, "run `buildifier -r .`:\n" + done.stdout + done.stderr


def test_buildifier_sees_a_violation(tmp_path: Path) -> None:
    (tmp_path / "BUILD.bazel").write_text('py_library(name="x",srcs=["b.py","a.py"])\n')
    done = subprocess.run(
        [_buildifier(), "--mode=check", str(tmp_path / "BUILD.bazel")], capture_output=True, text=True
    )
    assert done.returncode != 0


MAX_FUNCTION_LINES = 60


def test_no_function_is_longer_than_the_limit() -> None:
    """A function past MAX_FUNCTION_LINES is asking to be split (the mutation driver's main is
    the one exception: a script of steps)."""
    import ast

    long = []
    for name in _tree(("*.py",)):
        if name.startswith("tools/dev/mutation/") or name.startswith("tools/dev/mutation/"):
            continue
        for node in ast.walk(ast.parse((ROOT / name).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "\n".join(long)


def test_the_map_of_tools_names_every_folder_of_tools_and_only_those() -> None:
    """docs/development.md's map of tools/ and omni_oci/ (a row per package, in four groups)
    equals the tree."""
    import re

    page = (ROOT / "docs" / "development.md").read_text()
    block = page.split("<!-- tools-map:begin -->", 1)[1].split("<!-- tools-map:end -->", 1)[0]
    rows = re.findall(
        r"^\| `((?:tools|omni_oci)/[^`]*)` \| (library|rules|build and release|development only) \|", block, flags=re.M
    )
    mapped = sorted(folder.rstrip("/") for folder, _ in rows)
    folders = sorted(
        {
            str(path.parent.relative_to(ROOT))
            for pattern in ("BUILD.bazel", "*.py", "*.bzl")
            for top in ("tools", "omni_oci")
            for path in ROOT.glob(f"{top}/**/{pattern}")
            if "__pycache__" not in path.parts
        }
    )
    assert mapped == folders, f"docs/development.md's map differs from the tree: {mapped} vs {folders}"
    groups = {folder.rstrip("/"): group for folder, group in rows}
    assert all(groups[folder] == "development only" for folder in folders if folder.startswith("tools/dev"))
    assert all((groups[folder] == "library") == folder.startswith("omni_oci") for folder in folders)
