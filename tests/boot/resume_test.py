"""boot prepare's downloads resume after a cut, a reset, a stall, a refused range, another
ETag, a SIGKILL and a full disk: each row checks the exit, the bytes the hub sent again, and
that no partial or tampered file is ever placed (the lock decides, never the partial file)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from unittest import mock

import pytest

from attest.lock import PARTIAL_DIR
from boot.checkpoint.download import download_progress
from boot.checkpoint.sources import prepare
from boot.errors import BootError
from boot.settings import BootSettings
from tests.fixtures.bounds import ended_by_deadline, ended_long_before
from tests.fixtures.deepseek import SHARDS, boot_env, tiny_repo, write_lock
from tests.fixtures.fault_proxy import FaultProxy, Step, Trickler
from tests.fixtures.hub import HubRepo, LoopbackHub, hub_in_child

SHARD = SHARDS[0]
SHARD_BYTES = 8 << 20
# What a cut may cost beyond the shard: the bytes in flight (one network read) and headers.
CUT_ALLOWANCE = 192 << 10


def _repo(**knobs) -> HubRepo:
    repo = tiny_repo()
    repo.files[SHARD] = random.Random(7).randbytes(SHARD_BYTES)  # incompressible, fixed
    for key, value in knobs.items():
        setattr(repo, key, value)
    return repo


def _env(base: Path, endpoint: str, **extra: str) -> dict[str, str]:
    lock = base / "locks" / "checkpoint.lock.json"
    sha = write_lock(lock, _repo())
    settings = {"DOWNLOAD_WORKERS": "1", "DOWNLOAD_STALL_S": "1", **extra}
    return boot_env(base, HF_ENDPOINT=endpoint, CHECKPOINT_LOCK=str(lock), CHECKPOINT_LOCK_SHA256=sha, **settings)


def _prepare(base: Path, endpoint: str, **extra: str):
    with mock.patch.dict(os.environ, _env(base, endpoint, **extra), clear=True):
        return prepare(BootSettings.from_env())


def _total() -> int:
    return sum(len(data) for data in _repo().files.values())


def _assert_complete(base: Path) -> None:
    for name, data in _repo().files.items():
        assert (base / "model" / name).read_bytes() == data, name
    assert not (base / "model" / PARTIAL_DIR).exists()


@pytest.mark.parametrize(
    "step",
    [Step("cut", after=4 << 20), Step("reset", after=4 << 20), Step("stall", after=4 << 20, stall_s=3)],
    ids=["cut", "reset", "stall"],
)
def test_a_broken_connection_costs_only_what_was_in_flight(tmp_path: Path, step: Step, capsys) -> None:
    with LoopbackHub(_repo()) as hub, FaultProxy(("127.0.0.1", hub.port), [step]) as proxy:
        report = _prepare(tmp_path, proxy.url)
        assert proxy.to_client <= _total() + CUT_ALLOWANCE, proxy.to_client - _total()
        first, resumed = hub.ranges[SHARD]
        assert first == 0 and (4 << 20) - CUT_ALLOWANCE <= resumed <= 4 << 20
    assert report.downloaded == 5
    _assert_complete(tmp_path)
    assert "download attempt 1/3 failed" in capsys.readouterr().err


def test_a_hub_that_ignores_the_range_restarts_the_file_and_still_verifies(tmp_path: Path, capsys) -> None:
    with LoopbackHub(_repo(ignores_range=True)) as hub:
        with FaultProxy(("127.0.0.1", hub.port), [Step("cut", after=4 << 20)]) as proxy:
            _prepare(tmp_path, proxy.url)
        assert hub.ranges[SHARD] == [0, 0]
    _assert_complete(tmp_path)
    assert "ignored the range: starting again from byte 0" in capsys.readouterr().err


def test_another_etag_on_resume_restarts_the_file(tmp_path: Path, capsys) -> None:
    with LoopbackHub(_repo(other_etag_on_range={SHARD})) as hub:
        with FaultProxy(("127.0.0.1", hub.port), [Step("cut", after=4 << 20)]) as proxy:
            _prepare(tmp_path, proxy.url)
        assert hub.ranges[SHARD][0] == 0 and hub.ranges[SHARD][-1] == 0 and len(hub.ranges[SHARD]) == 3
    _assert_complete(tmp_path)
    assert "does not continue byte" in capsys.readouterr().err


def _partial_files(base: Path) -> list[Path]:
    return sorted((base / "model" / PARTIAL_DIR).glob("*.part"))


def _failed_run(base: Path, hub: LoopbackHub) -> int:
    """One run that gives up after a cut, keeping its partial file; its size."""
    with FaultProxy(("127.0.0.1", hub.port), [Step("cut", after=3 << 20)]) as proxy:
        with pytest.raises(BootError, match="its partial file is kept"):
            _prepare(base, proxy.url, DOWNLOAD_ATTEMPTS="1")
    assert not (base / "model" / SHARD).exists()  # never placed half-written
    (part,) = _partial_files(base)
    return part.stat().st_size


def test_the_next_run_resumes_a_kept_partial_file(tmp_path: Path, capsys) -> None:
    with LoopbackHub(_repo()) as hub:
        kept = _failed_run(tmp_path, hub)
        _prepare(tmp_path, hub.url)
        assert hub.ranges[SHARD] == [0, kept]
    _assert_complete(tmp_path)
    assert f"{SHARD}: resuming at byte {kept} of {SHARD_BYTES}" in capsys.readouterr().err


def test_a_tampered_partial_file_is_never_placed(tmp_path: Path, capsys) -> None:
    with LoopbackHub(_repo()) as hub:
        _failed_run(tmp_path, hub)
        (part,) = _partial_files(tmp_path)
        with part.open("r+b") as handle:
            handle.write(b"\xff" * 16)  # whoever can write the volume changed the prefix
        _prepare(tmp_path, hub.url)
        assert hub.ranges[SHARD][-1] == 0  # the whole file again, after the mismatch
    _assert_complete(tmp_path)
    assert "the hub served other bytes" in capsys.readouterr().err


def _plant(kind: str, part: Path, victim: Path) -> None:
    part.unlink()
    if kind == "hard link":
        os.link(victim, part)
    elif kind == "symlink":
        part.symlink_to(victim)
    else:
        os.mkfifo(part)


# Issue #68: whatever stands under a partial file's name is removed and the file made anew
# (exclusively, never through a link), and the file elsewhere stays as it was.
@pytest.mark.parametrize("kind", ["hard link", "symlink", "fifo"])
def test_a_partial_file_is_never_written_through_what_was_planted(tmp_path: Path, kind: str) -> None:
    victim = tmp_path / "precious"
    victim.write_bytes(b"the user's own file")
    with LoopbackHub(_repo()) as hub:
        _failed_run(tmp_path, hub)
        (part,) = _partial_files(tmp_path)
        _plant(kind, part, victim)
        _prepare(tmp_path, hub.url)
        assert hub.ranges[SHARD][-1] == 0  # nothing resumed from what was planted
    _assert_complete(tmp_path)
    assert victim.read_bytes() == b"the user's own file" and victim.stat().st_nlink == 1


def test_a_partial_file_with_no_matching_record_starts_from_zero(tmp_path: Path) -> None:
    with LoopbackHub(_repo()) as hub:
        _failed_run(tmp_path, hub)
        for record in (tmp_path / "model" / PARTIAL_DIR).glob("*.part.json"):
            record.write_text(json.dumps({"digest": "0" * 64, "size": 1, "etag": ""}))
        _prepare(tmp_path, hub.url)
        assert hub.ranges[SHARD][-1] == 0
    _assert_complete(tmp_path)


def test_boot_killed_mid_shard_resumes_where_its_file_ends(tmp_path: Path) -> None:
    with LoopbackHub(_repo(rate_bytes_s=4 << 20)) as hub:
        env = {**_env(tmp_path, hub.url), "PYTHONPATH": os.pathsep.join(sys.path)}
        child = subprocess.Popen([sys.executable, "-m", "boot", "prepare"], env=env, stderr=subprocess.DEVNULL)
        seen, deadline = 0, time.monotonic() + 300  # an event wait, sized for a loaded machine
        while seen < 3 << 20 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
            parts = _partial_files(tmp_path)
            seen = parts[0].stat().st_size if parts else 0
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert seen >= 3 << 20 and not (tmp_path / "model" / SHARD).exists()
        _prepare(tmp_path, hub.url)
        resumed = hub.ranges[SHARD][-1]
        assert resumed >= seen  # sent again: at most what was in flight when it died
    _assert_complete(tmp_path)


def test_a_hub_killed_and_started_again_mid_file_is_resumed(tmp_path: Path, capsys) -> None:
    repo = _repo(rate_bytes_s=4 << 20)
    with hub_in_child(repo) as first, FaultProxy(("127.0.0.1", first.port), []) as proxy:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                _prepare(tmp_path, proxy.url, DOWNLOAD_STALL_S="2")
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        seen, deadline = 0, time.monotonic() + 300  # an event wait, sized for a loaded machine
        while seen < 3 << 20 and time.monotonic() < deadline:
            time.sleep(0.05)
            parts = _partial_files(tmp_path)
            seen = parts[0].stat().st_size if parts else 0
        first.process.kill()  # SIGKILL: its connections die with it
        first.process.join(10)
        with hub_in_child(repo, port=first.port):
            runner.join(60)
        sent = proxy.to_client
    assert errors == [] and not runner.is_alive()
    assert sent <= _total() + (1 << 20), sent - _total()  # what was in flight, not the file again
    _assert_complete(tmp_path)
    assert "download attempt 1/3 failed" in capsys.readouterr().err


def test_a_full_disk_keeps_the_partial_file_and_names_the_file(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"a small tmpfs needs root (mount in a namespace of its own); this runs as uid {os.geteuid()}")
    model = tmp_path / "model"
    model.mkdir()
    with LoopbackHub(_repo()) as hub:
        env = {**_env(tmp_path, hub.url), "PYTHONPATH": os.pathsep.join(sys.path)}
        script = f"mount -t tmpfs -o size=6m tmpfs {model} && exec {sys.executable} -m boot prepare"
        done = subprocess.run(
            ["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 2, done.stderr[-2000:]
    refusal = json.loads(done.stderr.strip().splitlines()[-1])
    assert refusal["field"] == SHARD and "No space left on device" in refusal["error"], refusal
    assert "its partial file is kept" in refusal["error"]


def test_a_hub_trickling_its_answer_is_bounded_by_the_download_deadline(tmp_path: Path) -> None:
    """A hub sending a header byte every 0.1 s: DOWNLOAD_DEADLINE_S=1 ends prepare, whatever the stall limit."""
    with Trickler(0.1) as hub:
        started = time.monotonic()
        with pytest.raises(BootError, match="passed its deadline") as refused:
            _prepare(tmp_path, hub.url, DOWNLOAD_STALL_S="60", DOWNLOAD_DEADLINE_S="1")
        # The deadline, not the 60 s stall limit (the trickle itself would go on for hours).
        ended_by_deadline(time.monotonic() - started, 1, 60, started_with_it=False)
    assert refused.value.field == "deadline"


@pytest.mark.parametrize("status", [429, 503])
def test_the_hubs_retry_after_is_waited_for(tmp_path: Path, status: int, capsys) -> None:
    with LoopbackHub(_repo(failures_before_success={SHARD: 1}, failure=(status, "2"))) as hub:
        _prepare(tmp_path, hub.url)
        throttled, again = hub.asked_at[SHARD][:2]
    assert again - throttled >= 2.0  # not the 1 s backoff of an attempt without Retry-After
    _assert_complete(tmp_path)
    assert "waiting 2 s, as the hub's Retry-After asks" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["300", "Wed, 21 Oct 2099 07:28:00 GMT"], ids=["seconds", "an HTTP-date"])
def test_a_retry_after_past_the_download_deadline_is_refused_naming_it(tmp_path: Path, value: str) -> None:
    with LoopbackHub(_repo(failures_before_success={SHARD: 1}, failure=(429, value))) as hub:
        started = time.monotonic()
        with pytest.raises(BootError, match=r"asks to retry after .* \(Retry-After\), past the download's deadline"):
            _prepare(tmp_path, hub.url, DOWNLOAD_DEADLINE_S="100")
        assert len(hub.asked_at[SHARD]) == 1
        # Refused at once: neither the Retry-After waited for nor the 100 s deadline run out.
        ended_long_before(time.monotonic() - started, 100, what="the refusal of a Retry-After past the deadline")
    assert not (tmp_path / "model" / SHARD).exists()


def test_a_socks_proxy_is_refused_naming_its_variable(tmp_path: Path) -> None:
    with LoopbackHub(_repo()) as hub, pytest.raises(BootError, match="only http\\(s\\) proxies") as refused:
        _prepare(tmp_path, hub.url, ALL_PROXY="socks5://127.0.0.1:1080", NO_PROXY="")
    assert refused.value.field == "ALL_PROXY"


def test_progress_counts_hashed_bytes_only(capsys) -> None:
    gb = 1_000_000_000
    progress = download_progress(gb, 1, enabled=True)
    progress.add_resumed(gb * 4 // 10)
    for count in (gb * 3 // 10, -gb * 7 // 10, gb):  # a restart from byte 0 gives its bytes back
        progress.last = 0
        progress.add(count)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("downloading checkpoint")]
    done = [line.split(", ")[1].split(" GB")[0] for line in lines]
    assert done == ["0.70/1.00", "0.00/1.00", "1.00/1.00"], lines
    assert all("ETA -" not in line for line in lines) and "(0.40 GB resumed)" in lines[0]
