"""Every command that writes a path the user chose never replaces something it did not write:
a foreign file there is refused, named, and left byte for byte as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from tests.fixtures.qwen import SPECULATOR_REVISION, TARGET_REVISION, VLLM_COMMIT, make_checkpoint

NOTES = b"my notes: do not lose these\n"


def _attestation(tmp_path: Path, target: Path) -> int:
    from launcher import build_attestation

    make_checkpoint(tmp_path / "model")
    return build_attestation.main([str(tmp_path / "model"), "--revision", TARGET_REVISION, "--output", str(target)])


def _lock(tmp_path: Path, target: Path) -> int:
    from boot.lock_command import main as lock_main

    # --force is the user's "replace it": still only a lock is replaced. No hub is contacted first.
    with mock.patch.dict(os.environ, {"HF_ENDPOINT": "http://127.0.0.1:9"}):
        return lock_main(["--output", str(target), "--force"])


def _gate(tmp_path: Path, target: Path) -> int:
    from tools.gate import cli

    return cli.main(
        [
            "--ar-url",
            "http://127.0.0.1:9",
            "--spec-url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--target-revision",
            TARGET_REVISION,
            "--speculator-revision",
            SPECULATOR_REVISION,
            "--engine-commit",
            VLLM_COMMIT,
            "--output",
            str(target),
        ]
    )


def _deploy(tmp_path: Path, target: Path) -> int:
    """The manifests generator (a Bazel runner), its refusal passed on to this test's stderr."""
    runner = os.environ["QWEN_MANIFESTS"]
    flags = ["--repository", "r.example/q", "--model-pvc", "m", "--output", str(target)]
    done = subprocess.run([runner, *flags], capture_output=True, text=True, timeout=120)
    sys.stderr.write(done.stderr)
    return done.returncode


def _status_file(tmp_path: Path, target: Path) -> int:
    """`boot run` whose OMNI_STATUS_FILE names the user's file: refused at start-up, before any
    other work (the hub is a closed loopback port, so nothing else could go anywhere)."""
    from boot.cli import main as boot_main
    from tests.fixtures.deepseek import boot_env

    env = boot_env(tmp_path, OMNI_STATUS_FILE=str(target), HF_ENDPOINT="http://127.0.0.1:9")
    with mock.patch.dict(os.environ, env, clear=True):
        return boot_main(["run"])


def _output_dir(tmp_path: Path, target: Path) -> int:
    """The manifests as a kustomize base into the directory holding the user's file."""
    runner = os.environ["QWEN_MANIFESTS"]
    flags = ["--repository", "r.example/q", "--model-pvc", "m", "--output-dir", str(target.parent)]
    done = subprocess.run([runner, *flags], capture_output=True, text=True, timeout=120)
    sys.stderr.write(done.stderr)
    return done.returncode


def _gate_results(tmp_path: Path, target: Path) -> int:
    return _gate(tmp_path, target.with_name(target.name.removesuffix(".results.json")))


@pytest.mark.parametrize(
    "command, name, field",
    [
        (_attestation, "notes.json", "--output"),
        (_lock, "notes.json", "--output"),
        (_gate, "notes.json", "--output"),
        (_gate_results, "gate.json.results.json", "--output"),
        (_deploy, "notes.yaml", "--output"),
        (_status_file, "notes.json", "OMNI_STATUS_FILE"),
        (_output_dir, "base/notes.yaml", "--output-dir"),
    ],
)
@pytest.mark.parametrize("foreign", [NOTES, b'{"mine": true}\n'])
def test_a_foreign_file_at_the_output_is_refused_and_kept(
    tmp_path: Path, capsys, command, name: str, field: str, foreign: bytes
) -> None:
    target = tmp_path / name
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(foreign)
    assert command(tmp_path, target) == 2
    refusal = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert refusal["field"] == field and "left as it is" in refusal["error"]
    assert str(target) in refusal["error"] or (
        str(target.parent) in refusal["error"] and target.name in refusal["error"]
    )
    assert target.read_bytes() == foreign


def test_an_earlier_attestation_is_replaced(tmp_path: Path, capsys) -> None:
    target = tmp_path / "attestation.json"
    assert _attestation(tmp_path, target) == 0
    first = target.read_bytes()
    assert _attestation(tmp_path, target) == 0 and target.read_bytes() == first


FULL_DISK = """
import sys
from pathlib import Path
from tests.system.no_data_loss_test import _attestation
work, disk = Path(sys.argv[1]), Path(sys.argv[2])
target = disk / "attestation.json"
assert _attestation(work, target) == 0
earlier = target.read_bytes()
try:
    with open(disk / "filler", "wb") as filler:  # the disk fills up
        while True:
            filler.write(b"\\0" * 4096)
            filler.flush()
except OSError:
    pass
(work / "model" / "config.json").write_text('{"changed": true}')  # so the new attestation differs
code = _attestation(work, target)
print(code, target.read_bytes() == earlier, sorted(p.name for p in disk.iterdir()))
"""


def test_a_full_disk_at_the_output_keeps_the_earlier_file_whole(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"a small tmpfs needs root (mount in a namespace of its own); this runs as uid {os.geteuid()}")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = f'mount -t tmpfs -o size=256k tmpfs {disk} && exec {sys.executable} -c "$0" {tmp_path} {disk}'
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(["unshare", "-m", "sh", "-c", script, FULL_DISK], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    code, kept, names = done.stdout.strip().splitlines()[-1].split(" ", 2)
    assert (code, kept) == ("2", "True"), done.stdout + done.stderr[-2000:]
    assert names == "['attestation.json', 'filler']"  # no temporary file left behind
    assert "No space left on device" in done.stderr and '"field": "--output"' in done.stderr
