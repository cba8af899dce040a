"""`oci_load`'s runner as a user runs it: with neither docker nor podman on PATH it names what is
missing and the tarball to load elsewhere; with podman (tools/setup installs it) the tarball
loads. podman here keeps its own storage (tests/fixtures/podman.py) and needs real uids, so
this target runs outside Bazel's sandbox."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def _path_without(tmp_path: Path, *missing: str) -> str:
    """A PATH holding every program of the system directories but `missing` (set-up installs
    podman, so the refusal is shown on a PATH that lacks it, not on a machine that does)."""
    shown = tmp_path / "bin"
    shown.mkdir()
    for folder in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        for program in Path(folder).iterdir():
            if program.name not in missing and not (shown / program.name).exists():
                (shown / program.name).symlink_to(program)
    return str(shown)


def test_bazel_run_of_the_load_target_names_what_is_missing(tmp_path: Path) -> None:
    completed = subprocess.run(
        ["images/qwen_mi300x_load.load.sh"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PATH": _path_without(tmp_path, "docker", "podman"),
            "BUILD_WORKING_DIRECTORY": str(tmp_path),
        },
    )
    assert completed.returncode == 2, completed.stderr
    refusal = json.loads(completed.stderr.strip().splitlines()[-1])
    assert refusal["field"] == "PATH" and "neither docker nor podman is on PATH" in refusal["error"]
    assert "qwen_mi300x_load.tar" in refusal["error"]


def test_podman_loads_the_tarball() -> None:
    from tests.fixtures.podman import Podman

    engine = Podman(driver="vfs")  # storage of its own: the host's is never touched
    try:
        loaded = engine("load", "--input", "images/qwen_mi300x_load.tar", check=False)
        assert loaded.returncode == 0, loaded.stderr
        assert "omni/qwen_mi300x:latest" in loaded.stdout + loaded.stderr
    finally:
        engine.close()
