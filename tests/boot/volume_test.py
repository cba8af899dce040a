"""MODEL_SOURCE=image: the checkpoint as a read-only image volume (a read-only bind mount in a
mount namespace of the test's own, as the runtime mounts the model artifact). Every rank
verifies its own copy without waiting for rank 0 and writes nothing there; a writable root, a
missing, changed or extra file, another artifact's lock and SKIP_VERIFY are refused by name."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attest.lock import ARTIFACT_LOCK
from boot.checkpoint.receipt import RECEIPT
from tests.fixtures.deepseek import SHARDS, boot_env, tiny_repo, write_lock


def _volume(base: Path) -> dict[str, str]:
    """The files of the tiny checkpoint and its lock, laid out as the artifact's image volume."""
    repo = tiny_repo()
    source = base / "volume"
    for name, data in repo.files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    lock = base / "locks" / "checkpoint.lock.json"
    sha = write_lock(lock, repo)
    (source / ARTIFACT_LOCK).write_bytes(lock.read_bytes())
    return {"CHECKPOINT_LOCK": str(lock), "CHECKPOINT_LOCK_SHA256": sha, "MODEL_SOURCE": "image"}


def _boot(base: Path, settings: dict[str, str], *, read_only: bool = True, command: str = "prepare", then: str = ""):
    if os.geteuid() != 0:
        pytest.fail(f"a read-only bind mount needs root (in a namespace of its own); this runs as uid {os.geteuid()}")
    model = base / "model"
    model.mkdir(exist_ok=True)
    env = {**boot_env(base, **settings), "PYTHONPATH": os.pathsep.join(sys.path)}
    mount = f"mount --bind {shlex.quote(str(base / 'volume'))} {shlex.quote(str(model))}"
    if read_only:
        mount += f" && mount -o remount,ro,bind {shlex.quote(str(model))}"
    if then:
        mount += f" && {then}"
    script = f"{mount} && exec {shlex.quote(sys.executable)} -m boot {command}"
    return subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=120)


def _refusal(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 2, done.stderr[-2000:]
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_every_rank_verifies_its_own_read_only_copy_and_writes_nothing_there(tmp_path: Path) -> None:
    settings = _volume(tmp_path)
    before = sorted(p.name for p in (tmp_path / "volume").rglob("*"))
    for rank in ("0", "2"):  # rank 2 does not wait for a verdict from rank 0: there is none
        base = tmp_path
        done = _boot(base, {**settings, "NNODES": "3", "NODE_RANK": rank, "RANK_WAIT_TIMEOUT_S": "1"})
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"verifying the image volume at {base / 'model'} (rank {rank})" in done.stderr
    assert sorted(p.name for p in (tmp_path / "volume").rglob("*")) == before
    receipt = json.loads((tmp_path / "state" / RECEIPT).read_text())
    assert sorted(receipt["files"]) == sorted(tiny_repo().files)
    verified = _boot(tmp_path, settings, command="verify --full")
    assert verified.returncode == 0, verified.stderr[-2000:]


def _missing(volume: Path) -> None:
    (volume / SHARDS[1]).unlink()


def _changed(volume: Path) -> None:
    (volume / SHARDS[0]).write_bytes(b"\x00" * 4096)


def _extra(volume: Path) -> None:
    (volume / "notes.bak").write_text("not in the lock")


def _other_lock(volume: Path) -> None:
    (volume / ARTIFACT_LOCK).write_bytes(
        (volume / ARTIFACT_LOCK).read_bytes().replace(b"reviewed", b"trust-on-first-use")
    )


@pytest.mark.parametrize(
    ("spoil", "field", "says"),
    [
        (_missing, SHARDS[1], "missing"),
        (_changed, SHARDS[0], "Hash mismatch"),
        (_extra, "notes.bak", "does not list"),
        (_other_lock, ARTIFACT_LOCK, "another checkpoint lock"),
    ],
    ids=["missing", "changed", "extra", "another-artifact"],
)
def test_a_volume_that_is_not_the_lock_is_refused_naming_the_file(tmp_path: Path, spoil, field: str, says: str) -> None:
    settings = _volume(tmp_path)
    spoil(tmp_path / "volume")
    refusal = _refusal(_boot(tmp_path, settings))
    assert refusal["field"] == field and says in refusal["error"], refusal


def test_a_writable_root_or_a_skip_is_refused_with_an_image_source(tmp_path: Path) -> None:
    settings = _volume(tmp_path)
    refusal = _refusal(_boot(tmp_path, settings, read_only=False))
    assert refusal["field"] == "MODEL_SOURCE" and "mounted writable" in refusal["error"]
    for variable in ("SKIP_VERIFY", "SKIP_PREPARE"):
        for command in ("prepare", "verify"):
            refusal = _refusal(_boot(tmp_path, {**settings, variable: "1"}, command=command))
            assert refusal["field"] == variable and "cannot be used with MODEL_SOURCE=image" in refusal["error"]
    refusal = _refusal(_boot(tmp_path, {**settings, "MODEL_SOURCE": "volume"}))
    assert refusal["field"] == "MODEL_SOURCE" and "hub, image, registry" in refusal["error"]


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_a_file_mounted_over_part_of_the_volume_is_refused_naming_it(tmp_path: Path, read_only: bool) -> None:
    """The same bytes, but on a mount of its own: writable, it could change after verification."""
    settings = _volume(tmp_path)
    planted = tmp_path / "planted.safetensors"
    planted.write_bytes((tmp_path / "volume" / SHARDS[0]).read_bytes())
    target = shlex.quote(str(tmp_path / "model" / SHARDS[0]))
    then = f"mount --bind {shlex.quote(str(planted))} {target}"
    if read_only:
        then += f" && mount -o remount,ro,bind {target}"
    refusal = _refusal(_boot(tmp_path, settings, then=then))
    assert refusal["field"] == "MODEL_PATH" and f"{SHARDS[0]} under MODEL_PATH" in refusal["error"], refusal
    assert ("(writable)" in refusal["error"]) is not read_only


def test_a_mount_point_whose_name_mountinfo_escapes_is_named_as_it_is(tmp_path: Path) -> None:
    """proc(5) writes a space in a mount point as \\040: the refusal names the file itself."""
    settings = _volume(tmp_path)
    (tmp_path / "volume" / "notes v2.txt").write_text("planted over")
    (tmp_path / "planted").write_text("writable")
    then = (
        f"mount --bind {shlex.quote(str(tmp_path / 'planted'))} {shlex.quote(str(tmp_path / 'model' / 'notes v2.txt'))}"
    )
    refusal = _refusal(_boot(tmp_path, settings, then=then))
    assert refusal["field"] == "MODEL_PATH" and "notes v2.txt under MODEL_PATH" in refusal["error"], refusal
