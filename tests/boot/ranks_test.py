"""boot/checkpoint/ranks.py: with RANK_KEY_FILE, ranks > 0 take only this run's rank 0's verdict (MAC,
group, start, lock, exactly the lock's files, each file's size, mtime, ctime and inode); a
forged, another group's, a stale, a re-planted, an oversized verdict and a forged refusal are
not taken (the rank waits, then names why); rank 0's refusal is shown escaped; without a key
a rank hashes every file itself."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from attest.lock import REFUSED_MARKER, VERIFIED_MARKER
from boot.checkpoint import ranks
from boot.checkpoint.ranks import publish_refusal, wait_for_rank0
from boot.checkpoint.sources import prepare
from boot.errors import BootError
from boot.settings import BootSettings
from tests.fixtures.bounds import ended_long_before
from tests.fixtures.deepseek import SHARDS, boot_env, tiny_repo, write_lock
from tests.fixtures.hub import LoopbackHub
from tests.fixtures.processes import wait_for_line

KEY = "9f" * 32


def _env(base: Path, **extra: str) -> dict[str, str]:
    lock = base / "locks" / "checkpoint.lock.json"
    sha = hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else write_lock(lock, tiny_repo())
    key = base / "secret" / "key"
    key.parent.mkdir(exist_ok=True)
    key.write_text(KEY + "\n")
    keyed = {"RANK_KEY_FILE": str(key), "RANK_GROUP": "group-a", "RANK_WAIT_TIMEOUT_S": "1", "NNODES": "3"}
    return boot_env(base, CHECKPOINT_LOCK=str(lock), CHECKPOINT_LOCK_SHA256=sha, **{**keyed, **extra})


def _rank0(base: Path, **extra: str) -> None:
    with (
        LoopbackHub(tiny_repo()) as hub,
        mock.patch.dict(os.environ, _env(base, HF_ENDPOINT=hub.url, **extra), clear=True),
    ):
        prepare(BootSettings.from_env())


def _rank(base: Path, rank: int = 1, **extra: str) -> None:
    prepare(BootSettings.from_env(_env(base, NODE_RANK=str(rank), **extra)))


def _verdict(base: Path) -> Path:
    return base / "model" / VERIFIED_MARKER


def test_this_runs_verdict_is_taken_with_every_files_identity(tmp_path: Path, capsys) -> None:
    _rank0(tmp_path)
    _rank(tmp_path)
    assert "Rank 1: checkpoint verified by rank 0 against the reviewed lock" in capsys.readouterr().out
    # An in-place edit with the mtime restored: only ctime tells (rank 0 catches it by hashing).
    shard = tmp_path / "model" / SHARDS[1]
    before = shard.stat()
    time.sleep(0.01)
    with shard.open("r+b") as handle:
        handle.write(b"\x03")
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(BootError, match=f"Rank 1: {SHARDS[1]} differs from rank 0's verified view") as refused:
        _rank(tmp_path)
    assert refused.value.field == SHARDS[1] and "within 1 s" in str(refused.value)


def _forge(base: Path, change) -> None:
    document = json.loads(_verdict(base).read_text())
    change(document)
    _verdict(base).write_text(json.dumps(document))


@pytest.mark.parametrize(
    "plant, says",
    [
        # No rank 0 ever ran: zero-filled shards and a verdict naming them, MAC made up.
        ("forged", "its MAC does not match RANK_KEY_FILE's key"),
        ("another key", "its MAC does not match RANK_KEY_FILE's key"),
        ("another group", "it is for group 'group-a', this rank's is 'group-b'"),
        ("stale", "it is stale: its rank 0 started"),
        ("re-planted", f"{SHARDS[0]} differs from rank 0's verified view"),
        ("other files", "its MAC does not match"),
        ("oversized", "rank 0's verdict cannot be read"),
    ],
)
def test_a_verdict_that_is_not_this_runs_rank_0s_is_not_taken(tmp_path: Path, plant: str, says: str) -> None:
    _rank0(tmp_path)
    extra: dict[str, str] = {}
    later = mock.patch("boot.checkpoint.ranks.RUN_STARTED_NS", ranks.RUN_STARTED_NS)
    if plant == "forged":
        for name in SHARDS:
            path = tmp_path / "model" / name
            path.write_bytes(bytes(path.stat().st_size))
        _forge(tmp_path, lambda d: d.update(mac="ab" * 32))
    elif plant == "another key":
        extra = {"RANK_KEY_FILE": str(tmp_path / "other-key")}
        (tmp_path / "other-key").write_text("00" * 32)
    elif plant == "another group":
        extra = {"RANK_GROUP": "group-b"}
    elif plant == "stale":  # this rank started 1000 s after that rank 0: an earlier run's verdict
        later = mock.patch("boot.checkpoint.ranks.RUN_STARTED_NS", time.time_ns() + 1000 * 10**9)
    elif plant == "re-planted":  # the verdict of a run whose files were replaced since
        kept = tmp_path / "kept-verdict.json"
        shutil.copy(_verdict(tmp_path), kept)
        shard = tmp_path / "model" / SHARDS[0]
        shard.unlink()
        shard.write_bytes(b"\x01" * 4096)  # the same bytes: a new inode, not what rank 0 verified
        _verdict(tmp_path).write_bytes(kept.read_bytes())
    elif plant == "other files":
        _forge(tmp_path, lambda d: d["files"].update({"extra.safetensors": d["files"][SHARDS[0]]}))
    else:
        _forge(tmp_path, lambda d: d.update(padding="x" * (8 << 20)))
    with later, pytest.raises(BootError, match="no verified checkpoint from rank 0") as refused:
        _rank(tmp_path, **extra)
    assert says in str(refused.value), str(refused.value)


def _wait_while_planting(tmp_path: Path, data: bytes) -> BootError:
    """Rank 1 waiting while `data` appears as rank 0's refusal; what it refused with."""
    worker = BootSettings.from_env(_env(tmp_path, NODE_RANK="1"))

    def plant_later() -> None:
        time.sleep(0.2)
        (tmp_path / "model" / REFUSED_MARKER).write_bytes(data)

    planter = threading.Thread(target=plant_later)
    planter.start()
    try:
        with pytest.raises(BootError) as refused:
            wait_for_rank0(worker, None, poll_s=0.05)
    finally:
        planter.join()
    return refused.value


def test_a_refusal_counts_only_when_it_is_rank_0s_and_is_shown_escaped(tmp_path: Path, capsys) -> None:
    (tmp_path / "model").mkdir()
    publish_refusal(
        BootSettings.from_env(_env(tmp_path)), BootError("bidi \u202eevil\u202c and\nlines", field="a\u202eb")
    )
    genuine = (tmp_path / "model" / REFUSED_MARKER).read_bytes()
    (tmp_path / "model" / REFUSED_MARKER).unlink()
    forged = json.loads(genuine) | {"error": "forged", "mac": "cd" * 32}
    timed_out = _wait_while_planting(tmp_path, json.dumps(forged).encode())
    assert "no verified checkpoint" in str(timed_out)  # a planted refusal does not stop the rank
    assert "ignoring" in capsys.readouterr().err
    (tmp_path / "model" / REFUSED_MARKER).unlink()
    refused = _wait_while_planting(tmp_path, genuine)
    message = str(refused)
    assert "rank 0 refused the checkpoint" in message and "\\u202e" in message and "\u202e" not in message
    assert "\n" not in message.split("rank 0 refused")[1] and refused.field == "a\\u202eb"


def test_without_a_key_each_rank_hashes_every_file(tmp_path: Path, capsys) -> None:
    _rank0(tmp_path, RANK_KEY_FILE="")
    _rank(tmp_path, RANK_KEY_FILE="")
    assert "checkpoint hashed by this rank (no RANK_KEY_FILE" in capsys.readouterr().out
    shard = tmp_path / "model" / SHARDS[0]
    shard.write_bytes(bytes(shard.stat().st_size))
    with pytest.raises(BootError, match=f"Hash mismatch: {SHARDS[0]}"):
        _rank(tmp_path, RANK_KEY_FILE="")


@pytest.mark.parametrize(
    "where, content, says",
    [
        ("model/key", KEY, "is inside MODEL_PATH"),
        ("short-key", "abc", "holds 3 bytes; expected at least 32"),
        ("missing-key", None, "RANK_KEY_FILE"),
    ],
)
def test_a_bad_key_file_is_refused_naming_it(tmp_path: Path, where: str, content: str | None, says: str) -> None:
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is not None:
        path.write_text(content)
    with pytest.raises(BootError, match=says) as refused:
        _rank(tmp_path, RANK_KEY_FILE=str(path))
    assert refused.value.field == "RANK_KEY_FILE"


@pytest.mark.parametrize("keyed", [True, False], ids=["with a key", "without a key"])
def test_a_rank_starting_after_rank_0_refused_in_this_run_refuses_at_once(tmp_path: Path, keyed: bool) -> None:
    """Not after RANK_WAIT_TIMEOUT_S: rank 0's refusal of this run is already there."""
    (tmp_path / "model").mkdir()
    unkeyed = {} if keyed else {"RANK_KEY_FILE": "", "RANK_GROUP": ""}
    publish_refusal(BootSettings.from_env(_env(tmp_path, **unkeyed)), BootError("Hash mismatch", field=SHARDS[0]))
    started = time.monotonic()
    with pytest.raises(BootError, match="rank 0 refused the checkpoint") as refused:
        _rank(tmp_path, RANK_WAIT_TIMEOUT_S="600", **unkeyed)
    assert refused.value.field == SHARDS[0]
    ended_long_before(time.monotonic() - started, 600, what="rank 0's refusal")


@pytest.mark.parametrize("keyed", [True, False], ids=["with a key", "without a key"])
def test_an_earlier_runs_refusal_is_still_ignored(tmp_path: Path, capsys, keyed: bool) -> None:
    (tmp_path / "model").mkdir()
    unkeyed = {} if keyed else {"RANK_KEY_FILE": "", "RANK_GROUP": ""}
    with mock.patch("boot.checkpoint.ranks.RUN_STARTED_NS", time.time_ns() - 3600 * 10**9):  # rank 0 of an hour ago
        publish_refusal(BootSettings.from_env(_env(tmp_path, **unkeyed)), BootError("old", field=SHARDS[0]))
    marker = tmp_path / "model" / REFUSED_MARKER
    old = time.time_ns() - 3600 * 10**9
    os.utime(marker, ns=(old, old))
    with pytest.raises(BootError, match="no verified checkpoint from rank 0") as refused:
        _rank(tmp_path)
    assert refused.value.field == "RANK_WAIT_TIMEOUT_S"
    assert "ignoring" in capsys.readouterr().err


def test_a_stop_signal_ends_a_waiting_rank_at_once(tmp_path: Path) -> None:
    """As PID 1 of its pod a rank gets no default action for SIGTERM: without boot's handler the
    signal is dropped and the pod takes its whole grace period to stop. Here the rank waits for
    rank 0 (600 s allowed) and SIGTERM ends it at once, exit 143, one JSON line naming it. The
    signal goes only once the rank says it is waiting (its handlers are installed before that)."""
    import subprocess
    import sys

    env = {**_env(tmp_path, NODE_RANK="1", RANK_WAIT_TIMEOUT_S="600"), "PYTHONPATH": os.pathsep.join(sys.path)}
    (tmp_path / "model").mkdir()
    rank = subprocess.Popen([sys.executable, "-m", "boot", "prepare"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        said = wait_for_line(rank, "waiting for rank 0's verdict")
        started = time.monotonic()
        rank.send_signal(15)
        code = rank.wait(timeout=120)
        took = time.monotonic() - started
    finally:
        rank.kill()
    stderr = said + (rank.stderr.read() if rank.stderr else "")
    # Ended by the signal, long before the 600 s wait it would otherwise do.
    assert code == 143, (code, took, stderr[-2000:])
    ended_long_before(took, 600, what="SIGTERM")
    assert json.loads(stderr.strip().splitlines()[-1]) == {
        "ok": False,
        "error": "boot: stopped by SIGTERM",
        "field": "signal",
    }
