"""No standard-library API newer than the oldest supported Python (Debian 12's 3.11).

vermin reads every Python file of the project in this test's runfiles (the product, the
build tools and the tests) and fails naming the file, the API and the version it needs.
It knows only what arrived in a minor release; an API that arrived in a later 3.11 patch
release (extraction filters, 3.11.4) is caught by the `*_oldest_python` twins, which run the
suites under Debian 12's own 3.11.2 (tools/private/pytest_runner.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

OLDEST = "3.11"
# Files every scan must include: the scan is of the whole project, not of what happens to be here.
EXPECTED = [
    "launcher/__main__.py",
    "boot/cli.py",
    "attest/reader.py",
    "omni_oci/format/tar_members.py",
    "tools/oci/push.py",
    "tools/gate/cli.py",
    "tools/deploy/manifests.py",
    "tools/private/pytest_runner.py",
    "tools/private/wheel_unpack.py",
    "tools/private/pypi_repo.py",
    "tools/lock_python",
    "tests/system/oldest_python_test.py",
    "tests/fixtures/oci.py",
]


def _project_root() -> Path:
    return Path(os.environ["TEST_SRCDIR"]) / os.environ.get("TEST_WORKSPACE", "_main")


def _python_files(root: Path) -> list[Path]:
    files = [path for path in root.rglob("*.py") if "external" not in path.relative_to(root).parts[:1]]
    return sorted(files + [root / "tools/lock_python"])


def _vermin(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from vermin.main import main; sys.exit(main())",
            "--no-tips",
            f"-t={OLDEST}-",
            "--violations",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_project_uses_no_api_newer_than_the_oldest_python() -> None:
    root = _project_root()
    files = _python_files(root)
    relative = {str(path.relative_to(root)) for path in files}
    assert not [name for name in EXPECTED if name not in relative], "the scan misses project files"
    assert len(files) > 150
    scanned = _vermin(*files)
    assert scanned.returncode == 0, f"needs a Python newer than {OLDEST}:\n{scanned.stdout}{scanned.stderr}"


@pytest.mark.parametrize(
    "source, api",
    [
        ("import itertools\nprint(itertools.batched([1, 2], 1))\n", "itertools.batched"),
        ("from typing import override\n", "typing.override"),
        ("import pathlib\npathlib.Path('.').walk()\n", "walk"),
        ("type Alias = int\n", "type alias"),
    ],
)
def test_an_api_newer_than_the_oldest_python_is_named(tmp_path: Path, source: str, api: str) -> None:
    newer = tmp_path / "newer.py"
    newer.write_text(source)
    scanned = _vermin(newer)
    assert scanned.returncode == 1 and api in scanned.stdout and "3.12" in scanned.stdout, scanned.stdout
